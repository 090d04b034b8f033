"""The plain-Redis stores send EVALSHA on a pooled connection themselves (speed):
they must still survive a flushed script cache and error replies, sync and async.

SCRIPT FLUSH empties the whole server's script cache: these tests run only on a
server this test run started (``scratch_redis_url``), never on one the user named."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from ctxguard.errors import CorruptRecordError
from ctxguard.messages import Message
from ctxguard.stores import NewMessage, WriteOptions, open_async_store, open_store
from ctxguard.stores.keys import KeySpace
from tests.conftest import raw_client

pytestmark = [pytest.mark.redis, pytest.mark.destructive]
OPTIONS = WriteOptions(counter="c")


def new(text: str) -> NewMessage:
    return NewMessage(Message(role="user", content=text), 2)


def test_sync_store_reloads_flushed_scripts_and_survives_error_replies(
    scratch_redis_url: str, namespace: str, purge_after: Callable[[str], None]
) -> None:
    redis_url = scratch_redis_url
    purge_after(redis_url)
    store = open_store(redis_url, namespace=namespace)
    assert store._direct  # type: ignore[attr-defined]
    client = raw_client(redis_url)
    try:
        store.append("s", [new("a")], OPTIONS)
        client.script_flush()
        assert store.append("s", [new("b")], OPTIONS).message_count == 2
        assert [m.message.text for m in store.fetch_window("s", 100, OPTIONS).recent] == ["a", "b"]

        meta = KeySpace(namespace, "default").session_keys("broken")[0]
        client.set(meta, "not a hash")  # every script on this session now answers CORRUPT
        with pytest.raises(CorruptRecordError, match="not a hash") as caught:
            store.append("broken", [new("x")], OPTIONS)
        assert caught.value.key == meta
        assert store.append("s", [new("c")], OPTIONS).message_count == 3  # still in step
    finally:
        client.close()
        store.close()


async def test_async_store_reloads_flushed_scripts_and_survives_error_replies(
    scratch_redis_url: str, namespace: str, purge_after: Callable[[str], None]
) -> None:
    redis_url = scratch_redis_url
    purge_after(redis_url)
    store = open_async_store(redis_url, namespace=namespace)
    assert store._direct  # type: ignore[attr-defined]
    client = raw_client(redis_url)
    try:
        await store.append("s", [new("a")], OPTIONS)
        client.script_flush()
        assert (await store.append("s", [new("b")], OPTIONS)).message_count == 2
        meta = KeySpace(namespace, "default").session_keys("broken")[0]
        client.set(meta, "not a hash")
        with pytest.raises(CorruptRecordError, match="not a hash") as caught:
            await store.append("broken", [new("x")], OPTIONS)
        assert caught.value.key == meta
        assert (await store.append("s", [new("c")], OPTIONS)).message_count == 3
    finally:
        client.close()
        await store.close()
