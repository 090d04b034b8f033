"""Per-tenant token budgets in Redis (standalone and cluster)."""

from __future__ import annotations

import pytest
from faults.fake_servers import fake_server

from ctxguard.errors import (
    BudgetError,
    ConfigError,
    StoreConnectionError,
    StoreError,
    TenantBudgetError,
)
from ctxguard.guard import Guard
from ctxguard.observe import fan_out
from ctxguard.observe.tenant_budget import MAX_BUCKETS, TenantBudget
from ctxguard.stores.keys import KeySpace
from tests.conftest import private_memory_url, raw_client


def user(i: int) -> dict[str, str]:
    return {"role": "user", "content": f"question {i} " + "about things " * 8}


@pytest.fixture(params=["redis", "cluster"])
def url(request: pytest.FixtureRequest, namespace: str) -> str:
    return str(request.getfixturevalue(f"{request.param}_url"))


def test_charges_add_up_and_are_shared(url: str, namespace: str) -> None:
    a = TenantBudget(url, tokens=1000, window_seconds=3600, namespace=namespace, tenant="acme")
    b = TenantBudget(url, tokens=1000, window_seconds=3600, namespace=namespace, tenant="acme")
    other = TenantBudget(url, tokens=1000, window_seconds=3600, namespace=namespace, tenant="zed")
    try:
        assert a.spent()[0] == 0
        assert a.charge(300) == 300
        assert b.charge(200) == 500  # another process sees the same budget
        assert other.spent()[0] == 0  # tenants are apart
        assert a.remaining() == 500
        spent, wait = b.spent()
        assert spent == 500 and 0 < wait <= 3600 + 60
    finally:
        for x in (a, b, other):
            x.close()


def test_guard_limit_capped_then_refused(url: str, namespace: str) -> None:
    budget = TenantBudget(url, tokens=3000, window_seconds=3600, namespace=namespace, tenant="t")
    guard = Guard(
        private_memory_url(), limit=budget.limit(4000), observer=fan_out(budget), max_tokens=64
    )
    sid = f"b1-{namespace}"
    try:
        first = guard.prepare(sid, [user(0)])
        assert first.limit == 3000  # the tenant has 3000 left, less than the 4000 limit
        assert "tenant budget 4000->3000" in first.limit_source
        guard.complete(
            sid,
            {"role": "assistant", "content": "ok"},
            prepared=first,
            usage={"prompt_tokens": 2000, "completion_tokens": 500},
        )
        assert guard.prepare(sid, [user(1)]).limit == 500
        guard.complete(sid, {"role": "assistant", "content": "ok"}, usage={"total_tokens": 600})
        with pytest.raises(TenantBudgetError) as err:
            guard.prepare(sid, [user(2)])
        assert isinstance(err.value, BudgetError)
        assert err.value.spent == 3100 and err.value.budget == 3000
        assert err.value.retry_after > 0
        refused = [r for r in guard.store.read_audit(sid) if r.get("kind") == "refused"]
        assert refused[-1]["error"] == "TenantBudgetError"
        assert len(guard.store.read(sid, 0, 100)) == 4  # the refused message was not stored
    finally:
        budget.close()


def test_buckets_leave_the_window(redis_url: str, namespace: str) -> None:
    """Planted old buckets are dropped by the script (no sleeping for the window)."""
    budget = TenantBudget(redis_url, tokens=100, window_seconds=60, namespace=namespace, tenant="w")
    client = raw_client(redis_url)
    try:
        key = KeySpace(namespace, "w").tenant_budget_key()
        client.hset(key, mapping={"1000": 90, "2000": 5})  # buckets from 1970
        assert budget.spent()[0] == 0
        assert client.hlen(key) == 0
        assert budget.charge(7) == 7
        assert client.pttl(key) > 0
    finally:
        client.close()
        budget.close()


