"""Audit records are written once per record id (``rid``), on every backend.

A store sent the same record again (a retry after a lost reply) writes
nothing and answers as the first time: the same turn for a request record, a
hit for a commit, "committed" for a summary. Run against memory (the
reference), fakeredis, Redis and Redis Cluster, sync and async.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from ctxguard.errors import InvalidInputError
from ctxguard.messages import Message
from ctxguard.stores import NewMessage, Summary, WriteOptions
from ctxguard.stores.base import RecordWrite, WindowHit, audit_rid, encode_audit, with_rid

if TYPE_CHECKING:
    from tests.conftest import StoreFacade, StoreFactory

COUNTED = WriteOptions(counter="c")
BIG = 10_000


def new(content: str, role: str = "user", **kw: Any) -> NewMessage:
    return NewMessage(Message(role=role, content=content, **kw), tokens=3)


def request(rid: str, n: int = 0) -> dict[str, Any]:
    return {"turn": 0, "rid": rid, "kind": "request", "n": n}


async def test_a_record_sent_twice_is_written_once_with_one_turn(store: StoreFacade) -> None:
    await store.append("s", [new("a")], COUNTED)
    first = await store.add_audit("s", request("r-1"), 0)
    again = await store.add_audit("s", request("r-1", n=99), 0)  # same rid: the same record
    other = await store.add_audit("s", request("r-2"), 0)
    assert (first, again, other) == (1, 1, 2)
    assert await store.add_audit("s", {"rid": "u-1", "kind": "usage"}, 0) == 0
    assert await store.add_audit("s", {"rid": "u-1", "kind": "usage"}, 0) == 0
    audit = await store.read_audit("s")
    assert [(r["turn"], r["rid"], r["n"]) for r in audit[:2]] == [(1, "r-1", 0), (2, "r-2", 0)]
    assert [r["rid"] for r in audit] == ["r-1", "r-2", "u-1"]
    info = await store.info("s")
    assert info is not None and info.audit_count == 3


async def test_record_and_append_with_audit_repeat_nothing(store: StoreFacade) -> None:
    await store.append("s", [new("a")], COUNTED)
    write = RecordWrite(counter="c", counts={0: 5}, audit=request("r-rec"), retention=0)
    assert await store.record("s", write) == 1
    assert await store.record("s", write) == 1
    reply = new("reply", role="assistant")
    usage = RecordWrite(audit={"rid": "u-reply", "kind": "usage"}, retention=0)
    first = await store.append_with_audit("s", [reply], COUNTED, usage)
    again = await store.append_with_audit("s", [reply], COUNTED, usage)
    assert first.stored == (reply.message.id,) and again.duplicates == (reply.message.id,)
    assert [r["rid"] for r in await store.read_audit("s")] == ["r-rec", "u-reply"]
    assert len(await store.read("s")) == 2


async def test_a_repeated_commit_is_a_hit_with_the_same_turn(store: StoreFacade) -> None:
    await store.append("s", [new("q0")], COUNTED)
    token = (await store.fetch_window("s", BIG, COUNTED)).token
    assert token is not None
    batch = [new("a0", role="assistant"), new("q1")]
    write = RecordWrite(audit=request("r-commit"), retention=0)
    hit = await store.commit_if_unchanged("s", token, BIG, COUNTED, batch, 0, write)
    assert isinstance(hit, WindowHit) and hit.turn == 1 and hit.token

    # sent again (its reply was lost): the token has moved on, the record is there
    replay = await store.commit_if_unchanged("s", token, BIG, COUNTED, batch, 0, write)
    assert isinstance(replay, WindowHit)
    assert replay.turn == 1 and not replay.token  # the state after it is not known
    assert [r["rid"] for r in await store.read_audit("s")] == ["r-commit"]
    assert len(await store.read("s")) == 3

    # without messages too
    write2 = RecordWrite(audit=request("r-empty"), retention=0)
    token2 = (await store.fetch_window("s", BIG, COUNTED)).token
    assert token2 is not None
    hit2 = await store.commit_if_unchanged("s", token2, BIG, COUNTED, [], 0, write2)
    assert isinstance(hit2, WindowHit) and hit2.turn == 2
    await store.append("s", [new("q2")], COUNTED)  # someone else moves the session on
    replay2 = await store.commit_if_unchanged("s", token2, BIG, COUNTED, [], 0, write2)
    assert isinstance(replay2, WindowHit) and replay2.turn == 2
    assert [r["turn"] for r in await store.read_audit("s")] == [1, 2]


async def test_a_commit_on_a_moved_session_without_its_record_is_a_fetch(
    store: StoreFacade,
) -> None:
    await store.append("s", [new("q0")], COUNTED)
    token = (await store.fetch_window("s", BIG, COUNTED)).token
    assert token is not None
    await store.append("s", [new("other")], COUNTED)
    write = RecordWrite(audit=request("r-new"), retention=0)
    fetch = await store.commit_if_unchanged("s", token, BIG, COUNTED, [new("q1")], 0, write)
    assert not isinstance(fetch, WindowHit)
    assert await store.read_audit("s") == []


async def test_trimming_forgets_the_ids_of_trimmed_records(store_factory: StoreFactory) -> None:
    store = store_factory.make()
    await store.append("s", [new("a")], COUNTED)
    for n in range(5):
        await store.add_audit("s", {"rid": f"n-{n}", "n": n}, 3)
    await store.add_audit("s", {"rid": "n-4", "n": 4}, 3)  # still held: not again
    assert [r["n"] for r in await store.read_audit("s")] == [2, 3, 4]
    await store.add_audit("s", {"rid": "n-0", "n": 0}, 3)  # trimmed away: written again
    assert [r["n"] for r in await store.read_audit("s")] == [3, 4, 0]
    assert await _held_rids(store_factory, store, "s") == {"n-3", "n-4", "n-0"}
    await store.add_audit("s", {"rid": "n-9", "n": 9}, 1)  # a smaller retention drops several
    assert await _held_rids(store_factory, store, "s") == {"n-9"}


async def _held_rids(factory: StoreFactory, store: StoreFacade, session_id: str) -> set[str]:
    """The record ids the store remembers for a session (its ``rids`` hash)."""
    if factory.backend == "memory":
        inner = getattr(store.raw, "sync", store.raw)
        return set(inner._sessions[session_id].audit_rids)
    key = store.raw.protocol.keys(session_id)[7]
    found = store.raw.client.hkeys(key)
    if hasattr(found, "__await__"):
        found = await found
    return {k.decode() for k in found}


async def test_the_same_summary_committed_again_is_still_committed(store: StoreFacade) -> None:
    await store.append("s", [new("a"), new("b")], COUNTED)
    summary = Summary(version=1, text="t", covers_to=1)
    assert await store.commit_summary("s", summary, 0) is True
    assert await store.commit_summary("s", summary, 0) is True  # a retry: it is the current one
    rival = summary.model_copy(update={"text": "another writer's"})
    assert await store.commit_summary("s", rival, 0) is False
    current = await store.get_summary("s")
    assert current is not None and current.version == 1


async def test_a_retried_append_reports_what_its_lost_attempt_stored(
    store_factory: StoreFactory,
) -> None:
    """The Redis scripts' retry marker (Call.again): flag 2 = stored by this call."""
    if store_factory.backend == "memory":
        pytest.skip("the memory store never retries")
    store = store_factory.make()
    protocol = store.raw.protocol
    mine, theirs = new("mine", id="m-1"), new("theirs", id="m-2")
    await store.append("s", [mine, theirs], COUNTED)
    # the same message made again (another time: other bytes); other content under the
    # id would be refused (MessageIdReusedError, tests/stores/test_id_reuse.py)
    same_id_other_bytes = new("theirs", id="m-2")
    fresh = new("fresh", id="m-3")
    batch = [mine, same_id_other_bytes, fresh]
    call = protocol.append_call("s", batch, COUNTED).again()
    result = protocol.parse_append("s", batch, await store._run(call))
    assert result.stored == ("m-1", "m-3") and result.duplicates == ("m-2",)
    # the same call on a first attempt: ids already there are duplicates, as always
    first = protocol.append_call("s", [mine], COUNTED)
    assert protocol.parse_append("s", [mine], await store._run(first)).all_duplicates


# -- the rid itself -------------------------------------------------------------------


def test_with_rid_places_the_id_where_the_scripts_read_it() -> None:
    made = with_rid({"kind": "note", "n": 1})
    assert next(iter(made)) == "rid" and audit_rid(encode_audit(made)) == made["rid"]
    numbered = with_rid({"turn": 0, "kind": "request", "rid": "r.1:x-Y_z"})
    assert list(numbered)[:2] == ["turn", "rid"]
    assert audit_rid(encode_audit(numbered)) == "r.1:x-Y_z"
    kept = {"turn": 0, "rid": "r", "kind": "request"}
    assert with_rid(kept) is kept  # already in place: not copied
    assert audit_rid(encode_audit({"kind": "x", "rid": "late"})) is None  # not first: unseen
    assert audit_rid('{"turn":7,"rid":"old"}') == "old"


@pytest.mark.parametrize("rid", ["", "a b", 'q"uote', "x" * 65, 5, "é"])
def test_a_bad_rid_is_refused(rid: object) -> None:
    with pytest.raises(InvalidInputError, match="rid"):
        with_rid({"rid": rid, "kind": "note"})
