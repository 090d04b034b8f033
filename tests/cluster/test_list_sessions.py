"""Listing sessions on a cluster scans every primary, not just one node."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from redis.crc import key_slot

from ctxguard.messages import Message
from ctxguard.stores import NewMessage, WriteOptions, open_async_store, open_store
from ctxguard.stores.keys import KeySpace

from .test_guard_cluster import primaries_by_slot

pytestmark = [pytest.mark.cluster]
N = 60


def _spread(url: str, namespace: str, ids: list[str]) -> Counter[int]:
    ranges = primaries_by_slot(url)
    space = KeySpace(namespace)
    owners = Counter[int]()
    for sid in ids:
        slot = key_slot(space.session_keys(sid)[0].encode())
        owners[next(p for s, e, p in ranges if s <= slot <= e)] += 1
    return owners


async def test_list_sessions_finds_sessions_on_every_primary(
    cluster_url: str, namespace: str, purge_after: Any
) -> None:
    purge_after(cluster_url)
    ids = [f"user-{n}" for n in range(N)] + ["other-1", "other-2"]
    owners = _spread(cluster_url, namespace, ids)
    assert len(owners) == 3 and min(owners.values()) >= 5  # really spread out
    store = open_store(cluster_url, namespace=namespace)
    for sid in ids:
        store.append(sid, [NewMessage(Message(role="user", content="hi"))], WriteOptions())

    assert sorted(store.list_sessions()) == sorted(ids)
    assert sorted(store.list_sessions("user-")) == sorted(ids[:N])

    astore = open_async_store(cluster_url, namespace=namespace)
    assert sorted([s async for s in astore.list_sessions()]) == sorted(ids)
    assert sorted([s async for s in astore.list_sessions("other-")]) == ["other-1", "other-2"]
    await astore.close()
    store.close()
