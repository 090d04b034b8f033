"""A store operation has one deadline: its connect timeout plus its read timeout, for every
attempt, connection handshake and reply together (stores/redis_deadline.py).

A server that accepts connections and never answers took one read timeout per attempt
(4 attempts: ``ctxguard sessions`` waited 42 s on the default 10 s), and a handshake of
several replies each just under the read timeout took that many read timeouts per
attempt. The fake servers count what reached them, so no test here measures time.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from click.testing import CliRunner

from ctxguard.cli import cli
from ctxguard.errors import StoreConnectionError
from ctxguard.stores import open_async_store, open_store

from .fake_servers import Behaviour, fake_server
from .helpers import new
from .servers import FaultProxy, RedisServer

# a deadline of 0.4 + 0.4 s: the first attempt's handshake read (0.4 s) leaves room
# for one more attempt at most, where 4 were made before
FAST = "socket_timeout=0.4&socket_connect_timeout=0.4"


@pytest.mark.timeout(60)
def test_a_silent_server_is_retried_only_within_the_operations_deadline() -> None:
    with fake_server("silent") as server:
        store = open_store(f"{server.url}?{FAST}")
        try:
            with pytest.raises(StoreConnectionError) as info:
                store.read("s")
        finally:
            store.close()
        connections = server.connections
    assert info.value.phase == "connect", str(info.value)
    assert 1 <= connections <= 2, connections  # 4 (one per RetryPolicy attempt) before


@pytest.mark.timeout(60)
def test_an_async_store_does_not_retry_past_the_operations_deadline() -> None:
    async def read(url: str) -> None:
        store = open_async_store(url)
        try:
            await store.read("s")
        finally:
            await store.close()

    with fake_server("silent") as server:
        with pytest.raises(StoreConnectionError):
            asyncio.run(read(f"{server.url}?{FAST}"))
        connections = server.connections
    assert 1 <= connections <= 2, connections


@pytest.mark.timeout(60)
def test_a_handshake_of_slow_replies_ends_at_the_operations_deadline() -> None:
    """AUTH, CLIENT SETINFO twice and SELECT, each answered in 0.3 s (under the 0.4 s read
    timeout): the handshake alone is past the 0.8 s deadline, so the command is never
    sent and no second attempt starts."""
    with fake_server("slow_handshake_then_silent", delay=0.3) as server:
        url = f"redis://:pw@127.0.0.1:{server.port}/1?{FAST}"
        store = open_store(url)
        try:
            with pytest.raises(StoreConnectionError) as info:
                store.read("s")
        finally:
            store.close()
        commands = list(server.commands)
        connections = server.connections
    assert info.value.phase == "connect", str(info.value)
    assert "pw" not in str(info.value)
    assert connections == 1, connections
    assert commands and all(c in {b"AUTH", b"CLIENT", b"SELECT", b"HELLO"} for c in commands), (
        commands
    )


@pytest.mark.timeout(60)
@pytest.mark.parametrize("behaviour", ["silent", "handshake_then_silent"])
def test_cli_store_commands_fail_once_within_the_deadline_exit_3(behaviour: str) -> None:
    with fake_server(behaviour) as server:  # type: ignore[arg-type]
        url = f"{server.url}?{FAST}"
        result = CliRunner().invoke(cli, ["show", "s", "--url", url])
        connections = server.connections
    assert result.exit_code == 3, result.output
    assert "StoreConnectionError" in result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
    assert 1 <= connections <= 2, connections


# The async store's deadline bounds the attempt under way too (asyncio.timeout around the
# operation). A read timeout of 1 s with replies 0.8 s apart: each reply comes in time,
# several of them do not, and the 1.2 s deadline lands 0.6 s or more from any reply.
SLOW = "socket_timeout=1&socket_connect_timeout=0.2"


def _timed_read(url: str) -> tuple[pytest.ExceptionInfo[StoreConnectionError], float]:
    started = time.monotonic()
    with pytest.raises(StoreConnectionError) as info:
        asyncio.run(_read_once(url))
    return info, time.monotonic() - started


async def _read_once(url: str) -> None:
    store = open_async_store(url)
    try:
        await store.read("s")
    finally:
        await store.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("cluster", [False, True], ids=["redis", "cluster"])
def test_an_async_handshake_of_slow_replies_ends_at_the_operations_deadline(
    cluster: bool,
) -> None:
    """AUTH, CLIENT SETINFO twice (and SELECT), each answered in 0.8 s: every reply within
    the 1 s read timeout, the handshake past the 1.2 s deadline. The attempt under way is
    cut in its handshake: the command (the cluster's CLUSTER SLOTS) is never sent."""
    with fake_server("slow_handshake_then_silent", delay=0.8) as server:
        where = f"127.0.0.1:{server.port}"
        url = f"redis+cluster://:pw@{where}?{SLOW}" if cluster else f"redis://:pw@{where}/1?{SLOW}"
        info, took = _timed_read(url)
        commands = list(server.commands)
        connections = server.connections
    text = str(info.value)
    assert info.value.phase == "connect" and info.value.never_reached, text
    assert "pw" not in text and "\n" not in text
    assert took < 15, took  # a generous bound: the deadline is 1.2 s, a hang is for ever
    assert connections == 1, connections
    assert commands and all(c in {b"AUTH", b"CLIENT", b"SELECT", b"HELLO"} for c in commands), (
        commands
    )


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("behaviour", "phase", "words"),
    [
        ("silent", "connect", "did not answer the handshake within 1 s (read timeout"),
        ("dripping", "connect", "did not answer the handshake within 1 s (read timeout"),
        ("handshake_then_dripping", "read", "no reply from"),
        ("backlog_full", "connect", "within 0.2 s (connect timeout"),
    ],
)
def test_an_async_operation_against_a_stalled_server_ends_typed_near_its_deadline(
    behaviour: Behaviour, phase: str, words: str
) -> None:
    with fake_server(behaviour) as server:
        info, took = _timed_read(f"{server.url}?{SLOW}")
    text = str(info.value)
    assert info.value.phase == phase and words in text and "\n" not in text, text
    assert took < 15, took  # a generous bound: the deadline is 1.2 s, a hang is for ever


