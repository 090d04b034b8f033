"""Audit records are stored smaller on Redis and read back exactly as written.

``stores.audit_compact``: short key names, ``at`` as microseconds (from the rid's
time when the rid is a ULID), ``message_count`` / ``dropped`` / ``decisions`` left
out when the ``sent`` ranges rebuild them; checked at write time, one decoder on
read. What a reader sees is the record's JSON decoded, key for key and in order.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxguard.ids import new_message_id
from ctxguard.messages import Message
from ctxguard.stores import NewMessage, WriteOptions
from ctxguard.stores.audit_compact import ALIASES, MARKER, NAMES, compact, expand
from ctxguard.stores.audit_context import CONTEXT_FIELDS, audit_arg
from ctxguard.stores.base import encode_audit
from ctxguard.stores.keys import SUFFIXES
from ctxguard.stores.records import RID_PATTERN

if TYPE_CHECKING:
    from tests.conftest import StoreFacade, StoreFactory


def read_back(record: dict[str, Any]) -> dict[str, Any]:
    """What a Redis reader sees of ``record``: stored compacted, decoded, expanded."""
    stored: dict[str, Any] = json.loads(encode_audit(compact(record)))
    return expand(stored)


def as_json(record: dict[str, Any]) -> dict[str, Any]:
    """What a reader of the record written whole sees."""
    value: dict[str, Any] = json.loads(encode_audit(record))
    return value


def assert_reads_back(record: dict[str, Any]) -> None:
    got, want = read_back(record), as_json(record)
    assert got == want
    assert encode_audit(got) == encode_audit(want)  # key order, nested too; true vs 1


def window_record(rid: str, at: str, h: int = 0, start: int = 43, end: int = 60) -> dict[str, Any]:
    """A request record past its context, as the guard writes it once the window drops."""
    kept = 1 if h == 0 else 0
    return {
        "turn": 0,
        "rid": rid,
        "ctx": "6ba151a7f09491e8",
        "at": at,
        "sent": [[0, 1], [start, end]] if h == 0 else [[start, end]],
        "sent_digest": "4b31825329b2ed29",
        "tokens": 247,
        "message_count": end,
        "dropped": [[h, start]],
        "decisions": [
            {"policy": "user_start", "skipped": [start - 1]},
            {"policy": "window", "first_seq": start, "dropped_messages": start - h - kept},
        ],
    }


NOW = datetime.now(UTC).isoformat()


# -- what is stored -------------------------------------------------------------------


def test_a_guard_record_is_stored_without_what_its_ranges_say() -> None:
    rid = new_message_id()  # as the guard makes them: the rid, then the time
    record = window_record(rid, datetime.now(UTC).isoformat())
    stored = json.loads(encode_audit(compact(record)))
    assert list(stored)[:3] == ["turn", "rid", "ctx"]  # where the Lua scripts look
    assert stored[MARKER] == [0, 1]
    assert not {"message_count", "dropped", "decisions", "n", "x", "y", "at"} & set(stored)
    assert 0 <= stored["a"] < 10_000  # microseconds after the rid's millisecond
    assert len(encode_audit(stored)) < len(encode_audit(record)) - 130
    assert_reads_back(record)
    # after a summary (the window from 5) with the system message pinned, seq 0 sent
    later = window_record(rid, datetime.now(UTC).isoformat(), h=5, start=43)
    later["sent"] = [[0, 1], [43, 60]]
    later["decisions"][1]["dropped_messages"] = 43 - 5
    assert json.loads(encode_audit(compact(later)))[MARKER] == [5, 1]
    assert_reads_back(later)


def test_values_equal_in_python_but_not_in_json_are_kept() -> None:
    # 42.0 == 42 and True == 1 in Python; a reader of the JSON sees them apart
    record = window_record(new_message_id(), NOW, start=43, end=60)
    record["decisions"][1]["dropped_messages"] = 42.0
    assert_reads_back(record)
    first = window_record(new_message_id(), NOW)
    first.update(sent=[[0, 1]], message_count=True)
    del first["dropped"], first["decisions"]
    assert_reads_back(first)


def test_what_the_ranges_do_not_say_is_kept() -> None:
    record = window_record(new_message_id(), NOW)
    record["decisions"][1]["dropped_messages"] = 41  # not what the ranges say
    record["message_count"] = 61  # nor this
    stored = json.loads(encode_audit(compact(record)))
    assert stored["x"] == [[0, 43]] and stored["n"] == 61 and stored[MARKER] == -1
    assert_reads_back(record)


def test_a_time_that_does_not_round_trip_and_a_rid_that_is_no_ulid() -> None:
    for at in ["2026-12-01T22:41:15Z", "2026-12-01T22:41:15.606231+02:00", "yesterday", 7]:
        assert_reads_back(window_record(new_message_id(), at))  # type: ignore[arg-type]
    stored = json.loads(encode_audit(compact(window_record("r-1", NOW))))
    assert stored["A"] > 10**15  # from the epoch
    assert_reads_back(window_record("r-1", NOW))


def test_keys_that_look_like_aliases_or_the_marker_are_kept_apart() -> None:
    record: dict[str, Any] = {"rid": "u", "kind": "usage", "a": 1, "~": 2, "~s": 3, "n": "x"}
    stored = json.loads(encode_audit(compact(record)))
    assert stored["~a"] == 1 and stored["~~"] == 2 and stored["~~s"] == 3
    assert_reads_back(record)
    assert_reads_back({"~": -1, "dropped": [[0, 4]]})  # marker-like values of its own
    assert_reads_back({"rid": "u", 1: 2, None: 3, "~": 4})  # keys JSON makes text


def test_records_without_the_marker_read_as_stored() -> None:
    # as earlier releases and the scripts (retract, repair) write them
    old = window_record("01M8SW9XAP6FMHRW3KJJQSQQXE", NOW)
    assert expand(json.loads(encode_audit(old))) == old
    retract = {"kind": "retract", "at": "1764628875", "ids": ["a"], "count": 1}
    assert expand(dict(retract)) == retract


def test_a_damaged_marker_is_shown_not_guessed() -> None:
    stored = json.loads(encode_audit(compact(window_record(new_message_id(), NOW))))
    for bad in ["x", [0], [0, 1, 2], -3, True, None]:
        assert expand({**stored, MARKER: bad})[MARKER] == bad
    assert MARKER in expand({**stored, "s": "damaged"})
    # no reader allocates without bound or fails untyped on a damaged record
    assert expand({**stored, MARKER: [0, 10**12], "s": [[0, 10**13]]})[MARKER] == [0, 10**12]
    assert expand({**stored, "a": 10**30})["a"] == 10**30
    assert expand({**stored, "a": 5, "rid": "x"})["a"] == 5  # beside a rid that is no ULID


def test_no_context_field_or_reserved_key_is_an_alias() -> None:
    # a record written whole by with_context (cap reached) holds the context inline
    assert not (CONTEXT_FIELDS | {"turn", "rid", "ctx"}) & (set(NAMES) | set(ALIASES.values()))
    assert all(not a.startswith(MARKER) for a in NAMES)


# -- hypothesis: every kind of record reads back ----------------------------------------

scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**53), max_value=2**53),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
)
value = st.recursive(
    scalar,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=8,
)
names = st.sampled_from([*ALIASES, *NAMES, "~", "~~", "~a", "turn", "ctx", "kind", "é", "x"])
key = st.one_of(names, st.text(min_size=1, max_size=6))
times = st.one_of(
    st.datetimes(
        min_value=datetime(1970, 1, 2), max_value=datetime(2200, 1, 1), timezones=st.just(UTC)
    ).map(lambda d: d.isoformat()),
    st.datetimes(timezones=st.just(timezone(timedelta(hours=5)))).map(lambda d: d.isoformat()),
    st.datetimes().map(lambda d: d.isoformat()),
    st.text(max_size=30),
    st.integers(),
)
rids = st.one_of(
    st.builds(new_message_id),
    st.from_regex(RID_PATTERN, fullmatch=True),
    st.text(alphabet="0123456789ABCDEFGHJKMNPQRSTVWXYZ", min_size=26, max_size=26),
)
kinds = st.sampled_from(
    ["request", "refused", "usage", "summary", "summary_failed", "retract", "repair", "é"]
)


@st.composite
def records(draw: st.DrawFn) -> dict[str, Any]:
    record: dict[str, Any] = {}
    if draw(st.booleans()):
        record["turn"] = draw(st.integers(min_value=0, max_value=10**6))
    record["rid"] = draw(rids)
    record["kind"] = draw(kinds)
    record["at"] = draw(times)
    if draw(st.booleans()):  # a request's window, maybe as its ranges say
        h = draw(st.integers(min_value=0, max_value=5))
        start = h + draw(st.integers(min_value=0, max_value=50))
        end = start + draw(st.integers(min_value=0, max_value=50))
        base = window_record(record["rid"], record["at"], h, start, end)
        if draw(st.booleans()):
            base["decisions"] = base["decisions"][1:]
        for name in draw(st.lists(st.sampled_from(list(base)[4:]), max_size=3)):
            base[name] = draw(value)  # what the ranges do not say
        for name in ("sent", "sent_digest", "tokens", "message_count", "dropped", "decisions"):
            if draw(st.integers(min_value=0, max_value=5)) > 0:
                record[name] = base[name]
    for k, v in draw(st.lists(st.tuples(key, value), max_size=5)):
        record.setdefault(k, v)
    return record


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(record=records())
def test_every_record_reads_back_exactly(record: dict[str, Any]) -> None:
    assert_reads_back(record)


@settings(max_examples=200, deadline=None)
@given(
    at=st.datetimes(min_value=datetime(1970, 1, 2), timezones=st.just(UTC)),
    text=st.text(),
)
def test_guard_records_with_any_time_and_text_read_back(at: datetime, text: str) -> None:
    record = window_record(new_message_id(), at.isoformat())
    record["detail"] = text  # unicode, lone surrogates (escaped JSON) included
    assert_reads_back(record)


# -- through the store ------------------------------------------------------------------


async def test_records_read_back_through_every_store(store: StoreFacade) -> None:
    await store.append("s", [NewMessage(Message(role="user", content="q"), 3)], WriteOptions("c"))
    written = [
        window_record(new_message_id(), NOW),
        window_record("plain-rid", NOW, h=2),
        {"rid": "u-1", "kind": "usage", "at": NOW, "usage": {"prompt_tokens": 3}},
        {"kind": "refused", "at": NOW, "error": "BudgetError", "ids": ["q"], "a": 1},
    ]
    for record in written:
        await store.add_audit("s", record, 0)
    audit = await store.read_audit("s")
    assert [r["kind"] for r in audit[2:]] == ["usage", "refused"]
    for got, record in zip(audit, written, strict=True):
        want = {k: v for k, v in as_json(record).items() if k != "turn"}
        got = {k: v for k, v in got.items() if k != "turn"}
        if "rid" not in record:
            got.pop("rid")
        assert encode_audit(got) == encode_audit(want)


async def test_redis_stores_the_compact_form(store_factory: StoreFactory) -> None:
    if store_factory.backend == "memory":
        pytest.skip("the in-process store keeps each record whole")
    store = store_factory.make()
    await store.append("s", [NewMessage(Message(role="user", content="q"), 3)], WriteOptions("c"))
    record = window_record(new_message_id(), NOW)
    await store.add_audit("s", record, 0)
    key = dict(zip(SUFFIXES, store.raw.protocol.keys("s"), strict=True))["audit"]
    raw = store.raw.client.lrange(key, 0, -1)
    if hasattr(raw, "__await__"):
        raw = await raw
    [stored] = raw
    assert stored.decode() == audit_arg(record).replace('"turn":0', '"turn":1', 1)
    assert b'"~":[0,1]' in stored and b"dropped" not in stored
