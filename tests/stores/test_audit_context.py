"""A request record's context is stored once per session and read back in place.

``stores.audit_context``: on Redis the fields that are the same on every request of a
session (kind, session, counter, limit, reserve, margin, policy...) go into the
session's ``ctx`` hash once per distinct value, and each record in ``audit`` names
them by digest; ``read_audit`` puts them back, key for key and in order. Every
backend must read back what was written (memory stores the record whole: the
reference); the Redis tests look at the keys as stored. Run against memory,
fakeredis, Redis and Redis Cluster, sync and async.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest

from ctxguard.errors import CorruptRecordError
from ctxguard.messages import Message
from ctxguard.stores import NewMessage, WriteOptions
from ctxguard.stores.audit_compact import expand
from ctxguard.stores.audit_context import audit_arg, resolve, split
from ctxguard.stores.base import RecordWrite, WindowHit, encode_audit
from ctxguard.stores.integrity import plan_repair
from ctxguard.stores.keys import SUFFIXES

if TYPE_CHECKING:
    from tests.conftest import StoreFacade, StoreFactory

COUNTED = WriteOptions(counter="c")
BIG = 10_000


def new(content: str, role: str = "user") -> NewMessage:
    return NewMessage(Message(role=role, content=content), tokens=3)


def request(rid: str, limit: int = 4096, n: int = 0) -> dict[str, Any]:
    """A request record as the guard lays it out (its context fields together)."""
    return {
        "turn": 0,
        "rid": rid,
        "kind": "request",
        "session": "s",
        "exact": True,
        "additive": True,
        "counter": "c",
        "counter_spec": "tiktoken:cl100k_base",
        "limit": limit,
        "limit_source": "static",
        "reserved_output": 512,
        "safety_margin": 0,
        "overhead": 3,
        "policy": {"start_on_user": True, "window_policy": "sliding", "low_water": 0.5},
        "at": "2026-12-01T18:49:03.348295+00:00",
        "sent": [[0, 1], [n, n + 3]],
        "sent_digest": "4dd01e99464a0a98",
        "tokens": 40 + n,
        "message_count": n + 3,
    }


def numbered(record: dict[str, Any], turn: int) -> dict[str, Any]:
    return {**record, "turn": turn}


async def raw(store: StoreFacade, command: str, *args: Any) -> Any:
    result = getattr(store.raw.client, command)(*args)
    if hasattr(result, "__await__"):
        result = await result
    return result


def redis_only(factory: StoreFactory) -> None:
    if factory.backend == "memory":
        pytest.skip("the in-process store keeps each record whole")


def keys(store: StoreFacade, session_id: str = "s") -> dict[str, str]:
    return dict(zip(SUFFIXES, store.raw.protocol.keys(session_id), strict=True))


# -- every backend: what is read is what was written ----------------------------------


async def test_request_records_read_back_whole_and_in_order(store: StoreFacade) -> None:
    await store.append("s", [new("q0")], COUNTED)
    written = [request("r-0"), request("r-1", n=1)]
    assert await store.add_audit("s", written[0], 0) == 1
    reply = new("a0", role="assistant")
    await store.append_with_audit("s", [reply], COUNTED, RecordWrite(audit=written[1]))
    token = (await store.fetch_window("s", BIG, COUNTED)).token
    assert token is not None
    third = request("r-2", n=2)
    hit = await store.commit_if_unchanged(
        "s", token, BIG, COUNTED, [new("q1")], 0, RecordWrite(audit=third)
    )
    assert isinstance(hit, WindowHit) and hit.turn == 3
    audit = await store.read_audit("s")
    expected = [numbered(r, i + 1) for i, r in enumerate([*written, third])]
    assert audit == expected
    assert [list(r) for r in audit] == [list(r) for r in expected]  # key order too
    # what a reader changes in one record is not seen in another (no shared values)
    audit[0]["policy"]["low_water"] = 0.9
    assert audit[1]["policy"]["low_water"] == 0.5


async def test_a_context_stored_long_ago_resolves_after_the_trail_is_trimmed(
    store: StoreFacade,
) -> None:
    await store.append("s", [new("q0")], COUNTED)
    for n in range(8):  # retention 3: the record that stored the context is long gone
        await store.add_audit("s", request(f"r-{n}", n=n), 3)
    audit = await store.read_audit("s")
    assert audit == [numbered(request(f"r-{n}", n=n), n + 1) for n in (5, 6, 7)]


async def test_a_changed_setting_is_a_new_context_and_each_record_keeps_its_own(
    store: StoreFacade,
) -> None:
    await store.append("s", [new("q0")], COUNTED)
    limits = [4096, 4096, 8192, 8192, 4096]
    for n, limit in enumerate(limits):
        await store.add_audit("s", request(f"r-{n}", limit=limit, n=n), 0)
    assert [r["limit"] for r in await store.read_audit("s")] == limits


async def test_records_that_are_not_split_read_back_as_written(store: StoreFacade) -> None:
    await store.append("s", [new("q0")], COUNTED)
    scattered = request("r-a")
    scattered["limit"] = scattered.pop("limit")  # a context field apart from the others
    own = {**request("r-b"), "ctx": "mine"}  # a field named ctx of its own
    usage = {"rid": "u-1", "kind": "usage", "session": "s", "limit": 1}
    for record in (scattered, own, usage):
        await store.add_audit("s", record, 0)
    audit = await store.read_audit("s")
    assert audit == [numbered(scattered, 1), numbered(own, 2), usage]
    assert list(audit[0]) == list(scattered)


async def test_export_import_round_trips_the_records(store_factory: StoreFactory) -> None:
    source, target = store_factory.make(), store_factory.make(store_factory.namespace + "b")
    await source.append("s", [new("q0")], COUNTED)
    for n in range(3):
        await source.add_audit("s", request(f"r-{n}", limit=4096 + n % 2, n=n), 0)
    exported = await source.read_audit("s")
    await target.append("s", [new("q0")], COUNTED)
    for record in exported:  # as ctxguard import writes them back
        await target.add_audit("s", {**record, "turn": 0}, 0)
    assert await target.read_audit("s") == exported


# -- Redis: the keys as stored ----------------------------------------------------


async def test_the_context_is_stored_once_and_records_name_it(
    store_factory: StoreFactory,
) -> None:
    redis_only(store_factory)
    store = store_factory.make()
    await store.append("s", [new("q0")], COUNTED)
    for n in range(4):
        await store.add_audit("s", request(f"r-{n}", n=n), 0)
    k = keys(store)
    contexts = await raw(store, "hgetall", k["ctx"])
    assert len(contexts) == 1
    [(digest, context)] = contexts.items()
    assert json.loads(context)["limit"] == 4096 and json.loads(context)["kind"] == "request"
    stored = [json.loads(r) for r in await raw(store, "lrange", k["audit"], 0, -1)]
    assert all(r["ctx"] == digest.decode() and "limit" not in r for r in stored)
    assert await raw(store, "hget", k["meta"], "ctx") == digest
    # a new limit: a second context; the first one again: none more
    await store.add_audit("s", request("r-8", limit=8192), 0)
    await store.add_audit("s", request("r-9"), 0)
    assert await raw(store, "hlen", k["ctx"]) == 2


async def test_old_records_written_whole_read_the_same(store_factory: StoreFactory) -> None:
    redis_only(store_factory)
    store = store_factory.make()
    await store.append("s", [new("q0")], COUNTED)
    # as the previous release wrote it: whole, kind and session after the rid, the
    # counter's fields and the overhead after the tokens, the policy last
    fields = numbered(request("r-old"), 1)
    order = ["turn", "rid", "kind", "session", "at", "sent", "sent_digest", "tokens"]
    order += ["exact", "additive", "counter", "counter_spec", "limit", "limit_source"]
    order += ["reserved_output", "safety_margin", "overhead", "message_count", "policy"]
    old = {k: fields[k] for k in order}
    await raw(store, "rpush", keys(store)["audit"], encode_audit(old))
    await store.add_audit("s", request("r-new"), 0)
    audit = await store.read_audit("s")
    assert audit[0] == old and list(audit[0]) == list(old)
    assert audit[1]["limit"] == 4096


async def test_the_ctx_key_is_deleted_expired_and_in_the_sessions_slot(
    store_factory: StoreFactory,
) -> None:
    redis_only(store_factory)
    store = store_factory.make()
    await store.append("s", [new("q0")], WriteOptions(counter="c", ttl_seconds=300))
    await store.add_audit("s", request("r-0"), 0, 300)
    k = keys(store)
    assert 0 < await raw(store, "ttl", k["ctx"]) <= 300
    for name in k.values():  # as if time went by (past the TTL's slack): a write slides it on
        await raw(store, "expire", name, 10)
    await store.add_audit("s", request("r-1"), 0, 300)  # (the same context: not written)
    assert 10 < await raw(store, "ttl", k["ctx"]) <= 300
    assert k["ctx"].split("}")[0] == k["meta"].split("}")[0]  # one hash tag: one slot
    assert await store.delete("s")
    assert await raw(store, "exists", k["ctx"]) == 0
    # the session made again: its first record stores the context again
    await store.append("s", [new("q0")], COUNTED)
    await store.add_audit("s", request("r-2"), 0)
    assert await store.read_audit("s") == [numbered(request("r-2"), 1)]


async def test_contexts_past_the_cap_are_written_inline(store_factory: StoreFactory) -> None:
    redis_only(store_factory)
    store = store_factory.make()
    await store.append("s", [new("q0")], COUNTED)
    records = [request(f"r-{n}", limit=1000 + n) for n in range(66)]
    for record in records:
        await store.add_audit("s", record, 0)
    k = keys(store)
    assert await raw(store, "hlen", k["ctx"]) == 64
    last = json.loads((await raw(store, "lrange", k["audit"], -1, -1))[0])
    assert last["limit"] == 1065 and "ctx" not in last
    assert await store.read_audit("s") == [numbered(r, i + 1) for i, r in enumerate(records)]


async def test_a_digest_taken_by_another_context_is_written_inline(
    store_factory: StoreFactory,
) -> None:
    redis_only(store_factory)
    store = store_factory.make()
    await store.append("s", [new("q0")], COUNTED)
    digest = audit_arg(request("r-0")).split("\n")[1][:16]
    await raw(store, "hset", keys(store)["ctx"], digest, '{"kind":"request","limit":1}')
    await store.add_audit("s", request("r-0"), 0)
    [record] = await store.read_audit("s")
    assert record == numbered(request("r-0"), 1)


async def test_a_ctx_key_of_another_type_writes_whole_reads_as_corrupt_and_is_repaired(
    store_factory: StoreFactory,
) -> None:
    redis_only(store_factory)
    store = store_factory.make()
    await store.append("s", [new("q0")], COUNTED)
    k = keys(store)
    await store.add_audit("s", request("r-0"), 0)  # its context stored
    await raw(store, "delete", k["ctx"])
    await raw(store, "set", k["ctx"], "x")  # damaged behind ctxguard's back
    await store.add_audit("s", request("r-1", limit=8192), 0)  # not refused: written whole
    stored = json.loads((await raw(store, "lrange", k["audit"], 1, 1))[0])
    assert "kind" in stored and "ctx" not in stored  # the context inline
    assert expand(stored) == numbered(request("r-1", limit=8192), 2)  # (audit_compact)
    with pytest.raises(CorruptRecordError, match="ctx"):
        await store.read_audit("s")
    if store_factory.backend == "fakeredis":
        return  # its Lua has no redis.sha1hex for repair.lua
    # ctxguard repair names the key and deletes it; the next record stores its context
    found = await store.inspect("s")
    plan = plan_repair("s", found, 0, 2)
    assert "ctx: is a string, not a hash" in plan.changes
    assert await store.repair("s", plan, {"rid": "fix", "kind": "repair"})
    assert await raw(store, "hget", k["meta"], "ctx") is None
    await store.add_audit("s", request("r-2"), 0)
    assert await raw(store, "hlen", k["ctx"]) == 1
    audit = await store.read_audit("s")
    # the first record's context went with the damaged key and came back with the
    # record that stored the same context again
    assert [r.get("limit") for r in audit] == [4096, 8192, None, 4096]
    assert audit[0] == numbered(request("r-0"), 1) and audit[3] == numbered(request("r-2"), 3)


# -- the pure part ------------------------------------------------------------------


def test_split_and_resolve_are_inverse_for_the_guards_layout() -> None:
    record = numbered(request("r-1"), 7)
    parts = split(record)
    assert parts is not None
    compact, digest, context = parts
    assert list(compact)[:3] == ["turn", "rid", "ctx"] and compact["ctx"] == digest
    assert resolve([compact], {digest: context}) == [record]
    assert list(resolve([compact], {digest: context})[0]) == list(record)
    assert resolve([compact], {}) == [compact]  # an unknown digest: left as stored
    assert split({"rid": "u", "kind": "usage"}) is None


def test_the_argument_carries_the_context_after_a_newline() -> None:
    arg = audit_arg(request("r-1"))
    head, tail = arg.split("\n")
    assert head.startswith('{"turn":0,"rid":"r-1","ctx":"')
    assert json.loads(tail[16:])["counter_spec"] == "tiktoken:cl100k_base"
    assert "\n" not in audit_arg({"rid": "u", "kind": "usage"})
