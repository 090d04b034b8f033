"""What a turn's scripts make Redis do, and the clock they write with.

Counted with INFO commandstats deltas on a server of this module's own (nothing else
sends it commands): a cached turn is two script calls that run no ``TIME`` and no
``HINCRBY`` (the caller sends its clock; the request record's number goes in the one
``HSET`` of meta), read meta once each, ``TYPE`` only the keys they write but do not
read first, and leave alone (no ``TYPE``) the keys they neither read nor write. The
stamp of the state token and ``updated`` come from the caller's clock, and a session
whose epoch and stamp the server's clock wrote (every session written before) keeps
working.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from ctxguard import Guard
from ctxguard.messages import Message
from ctxguard.stores import NewMessage, WriteOptions, open_store
from ctxguard.stores import redis_protocol as protocol_module
from ctxguard.stores.base import RecordWrite
from ctxguard.stores.keys import SUFFIXES, KeySpace
from tests.conftest import raw_client

pytestmark = pytest.mark.redis


def said(text: str, role: str = "user") -> Message:
    return Message(role=role, content=text)


def calls(client: Any) -> Counter[str]:
    stats = client.info("commandstats")
    return Counter({k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()})


@pytest.fixture
def url(own_redis_url: str, purge_after: Callable[[str], None]) -> str:
    purge_after(own_redis_url)
    return own_redis_url


@pytest.fixture
def client(url: str) -> Iterator[Any]:
    c = raw_client(url)
    yield c
    c.close()


def keys_of(namespace: str, session_id: str = "s") -> dict[str, str]:
    names = KeySpace(namespace, "default").session_keys(session_id)
    return dict(zip(SUFFIXES, names, strict=True))


def delta(client: Any, before: Counter[str]) -> Counter[str]:
    moved = calls(client) - before
    moved.pop("info", None)
    return moved


def test_a_cached_turn_runs_no_time_and_types_only_keys_it_does_not_read(
    url: str, namespace: str, client: Any
) -> None:
    guard = Guard(open_store(url, namespace=namespace), counter="approx", limit=4000)
    try:
        guard.append("s", [said("be brief", "system")])
        for text in ("hello", "again"):  # the second prepare plans on the cached window
            guard.prepare("s", [said(text)])
            guard.complete("s", said("reply to " + text, "assistant"))
        before = calls(client)
        guard.prepare("s", [said("third")])
        guard.complete("s", said("ok", "assistant"))
        moved = delta(client, before)
    finally:
        guard.close()
    assert moved["evalsha"] == 2, moved  # a hit and the reply: two script calls
    assert moved["time"] == 0 and moved["hincrby"] == 0, moved
    assert moved["hmget"] == 2, moved  # meta read once per script
    # none: window checks ids by the new id's HSETNX, the trail by the request record's
    # RPUSH and rids by its rid's HSETNX (each taken back on failure); append (no record)
    # neither reads nor writes sum, audit and rids, and checks ids by its HSETNX
    assert moved["type"] == 0, moved
    # the hit's one new id and its record's rid are not looked up: each one's HSETNX
    # says whether it is new (a rid written already takes the id's HSETNX back)
    assert moved["hexists"] == 0 and moved["hget"] == 0 and moved["hsetnx"] == 2 + 1, moved
    # no pinned message appended: pins is not read; nor is rids' length
    assert moved["lrange"] == 0 and moved["hlen"] == 0, moved
    assert sum(moved.values()) - moved["evalsha"] == 16, moved  # was 26, then 18, 17
    turns = [r["turn"] for r in guard.store.read_audit("s") if r.get("kind") == "request"]
    assert turns == [1, 2, 3]


def test_updated_and_the_stamp_come_from_the_callers_clock(
    url: str, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_store(url, namespace=namespace)
    ns = 1_700_000_000_123_456_789
    monkeypatch.setattr(protocol_module.time, "time_ns", lambda: ns)
    try:
        first = store.append("s", [NewMessage(said("a"), tokens=3)])
        assert first.token_after == "1700000000123456:1:1700000000123456"
        info = store.info("s")
        assert info is not None
        when = datetime(2023, 11, 14, 22, 13, 20, 123000, tzinfo=UTC)
        assert info.created_at == when and info.updated_at == when
        monkeypatch.setattr(protocol_module.time, "time_ns", lambda: ns + 5_000_000)
        second = store.append("s", [NewMessage(said("b"), tokens=3)])
        # the epoch is the creation's, the stamp this append's
        assert second.token_after == "1700000000123456:2:1700000000128456"
        info = store.info("s")
        assert info is not None and info.updated_at == datetime(
            2023, 11, 14, 22, 13, 20, 128000, tzinfo=UTC
        )
        assert info.created_at == when
    finally:
        store.close()


def test_a_session_stamped_by_the_servers_clock_keeps_working(
    url: str, namespace: str, client: Any
) -> None:
    writer = Guard(open_store(url, namespace=namespace), counter="approx", limit=4000)
    writer.append("s", [said("be brief", "system")])
    writer.prepare("s", [said("hello")])
    writer.complete("s", said("hi", "assistant"))
    writer.close()
    keys = keys_of(namespace)
    # as the scripts wrote them from TIME before: seconds '.' microseconds
    client.hset(keys["meta"], mapping={"epoch": "1764614400.5", "stamp": "1764614401.123456"})
    token = "1764614400.5:" + client.hget(keys["meta"], "ver").decode() + ":1764614401.123456"
    guard = Guard(open_store(url, namespace=namespace), counter="approx", limit=4000)
    try:
        assert guard.store.fetch_window("s", 4000).token == token
        first = guard.prepare("s", [said("next")])  # a fetch, then a commit on that token
        guard.complete("s", said("fine", "assistant"))
        before = calls(client)
        second = guard.prepare("s", [said("and then")])  # the cached window: one call
        assert delta(client, before)["evalsha"] == 1
        guard.complete("s", said("done", "assistant"))
        after = guard.store.fetch_window("s", 4000).token
    finally:
        guard.close()
    assert after is not None and after.startswith("1764614400.5:") and after != token
    assert [m.content for m in first.messages][-1] == "next"
    assert [m.content for m in second.messages][-1] == "and then"
    history = [m.message.content for m in guard.store.read("s")]
    assert history == ["be brief", "hello", "hi", "next", "fine", "and then", "done"]
    turns = [r["turn"] for r in guard.store.read_audit("s") if r.get("kind") == "request"]
    assert turns == [1, 2, 3]


@pytest.mark.parametrize("write", ["add_audit", "append_with_audit"])
def test_an_audit_index_made_by_a_call_without_a_ttl_gets_the_sessions(
    url: str, namespace: str, client: Any, write: str
) -> None:
    """A call with a TTL gives every key it (touch); one without gives the trail and
    the index it creates the session's remaining TTL, so neither outlives the session
    (known from the RPUSH's reply: no HLEN)."""
    store = open_store(url, namespace=namespace)
    keys = keys_of(namespace)
    try:
        store.append("s", [NewMessage(said("a"), tokens=3)], WriteOptions(ttl_seconds=100))
        assert client.exists(keys["rids"]) == 0 and client.ttl(keys["meta"]) > 0
        if write == "add_audit":
            store.add_audit("s", {"kind": "note"}, retention=0, ttl=0)
        else:
            store.append_with_audit(
                "s",
                [NewMessage(said("b"), tokens=3)],
                WriteOptions(),
                RecordWrite(audit={"kind": "note"}),
            )
        assert 0 < client.ttl(keys["rids"]) <= 100
        assert 0 < client.ttl(keys["audit"]) <= 100
        before = calls(client)
        store.add_audit("s", {"kind": "again"}, retention=0, ttl=0)  # the trail exists
        assert delta(client, before)["hlen"] == delta(client, before)["pttl"] == 0
        store.add_audit("s", {"kind": "later"}, retention=0, ttl=50)
        assert 0 < client.ttl(keys["rids"]) <= 50  # the call's own TTL, on every key
        assert 0 < client.ttl(keys["meta"]) <= 50
    finally:
        store.close()
