"""The server restarts (SIGKILL or SHUTDOWN) or stops answering for a while.

Acknowledged messages survive a restart (append-only file, fsync always),
the same store object reconnects, and a stalled server gives a typed
StoreConnectionError within the socket timeout, then the store recovers.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import defaultdict

import pytest

from ctxguard.errors import StoreConnectionError
from ctxguard.stores import WriteOptions, open_async_store, open_store
from ctxguard.stores.redis import RetryPolicy

from .helpers import RecordingPolicy, append_until_stored, assert_once_in_order, new
from .servers import RedisServer

pytestmark = [pytest.mark.redis, pytest.mark.timeout(90), pytest.mark.destructive]
OPTS = WriteOptions(counter="c1")


def test_acknowledged_messages_survive_a_crash_restart(private_redis: RedisServer) -> None:
    store = open_store(private_redis.url, namespace="restart")
    sent = [new(f"m{i}", id=f"m{i:03d}") for i in range(200)]
    for message in sent:
        store.append("s", [message], OPTS)

    private_redis.restart(kill=True)  # SIGKILL: only what was fsynced survives

    assert [m.message.id for m in store.read("s")] == [m.message.id for m in sent]
    assert store.append("s", [new("after", id="after")], OPTS).stored == ("after",)
    info = store.info("s")
    assert info is not None and info.message_count == 201
    store.close()


def test_writer_follows_a_restart_during_traffic(private_redis: RedisServer) -> None:
    policy = RecordingPolicy()
    store = open_store(private_redis.url, namespace="restart", retry=policy)
    sent: dict[str, list[str]] = defaultdict(list)
    failures: list[int] = []
    acked = threading.Semaphore(0)

    def writer(name: str) -> None:
        for i in range(300):
            message = new(f"{name}-{i}", id=f"{name}-{i:04d}")
            failures.append(append_until_stored(store, "s", message))
            sent[name].append(message.message.id)
            acked.release()

    threads = [threading.Thread(target=writer, args=(f"w{n}",)) for n in range(2)]
    for t in threads:
        t.start()
    for _ in range(100):
        assert acked.acquire(timeout=30)
    private_redis.restart(kill=True, down_for=0.6)
    for t in threads:
        t.join(60)

    assert_once_in_order([m.message.id for m in store.read("s")], sent)
    assert policy.used or sum(failures)  # the outage was seen, and ridden out
    store.close()


async def test_async_store_reconnects_after_shutdown(private_redis: RedisServer) -> None:
    store = open_async_store(private_redis.url, namespace="restart")
    ids = [f"a{i:03d}" for i in range(50)]
    for i in ids:
        await store.append("s", [new(i, id=i)], OPTS)

    await asyncio.to_thread(private_redis.restart)  # SHUTDOWN: AOF flushed on exit

    assert [m.message.id for m in await store.read("s")] == ids
    await store.append("s", [new("after", id="after")], OPTS)
    assert len(await store.read("s")) == 51
    await store.close()


def _sleep_server(server: RedisServer, seconds: float) -> threading.Thread:
    admin = server.client()
    thread = threading.Thread(target=admin.execute_command, args=("DEBUG", "SLEEP", seconds))
    thread.start()
    time.sleep(0.1)  # the server is asleep from here on
    return thread


def test_stalled_server_times_out_typed_then_recovers(private_redis: RedisServer) -> None:
    url = private_redis.url + "?socket_timeout=0.25"
    store = open_store(url, namespace="slow", retry=RetryPolicy(attempts=2, first_delay=0.05))
    store.append("s", [new("before", id="before")], OPTS)

    sleeper = _sleep_server(private_redis, 1.5)
    started = time.monotonic()
    with pytest.raises(StoreConnectionError, match="lost the connection"):
        store.append("s", [new("during", id="during")], OPTS)
    assert time.monotonic() - started < 1.2  # bounded by the timeout, not the stall
    sleeper.join(10)

    # The timed-out append may have run once the server woke up; resending the
    # same id (what a caller does after StoreConnectionError) stores it once.
    store.append("s", [new("during", id="during")], OPTS)
    assert [m.message.id for m in store.read("s")] == ["before", "during"]
    store.close()


def test_paused_clients_time_out_typed_then_recover(private_redis: RedisServer) -> None:
    url = private_redis.url + "?socket_timeout=0.2"
    store = open_store(url, namespace="slow", retry=RetryPolicy(attempts=2, first_delay=0.05))
    store.append("s", [new("one", id="one")], OPTS)
    admin = private_redis.client()

    admin.execute_command("CLIENT", "PAUSE", 1500, "ALL")
    try:
        with pytest.raises(StoreConnectionError):
            store.read("s")
        with pytest.raises(StoreConnectionError):
            store.info("s")
    finally:
        admin.execute_command("CLIENT", "UNPAUSE")

    assert [m.message.id for m in store.read("s")] == ["one"]
    store.close()
    admin.close()


async def test_async_stalled_server_times_out_typed_then_recovers(
    private_redis: RedisServer,
) -> None:
    url = private_redis.url + "?socket_timeout=0.25"
    store = open_async_store(url, namespace="slow", retry=RetryPolicy(attempts=2))
    await store.append("s", [new("before", id="before")], OPTS)

    sleeper = await asyncio.to_thread(_sleep_server, private_redis, 1.5)
    with pytest.raises(StoreConnectionError):
        await store.read("s")
    await asyncio.to_thread(sleeper.join, 10)

    assert [m.message.id for m in await store.read("s")] == ["before"]
    await store.close()