@pytest.mark.timeout(60)
def test_an_async_operation_cut_mid_reply_leaves_no_reply_for_the_next(
    private_redis: RedisServer,
) -> None:
    """The deadline cuts the append while its reply is on the way (a fresh connection:
    handshake replies 2.5 s late, then the script's): redis-py drops that connection, so
    the late reply reaches no one, and the same store at once reads and writes what is
    stored, each command reading its own reply.

    The proxy holds each burst of replies once (the handshake's pipelined replies came
    in two reads now and then and were held twice: cut in the handshake, 2 runs in 54
    under load). The timings leave room for a loaded machine: the deadline is 4.2 s
    (connect 0.2 + read 4); the handshake's one round trip ends at 2.5 s plus any delay
    of the machine (1.7 s to spare), the script's reply at 5 s or later, past it."""
    proxy = FaultProxy(private_redis.port).start()
    url = f"{proxy.url}?socket_timeout=4&socket_connect_timeout=0.2"

    async def scenario() -> tuple[StoreConnectionError, list[str], list[str], int]:
        warm = open_async_store(url)  # the scripts loaded: the append below is one EVALSHA
        try:
            await warm.append("w", [new("w")])
        finally:
            await warm.close()
        store = open_async_store(url)
        try:
            proxy.reply_delay = 2.5
            try:
                await store.append("s", [new("x")])
            except StoreConnectionError as exc:
                cut = exc
            else:
                raise AssertionError("the append ended within its deadline")
            proxy.reply_delay = 0  # (the append's reply is still held back 0.8 s: were its
            # connection reused now, the read's command would go out on it and read that)
            first = [m.message.content for m in await store.read("s")]
            await store.append("s", [new("y")])
            second = [m.message.content for m in await store.read("s")]
            info = await store.info("s")
            return cut, first, second, 0 if info is None else info.message_count
        finally:
            await store.close()

    try:
        cut, first, second, count = asyncio.run(scenario())
    finally:
        proxy.stop()
    assert cut.phase == "read" and not cut.never_reached, str(cut)  # it may have run: it did
    assert first == ["x"], first
    assert second == ["x", "y"], second
    assert count == 2
