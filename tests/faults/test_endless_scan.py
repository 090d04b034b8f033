"""A SCAN that never ends (a broken proxy answering a non-zero cursor for ever) is a
typed ``StoreError`` after a bounded number of pages, not a listing that runs for ever
(stores/redis_scan.py); ``ctxguard sessions`` exits 3 with one line."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from click.testing import CliRunner

from ctxguard.cli import cli
from ctxguard.errors import StoreConnectionError, StoreError
from ctxguard.stores import open_async_store, open_store, redis_scan
from ctxguard.stores import redis as redis_store

from .fake_servers import Behaviour, fake_server
from .helpers import new

FREE = 40  # redis_scan.FREE_PAGES, lowered so that a walk reaches its DBSIZE check soon
# behaviour -> how many SCANs the server may see: a repeated cursor on the 2nd page; new
# cursors until the FREE pages are spent (the server's DBSIZE is 0: 2 * 0 + FREE allowed)
SCANS: dict[Behaviour, int] = {"scan_same_cursor": 2, "scan_new_cursor": FREE}


@pytest.fixture(autouse=True)
def _few_free_pages(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(redis_scan, "FREE_PAGES", FREE)


def _scans(commands: list[bytes]) -> int:
    return sum(c == b"SCAN" for c in commands)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("behaviour", list(SCANS))
def test_an_endless_scan_is_a_store_error_after_bounded_pages(behaviour: Behaviour) -> None:
    with fake_server(behaviour) as server:
        store = open_store(server.url)
        try:
            with pytest.raises(StoreError) as info:
                list(store.list_sessions())
        finally:
            store.close()
        commands = list(server.commands)
    assert not isinstance(info.value, StoreConnectionError)  # the server answered
    assert "never ends" in str(info.value) and "\n" not in str(info.value)
    assert _scans(commands) == SCANS[behaviour]
    assert commands.count(b"DBSIZE") == (behaviour == "scan_new_cursor")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("behaviour", list(SCANS))
def test_an_endless_scan_is_a_store_error_on_the_async_store(behaviour: Behaviour) -> None:
    async def listing(url: str) -> list[str]:
        store = open_async_store(url)
        try:
            return [s async for s in store.list_sessions()]
        finally:
            await store.close()

    with fake_server(behaviour) as server:
        with pytest.raises(StoreError, match="never ends"):
            asyncio.run(listing(server.url))
        commands = list(server.commands)
    assert _scans(commands) == SCANS[behaviour]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("behaviour", list(SCANS))
def test_cli_sessions_against_an_endless_scan_exits_3(behaviour: Behaviour) -> None:
    with fake_server(behaviour) as server:
        result = CliRunner().invoke(cli, ["sessions", "--url", server.url])
        commands = list(server.commands)
    assert result.exit_code == 3, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "StoreError" in lines[0] and "never ends" in lines[0], lines
    assert _scans(commands) == SCANS[behaviour]


def test_a_walk_past_its_free_pages_goes_on_when_the_keyspace_needs_them(
    redis_url: str, redis_namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a real server, one key a page (COUNT 1): the walk outlasts its free pages, reads
    DBSIZE, and lists every session."""
    monkeypatch.setattr(redis_scan, "COUNT", 1)
    monkeypatch.setattr(redis_scan, "FREE_PAGES", 3)
    asked: list[int] = []

    def counted(client: Any, node: Any) -> int:
        asked.append(redis_scan.dbsize(client, node))
        return asked[-1]

    monkeypatch.setattr(redis_store, "dbsize", counted)
    store = open_store(redis_url, namespace=redis_namespace)
    ids = [f"s{i}" for i in range(30)]
    try:
        for session in ids:
            store.append(session, [new("hi", id=f"{session}-m")])
        assert sorted(store.list_sessions()) == sorted(ids)
    finally:
        store.close()
    assert asked, "the walk never went past its free pages"
