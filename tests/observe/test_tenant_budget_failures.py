"""A charge the budget's observer could not make is counted and logged, never silent.

(The guard ignores what its observer raises, so with Redis down the budget stopped
counting and nothing said so.)
"""

from __future__ import annotations

import logging

import pytest

from ctxguard.guard import Guard
from ctxguard.observe import tenant_budget
from ctxguard.observe.tenant_budget import TenantBudget
from ctxguard.stores.keys import KeySpace
from tests.conftest import private_memory_url, raw_client

DOWN = "redis://:s3cretPW@127.0.0.1:1/0?socket_connect_timeout=0.5"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _turn(guard: Guard, sid: str, i: int) -> None:
    req = guard.prepare(sid, [{"role": "user", "content": f"question {i}"}])
    guard.complete(
        sid,
        {"role": "assistant", "content": "ok"},
        prepared=req,
        usage={"prompt_tokens": 10, "completion_tokens": 5},
    )


def _warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [
        r for r in caplog.records if r.name == "ctxguard.observe" and r.levelno == logging.WARNING
    ]


def test_failed_charges_are_counted_and_warned_once_per_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    budget = TenantBudget(DOWN, tokens=1000, window_seconds=60, tenant="acme")
    budget._clock = clock = Clock()
    guard = Guard(private_memory_url(), limit=4096, observer=budget, max_tokens=64)
    caplog.set_level(logging.INFO, logger="ctxguard.observe")
    try:
        for i in range(5):  # every request still answers
            _turn(guard, "s", i)
        assert (budget.charge_failures, budget.uncharged_tokens) == (5, 75)
        [first] = _warnings(caplog)
        text = first.getMessage()
        assert "tenant budget of 'acme'" in text and "could not charge 15 tokens" in text
        assert "StoreConnectionError" in text and "\n" not in text
        clock.now += tenant_budget.LOG_EVERY
        _turn(guard, "s", 5)
        later = _warnings(caplog)[1].getMessage()
        assert "(5 failed since the last warning)" in later and "90 uncharged" in later
        assert len(_warnings(caplog)) == 2
        assert "s3cretPW" not in caplog.text
    finally:
        guard.close()
        budget.close()


def test_charges_working_again_are_said_once(
    redis_url: str, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    budget = TenantBudget(redis_url, tokens=1000, window_seconds=60, namespace=namespace)
    budget._clock = Clock()
    guard = Guard(private_memory_url(), limit=4096, observer=budget, max_tokens=64)
    client = raw_client(redis_url)
    key = KeySpace(namespace, budget.tenant).tenant_budget_key()
    caplog.set_level(logging.INFO, logger="ctxguard.observe")
    try:
        client.set(key, "not a hash")  # every charge fails: a StoreError
        _turn(guard, "s", 0)
        _turn(guard, "s", 1)
        assert budget.charge_failures == 2 and len(_warnings(caplog)) == 1
        assert "not a hash" in _warnings(caplog)[0].getMessage()
        client.delete(key)
        _turn(guard, "s", 2)
        _turn(guard, "s", 3)
        again = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
        assert again == [
            f"tenant budget of 'default' on {budget.store_url.redacted} charges again "
            "after 2 failed charges"
        ]
        assert budget.spent()[0] == 30 and budget.charge_failures == 2
    finally:
        client.delete(key)
        client.close()
        guard.close()
        budget.close()


@pytest.mark.parametrize(
    ("total", "charged"), [(-1, 1050), (0, 1050), (True, 1050), ("1050", 1050), (2000, 2000)]
)
def test_a_total_the_server_got_wrong_charges_prompt_and_completion(
    redis_url: str, namespace: str, total: object, charged: int
) -> None:
    """(usage["total_tokens"] is not checked: a -1, 0 or true there was charged as the
    request's whole spend, so a server that got it wrong let the tenant past its budget)"""
    budget = TenantBudget(
        redis_url, tokens=10_000, window_seconds=60, namespace=namespace, tenant="tt"
    )
    guard = Guard(private_memory_url(), limit=4096, observer=budget)
    try:
        req = guard.prepare("s", [{"role": "user", "content": "question"}])
        usage = {"prompt_tokens": 1000, "completion_tokens": 50, "total_tokens": total}
        guard.complete("s", {"role": "assistant", "content": "ok"}, prepared=req, usage=usage)
        assert budget.spent()[0] == charged
        assert budget.charge_failures == 0
    finally:
        guard.close()
        client = raw_client(redis_url)
        client.delete(KeySpace(namespace, "tt").tenant_budget_key())
        client.close()
        budget.close()
