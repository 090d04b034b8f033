"""A connection killed mid-operation (CLIENT KILL while the command is held by CLIENT PAUSE).

Operations that are safe to repeat (every one but retract) are retried with
backoff and succeed once; retract raises StoreConnectionError at once, and
nothing is applied twice.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
import redis

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
    # fetch_window: plain reads, which CLIENT PAUSE WRITE does not hold (its own test below)
    "set_token_counts": lambda s: s.set_token_counts(SID, "c1", {0: 7}),
    # audit records carry an id (rid): written once however often they are sent
    "add_audit": lambda s: s.add_audit(SID, {"kind": "note"}, retention=10),
    "record": lambda s: s.record(SID, RecordWrite(audit={"turn": 0, "x": 1}, retention=10)),
    "append_with_audit": lambda s: s.append_with_audit(
        SID,
        [new("retried", id="m-retried")],
        OPTS,
        RecordWrite(audit={"kind": "usage"}, retention=10),
    ),
    # the same summary found committed answers "committed"
    "commit_summary": lambda s: s.commit_summary(SID, Summary(version=1, text="t", covers_to=1), 0),
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
    appends = op in ("append", "append_with_audit")
    assert ids == (["m-first", "m-retried"] if appends else ["m-first"])  # nothing doubled
    if op == "set_token_counts":
        assert store.read(SID)[0].tokens == 7
    audits = op in ("add_audit", "record", "append_with_audit")
    assert len(store.read_audit(SID)) == (1 if audits else 0)
    if op == "record":
        assert outcome == 1 and store.read_audit(SID)[0]["turn"] == 1
    if op == "commit_summary":
        assert outcome is True and store.get_summary(SID) is not None
    store.close()
    admin.close()


def test_a_window_read_is_retried_when_its_connection_drops(private_redis: RedisServer) -> None:
    """fetch_window is plain reads in one MULTI/EXEC (no script), which CLIENT PAUSE
    WRITE lets through: the connection fails right after the reads are sent instead."""
    policy = RecordingPolicy()
    store = _open(private_redis, policy)
    store.append(SID, [new("first", id="m-first")], OPTS)
    take = store._shelf.take  # where the store's calls get their connection
    dropped: list[bool] = []

    def take_once_dropped() -> Any:
        conn = take()
        send = conn.send_packed_command
        if dropped:
            return conn

        def send_then_drop(command: Any, *a: Any, **kw: Any) -> None:
            send(command, *a, **kw)  # the reads run on the server; their reply is lost
            conn.send_packed_command = send
            dropped.append(True)
            raise redis.ConnectionError("Connection closed by server.")

        conn.send_packed_command = send_then_drop
        return conn

    store._shelf.take = take_once_dropped
    fetch = store.fetch_window(SID, 10_000, OPTS)
    assert dropped and policy.used and policy.used[0] == policy.first_delay
    assert [m.message.id for m in fetch.recent] == ["m-first"]
    store.close()


def test_retract_is_not_retried(private_redis: RedisServer) -> None:
    """A repeat would remove more messages: it raises, and nothing was applied."""
    policy = RecordingPolicy()
    store = _open(private_redis, policy)
    admin = private_redis.client()
    store.append(SID, [new("first", id="m-first"), new("second", id="m-second")], OPTS)

    outcome = run_killed(admin, lambda: store.retract(SID, 1))

    assert isinstance(outcome, StoreConnectionError), outcome
    assert policy.used == []  # never re-sent
    assert "lost the connection" in str(outcome)
    assert [m.message.id for m in store.read(SID)] == ["m-first", "m-second"]
    assert store.read_audit(SID) == []
    store.close()
    admin.close()


async def test_async_writes_retry_and_retract_raises(private_redis: RedisServer) -> None:
    policy = RecordingPolicy()
    store = open_async_store(private_redis.url, namespace="faults", retry=policy)
    admin = private_redis.client()
    await store.append(SID, [new("first", id="m-first")], OPTS)

    for op in ("append", "add_audit", "retract"):
        used = len(policy.used)
        admin.execute_command("CLIENT", "PAUSE", 5000, "WRITE")
        if op == "append":
            task = asyncio.create_task(store.append(SID, [new("x", id="m-async")], OPTS))
        elif op == "add_audit":
            task = asyncio.create_task(store.add_audit(SID, {"kind": "note"}, retention=10))
        else:
            task = asyncio.create_task(store.retract(SID, 1))
        await asyncio.to_thread(kill_blocked, admin)
        if op == "append":
            result = await task
            assert result.stored == ("m-async",)
        elif op == "add_audit":
            assert await task == 0
        else:
            with pytest.raises(StoreConnectionError):
                await task
        assert (len(policy.used) > used) == (op != "retract")  # retried, or raised at once

    assert [m.message.id for m in await store.read(SID)] == ["m-first", "m-async"]
    assert [r["kind"] for r in await store.read_audit(SID)] == ["note"]
    await store.close()
    admin.close()
