"""A connection killed mid-operation (CLIENT KILL while the command is held by CLIENT PAUSE).

Operations that are safe to repeat are retried with backoff and succeed once;
the others raise StoreConnectionError at once, and nothing is applied twice.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from ctxguard.errors import StoreConnectionError
from ctxguard.stores import Summary, WriteOptions, open_async_store, open_store
from ctxguard.stores.base import RecordWrite

from .helpers import RecordingPolicy, kill_blocked, new, run_killed
from .servers import RedisServer

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60), pytest.mark.destructive]
OPTS = WriteOptions(counter="c1")
SID = "s1"


def _open(server: RedisServer, policy: RecordingPolicy) -> Any:
    return open_store(server.url, namespace="faults", retry=policy)


RETRYABLE: dict[str, Callable[[Any], Any]] = {
    "append": lambda s: s.append(SID, [new("retried", id="m-retried")], OPTS),
    "read": lambda s: s.read(SID),
    "fetch_window": lambda s: s.fetch_window(SID, 10_000, OPTS),
    "set_token_counts": lambda s: s.set_token_counts(SID, "c1", {0: 7}),
}


@pytest.mark.parametrize("op", sorted(RETRYABLE))
def test_idempotent_operations_retry_with_backoff(private_redis: RedisServer, op: str) -> None:
    policy = RecordingPolicy()
    store = _open(private_redis, policy)
    admin = private_redis.client()
    store.append(SID, [new("first", id="m-first")], OPTS)

    outcome = run_killed(admin, lambda: RETRYABLE[op](store))

    assert not isinstance(outcome, BaseException), outcome
    assert policy.used and policy.used[0] == policy.first_delay  # backed off, then retried
    ids = [m.message.id for m in store.read(SID)]
    expected = ["m-first", "m-retried"] if op == "append" else ["m-first"]
    assert ids == expected  # nothing lost, nothing doubled
    if op == "set_token_counts":
        assert store.read(SID)[0].tokens == 7
    store.close()
    admin.close()


NOT_RETRYABLE: dict[str, Callable[[Any], Any]] = {
    "add_audit": lambda s: s.add_audit(SID, {"kind": "note"}, retention=10),
    "commit_summary": lambda s: s.commit_summary(SID, Summary(version=1, text="t", covers_to=1), 0),
    "record": lambda s: s.record(SID, RecordWrite(audit={"turn": 0, "x": 1}, retention=10)),
    "append_with_audit": lambda s: s.append_with_audit(
        SID, [new("late", id="m-late")], OPTS, RecordWrite(audit={"kind": "usage"}, retention=10)
    ),
}


@pytest.mark.parametrize("op", sorted(NOT_RETRYABLE))
def test_other_operations_raise_typed_and_apply_nothing(
    private_redis: RedisServer, op: str
) -> None:
    policy = RecordingPolicy()
    store = _open(private_redis, policy)
    admin = private_redis.client()
    store.append(SID, [new("first", id="m-first")], OPTS)

    outcome = run_killed(admin, lambda: NOT_RETRYABLE[op](store))

    assert isinstance(outcome, StoreConnectionError), outcome
    assert policy.used == []  # never re-sent
    assert "lost the connection" in str(outcome)
    # The killed command never ran: no audit record, no summary, no message.
    assert store.read_audit(SID) == []
    assert store.get_summary(SID) is None
    assert [m.message.id for m in store.read(SID)] == ["m-first"]
    # The caller may now decide to send it again: it lands exactly once.
    NOT_RETRYABLE[op](store)
    assert len(store.read_audit(SID)) == (0 if op == "commit_summary" else 1)
    assert (store.get_summary(SID) is not None) == (op == "commit_summary")
    assert len(store.read(SID)) == (2 if op == "append_with_audit" else 1)
    store.close()
    admin.close()


async def test_async_append_retries_and_audit_raises(private_redis: RedisServer) -> None:
    policy = RecordingPolicy()
    store = open_async_store(private_redis.url, namespace="faults", retry=policy)
    admin = private_redis.client()
    await store.append(SID, [new("first", id="m-first")], OPTS)

    for op in ("append", "add_audit"):
        admin.execute_command("CLIENT", "PAUSE", 5000, "WRITE")
        if op == "append":
            task = asyncio.create_task(store.append(SID, [new("x", id="m-async")], OPTS))
        else:
            task = asyncio.create_task(store.add_audit(SID, {"kind": "note"}, retention=10))
        await asyncio.to_thread(kill_blocked, admin)
        if op == "append":
            result = await task
            assert result.stored == ("m-async",)
            assert policy.used
        else:
            used = len(policy.used)
            with pytest.raises(StoreConnectionError):
                await task
            assert len(policy.used) == used

    assert [m.message.id for m in await store.read(SID)] == ["m-first", "m-async"]
    assert await store.read_audit(SID) == []
    await store.close()
    admin.close()