@pytest.mark.parametrize("stale", [8_999, 20_001])
def test_many_buckets_leaving_the_window_at_once_are_dropped(
    url: str, namespace: str, stale: int
) -> None:
    """A budget of many buckets idle for most of its window finds that many stale at
    once: they were dropped with one HDEL of unpack(stale), a Lua error past ~8,000
    values, so every charge and every limit failed (StoreError) until the key expired."""
    budget = TenantBudget(
        url, tokens=100, window_seconds=60, namespace=namespace, tenant="m", buckets=MAX_BUCKETS
    )
    client = raw_client(url)
    try:
        key = KeySpace(namespace, "m").tenant_budget_key()
        for low in range(0, stale, 5_000):  # buckets from 1970, as charges once wrote them
            fields = range(1000 + low, 1000 + min(stale, low + 5_000))
            client.hset(key, mapping={str(f): 1 for f in fields})
        assert client.hlen(key) == stale
        assert budget.charge(7) == 7
        assert client.hlen(key) == 1
        assert budget.remaining() == 93
    finally:
        client.delete(KeySpace(namespace, "m").tenant_budget_key())
        client.close()
        budget.close()


def test_corrupt_key_is_a_store_error(redis_url: str, namespace: str) -> None:
    budget = TenantBudget(redis_url, tokens=100, window_seconds=60, namespace=namespace, tenant="c")
    client = raw_client(redis_url)
    try:
        client.set(KeySpace(namespace, "c").tenant_budget_key(), "x")
        with pytest.raises(StoreError, match="not a hash"):
            budget.charge(1)
    finally:
        client.close()
        budget.close()


def test_a_server_that_sends_the_password_back_is_typed_and_redacted() -> None:
    """A server that knows no AUTH quotes the password in its refusal: not in the
    error, nor in any exception under it."""
    with fake_server("echoing") as echoing:
        budget = TenantBudget(
            f"redis://:hunter2@127.0.0.1:{echoing.port}/0", tokens=10, window_seconds=1
        )
        try:
            with pytest.raises(StoreConnectionError) as err:
                budget.charge(1)
        finally:
            budget.close()
    chain: list[BaseException] = []
    item: BaseException | None = err.value
    while item is not None:
        chain.append(item)
        item = item.__cause__ or item.__context__
    assert len(chain) > 1 and err.value.never_reached
    assert all("hunter2" not in f"{e} {e!r}" for e in chain)
    assert "`***`" in str(err.value)  # what it sent back, without the password


def test_unreachable_redis_is_typed_and_redacted() -> None:
    budget = TenantBudget(
        "redis://:hunter2@127.0.0.1:1/0?socket_connect_timeout=0.5", tokens=10, window_seconds=1
    )
    with pytest.raises(StoreError) as err:
        budget.spent()
    assert "hunter2" not in str(err.value) and "hunter2" not in repr(budget)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"tokens": 0},
        {"tokens": True},
        {"window_seconds": 0},
        {"window_seconds": float("inf")},
        {"window_seconds": 1e300},  # (before: a StoreError from the script's PEXPIRE)
        {"buckets": 0},
        {"min_tokens": 11},  # (before: accepted, then every request refused, nothing spent)
    ],
)
def test_bad_settings(kwargs: dict[str, object]) -> None:
    args: dict[str, object] = {"tokens": 10, "window_seconds": 1, **kwargs}
    with pytest.raises(ConfigError):
        TenantBudget("redis://127.0.0.1:1/0", **args)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="Redis"):
        TenantBudget(private_memory_url(), tokens=10, window_seconds=1)


def test_a_charge_past_2_53_is_a_config_error(redis_url: str, namespace: str) -> None:
    """(before: a StoreError "value is not an integer or out of range script: ..., on
    @user_script:36", as if Redis had failed)"""
    budget = TenantBudget(redis_url, tokens=10, window_seconds=60, namespace=namespace)
    try:
        with pytest.raises(ConfigError, match="2\\*\\*53"):
            budget.charge(2**62)
        assert budget.charge(2**53) == 2**53  # the largest charge still adds up exactly
    finally:
        budget.close()
