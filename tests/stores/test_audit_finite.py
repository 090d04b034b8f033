"""An audit record holding a NaN or an infinite number is refused, on every backend.

JSON has no such number: a stored one made a session that ``ctxguard show --json``
and ``export`` could not write. Every door that writes an audit record refuses it
with one line naming the field, and writes nothing (neither the record nor the
messages or counts that came with it). Memory, fakeredis, Redis and Redis Cluster,
sync and async.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest

from ctxguard.errors import InvalidInputError
from ctxguard.messages import Message
from ctxguard.stores import NewMessage, WriteOptions
from ctxguard.stores.base import RecordWrite

if TYPE_CHECKING:
    from tests.conftest import StoreFacade

COUNTED = WriteOptions(counter="c")
BIG = 10_000
NAN, INF = float("nan"), float("inf")

BAD_RECORDS = [
    pytest.param({"kind": "note", "x": [1, {"y": NAN}]}, "x[1].y", id="nested-nan"),
    pytest.param({"turn": 0, "kind": "request", "n": INF}, "n", id="request-inf"),
    pytest.param(
        {"kind": "usage", "usage": {"prompt_tokens": -INF}}, "usage.prompt_tokens", id="usage"
    ),
    pytest.param({"kind": "note", "t": (1.0, NAN)}, "t[1]", id="tuple"),
]


def new(content: str, role: str = "user") -> NewMessage:
    return NewMessage(Message(role=role, content=content), tokens=3)


async def snapshot(store: StoreFacade) -> tuple[Any, ...]:
    info = await store.info("s")
    return (
        await store.read_audit("s"),
        [m.message.id for m in await store.read("s")],
        None if info is None else (info.message_count, info.audit_count),
    )


def refused(exc: pytest.ExceptionInfo[InvalidInputError], field: str) -> None:
    text = str(exc.value)
    assert "\n" not in text
    assert f"field {field!r}" in text and "not a finite number" in text


@pytest.mark.parametrize(("record", "field"), BAD_RECORDS)
async def test_every_audit_door_refuses_a_non_finite_number_and_writes_nothing(
    store: StoreFacade, record: dict[str, Any], field: str
) -> None:
    await store.append("s", [new("q0")], COUNTED)
    await store.add_audit("s", {"kind": "note", "ok": 1.5}, 0)
    before = await snapshot(store)

    with pytest.raises(InvalidInputError) as exc:
        await store.add_audit("s", record, 0)
    refused(exc, field)
    write = RecordWrite(counter="c", counts={0: 7}, audit=record, retention=0)
    with pytest.raises(InvalidInputError) as exc:
        await store.record("s", write)
    refused(exc, field)
    with pytest.raises(InvalidInputError) as exc:
        await store.append_with_audit("s", [new("reply", "assistant")], COUNTED, write)
    refused(exc, field)
    token = (await store.fetch_window("s", BIG, COUNTED)).token
    assert token is not None
    with pytest.raises(InvalidInputError) as exc:
        await store.commit_if_unchanged("s", token, BIG, COUNTED, [new("q1")], 0, write)
    refused(exc, field)

    assert await snapshot(store) == before
    assert [m.tokens for m in await store.read("s")] == [3]  # the counts were not written
    json.dumps(await store.read_audit("s"), allow_nan=False)  # the session still exports


async def test_the_words_nan_and_infinity_in_text_are_kept(store: StoreFacade) -> None:
    await store.append("s", [new("q0")], COUNTED)
    record = {"kind": "note", "NaN": "Infinity and NaN", "n": [1e308, -0.0]}
    await store.add_audit("s", record, 0)
    (stored,) = await store.read_audit("s")
    assert {k: v for k, v in stored.items() if k != "rid"} == record


def nested(depth: int, dicts: bool) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = {"k": value} if dicts else [value]
    return value


@pytest.mark.parametrize("dicts", [True, False], ids=["dicts", "lists"])
async def test_an_audit_record_nested_past_what_json_can_encode_is_refused_typed(
    store: StoreFacade, dicts: bool
) -> None:
    """Found by the larger-budget fuzz run: a record nested 2,000 deep raised a bare
    RecursionError out of the encoder (pydantic-core's depth limit, then json's)."""
    await store.append("s", [new("q0")], COUNTED)
    before = await snapshot(store)
    record = {"kind": "note", "k": nested(2_000, dicts)}
    write = RecordWrite(counter="c", counts={0: 7}, audit=record, retention=0)
    token = (await store.fetch_window("s", BIG, COUNTED)).token
    assert token is not None
    doors = [
        lambda: store.add_audit("s", record, 0),
        lambda: store.record("s", write),
        lambda: store.append_with_audit("s", [new("reply", "assistant")], COUNTED, write),
        lambda: store.commit_if_unchanged("s", token, BIG, COUNTED, [new("q1")], 0, write),
    ]
    for door in doors:
        with pytest.raises(InvalidInputError) as exc:
            await door()
        text = str(exc.value)
        assert "\n" not in text and "nested" in text, text
    assert await snapshot(store) == before
    assert [m.tokens for m in await store.read("s")] == [3]
