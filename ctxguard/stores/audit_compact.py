"""An audit record in fewer bytes on Redis, read back exactly as written (no I/O).

One request record per turn makes the audit trail a large part of what a session
of short messages costs. After :mod:`~ctxguard.stores.audit_context` has taken the
request context out, :func:`compact` stores the rest smaller, losslessly:

* key names from a fixed table (``ALIASES``: ``"message_count"`` as ``"n"``...),
  never ``turn``, ``rid`` or ``ctx`` (the Lua scripts match ``{"turn":0,``,
  ``{"turn":N,"rid":"`` and ``"ctx":"<digest>"`` in the text);
* ``at`` (``datetime.isoformat()`` in UTC) as an integer of microseconds;
* a request record's ``dropped`` and ``decisions`` left out when they are what a
  window that starts at the last ``sent`` range says (the window policy's
  ``[[h, start]]``, ``first_seq``, the unpinned messages it left out, and the
  ``user_start`` skip before it): the marker ``"~": h`` (or ``[h, skipped]``) stands
  in their place.

A compacted record always holds the marker key ``"~"`` (``-1`` when nothing was
derived), so a record without it (written whole, by an earlier release or by a
script: ``retract``, ``repair``) reads as stored. In a compacted record a key of the
record's own that is an alias, or starts with ``~``, is stored with a ``~`` before it.

:func:`compact` checks its own work: the compacted record, encoded, decoded and
expanded, must encode to exactly the original's JSON (key for key, in order, types
included), else the record is stored whole. :func:`expand` is the one decoder every
reader of Redis audit records goes through (``RedisProtocol.parse_audit``). The
in-process store keeps records whole: it never calls these.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from ctxguard.stores.records import encode_audit

MARKER = "~"
ALIASES: dict[str, str] = {
    "kind": "k",
    "at": "a",
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
NAMES: dict[str, str] = {alias: name for name, alias in ALIASES.items()}
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)


def compact(record: Mapping[str, Any]) -> Mapping[str, Any]:
    """``record`` as stored: compacted if that reads back exactly, else as it is."""
    out = _compact(record)
    if _reads_back(out, record):
        return out
    if MARKER not in record:
        return record
    out = _compact(record, plain=True)  # a record of its own with a "~" key
    if _reads_back(out, record):
        return out
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
                out["dropped"], out["decisions"] = derived
        elif key.startswith(MARKER):
            out[key[1:]] = value
        elif key == "a":
            out["at"] = _iso(value) if type(value) is int else value
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
    marker = _derivable(record)
    for key, value in record.items():
        if marker != -1 and key in ("dropped", "decisions"):
            if key == "dropped":
                out[MARKER] = marker
            continue
        if key == "at":
            if isinstance(value, str):
                micros = _micros(value)
                out["a"] = value if micros is None else micros
            else:
                out["at"] = value  # "a" holding an int is a time
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


def _reads_back(stored: Mapping[str, Any], record: Mapping[str, Any]) -> bool:
    try:
        text = encode_audit(stored)
        return encode_audit(expand(json.loads(text))) == encode_audit(record)
    except (ValueError, TypeError, KeyError):
        return False


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


def _derivable(record: Mapping[str, Any]) -> Any:
    """The marker for ``dropped`` + ``decisions`` rebuilt from the record (-1: not)."""
    keys = list(record)
    if "dropped" not in record or "decisions" not in record:
        return -1
    at = keys.index("dropped")
    if at + 1 >= len(keys) or keys[at + 1] != "decisions":
        return -1
    dropped, decisions = record["dropped"], record["decisions"]
    if not (isinstance(dropped, list) and len(dropped) == 1 and isinstance(dropped[0], list)):
        return -1
    if len(dropped[0]) != 2 or type(dropped[0][0]) is not int:
        return -1
    h = dropped[0][0]
    if not isinstance(decisions, list) or not decisions or h < 0:
        return -1
    first = decisions[0]
    skipped = 0
    if isinstance(first, dict) and first.get("policy") == "user_start":
        value = first.get("skipped")
        skipped = len(value) if isinstance(value, list) else 0
    marker: Any = [h, skipped] if skipped else h
    return marker if _derived(record.get("sent"), marker) == (dropped, decisions) else -1


def _derived(sent: Any, marker: Any) -> tuple[list[Any], list[Any]] | None:
    """``dropped`` and ``decisions`` as a window from ``h`` to the last sent range says."""
    if isinstance(marker, list):
        if len(marker) != 2 or not all(type(v) is int and v >= 0 for v in marker):
            return None
        h, skipped = marker
    else:
        h, skipped = marker, 0
    if type(h) is not int or h < 0:
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
    start = ranges[-1][0]
    if start < h:
        return None
    kept = sum(max(0, min(b, start) - max(a, h)) for a, b in ranges)
    decisions: list[Any] = []
    if skipped:
        decisions.append({"policy": "user_start", "skipped": list(range(start - skipped, start))})
    decisions.append(
        {"policy": "window", "first_seq": start, "dropped_messages": start - h - kept}
    )
    return [[h, start]], decisions
