"""The server restarts (SIGKILL or SHUTDOWN) or stops answering for a while.

Acknowledged messages survive a restart (append-only file, fsync always),
the same store object reconnects, and a stalled server gives a typed
StoreConnectionError within the socket timeout, then the store recovers.

Nothing hangs: servers that accept and never answer, accept and close, answer
the handshake and then stall or drop, never accept, or speak plain TCP to a
``rediss://`` client give a StoreConnectionError that says which (connect,
TLS, read, lost) from every entry point (Guard, AsyncGuard, the store, the
CLI), bounded by the timeouts, which are on by default.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import pytest
import redis
from click.testing import CliRunner
from redis.backoff import NoBackoff
from redis.retry import Retry

from ctxguard.cli import cli
from ctxguard.errors import ConfigError, StoreConnectionError
from ctxguard.guard import AsyncGuard, Guard, GuardConfig
from ctxguard.messages import Message
from ctxguard.stores import NewMessage, WriteOptions, open_async_store, open_store
from ctxguard.stores.redis import RetryPolicy
from ctxguard.stores.urls import parse_store_url
from tests.conftest import private_memory_url

from .fake_servers import Behaviour, FakeServer, fake_server
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


def _sleep_server(
    server: RedisServer, seconds: float, probe_timeout: float = 0.1
) -> threading.Thread:
    """``DEBUG SLEEP seconds`` on its own thread, returned once the server is asleep: a
    probe's PING then gets no answer. (A fixed pause was not enough on a loaded machine:
    the thread's command could reach the server after the test's own.)"""
    admin = server.client(socket_timeout=seconds + 10)  # the sleep's own reply comes after it
    # no retries: redis-py's default Retry would wait out the sleep and answer
    probe = server.client(socket_timeout=probe_timeout, retry=Retry(NoBackoff(), 0))
    admin.ping()
    probe.ping()  # both connected now, while the server answers
    # Sent from this thread, before any probe: a thread of its own could be scheduled
    # late on a loaded machine, and the server then read what the test sent next first.
    conn = admin.connection_pool.get_connection()
    conn.send_command("DEBUG", "SLEEP", seconds)

    def wait_for_the_reply() -> None:
        try:
            conn.read_response()
        finally:
            admin.connection_pool.release(conn)
            admin.close()

    thread = threading.Thread(target=wait_for_the_reply)
    thread.start()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            probe.ping()
        except redis.TimeoutError:
            break  # asleep
        time.sleep(0.005)
    else:
        raise AssertionError("the server never went to sleep")
    probe.close()
    return thread


def test_stalled_server_times_out_typed_then_recovers(private_redis: RedisServer) -> None:
    url = private_redis.url + "?socket_timeout=0.25"
    store = open_store(url, namespace="slow", retry=RetryPolicy(attempts=2, first_delay=0.05))
    store.append("s", [new("before", id="before")], OPTS)

    sleeper = _sleep_server(private_redis, 1.5)
    with pytest.raises(StoreConnectionError, match=r"no reply from .* within 0.25 s") as info:
        store.append("s", [new("during", id="during")], OPTS)
    # the wait was the read timeout on each attempt: the message says how many
    assert "tried 2 times" in str(info.value)
    # the first attempt was sent: a later refused reconnect must not hide that
    assert info.value.phase == "read" and not info.value.never_reached
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
    with pytest.raises(StoreConnectionError, match="tried 2 times"):
        await store.read("s")
    await asyncio.to_thread(sleeper.join, 10)

    assert [m.message.id for m in await store.read("s")] == ["before"]
    await store.close()


# -- nothing hangs -------------------------------------------------------------

FAST = "socket_timeout=0.3&socket_connect_timeout=0.3"
USER = {"role": "user", "content": "hello"}
# behaviour -> (phase, words the message must hold)
EXPECTED: dict[Behaviour, tuple[set[str], str]] = {
    "silent": ({"connect"}, "did not answer the handshake within 0.3 s (read timeout"),
    "closing": ({"connect"}, "nothing was sent, safe to retry"),
    "handshake_then_silent": ({"read"}, "no reply from"),
    "handshake_then_close": ({"lost"}, "lost the connection to"),
    "backlog_full": ({"connect"}, "within 0.3 s (connect timeout"),
    # (a reply sent a byte at a time kept a sync call waiting forever: redis-py's sync
    # socket timeout bounds each read alone; stores/redis_deadline.py)
    "dripping": ({"connect"}, "did not answer the handshake within 0.3 s (read timeout"),
    "handshake_then_dripping": ({"read"}, "no reply from"),
}


def _sync_guard_prepare(url: str) -> None:
    guard = Guard(url, counter="approx", limit=1000, max_tokens=10)
    try:
        guard.prepare("s", [USER])
    finally:
        guard.close()


def _sync_guard_complete(url: str) -> None:
    guard = Guard(url, counter="approx", limit=1000, max_tokens=10)
    try:
        guard.complete("s", {"role": "assistant", "content": "hi"})
    finally:
        guard.close()


def _store_read(url: str) -> None:
    store = open_store(url)
    try:
        store.read("s")
    finally:
        store.close()


def _async_guard_prepare(url: str) -> None:
    async def run() -> None:
        guard = AsyncGuard(url, counter="approx", limit=1000, max_tokens=10)
        try:
            await guard.prepare("s", [USER])
        finally:
            await guard.aclose()

    asyncio.run(run())


ENTRY_POINTS: dict[str, Callable[[str], None]] = {
    "Guard.prepare": _sync_guard_prepare,
    "Guard.complete": _sync_guard_complete,
    "store.read": _store_read,
    "AsyncGuard.prepare": _async_guard_prepare,
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("behaviour", list(EXPECTED))
@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
def test_a_misbehaving_server_gives_a_typed_error_saying_which(
    behaviour: Behaviour, entry: str
) -> None:
    phases, words = EXPECTED[behaviour]
    with fake_server(behaviour) as server:
        url = f"{server.url}?{FAST}"
        with pytest.raises(StoreConnectionError) as info:
            ENTRY_POINTS[entry](url)
    assert info.value.phase in phases, str(info.value)
    assert words in str(info.value)
    assert info.value.never_reached == (info.value.phase == "connect")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("behaviour", list(EXPECTED))
@pytest.mark.parametrize("how", ["--url", "env"])
def test_cli_sessions_against_a_misbehaving_server_exits_3(behaviour: Behaviour, how: str) -> None:
    with fake_server(behaviour) as server:
        url = f"{server.url}?{FAST}"
        args, env = (["--url", url], {}) if how == "--url" else ([], {"CTXGUARD_URL": url})
        result = CliRunner().invoke(cli, ["sessions", *args], env=env)
    assert result.exit_code == 3, result.output
    assert "StoreConnectionError" in result.output and EXPECTED[behaviour][1] in result.output


@pytest.mark.timeout(60)
@pytest.mark.parametrize("behaviour", ["silent", "closing", "handshake_then_close"])
@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
def test_rediss_to_a_plain_port_is_a_tls_error(behaviour: Behaviour, entry: str) -> None:
    with fake_server(behaviour) as server:
        url = f"rediss://127.0.0.1:{server.port}/0?{FAST}"
        with pytest.raises(StoreConnectionError) as info:
            ENTRY_POINTS[entry](url)
    text = str(info.value)
    assert info.value.never_reached, text
    # asyncio cannot tell a TLS handshake timeout from a TCP one: it says both
    assert "TLS handshake" in text
    if info.value.phase == "tls":
        assert "is this a TLS port?" in text


@pytest.mark.timeout(60)
@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
def test_rediss_to_a_real_plain_redis_port(private_redis: RedisServer, entry: str) -> None:
    url = f"rediss://127.0.0.1:{private_redis.port}/0?{FAST}"
    with pytest.raises(StoreConnectionError) as info:
        ENTRY_POINTS[entry](url)
    assert info.value.never_reached
    assert "TLS handshake" in str(info.value)


@pytest.mark.timeout(60)
def test_cli_rediss_to_a_plain_redis_port(private_redis: RedisServer) -> None:
    url = f"rediss://127.0.0.1:{private_redis.port}/0?{FAST}"
    result = CliRunner().invoke(cli, ["sessions", "--url", url])
    assert result.exit_code == 3 and "TLS handshake" in result.output, result.output


def _timeouts(client: Any) -> tuple[float, float]:
    pool = getattr(client, "connection_pool", None)
    kwargs = pool.connection_kwargs if pool is not None else client.connection_kwargs
    return kwargs["socket_connect_timeout"], kwargs["socket_timeout"]


def test_every_client_has_timeouts_by_default(cluster_url: str) -> None:
    plain = "redis://127.0.0.1:1/0"
    assert _timeouts(open_store(plain).client) == (5.0, 10.0)  # type: ignore[attr-defined]
    assert _timeouts(open_async_store(plain).client) == (5.0, 10.0)  # type: ignore[attr-defined]
    async_cluster = open_async_store(cluster_url).client  # type: ignore[attr-defined]
    assert _timeouts(async_cluster) == (5.0, 10.0)
    cluster = open_store(cluster_url)
    for node in cluster.client.get_nodes():  # type: ignore[attr-defined]
        assert _timeouts(node.redis_connection) == (5.0, 10.0)
    cluster.close()


def test_timeouts_come_from_the_url_or_the_guard(cluster_url: str) -> None:
    url = "redis://127.0.0.1:1/0?socket_timeout=2.5&socket_connect_timeout=1.5"
    assert _timeouts(open_store(url).client) == (1.5, 2.5)  # type: ignore[attr-defined]
    guard = Guard(url, counter="approx", limit=100, read_timeout=7, connect_timeout=3)
    assert _timeouts(guard.store.client) == (3.0, 7.0)  # type: ignore[attr-defined]
    aguard = AsyncGuard(url, counter="approx", limit=100, read_timeout=4)
    assert _timeouts(aguard.store.client) == (1.5, 4.0)  # type: ignore[attr-defined]
    cluster = open_store(cluster_url + "?socket_timeout=3", connect_timeout=2)
    for node in cluster.client.get_nodes():  # type: ignore[attr-defined]
        assert _timeouts(node.redis_connection) == (2.0, 3.0)
    cluster.close()
    assert _timeouts(open_async_store(cluster_url, read_timeout=6).client) == (5.0, 6.0)  # type: ignore[attr-defined]


@pytest.mark.parametrize("value", [0, -1, float("nan"), float("inf"), "5", True])
def test_bad_timeouts_are_config_errors(value: object) -> None:
    with pytest.raises(ConfigError, match="positive number of seconds"):
        GuardConfig(read_timeout=value)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="positive number of seconds"):
        Guard(private_memory_url(), counter="approx", limit=100, connect_timeout=value)
    with pytest.raises(ConfigError, match="positive number of seconds"):
        open_store("redis://h:1/0", read_timeout=value)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "query",
    ["socket_timeout=0", "socket_timeout=abc", "socket_connect_timeout=-1", "socket_timeout=nan"],
)
def test_bad_timeouts_in_the_url_are_config_errors(query: str) -> None:
    with pytest.raises(ConfigError, match="positive number of seconds"):
        parse_store_url(f"redis://h:1/0?{query}")
    with pytest.raises(ConfigError, match="positive number of seconds"):
        parse_store_url(f"redis+cluster://h:1,h:2?{query}")


def test_a_fake_server_is_what_it_says() -> None:
    """The fixtures themselves: the backlog server really never completes a connect."""
    server = FakeServer("backlog_full").start()
    try:
        import socket

        probe = socket.socket()
        probe.settimeout(0.3)
        with pytest.raises(OSError):
            probe.connect(("127.0.0.1", server.port))
        probe.close()
    finally:
        server.stop()


def _after_the_write_timeout(error: StoreConnectionError, ids: list[str]) -> None:
    """What a send cut short by the socket timeout leaves: an error that says the write
    (not the reply) timed out and that it may have run, and a session with or without
    the big message, whole. What was buffered when the client gave up can still reach
    the server once it reads again (the kernel's buffer, and asyncio's transport, which
    flushes on close), so the library cannot promise it did not run, and does not."""
    assert "writing" in str(error.__cause__)  # redis-py's write timeout, not the read's
    assert error.phase == "write" and not error.never_reached, str(error)
    assert "could not finish sending" in str(error) and "may or may not have run" in str(error)
    assert ids in (["before"], ["before", "big"])


BIG = NewMessage(Message(role="user", content="x" * (48 << 20), id="big"), 1)
# The server must be asleep before the big send starts: awake, it reads the 48 MB and
# the test sees a read timeout instead. A PING unanswered for 0.1 s can be a loaded
# machine rather than a sleeping server; for 0.5 s it is not (the sleep is WRITE_SLEEP).
WRITE_PROBE = 0.5
# The send must also begin before the server wakes: encoding and packing the 48 MB took
# over 2.5 s once on 2 cores shared with three CI runs (the server woke, read it all, and
# the client timed out on the reply: loop run 8 of 50, session 11). 8 s leaves 7.5.
WRITE_SLEEP = 8.0


def test_send_the_server_does_not_read_times_out_on_the_write(
    private_redis: RedisServer,
) -> None:
    """A command bigger than the socket buffers, to a server that does not read it:
    redis-py's send gives up under the socket timeout and the store says so."""
    url = private_redis.url + "?socket_timeout=0.25"
    store = open_store(url, namespace="slow", retry=RetryPolicy(attempts=1))
    store.append("s", [new("before", id="before")], OPTS)

    sleeper = _sleep_server(private_redis, WRITE_SLEEP, probe_timeout=WRITE_PROBE)
    with pytest.raises(StoreConnectionError) as caught:
        store.append("s", [BIG], OPTS)
    sleeper.join(WRITE_SLEEP + 10)
    store.close()

    # Checked on a store with the default timeouts: once awake, the server may still
    # be taking in (or dropping) the 48 MB, which a loaded machine stretches past 0.25 s.
    check = open_store(private_redis.url, namespace="slow")
    _after_the_write_timeout(caught.value, [m.message.id for m in check.read("s")])
    check.close()


async def test_async_send_the_server_does_not_read_times_out_on_the_write(
    private_redis: RedisServer,
) -> None:
    """The same through the async store's own send (``redis_clients.asend``): it waits
    for the buffered rest under the socket timeout, as redis-py's send does."""
    url = private_redis.url + "?socket_timeout=0.25"
    store = open_async_store(url, namespace="slow", retry=RetryPolicy(attempts=1))
    await store.append("s", [new("before", id="before")], OPTS)

    sleeper = await asyncio.to_thread(_sleep_server, private_redis, WRITE_SLEEP, WRITE_PROBE)
    with pytest.raises(StoreConnectionError) as caught:
        await store.append("s", [BIG], OPTS)
    await asyncio.to_thread(sleeper.join, WRITE_SLEEP + 10)
    await store.close()

    check = open_async_store(private_redis.url, namespace="slow")
    _after_the_write_timeout(caught.value, [m.message.id for m in await check.read("s")])
    await check.close()
