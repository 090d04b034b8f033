"""A message id names one message: the same id with the same message again is a retry
(nothing stored twice), with another message a MessageIdReusedError, nothing of the
call written. On every backend, sync and async, through every store write that appends
(append, append_with_audit, a fetch's flags, a commit) and through the Guard."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

import pytest

from ctxguard import (
    AsyncGuard,
    Guard,
    InvalidMessageError,
    Message,
    MessageIdReusedError,
    StoreError,
)
from ctxguard._record_time import comparable_record
from ctxguard.stores.base import NewMessage, RecordWrite, WriteOptions
from ctxguard.stores.redis_protocol import general_source

if TYPE_CHECKING:
    from tests.conftest import StoreFacade

OPTIONS = WriteOptions(counter="c1")
PLUS_TWO = timezone(timedelta(hours=2))


def new(message: Message, tokens: int = 3) -> NewMessage:
    return NewMessage(message, tokens)


def said(msg_id: str, content: str = "hello", **fields: Any) -> Message:
    return Message(role=fields.pop("role", "user"), content=content, id=msg_id, **fields)


async def state(store: StoreFacade, session_id: str) -> tuple[Any, ...]:
    """Every key of the session as stored (RawSession: meta with its times, records,
    counts, ids, pins, summary; fakeredis has no sha1hex for it: what reads see there)
    and its audit trail."""
    try:
        raw = await store.inspect(session_id)
    except StoreError as exc:
        assert "sha1hex" in str(exc)
        info = await store.info(session_id)
        stored = [(m.message.to_record(), m.tokens) for m in await store.read(session_id)]
        window = await store.fetch_window(session_id, 10_000, OPTIONS)
        raw = (info, stored, window.token, [m.seq for m in window.pinned])
    return raw, await store.read_audit(session_id)


# the ways a message can differ from the stored one under the same id
OTHERS = {
    "content": said("m1", "goodbye"),
    "role": Message(role="assistant", content="hello", id="m1"),
    "name": said("m1", name="bob"),
    "extra": said("m1", extra={"refusal": None}),
    "tool_call_id": Message(role="tool", content="hello", tool_call_id="c", id="m1"),
}


@pytest.mark.parametrize("other", list(OTHERS))
async def test_append_of_a_stored_id_with_another_message_is_refused(
    store: StoreFacade, other: str
) -> None:
    await store.append("s", [new(said("m0", "first")), new(said("m1"))], OPTIONS)
    before = await state(store, "s")
    batch = [new(said("fresh")), new(OTHERS[other])]  # a new message first: not stored either
    with pytest.raises(MessageIdReusedError) as caught:
        await store.append("s", batch, OPTIONS)
    assert caught.value.message_id == "m1" and "'m1'" in str(caught.value)
    assert "\n" not in str(caught.value) and "new id" in str(caught.value)
    assert isinstance(caught.value, InvalidMessageError)
    write = RecordWrite(audit={"kind": "usage", "n": 1}, retention=10)
    with pytest.raises(MessageIdReusedError):
        await store.append_with_audit("s", batch, OPTIONS, write)
    assert await state(store, "s") == before


async def test_the_same_message_again_is_a_duplicate_whatever_its_time(store: StoreFacade) -> None:
    first = [new(said("m0", "first")), new(said("m1"))]
    await store.append("s", first, OPTIONS)
    named = said("m2", name="bob", metadata={"k": [1, 2]})
    await store.append("s", [new(named)], OPTIONS)
    later = datetime.now(UTC) + timedelta(seconds=5)
    retries = [
        said("m1"),  # another time, the same (positional) form
        said("m1", created_at=datetime(2020, 1, 1, tzinfo=PLUS_TWO)),  # the ISO form
        said("m2", name="bob", metadata={"k": [1, 2]}, created_at=later),
        said("m2", name="bob", metadata={"k": [1, 2]}, created_at=datetime(2021, 5, 5)),
        # metadata is ctxguard's annotation, never sent to a model: not the message
        said("m1", metadata={"loaded": '"}{[', "n": {"deep": [1]}}),
        said("m2", name="bob"),
        said("m2", name="bob", metadata={"other": 1}, created_at=datetime(2021, 5, 5)),
    ]
    records = [m.message.to_record() for m in await store.read("s")]
    for retry in retries:
        result = await store.append("s", [new(retry, tokens=7)], OPTIONS)
        assert result.stored == () and result.duplicates == (retry.id,)
        window = await store.fetch_window("s", 10_000, OPTIONS, [new(retry)])
        assert window.appended is not None and window.appended.stored == ()
    assert [m.message.to_record() for m in await store.read("s")] == records


async def test_a_fetch_and_a_commit_refuse_it_writing_nothing(store: StoreFacade) -> None:
    await store.append("s", [new(said("m0", "first")), new(said("m1"))], OPTIONS)
    before = await state(store, "s")
    batch = [new(said("fresh")), new(said("m1", "goodbye"))]
    with pytest.raises(MessageIdReusedError):
        await store.fetch_window("s", 10_000, OPTIONS, batch, 2)
    token = (await store.fetch_window("s", 10_000, OPTIONS)).token
    write = RecordWrite(counter="c1", audit={"turn": 0, "kind": "request"}, retention=10)
    for expected in (token, "stale"):  # the planned-on state, and another
        with pytest.raises(MessageIdReusedError):
            await store.commit_if_unchanged("s", expected, 10_000, OPTIONS, batch, 2, write)
        with pytest.raises(MessageIdReusedError):  # the id first: the commit's probe
            await store.commit_if_unchanged("s", expected, 10_000, OPTIONS, batch[::-1], 2, write)
    assert await state(store, "s") == before


async def test_a_bulk_append_finds_the_reused_id_among_many(store: StoreFacade) -> None:
    await store.append("s", [new(said(f"m{i}", f"c{i}")) for i in range(3)], OPTIONS)
    before = await state(store, "s")
    batch = [new(said(f"n{i}", f"d{i}")) for i in range(1500)]
    batch[1200] = new(said("m2", "changed"))  # past the script's first 1000 lookups
    with pytest.raises(MessageIdReusedError) as caught:
        await store.append("s", batch, OPTIONS)
    assert caught.value.message_id == "m2"
    assert await state(store, "s") == before


def guard_of(store: StoreFacade) -> Any:
    raw = store.raw
    if hasattr(raw, "aclose") or type(raw).__name__.startswith("Async"):
        return AsyncGuard(raw, limit=4000, counter="approx")
    return Guard(raw, limit=4000, counter="approx")


async def call(value: Any) -> Any:
    return (await value) if hasattr(value, "__await__") else value


async def test_the_guard_refuses_a_reused_id_in_prepare_complete_and_append(
    store: StoreFacade,
) -> None:
    guard = guard_of(store)
    await call(guard.prepare("s", [said("u1", "question")], max_tokens=64))
    await call(guard.complete("s", Message(role="assistant", content="answer", id="a1")))
    records = [m.message.to_record() for m in await store.read("s")]
    audit = await store.read_audit("s")
    # a retry of the same messages at another time: nothing stored twice
    again = await call(guard.prepare("s", [said("u1", "question")], max_tokens=64))
    assert [m.id for m in again.messages][-1] == "a1"
    assert [m.message.to_record() for m in await store.read("s")] == records
    audit = await store.read_audit("s")
    for attempt in (
        lambda: guard.prepare("s", [said("u2", "new"), said("u1", "edited")], max_tokens=64),
        lambda: guard.append("s", [said("u2", "new"), said("a1", "edited")]),
        lambda: guard.complete("s", Message(role="assistant", content="other", id="a1")),
    ):
        with pytest.raises(MessageIdReusedError):
            await call(attempt())
    assert [m.message.to_record() for m in await store.read("s")] == records
    added = (await store.read_audit("s"))[len(audit) :]
    # what every refused prepare writes (docs/turn.md): one `refused` record, no content
    assert [r["kind"] for r in added] == ["refused"]
    assert "edited" not in str(added)
    await call(guard.aclose() if hasattr(guard, "aclose") else guard.close())


Q = 'q"\\'  # an id JSON escapes
RECORDS = [
    (said("x").to_record(), "x"),
    (said(Q, 'a "quoted" , 1]').to_record(), Q),
    (said("01ARZ3NDEKTSV4RRFFQ69G5FAV").to_record(), "01ARZ3NDEKTSV4RRFFQ69G5FAV"),
    (said("x", created_at=datetime(2020, 1, 1, tzinfo=PLUS_TWO)).to_record(), "x"),
    (said("x", created_at=datetime(2020, 1, 1)).to_record(), "x"),
    (said("x", name="n", metadata={"created_at": "z"}).to_record(), "x"),
    (said("x", metadata={"a": '}"{\\', "b": [{"c": "]"}]}, extra={"e": 1}).to_record(), "x"),
    (said(Q, metadata={"a": 1}, created_at=datetime(2020, 1, 1)).to_record(), Q),
    ('{"role":"user","content":"x","id":"x","metadata":{"a":"\\"}', "x"),
    (Message(role="tool", content="r", tool_call_id="c", id="x").to_record(), "x"),
    ('["u","hi","x",]', "x"),
    ('["z","hi","x",1]', "x"),
    ('["u","x",1]', "x"),
    ("not json", "x"),
]


def test_a_comparable_record_keeps_all_but_the_time_and_the_metadata() -> None:
    base = said(Q, "hi", name="n", extra={"e": [1]})
    alike = [
        said(Q, "hi", name="n", extra={"e": [1]}, created_at=datetime(2020, 1, 1)),
        said(Q, "hi", name="n", extra={"e": [1]}, metadata={"m": '"}'}),
    ]
    other = [said(Q, "hi!", name="n", extra={"e": [1]}), said(Q, "hi", name="n", extra={})]
    key = comparable_record(base.to_record(), Q)
    assert all(comparable_record(m.to_record(), Q) == key for m in alike)
    assert all(comparable_record(m.to_record(), Q) != key for m in other)
    plain = said(Q, "hi")
    assert comparable_record(plain.to_record(), Q) == comparable_record(
        said(Q, "hi", metadata={"x": 1}, created_at=datetime(2020, 1, 1)).to_record(), Q
    )


@pytest.mark.redis
def test_the_script_and_the_client_take_the_time_out_alike(redis_url: str) -> None:
    from tests.conftest import raw_client

    source = general_source("append")
    helper = source[source.index("local function comparable") : source.index("-- The position")]
    client = raw_client(redis_url)
    try:
        for record, msg_id in RECORDS:
            lua = helper + "\nreturn comparable(ARGV[1], ARGV[2])"
            got = client.eval(lua, 0, record, msg_id)
            assert got.decode() == comparable_record(record, msg_id), record
    finally:
        client.close()
