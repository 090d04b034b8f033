"""The audit record compaction as merged in round 5 (issue 16), frozen: the reference the
faster write path must match byte for byte (tests/stores/test_audit_compact_equal.py)."""

# ruff: noqa
# mypy: ignore-errors
from __future__ import annotations

import json
import re
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from ctxguard.stores.records import encode_audit

MARKER = "~"
MAX_SKIPPED = 4096  # a user_start skip rebuilt from the marker at most (longer: kept)
ALIASES: dict[str, str] = {
    "kind": "k",
    "sent": "s",
    "sent_digest": "d",
    "summary_at": "sa",
    "tokens": "t",
    "message_count": "n",
    "summary_version": "sv",
    "summary_covers_to": "sc",
    "summary_tokens": "st",
    "dropped": "x",
    "decisions": "y",
    "reused": "ru",
    "prefilled": "pf",
    "error": "e",
    "ids": "i",
    "usage": "u",
}
NAMES: dict[str, str] = {alias: name for name, alias in ALIASES.items()} | {"a": "at", "A": "at"}
_ULID_TIME = re.compile("[0-9A-HJKMNP-TV-Z]{10}")
_TO_BASE32 = str.maketrans("ABCDEFGHJKMNPQRSTVWXYZ", "abcdefghijklmnopqrstuv")  # Crockford -> int
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)


def compact(record: Mapping[str, Any]) -> Mapping[str, Any]:
    """``record`` as stored: compacted if that reads back exactly, else as it is."""
    return json.loads(compact_json(record))  # type: ignore[no-any-return]


def compact_json(record: Mapping[str, Any]) -> str:
    """The JSON stored for ``record``: compacted if that reads back exactly, else whole
    (the check: the compacted JSON decoded and expanded encodes to ``record``'s JSON)."""
    whole = encode_audit(record)
    if not all(type(key) is str for key in record):
        record = json.loads(whole)  # keys as JSON makes them: what a reader would see
        whole = encode_audit(record)
    text = _reads_back(_compact(record), whole)
    if text is not None:
        return text
    if MARKER not in record:
        return whole
    text = _reads_back(_compact(record, plain=True), whole)  # a "~" key of its own
    if text is not None:
        return text
    raise ValueError("audit record cannot be stored so that it reads back")  # not reached


def expand(record: dict[str, Any]) -> dict[str, Any]:
    """A stored record as written (a record without the marker is returned as is)."""
    if MARKER not in record:
        return record
    out: dict[str, Any] = {}
    for key, value in record.items():
        if key == MARKER:
            if type(value) is int and value == -1:
                continue  # nothing derived
            derived = _derived(record.get("s"), value)
            if derived is None:  # damaged: shown as stored, not guessed at
                out[key] = value
            else:
                out.update(derived)
        elif key.startswith(MARKER):
            out[key[1:]] = value
        elif key in ("a", "A") and type(value) is int:
            base = _rid_micros(record.get("rid")) if key == "a" else 0
            try:
                if base is None:
                    raise OverflowError  # "a" beside a rid that is no ULID: damaged
                out["at"] = _iso(base + value)
            except OverflowError:  # damaged (or past any date): shown as stored
                out[key] = value
        else:
            out[NAMES.get(key, key)] = value
    return out


def _compact(record: Mapping[str, Any], plain: bool = False) -> dict[str, Any]:
    """Aliases, ``at`` in microseconds, derived fields left out; or (``plain``) only
    the keys that would read as something else escaped."""
    out: dict[str, Any] = {}
    if plain:
        for key, value in record.items():
            out[MARKER + key if key in NAMES or key.startswith(MARKER) else key] = value
        out[MARKER] = -1
        return out
    marker, left_out = _derivable(record)
    for key, value in record.items():
        if key in left_out:
            if key == left_out[0]:
                out[MARKER] = marker
            continue
        if key == "at":
            micros = _micros(value) if isinstance(value, str) else None
            if micros is None:
                out["at"] = value  # as it is: "at" is no alias
            else:
                base = _rid_micros(record.get("rid"))
                if base is None:
                    out["A"] = micros
                else:
                    out["a"] = micros - base
            continue
        alias = ALIASES.get(key)
        if alias is not None:
            out[alias] = value
        elif key in NAMES or key.startswith(MARKER):
            out[MARKER + key] = value
        else:
            out[key] = value
    if MARKER not in out:
        out[MARKER] = -1
    return out


def _reads_back(stored: Mapping[str, Any], whole: str) -> str | None:
    """``stored``'s JSON if a reader of it sees exactly ``whole`` (the record's JSON)."""
    try:
        text = encode_audit(stored)
        return text if encode_audit(expand(json.loads(text))) == whole else None
    except (ValueError, TypeError, KeyError):
        return None


