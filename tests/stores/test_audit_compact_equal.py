"""The write path's one-pass proof stores exactly the bytes the byte-checked path stored.

``audit_compact.compact_json`` proves, for a record of plain JSON values, that its
compacted form reads back (no decode, expand and encode per record); anything else takes
the byte check. The reference is the implementation merged in round 5, frozen in
``tests/stores/audit_compact_reference.py``: for every record both store the same bytes
(or both refuse it alike), so old and new writers interoperate.
"""

from __future__ import annotations

import enum
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ctxguard.ids import new_message_id
from ctxguard.stores import audit_compact
from ctxguard.stores.audit_compact import compact_json
from tests.stores import audit_compact_reference as reference
from tests.stores.test_audit_compact import records, value, window_record


class Seq(enum.IntEnum):
    FORTY_THREE = 43


class Text(str):
    pass


def same_bytes(record: dict[str, Any]) -> None:
    try:
        want = reference.compact_json(record)
    except Exception as exc:  # whatever the reference raises, the new path must too
        try:
            compact_json(record)
        except type(exc):
            return
        raise AssertionError(f"the reference raised {exc!r}, the new path did not") from None
    assert compact_json(record) == want


def skipped(decision: dict[str, Any], change: Any) -> dict[str, Any]:
    if "skipped" not in decision:
        return decision
    return {**decision, "skipped": [change(seq) for seq in decision["skipped"]]}


def guard_record(h: int, start: int, end: int, skip: bool) -> dict[str, Any]:
    record = window_record(new_message_id(), datetime.now(UTC).isoformat(), h, start, end)
    if not skip:
        record["decisions"] = record["decisions"][1:]
    return record


# one change each, as a record could be: types equal in Python but not in JSON, shapes the
# ranges do not say, key orders, keys of other types, times isoformat() does not write
MUTATIONS: list[tuple[Any, Any]] = [
    ("message_count", lambda r: r["message_count"] * 1.0),
    ("message_count", lambda r: True if r["message_count"] == 1 else r["message_count"]),
    ("message_count", lambda r: Seq.FORTY_THREE),
    ("message_count", lambda r: r["message_count"] + 1),
    ("tokens", lambda r: 247.5),
    ("dropped", lambda r: [tuple(r["dropped"][0])]),
    ("dropped", lambda r: [[r["dropped"][0][0], float(r["dropped"][0][1])]]),
    ("dropped", lambda r: [[True if r["dropped"][0][0] == 1 else 0.0, r["dropped"][0][1]]]),
    ("decisions", lambda r: [dict(reversed(list(d.items()))) for d in r["decisions"]]),
    ("decisions", lambda r: [{**d, "policy": Text(d["policy"])} for d in r["decisions"]]),
    ("decisions", lambda r: [{Text(k): v for k, v in d.items()} for d in r["decisions"]]),
    ("decisions", lambda r: [{**d, "first_seq": Seq.FORTY_THREE} for d in r["decisions"]]),
    ("decisions", lambda r: [skipped(d, lambda s: True if s == 1 else s) for d in r["decisions"]]),
    ("decisions", lambda r: [skipped(d, float) for d in r["decisions"]]),
    (
        "decisions",
        lambda r: [skipped(d, Seq) if d.get("skipped") == [43] else d for d in r["decisions"]],
    ),
    (
        "decisions",
        lambda r: [
            {**d, "dropped_messages": d.get("dropped_messages", 0) * 1.0} for d in r["decisions"]
        ],
    ),
    ("decisions", lambda r: [{"policy": "tool_integrity", "removed": [1]}, *r["decisions"]]),
    ("decisions", lambda r: [{**d, 1: 2} for d in r["decisions"]]),
    ("decisions", lambda r: [{**d, "1": 3, 1: 2} for d in r["decisions"]]),
    ("sent", lambda r: [tuple(p) for p in r["sent"]]),
    ("sent", lambda r: [*r["sent"][:-1], [r["sent"][-1][0], True]]),
    ("sent", lambda r: r["sent"][:-1] or "x"),
    ("at", lambda r: "1969-12-31T23:59:59.999999+00:00"),
    ("at", lambda r: "0001-01-01T00:00:00+00:00"),
    ("at", lambda r: "9999-12-31T23:59:59.999999+00:00"),
    ("at", lambda r: "2026-02-29T10:00:00.000001+00:00"),
    ("at", lambda r: "2028-02-29T10:00:00.000001+00:00"),
    ("at", lambda r: "2026-13-01T10:00:00.000001+00:00"),
    ("at", lambda r: "2026-12-01T24:00:00+00:00"),
    ("at", lambda r: "2026-12-01T23:60:00+00:00"),
    ("at", lambda r: "2026-12-01T23:59:60+00:00"),
    ("at", lambda r: "2026-12-01T23:59:59.000000+00:00"),
    ("at", lambda r: "2026-12-01T23:59:59.5+00:00"),
    ("at", lambda r: "2026-12-01 23:59:59+00:00"),
    ("at", lambda r: "2026-12-01T23:59:59Z"),
    ("at", lambda r: "2026-12-01T23:59:59.123456"),
    ("at", lambda r: "２026-12-01T23:59:59+00:00"),
    ("at", lambda r: Text(r["at"])),
    ("rid", lambda r: "01M8SW9XAP6FMHRW3KJJQSQQX"),
    ("rid", lambda r: "0lM8SW9XAP6FMHRW3KJJQSQQXE"),
    ("rid", lambda r: "01m8sw9xap6fmhrw3kjjqsqqxe"),
    ("rid", lambda r: 7),
    ("detail", lambda r: "\ud800 a lone surrogate"),
    ("detail", lambda r: float("nan")),
    ("detail", lambda r: 10**40),
    ("detail", lambda r: 10**5000),  # past the 4,300 digits JSON decoding reads
    ("detail", lambda r: {"nested": [10**5000]}),
    ("detail", lambda r: {"nested": (1, 2)}),
    ("detail", lambda r: {1: "a", "1": "b"}),
    ("detail", lambda r: datetime(2026, 1, 1, tzinfo=UTC)),
    ("detail", lambda r: Text("x")),
    ("~", lambda r: -1),
    (1, lambda r: 2),
    (None, lambda r: 3),
    ("1", lambda r: r.setdefault(1, "x") and "y"),
    ("a", lambda r: 5),
]


