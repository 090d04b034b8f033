"""Leases (the gateway's Idempotency-Key in flight) on every backend, sync and async:
one holder at a time, renewed by its holder, released only by it, free once expired."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from ctxguard.errors import ConfigError
from ctxguard.stores.keys import KeySpace


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
