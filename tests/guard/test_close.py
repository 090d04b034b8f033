"""close() releases what the guard opened, and nothing it was given.

A guard built from a URL owns its store and closes its connections; a store passed in
belongs to the caller (shared by several guards, or reused after the guard), so the
guard's close leaves it working. Both for Guard and AsyncGuard on the real Redis.
"""

from __future__ import annotations

from typing import Any

import pytest

from ctxguard import AsyncGuard, Guard
from ctxguard.stores import open_async_store, open_store

pytestmark = pytest.mark.redis

HI = [{"role": "user", "content": "hi"}]


def connected(store: Any) -> int:
    """Connections of the store's pool that still hold a socket."""
    pool = store.client.connection_pool
    conns = list(getattr(pool, "_available_connections", [])) + list(
        getattr(pool, "_in_use_connections", [])
    )
    return sum(1 for c in conns if getattr(c, "_sock", None) is not None or _async_open(c))


def _async_open(conn: Any) -> bool:
    return getattr(conn, "_writer", None) is not None


def test_a_store_passed_in_survives_the_guards_close(redis_url: str, namespace: str) -> None:
    store = open_store(redis_url, namespace=namespace)
    guard = Guard(store, counter="approx", limit=400, max_tokens=50)
    guard.prepare("s", HI)
    guard.close()
    assert connected(store) >= 1
    assert [m.message.text for m in store.read("s")] == ["hi"]  # still the caller's, still working
    second = Guard(store, counter="approx", limit=400, max_tokens=50)  # shareable
    second.prepare("s", [{"role": "user", "content": "again"}])
    second.close()
    store.close()
    assert connected(store) == 0


def test_a_store_the_guard_opened_is_closed(redis_url: str, namespace: str) -> None:
    guard = Guard(redis_url, namespace=namespace, counter="approx", limit=400, max_tokens=50)
    guard.prepare("s", HI)
    assert connected(guard.store) >= 1
    guard.close()
    assert connected(guard.store) == 0


async def test_async_store_passed_in_survives_and_opened_one_is_closed(
    redis_url: str, namespace: str
) -> None:
    store = open_async_store(redis_url, namespace=namespace)
    guard = AsyncGuard(store, counter="approx", limit=400, max_tokens=50)
    await guard.prepare("s", HI)
    await guard.aclose()
    assert connected(store) >= 1
    assert [m.message.text for m in await store.read("s")] == ["hi"]
    await store.close()

    owned = AsyncGuard(redis_url, namespace=namespace, counter="approx", limit=400, max_tokens=50)
    await owned.prepare("t", HI)
    assert connected(owned.store) >= 1
    await owned.aclose()
    assert connected(owned.store) == 0


# audit_mode="with_reply": a request's record is held until its complete
HOLDING: dict[str, Any] = {
    "counter": "approx",
    "limit": 400,
    "max_tokens": 50,
    "audit_mode": "with_reply",
}


def _damage_the_trail(url: str, namespace: str) -> None:
    from ctxguard.stores.keys import SUFFIXES, KeySpace
    from tests.conftest import raw_client

    keys = dict(zip(SUFFIXES, KeySpace(namespace, "default").session_keys("s"), strict=True))
    raw = raw_client(url)
    try:
        raw.delete(keys["audit"])
        raw.set(keys["audit"], "not a list")  # the held record cannot be written
    finally:
        raw.close()


def test_close_releases_the_connections_when_the_held_records_cannot_be_written(
    redis_url: str, namespace: str
) -> None:
    """audit_mode="with_reply" holds a request's record until complete; close writes
    what is still held. When that write fails, close raises it (the records are lost)
    and has still released the connections (the pool went with the error before)."""
    from ctxguard.errors import CorruptRecordError

    guard = Guard(redis_url, namespace=namespace, **HOLDING)
    guard.prepare("s", HI)  # its record is held: no complete comes
    _damage_the_trail(redis_url, namespace)
    with pytest.raises(CorruptRecordError):
        guard.close()
    assert connected(guard.store) == 0


async def test_aclose_releases_the_connections_when_the_held_records_cannot_be_written(
    redis_url: str, namespace: str
) -> None:
    from ctxguard.errors import CorruptRecordError

    guard = AsyncGuard(redis_url, namespace=namespace, **HOLDING)
    await guard.prepare("s", HI)
    _damage_the_trail(redis_url, namespace)
    with pytest.raises(CorruptRecordError):
        await guard.aclose()
    assert connected(guard.store) == 0