def bases() -> list[dict[str, Any]]:
    """The guard's request record shapes: a window dropping (with a user_start skip or
    not, from 0 or after a summary), nothing dropped, a window with no count before it."""
    out = [
        guard_record(0, 43, 60, True),
        guard_record(5, 43, 60, False),
        guard_record(1, 1, 9, True),
    ]
    out += [guard_record(0, 2, 9, True), guard_record(0, 44, 50, True)]
    out.append({k: v for k, v in guard_record(0, 0, 1, False).items() if k not in WINDOW})
    reordered = guard_record(0, 43, 60, True)
    reordered["message_count"] = reordered.pop("message_count")
    return [*out, reordered]


WINDOW = ("dropped", "decisions")


@pytest.mark.parametrize("index", range(len(MUTATIONS)))
def test_each_near_miss_stores_the_same_bytes(index: int) -> None:
    name, change = MUTATIONS[index]
    for record in bases():
        if name in WINDOW and name not in record:
            continue
        record[name] = change(record)
        same_bytes(record)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    h=st.integers(min_value=0, max_value=3),
    gap=st.integers(min_value=0, max_value=60),
    length=st.integers(min_value=0, max_value=40),
    skip=st.booleans(),
    changes=st.lists(st.sampled_from(range(len(MUTATIONS))), max_size=3),
    reorder=st.booleans(),
)
def test_guard_records_and_their_near_misses_store_the_same_bytes(
    h: int, gap: int, length: int, skip: bool, changes: list[int], reorder: bool
) -> None:
    record = guard_record(h, h + gap, h + gap + length, skip and h + gap > 0)
    for index in changes:
        name, change = MUTATIONS[index]
        record[name] = change(record)
    if reorder:  # message_count after the window: the count is not derived with it
        record["message_count"] = record.pop("message_count")
    same_bytes(record)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(record=records())
def test_every_record_stores_the_same_bytes(record: dict[str, Any]) -> None:
    same_bytes(record)


@settings(max_examples=200, deadline=None)
@given(
    at=st.datetimes(min_value=datetime(1, 1, 1), timezones=st.just(UTC)),
    extra=st.dictionaries(st.text(max_size=4), value, max_size=3),
)
def test_any_time_and_any_extra_field_store_the_same_bytes(
    at: datetime, extra: dict[str, Any]
) -> None:
    record = {**window_record(new_message_id(), at.isoformat()), **extra}
    same_bytes(record)
    same_bytes({"rid": "u-1", "kind": "usage", "at": at.isoformat(), **extra})


def test_the_guard_records_take_the_proof_not_the_byte_check() -> None:
    # the point of the change: the guard's own records never pay the byte check
    now = datetime.now(UTC)
    for record in [
        guard_record(0, 43, 60, True),
        guard_record(5, 43, 60, False),
        {
            k: v
            for k, v in guard_record(0, 0, 60, False).items()
            if k not in ("dropped", "decisions")
        },
        {
            "rid": new_message_id(),
            "kind": "refused",
            "at": now.isoformat(),
            "error": "E",
            "ids": [],
        },
        {"rid": "u-1", "kind": "usage", "at": (now - timedelta(days=400)).isoformat(), "drift": 0},
    ]:
        assert audit_compact._proven(record) is not None, record
        same_bytes(record)


def test_a_record_the_proof_does_not_cover_takes_the_byte_check() -> None:
    record = guard_record(0, 43, 60, True)
    record["message_count"] = 60.0  # == 60 in Python, not in JSON
    assert audit_compact._proven(record) is None
    assert compact_json(record) == reference.compact_json(record)
    assert '"message_count":60.0' in compact_json(record)  # stored whole


@settings(max_examples=300, deadline=None)
@given(
    rid=st.one_of(
        st.builds(new_message_id),
        st.text(alphabet="0123456789ABCDEFGHJKMNPQRSTVWXYZabcILOU_ -+", min_size=24, max_size=27),
    )
)
def test_the_rid_time_is_read_as_before(rid: str) -> None:
    assert audit_compact._rid_micros(rid) == reference._rid_micros(rid)


@settings(max_examples=300, deadline=None)
@given(
    at=st.one_of(
        st.datetimes(timezones=st.just(UTC)).map(lambda d: d.isoformat()),
        st.from_regex(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{6})?\+00:00", fullmatch=True),
        st.text(max_size=34),
    )
)
@example("2026-12-01T23:59:60+00:00")
@example("2026-12-01T24:00:00.000001+00:00")
@example("2026-12-01T23:59:59.000000+00:00")
@example("1969-12-31T23:59:59.999999+00:00")
@example("2026-02-29T00:00:00+00:00")
def test_the_time_is_read_as_before(at: str) -> None:
    assert audit_compact._micros(at) == reference._micros(at)
