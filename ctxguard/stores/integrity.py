"""A session's keys checked against each other, and the plan that repairs them (no I/O).

Every derived key of a session can be rebuilt from its message list: the token
counts (``toks``, one per message, -1 unknown), the id index (``ids``), the
pinned positions (``pins``) and the meta hash's ``count`` and ``tokens``. A key
written by something other than ctxguard (``RPUSH ...:pins x``) breaks the
scripts; :func:`find_problems` names each such key and what is wrong with it,
and :func:`plan_repair` computes what to write back. The stores read a
:class:`RawSession` and apply a :class:`RepairPlan` atomically, only if the
session still has the fingerprint it had when read (``repair.lua``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ctxguard.errors import CorruptRecordError
from ctxguard.messages import PINNED_ROLES
from ctxguard.stores.base import decode_message, decode_summary
from ctxguard.stores.records import STORED_INTEGER

EXPECTED_TYPES = {
    "meta": "hash",
    "msgs": "list",
    "toks": "list",
    "ids": "hash",
    "pins": "list",
    "sum": "string",
    "audit": "list",
    "rids": "hash",
    "ctx": "hash",
}
_INTEGER = re.compile(STORED_INTEGER)
NUMERIC_META = ("created", "updated", "count", "tokens", "sumver", "turns", "ver")


@dataclass(frozen=True)
class RawSession:
    """A session's keys as stored: types (``none`` when absent) and raw contents."""

    types: dict[str, str]
    meta: dict[str, str]
    records: list[bytes]
    toks: list[str]
    ids: dict[str, str]
    pins: list[str]
    summary: bytes | None
    fingerprint: str


@dataclass(frozen=True)
class KeyProblem:
    key: str  # the key's suffix: meta, msgs, toks, ids, pins, sum, audit
    detail: str


@dataclass(frozen=True)
class RepairPlan:
    """What a repair writes: every derived key rebuilt from the message list."""

    fingerprint: str
    ids: list[str]
    toks: list[int]
    pins: list[int]
    meta: dict[str, str]
    drop_summary: bool
    changes: list[str] = field(default_factory=list)


def _int(value: str | bytes | None) -> int | None:
    """An integer as the scripts' ``is_integer`` takes it (at most 15 digits, no spaces or
    underscores, which ``int()`` would allow), else None."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if value is None or not _INTEGER.fullmatch(value):
        return None
    return int(value)


def _text(value: str | bytes) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def find_problems(session_id: str, raw: RawSession) -> list[KeyProblem]:
    """Every way the session's keys disagree with each other or cannot be used."""
    found = [
        KeyProblem(suffix, f"is a {raw.types[suffix]}, not a {want}")
        for suffix, want in EXPECTED_TYPES.items()
        if raw.types.get(suffix, "none") not in ("none", want)
    ]
    count = len(raw.records)
    for name in NUMERIC_META:
        value = raw.meta.get(name)
        if value is not None and _int(value) is None:
            found.append(KeyProblem("meta", f"field {name} is {value[:40]!r}, not an integer"))
    if raw.types.get("meta") == "hash" and "created" in raw.meta and "epoch" not in raw.meta:
        # the scripts refuse to write without it (no state token); repair makes one
        found.append(KeyProblem("meta", "field epoch is missing"))
    if raw.types.get("meta") == "hash" and _int(raw.meta.get("count")) not in (count, None):
        found.append(KeyProblem("meta", f"count is {raw.meta.get('count')} but msgs holds {count}"))
    counts = [_int(t) for t in raw.toks]
    if len(raw.toks) != count:
        found.append(KeyProblem("toks", f"holds {len(raw.toks)} counts for {count} messages"))
    bad = [i for i, c in enumerate(counts) if c is None or c < -1]
    if bad:
        found.append(KeyProblem("toks", f"entry {bad[0]} is {raw.toks[bad[0]][:40]!r}"))
    elif len(raw.toks) == count and raw.meta.get("counter"):
        total = sum(c for c in counts if c is not None and c > 0)
        if _int(raw.meta.get("tokens")) not in (total, None):
            held = raw.meta.get("tokens")
            found.append(KeyProblem("meta", f"tokens is {held} but the counts add to {total}"))
    found += _pin_problems(raw, count)
    found += _id_problems(session_id, raw)
    found += _summary_problems(session_id, raw, count)
    return found


def _pin_problems(raw: RawSession, count: int) -> list[KeyProblem]:
    for pin in raw.pins:
        seq = _int(pin)
        if seq is None or not 0 <= seq < count:
            return [KeyProblem("pins", f"holds {pin[:40]!r}, not a position below {count}")]
    return []


def _id_problems(session_id: str, raw: RawSession) -> list[KeyProblem]:
    """ids must map exactly the stored messages' ids to their positions."""
    expected: dict[str, int] = {}
    for seq, record in enumerate(raw.records):
        try:
            expected.setdefault(decode_message(session_id, seq, record).id, seq)
        except CorruptRecordError:
            return []  # reported as an undecodable record; the index cannot be checked
    held = {k: _int(v) for k, v in raw.ids.items()}
    if held == expected:
        return []
    wrong = sorted(set(held) ^ set(expected)) or [k for k in held if held[k] != expected.get(k)]
    return [KeyProblem("ids", f"does not match the messages (first difference: {wrong[0]!r})")]


def _summary_problems(session_id: str, raw: RawSession, count: int) -> list[KeyProblem]:
    if raw.summary is None:
        return []
    try:
        summary = decode_summary(session_id, raw.summary)
    except CorruptRecordError as exc:
        return [KeyProblem("sum", f"does not decode ({str(exc).split('(', 1)[-1][:80]}")]
    if summary is not None and not 0 <= summary.covers_to <= count:
        return [KeyProblem("sum", f"covers_to {summary.covers_to} is beyond the {count} messages")]
    return []


def plan_repair(session_id: str, raw: RawSession, now_ms: int, max_turn: int) -> RepairPlan:
    """The derived keys rebuilt from the message list.

    Raises :class:`CorruptRecordError` when the message list itself is not a
    list or a record does not decode: that cannot be rebuilt from anything.
    """
    if raw.types.get("msgs") not in ("list", "none"):
        raise CorruptRecordError(session_id, "msgs", f"the message list is a {raw.types['msgs']}")
    messages = [decode_message(session_id, seq, r) for seq, r in enumerate(raw.records)]
    problems = find_problems(session_id, raw)
    ids: list[str] = [m.id for m in messages]
    pins = [seq for seq, m in enumerate(messages) if m.role in PINNED_ROLES]
    counter = raw.meta.get("counter") or ""
    toks = []
    for seq in range(len(messages)):
        value = _int(raw.toks[seq]) if seq < len(raw.toks) else None
        toks.append(value if value is not None and value >= -1 and counter else -1)
    drop = any(p.key == "sum" for p in problems)
    summary = None if drop else decode_summary(session_id, raw.summary)
    meta = {
        "count": str(len(messages)),
        "tokens": str(sum(t for t in toks if t > 0)),
        "sumver": str(summary.version if summary else _int(raw.meta.get("sumver")) or 0),
        "turns": str(max(_int(raw.meta.get("turns")) or 0, max_turn)),
        "created": str(_int(raw.meta.get("created")) or now_ms),
        "updated": str(now_ms),
        "ver": str(_int(raw.meta.get("ver")) or 0),
    }
    changes = [f"{p.key}: {p.detail}" for p in problems]
    if drop:
        changes.append("sum: dropped the summary (the next turns fold a new one)")
    return RepairPlan(raw.fingerprint, ids, toks, pins, meta, drop, changes)
