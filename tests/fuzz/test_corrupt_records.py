"""Corrupted records planted in a real Redis: typed errors, other sessions unaffected.

Garbage bytes, truncated JSON, JSON of the wrong shape, and keys of the wrong
Redis type (WRONGTYPE) in each of a session's keys. Every read path (store and
Guard) raises CorruptRecordError or StoreError, never a bare redis, pydantic
or ValueError; a neighbour session reads back unchanged.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxguard.errors import StoreError
from ctxguard.guard import Guard
from ctxguard.messages import Message
from ctxguard.stores import NewMessage, WriteOptions, open_store
from ctxguard.stores.keys import KeySpace

pytestmark = [pytest.mark.redis]
OPTS = WriteOptions(counter="c")
GOOD = Message(role="user", content="fine", id="good-1")
META, MSGS, TOKS, IDS, PINS, SUM, AUDIT = range(7)


@pytest.fixture
def setup(redis_url: str, namespace: str, purge_after: Any) -> Iterator[tuple[Any, redis.Redis]]:
    purge_after(redis_url)
    store = open_store(redis_url, namespace=namespace)
    client = redis.Redis.from_url(redis_url)
    yield store, client
    store.close()
    client.close()


def keys(store: Any, sid: str) -> list[str]:
    return KeySpace(store.namespace, store.tenant).session_keys(sid)


def seed(store: Any, sid: str) -> None:
    store.append(sid, [NewMessage(GOOD, 2)], OPTS)
    store.add_audit(sid, {"kind": "note"}, retention=5)


def overwrite(client: redis.Redis, key: str, kind: str, value: Any) -> None:
    client.delete(key)
    if kind == "list":
        client.rpush(key, *value)
    elif kind == "hash":
        client.hset(key, mapping=value)
    elif kind == "set":
        client.sadd(key, *value)
    else:
        client.set(key, value)


PLANTS: dict[str, tuple[int, str, Any]] = {
    "msgs-garbage": (MSGS, "list", [b"\xff\xfe\x00garbage"]),
    "msgs-truncated": (MSGS, "list", [GOOD.to_record()[:25].encode()]),
    "msgs-number": (MSGS, "list", [b"42"]),
    "msgs-json-list": (MSGS, "list", [b'["role", "user"]']),
    "msgs-wrong-role": (MSGS, "list", [b'{"role": "robot", "content": "x", "id": "a"}']),
    "msgs-is-hash": (MSGS, "hash", {"a": "b"}),
    "msgs-is-string": (MSGS, "string", b"not a list"),
    "meta-is-list": (META, "list", [b"x"]),
    "meta-bad-count": (META, "hash", {"count": "many", "created": "yesterday"}),
    "toks-garbage": (TOKS, "list", [b"lots"]),
    "toks-is-set": (TOKS, "set", [b"1"]),
    "ids-is-string": (IDS, "string", b"x"),
    "pins-garbage": (PINS, "list", [b"first"]),
    "sum-garbage": (SUM, "string", b'{"version": "x"'),
    "sum-is-list": (SUM, "list", [b"x"]),
    "audit-garbage": (AUDIT, "list", [b"\x00\x01"]),
    "audit-not-object": (AUDIT, "list", [b"[1, 2]"]),
}


def read_paths(store: Any, sid: str) -> list[Callable[[], Any]]:
    guard = Guard(store, counter="approx", limit=4096, max_tokens=64)
    return [
        lambda: store.read(sid),
        lambda: store.read_last(sid, 3),
        lambda: store.info(sid),
        lambda: store.fetch_window(sid, 1000, OPTS),
        lambda: store.get_summary(sid),
        lambda: store.read_audit(sid),
        lambda: store.append(sid, [NewMessage(Message(role="user", content="more"), 1)], OPTS),
        lambda: guard.prepare(sid, [{"role": "user", "content": "hello"}]),
        lambda: list(store.list_sessions()),
    ]


def assert_typed_everywhere(store: Any, sid: str) -> None:
    for path in read_paths(store, sid):
        with contextlib.suppress(StoreError):  # CorruptRecordError is one
            path()


@pytest.mark.parametrize("plant", sorted(PLANTS))
def test_planted_corruption_gives_typed_errors(setup: Any, plant: str) -> None:
    store, client = setup
    seed(store, "victim")
    seed(store, "neighbour")
    before = [client.dump(k) for k in keys(store, "neighbour")]
    index, kind, value = PLANTS[plant]
    overwrite(client, keys(store, "victim")[index], kind, value)

    assert_typed_everywhere(store, "victim")

    assert [client.dump(k) for k in keys(store, "neighbour")] == before
    assert [m.message for m in store.read("neighbour")] == [GOOD]


def test_each_plant_is_reported_somewhere(setup: Any) -> None:
    """Corruption of the message list is not silently skipped: read names it."""
    store, client = setup
    for plant in ("msgs-garbage", "msgs-truncated", "msgs-number", "msgs-is-hash"):
        seed(store, plant)
        index, kind, value = PLANTS[plant]
        overwrite(client, keys(store, plant)[index], kind, value)
        with pytest.raises(StoreError):
            store.read(plant)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(raw=st.binary(max_size=300), where=st.sampled_from([MSGS, TOKS, PINS, SUM, AUDIT, META]))
def test_random_bytes_anywhere_give_typed_errors(setup: Any, raw: bytes, where: int) -> None:
    store, client = setup
    seed(store, "neighbour")
    seed(store, "victim")
    before = [client.dump(k) for k in keys(store, "neighbour")]
    key = keys(store, "victim")[where]
    if where == META:
        client.hset(key, "count", raw or b"?")
    elif where == SUM:
        client.set(key, raw)
    else:
        client.rpush(key, raw)

    assert_typed_everywhere(store, "victim")

    assert [client.dump(k) for k in keys(store, "neighbour")] == before
    store.delete("victim")
