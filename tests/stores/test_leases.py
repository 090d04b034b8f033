"""Leases (the gateway's Idempotency-Key in flight) on every backend, sync and async:
one holder at a time, renewed by its holder, released only by it, free once expired."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from ctxguard.errors import ConfigError
from ctxguard.messages import Message
from ctxguard.stores import NewMessage, WriteOptions
from ctxguard.stores.keys import KeySpace, encode_session_id
from tests import store_diff


async def test_one_holder_at_a_time(store: Any) -> None:
    s = store
    assert await s.acquire_lease("s1", "key-1", "a", 5) is True
    assert await s.acquire_lease("s1", "key-1", "b", 5) is False
    assert await s.acquire_lease("s1", "key-1", "a", 5) is True  # renewed
    assert await s.acquire_lease("s1", "key-2", "b", 5) is True  # another name
    assert await s.acquire_lease("s2", "key-1", "b", 5) is True  # another session
    assert await s.release_lease("s1", "key-1", "b") is False  # not b's
    assert await s.release_lease("s1", "key-1", "a") is True
    assert await s.release_lease("s1", "key-1", "a") is False
    assert await s.acquire_lease("s1", "key-1", "b", 5) is True


async def test_an_expired_lease_is_free(store: Any) -> None:
    s = store
    assert await s.acquire_lease("s1", "k", "dead", 0.2) is True
    assert await s.acquire_lease("s1", "k", "b", 5) is False
    await asyncio.sleep(0.35)
    assert await s.acquire_lease("s1", "k", "b", 5) is True
    assert await s.release_lease("s1", "k", "dead") is False


async def test_bad_lease_arguments_are_typed_errors(store: Any) -> None:
    s = store
    with pytest.raises(ConfigError):
        await s.acquire_lease("s1", "k", "", 5)
    with pytest.raises(ConfigError):
        await s.acquire_lease("s1", "k", "a", 0)


def test_the_lease_key_shares_the_session_slot() -> None:
    space = KeySpace("ns", "t")
    key = space.lease_key("a:b", "req/1")
    assert key == "ns:t:{a%3Ab}:lease:req%2F1"
    assert key.split("}")[0] == space.session_keys("a:b")[0].split("}")[0]
    assert space.session_id_from_key(key) is None  # not one of the session's own keys


def _of(snap: store_diff.Snapshot, session: str) -> store_diff.Snapshot:
    """The snapshot's keys of ``session`` (memory: ``<id>:...``; Redis: ``{<enc id>}``)."""
    tag = f"{{{encode_session_id(session)}}}"
    return {k: v for k, v in snap.items() if k.startswith(f"{session}:") or tag in k}


async def test_delete_removes_the_sessions_leases_and_nothing_else(
    store: Any, store_factory: Any
) -> None:
    """``delete`` took the session's keys but left its leases (an Idempotency-Key in
    flight) until their TTL: now nothing of the session is left, other sessions' keys and
    leases untouched, and a lease of the deleted session is free at once."""
    s = store
    new = [NewMessage(Message(role="user", content="q"), 3)]
    for sid in ("s1", "s2"):
        await s.append(sid, new, WriteOptions("c"))
        assert await s.acquire_lease(sid, "key-1", "a", 60) is True
        assert await s.acquire_lease(sid, "body:x/y", "a", 60) is True
    assert await s.acquire_lease("s1", "key-2", "a", 60) is True
    assert await s.release_lease("s1", "key-2", "a") is True  # a name released before
    snapshot = store_factory.backend != "fakeredis"  # (no raw client for fakeredis here)
    url = store_factory.url
    before = store_diff.take(s.raw, url) if snapshot else {}
    if snapshot:
        assert len([k for k in _of(before, "s1") if "lease:" in k]) == 2
    assert await s.delete("s1") is True
    if snapshot:
        after = store_diff.take(s.raw, url)
        assert _of(after, "s1") == {}  # nothing of the session left
        assert after == {k: v for k, v in before.items() if k not in _of(before, "s1")}
    assert await s.acquire_lease("s1", "key-1", "b", 5) is True  # free at once
    assert await s.acquire_lease("s2", "key-1", "b", 5) is False  # s2's still held
    assert await s.delete("s1") is False  # no session (its new lease goes too)
    assert await s.acquire_lease("s1", "key-1", "c", 5) is True
