"""The meta hash a session's first append makes keeps its field order and values: the
append's one HSET writes its arguments out (no field table), a new session's fields
first, the numbers as Redis stored them before."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from ctxguard import Guard
from ctxguard.messages import Message
from ctxguard.stores import NewMessage, open_store
from ctxguard.stores.keys import KeySpace
from tests.conftest import raw_client

pytestmark = pytest.mark.redis

# a guard's first prepare: the counter is set first (a switch from none), then the append
WITH_COUNTER = ["counter", "tokens", "stamp", "ver", "updated", "created", "sumver", "epoch"]
WITH_COUNTER += ["count", "turns", "ctx"]
# a plain append, no counter: the append's HSET alone
PLAIN = ["updated", "created", "sumver", "epoch", "count", "tokens", "ver", "stamp"]


def test_a_new_session_s_meta_fields_are_stored_in_their_order(
    redis_url: str, namespace: str, purge_after: Callable[[str], None]
) -> None:
    purge_after(redis_url)
    store = open_store(redis_url, namespace=namespace)
    guard = Guard(store, counter="approx", limit=4000)
    client = raw_client(redis_url)
    space = KeySpace(namespace, "default")
    meta = space.session_keys("s")[0]
    try:
        guard.prepare("s", [Message(role="user", content="hello")])  # the first append
        assert [f.decode() for f in client.hkeys(meta)] == WITH_COUNTER
        assert client.hget(meta, "created") == client.hget(meta, "updated")
        assert client.hget(meta, "sumver") == b"0"
        assert client.hget(meta, "count") == b"1" and client.hget(meta, "turns") == b"1"
        guard.complete("s", Message(role="assistant", content="hi"))
        guard.prepare("s", [Message(role="user", content="again")])  # a warm turn
        assert [f.decode() for f in client.hkeys(meta)] == WITH_COUNTER
        assert client.hget(meta, "count") == b"3" and client.hget(meta, "turns") == b"2"

        plain = space.session_keys("p")[0]
        store.append("p", [NewMessage(Message(role="user", content="a"), tokens=None)])
        assert [f.decode() for f in client.hkeys(plain)] == PLAIN
        assert client.hmget(plain, "count", "tokens", "ver") == [b"1", b"0", b"1"]
        store.append("p", [NewMessage(Message(role="user", content="b"), tokens=None)])
        assert [f.decode() for f in client.hkeys(plain)] == PLAIN
        assert client.hmget(plain, "count", "tokens", "ver") == [b"2", b"0", b"2"]
    finally:
        client.close()
        guard.close()
