"""The sliding TTL refreshed with slack (``touch`` in ``_lib.lua``).

A call with a TTL reads meta's PTTL; when it is within ``slack`` of the full TTL
(min(ttl / 20, 60 s); none under 1 s) nothing is refreshed, else every key gets the
full TTL. Keys the call made (created, or made anew: a DEL then a write, a SET) get
the session's TTL either way: every path that makes a key is taken here with the
slack path (a session just refreshed), and after it every existing key of the
session has a TTL (none outlives the session: a leak forever). Counted with INFO
commandstats on a server of this module's own (`own_redis_url`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from ctxguard import Guard
from ctxguard.messages import Message
from ctxguard.stores import NewMessage, WriteOptions, open_store
from ctxguard.stores.base import RecordWrite, Summary, WindowHit
from tests.stores.test_audit_context import request
from tests.stores.test_script_commands import calls, delta, keys_of

pytestmark = pytest.mark.redis

TTL = 1000  # slack: 50 s
WITH_TTL = WriteOptions(counter="c", ttl_seconds=TTL)


def msg(text: str, role: str = "user") -> NewMessage:
    return NewMessage(Message(role=role, content=text), tokens=3)


@pytest.fixture
def url(own_redis_url: str, purge_after: Callable[[str], None]) -> str:
    purge_after(own_redis_url)
    return own_redis_url


@pytest.fixture
def store(url: str, namespace: str) -> Iterator[Any]:
    s = open_store(url, namespace=namespace)
    yield s
    s.close()


@pytest.fixture
def client(store: Any) -> Any:
    return store.client


def refreshed(client: Any, keys: dict[str, str]) -> None:
    """Every existing key with the full TTL, as a refresh just gave it."""
    for key in keys.values():
        client.expire(key, TTL)


def commit(store: Any, new: list[NewMessage], options: WriteOptions, **write: Any) -> None:
    token = store.fetch_window("s", 10_000, options).token
    assert token is not None
    hit = store.commit_if_unchanged(
        "s", token, 10_000, options, new, 0, RecordWrite(ttl=TTL, **write)
    )
    assert isinstance(hit, WindowHit)


def retract_all(store: Any) -> None:
    store.retract("s", count=len(store.read("s")), ttl=TTL)


# (what the session holds before, the call that makes keys, the keys it makes)
PATHS: dict[str, tuple[Callable[[Any], Any], Callable[[Any], Any], set[str]]] = {
    "append: the first pin": (
        lambda s: s.append("s", [msg("q0")], WITH_TTL),
        lambda s: s.append("s", [msg("be brief", "system")], WITH_TTL),
        {"pins"},
    ),
    "commit hit: the first pin": (
        lambda s: s.append("s", [msg("q0")], WITH_TTL),
        lambda s: commit(s, [msg("be brief", "system")], WITH_TTL),
        {"pins"},
    ),
    "add_audit: the first record (audit, rids, ctx)": (
        lambda s: s.append("s", [msg("q0")], WITH_TTL),
        lambda s: s.add_audit("s", request("r-0"), 0, TTL),
        {"audit", "rids", "ctx"},
    ),
    "append_with_audit: the first record": (
        lambda s: s.append("s", [msg("q0")], WITH_TTL),
        lambda s: s.append_with_audit(
            "s", [msg("a0", "assistant")], WITH_TTL, RecordWrite(audit=request("r-0"), ttl=TTL)
        ),
        {"audit", "rids", "ctx"},
    ),
    "append: an audit record, no message": (
        lambda s: s.append("s", [msg("q0")], WITH_TTL),
        lambda s: s.append_with_audit(
            "s", [], WITH_TTL, RecordWrite(audit={"kind": "note"}, ttl=TTL)
        ),
        {"audit", "rids"},
    ),
    "commit hit: the first record": (
        lambda s: s.append("s", [msg("q0")], WITH_TTL),
        lambda s: commit(s, [msg("q1")], WITH_TTL, audit=request("r-0")),
        {"audit", "rids", "ctx"},
    ),
    "add_audit: a new context in ctx": (
        lambda s: (
            s.append("s", [msg("q0")], WITH_TTL),
            s.add_audit("s", request("r-0"), 0, TTL),
            s.client.delete(s.protocol.keys("s")[8]),  # ctx: gone (trimmed contexts, say)
            s.client.hdel(s.protocol.keys("s")[0], "ctx"),
        ),
        lambda s: s.add_audit("s", request("r-1", limit=8192), 0, TTL),
        {"ctx"},
    ),
    "commit_summary: the summary (a SET)": (
        lambda s: s.append("s", [msg("q0"), msg("a0", "assistant"), msg("q1")], WITH_TTL),
        lambda s: s.commit_summary("s", Summary(version=1, text="t", covers_to=2), 0, TTL),
        {"sum"},
    ),
    "commit_summary: a summary replaced": (
        lambda s: (
            s.append("s", [msg("q0"), msg("a0", "assistant"), msg("q1")], WITH_TTL),
            s.commit_summary("s", Summary(version=1, text="t", covers_to=1), 0, TTL),
        ),
        lambda s: s.commit_summary("s", Summary(version=2, text="u", covers_to=2), 1, TTL),
        {"sum"},
    ),
    "restore: the summary": (
        lambda s: s.append("s", [msg("q0"), msg("a0", "assistant")], WITH_TTL),
        lambda s: s.restore("s", 3, Summary(version=1, text="t", covers_to=1), TTL),
        {"sum"},
    ),
    "set_counts: a counter switch makes toks anew": (
        lambda s: s.append("s", [msg("q0"), msg("q1")], WITH_TTL),
        lambda s: s.set_token_counts("s", "d", {0: 5}, TTL),
        {"toks"},
    ),
    "append: a counter switch makes toks anew": (
        lambda s: s.append("s", [msg("q0")], WITH_TTL),
        lambda s: s.append("s", [msg("q1")], WriteOptions(counter="d", ttl_seconds=TTL)),
        {"toks"},
    ),
    "commit hit: a counter switch and recounts": (
        lambda s: s.append("s", [msg("q0")], WITH_TTL),
        lambda s: commit(s, [msg("q1")], WriteOptions(counter="d", ttl_seconds=TTL), counts={0: 4}),
        {"toks"},
    ),
    "append after every message was retracted (msgs, toks, ids)": (
        lambda s: (s.append("s", [msg("q0")], WITH_TTL), retract_all(s)),
        lambda s: s.append("s", [msg("q1")], WITH_TTL),
        {"msgs", "toks", "ids"},
    ),
    "commit hit after every message was retracted": (
        lambda s: (s.append("s", [msg("q0")], WITH_TTL), retract_all(s)),
        lambda s: commit(s, [msg("be brief", "system"), msg("q1")], WITH_TTL),
        {"msgs", "toks", "ids", "pins"},
    ),
    "retract: pins made anew, the first record": (
        lambda s: s.append("s", [msg("be brief", "system"), msg("q0"), msg("a0")], WITH_TTL),
        lambda s: s.retract("s", count=1, ttl=TTL),
        {"pins", "audit"},
    ),
}


# the keys made anew (they exist before the call: a DEL then a write, a SET)
ANEW = {
    "commit_summary: a summary replaced": {"sum"},
    "set_counts: a counter switch makes toks anew": {"toks"},
    "append: a counter switch makes toks anew": {"toks"},
    "commit hit: a counter switch and recounts": {"toks"},
    "retract: pins made anew, the first record": {"pins"},
}


@pytest.mark.parametrize("path", list(PATHS))
def test_every_key_a_call_makes_gets_the_sessions_ttl_on_the_slack_path(
    store: Any, client: Any, namespace: str, path: str
) -> None:
    before_call, call, made = PATHS[path]
    keys = keys_of(namespace)
    before_call(store)
    existed = {name for name, key in keys.items() if client.exists(key)}
    fresh = made - ANEW.get(path, set())
    assert not fresh & existed, existed  # the call makes them (or makes them anew)
    refreshed(client, keys)  # the session was just refreshed: the slack path
    before = calls(client)
    call(store)
    moved = delta(client, before)
    assert moved["expire"] == 0, moved  # nothing refreshed
    assert moved["pttl"] >= 1, moved
    now = {name for name, key in keys.items() if client.exists(key)}
    assert made <= now, now
    meta = client.pttl(keys["meta"])
    assert meta > (TTL - 50) * 1000
    for name in now:
        ttl = client.pttl(keys[name])
        # the session's TTL: no key outlives it (nor is it cut short)
        assert ttl > 0 and abs(ttl - meta) < 2000, (name, ttl, meta)


def test_an_index_made_next_to_a_trail_without_rids_refreshes_the_session(
    store: Any, client: Any, namespace: str
) -> None:
    """A trail holding only records without a rid (a retract's) and no rids: the
    next record with a rid makes rids with the trail's length past 1 (no sign of it
    in a reply); rids' TTL is read instead of meta's (-1: a full refresh)."""
    keys = keys_of(namespace)
    store.append("s", [msg("q0"), msg("q1")], WITH_TTL)
    store.retract("s", count=1, ttl=TTL)
    assert client.exists(keys["audit"]) == 1 and client.exists(keys["rids"]) == 0
    refreshed(client, keys)
    store.add_audit("s", {"kind": "note"}, 0, TTL)
    assert client.exists(keys["rids"]) == 1
    for name, key in keys.items():
        if client.exists(key):
            assert 0 < client.pttl(key) <= TTL * 1000, name
    # and once it is refreshed, the next record takes the slack path
    before = calls(client)
    store.add_audit("s", {"kind": "again"}, 0, TTL)
    assert delta(client, before)["expire"] == 0


def test_a_session_refreshed_past_the_slack_is_refreshed_whole(
    store: Any, client: Any, namespace: str
) -> None:
    keys = keys_of(namespace)
    store.append("s", [msg("q0")], WITH_TTL)
    for key in keys.values():
        client.expire(key, TTL - 51)  # 51 s since the last refresh: past the slack
    before = calls(client)
    store.append("s", [msg("q1")], WITH_TTL)
    assert delta(client, before)["expire"] == len(keys)
    assert client.ttl(keys["meta"]) > TTL - 5 and client.ttl(keys["msgs"]) > TTL - 5
    for key in keys.values():
        client.expire(key, TTL - 49)  # 49 s: within it, nothing refreshed
    before = calls(client)
    store.append("s", [msg("q2")], WITH_TTL)
    assert delta(client, before)["expire"] == 0
    assert client.ttl(keys["meta"]) <= TTL - 49


@pytest.mark.parametrize(("ttl", "slack"), [(19, 0), (20, 1), (100, 5), (5000, 60)])
def test_the_slack_is_a_twentieth_of_the_ttl_at_most_a_minute_none_under_a_second(
    store: Any, client: Any, namespace: str, ttl: int, slack: int
) -> None:
    keys = keys_of(namespace)
    options = WriteOptions(counter="c", ttl_seconds=ttl)
    store.append("s", [msg("q0")], options)
    for key in keys.values():  # refreshed just past the slack ago (a tiny TTL: just now)
        client.pexpire(key, ttl * 1000 - slack * 1000 - 100)
    before = calls(client)
    store.append("s", [msg("q1")], options)
    assert delta(client, before)["expire"] == len(keys)
    if slack:
        for key in keys.values():  # just within it
            client.pexpire(key, ttl * 1000 - slack * 1000 + 500)
        before = calls(client)
        store.append("s", [msg("q2")], options)
        assert delta(client, before)["expire"] == 0


def test_a_call_with_a_shorter_ttl_sets_its_own(store: Any, client: Any, namespace: str) -> None:
    keys = keys_of(namespace)
    store.append("s", [msg("q0")], WITH_TTL)
    store.append("s", [msg("q1")], WriteOptions(counter="c", ttl_seconds=100))
    assert 0 < client.ttl(keys["meta"]) <= 100 and 0 < client.ttl(keys["msgs"]) <= 100


def test_a_new_session_is_refreshed_whole(store: Any, client: Any, namespace: str) -> None:
    keys = keys_of(namespace)
    before = calls(client)
    store.append("s", [msg("be brief", "system"), msg("q0")], WITH_TTL)
    assert delta(client, before)["expire"] == len(keys)
    for name, key in keys.items():
        if client.exists(key):
            assert client.ttl(key) > TTL - 5, name


def test_a_warm_turn_with_a_ttl_refreshes_nothing_within_the_slack(
    url: str, namespace: str, client: Any
) -> None:
    """A cached turn with ``ttl_seconds``: two script calls, one PTTL each, no EXPIRE
    (was 9 each): 18 commands of work and TTL where it was 36."""
    guard = Guard(
        open_store(url, namespace=namespace), counter="approx", limit=4000, ttl_seconds=TTL
    )
    try:
        guard.append("s", [Message(role="system", content="be brief")])
        for text in ("hello", "again"):
            guard.prepare("s", [Message(role="user", content=text)])
            guard.complete("s", Message(role="assistant", content="reply to " + text))
        before = calls(client)
        guard.prepare("s", [Message(role="user", content="third")])
        guard.complete("s", Message(role="assistant", content="ok"))
        moved = delta(client, before)
    finally:
        guard.close()
    assert moved["evalsha"] == 2, moved
    assert moved["expire"] == 0 and moved["pttl"] == 2 and moved["pexpire"] == 0, moved
    assert sum(moved.values()) - moved["evalsha"] == 16 + 2, moved  # was 18 + 18, 18 + 2
    keys = keys_of(namespace)
    for name, key in keys.items():
        if client.exists(key):
            assert client.ttl(key) > TTL - 60, name


def test_scripts_without_a_ttl_give_the_keys_they_make_the_sessions(
    store: Any, client: Any, namespace: str
) -> None:
    """A call without a TTL on a session with one: what it makes (a pin, a summary)
    gets the session's remaining TTL; on a session without one, no key gets a TTL."""
    keys = keys_of(namespace)
    store.append("s", [msg("q0"), msg("q1")], WITH_TTL)
    store.append("s", [msg("be brief", "system")], WriteOptions(counter="c"))
    store.commit_summary("s", Summary(version=1, text="t", covers_to=1), 0)
    for name in ("pins", "sum"):
        assert 0 < client.ttl(keys[name]) <= TTL, name
    store.delete("s")
    store.append("s", [msg("q0"), msg("be brief", "system")], WriteOptions(counter="c"))
    store.commit_summary("s", Summary(version=1, text="t", covers_to=1), 0)
    for name, key in keys.items():
        assert client.ttl(key) in (-1, -2), name
