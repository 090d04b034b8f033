"""A store operation has one deadline: its connect timeout plus its read timeout, for every
attempt, connection handshake and reply together (stores/redis_deadline.py).

A server that accepts connections and never answers took one read timeout per attempt
(4 attempts: ``ctxguard sessions`` waited 42 s on the default 10 s), and a handshake of
several replies each just under the read timeout took that many read timeouts per
attempt. The fake servers count what reached them, so no test here measures time.
"""

from __future__ import annotations

import asyncio

import pytest
from click.testing import CliRunner

from ctxguard.cli import cli
from ctxguard.errors import StoreConnectionError
from ctxguard.stores import open_async_store, open_store

from .fake_servers import fake_server

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