def _micros(at: str) -> int | None:
    """``at`` as microseconds since the epoch, if that gives ``at`` back exactly."""
    try:
        when = datetime.fromisoformat(at)
    except ValueError:
        return None
    if when.tzinfo is None or when.utcoffset() != timedelta(0):
        return None
    micros = (when - _EPOCH) // _US
    return micros if _iso(micros) == at else None


def _iso(micros: int) -> str:
    return (_EPOCH + timedelta(microseconds=micros)).isoformat()


def _rid_micros(rid: Any) -> int | None:
    """The time in a ULID rid (its first 10 digits: milliseconds), in microseconds."""
    if not isinstance(rid, str) or len(rid) != 26 or not _ULID_TIME.match(rid):
        return None
    return int(rid[:10].translate(_TO_BASE32), 32) * 1000


_WINDOW = ("dropped", "decisions")


def _derivable(record: Mapping[str, Any]) -> tuple[Any, tuple[str, ...]]:
    """The marker and the fields it stands for, in order (``(-1, ())``: none)."""
    keys = list(record)
    window: Any = None  # (h, skipped) when dropped + decisions, together, can be rebuilt
    if "dropped" in record:
        at = keys.index("dropped")
        if keys[at + 1 : at + 2] == ["decisions"]:
            window = _window_of(record)
    count = False
    if "message_count" in record:
        at = keys.index("message_count")
        follows = keys[at + 1 : at + 3]
        count = window is None or follows == list(_WINDOW)
    for marker, fields in _candidates(window, count):
        derived = _derived(record.get("sent"), marker)
        if (
            derived is not None
            and list(derived) == list(fields)
            and all(record[k] == v for k, v in derived.items())
        ):
            return marker, fields
    return -1, ()


def _window_of(record: Mapping[str, Any]) -> tuple[int, int] | None:
    dropped, decisions = record["dropped"], record["decisions"]
    if not (isinstance(dropped, list) and len(dropped) == 1 and isinstance(dropped[0], list)):
        return None
    if len(dropped[0]) != 2 or type(dropped[0][0]) is not int or dropped[0][0] < 0:
        return None
    if not isinstance(decisions, list) or not decisions:
        return None
    first = decisions[0]
    skipped = 0
    if isinstance(first, dict) and first.get("policy") == "user_start":
        value = first.get("skipped")
        skipped = len(value) if isinstance(value, list) else 0
    return dropped[0][0], skipped


def _candidates(window: Any, count: bool) -> list[tuple[Any, tuple[str, ...]]]:
    out: list[tuple[Any, tuple[str, ...]]] = []
    if window is not None:
        h, skipped = window
        if count:
            out.append(([h, skipped] if skipped else h, ("message_count", *_WINDOW)))
        out.append(([h, skipped, 0], _WINDOW))
    if count:
        out.append((-2, ("message_count",)))
    return out


def _derived(sent: Any, marker: Any) -> dict[str, Any] | None:
    """The fields ``marker`` stands for, as the last sent range says (None: damaged)."""
    count, h, skipped = True, -1, 0
    if isinstance(marker, list):
        if not 2 <= len(marker) <= 3 or not all(type(v) is int and v >= 0 for v in marker):
            return None
        h, skipped = marker[0], marker[1]
        if len(marker) == 3:
            if marker[2] != 0:
                return None
            count = False
    elif type(marker) is int and marker >= 0:
        h = marker
    elif type(marker) is not int or marker != -2:
        return None
    if not isinstance(sent, list) or not sent:
        return None
    ranges: list[tuple[int, int]] = []
    for pair in sent:
        if not (isinstance(pair, list) and len(pair) == 2):
            return None
        a, b = pair
        if type(a) is not int or type(b) is not int or a > b:
            return None
        ranges.append((a, b))
    out: dict[str, Any] = {}
    if count:
        out["message_count"] = ranges[-1][1]
    if h < 0:
        return out
    start = ranges[-1][0]
    if start < h or skipped > min(start, MAX_SKIPPED):
        return None  # (a damaged marker must not make a reader allocate without bound)
    kept = sum(max(0, min(b, start) - max(a, h)) for a, b in ranges)
    decisions: list[Any] = []
    if skipped:
        decisions.append({"policy": "user_start", "skipped": list(range(start - skipped, start))})
    decisions.append({"policy": "window", "first_seq": start, "dropped_messages": start - h - kept})
    out["dropped"], out["decisions"] = [[h, start]], decisions
    return out
