"""An audit record in fewer bytes on Redis, read back exactly as written (no I/O).

One request record per turn makes the audit trail a large part of what a session
of short messages costs. After :mod:`~ctxguard.stores.audit_context` has taken the
request context out, :func:`compact` stores the rest smaller, losslessly:

* key names from a fixed table (``ALIASES``: ``"message_count"`` as ``"n"``...),
  never ``turn``, ``rid`` or ``ctx`` (the Lua scripts match ``{"turn":0,``,
  ``{"turn":N,"rid":"`` and ``"ctx":"<digest>"`` in the text);
* ``at`` (``datetime.isoformat()`` in UTC) as an integer of microseconds: as
  ``"a"``, counted from the time in the record's ``rid`` when that is a ULID (the
  guard makes the rid just before ``at``: a few digits), else as ``"A"``, from the epoch;
* a request record's ``message_count`` when it is the end of the last ``sent``
  range, and ``dropped`` + ``decisions`` when they are what a window that starts
  at that range says (the window policy's ``[[h, start]]``, ``first_seq``, the
  unpinned messages it left out, and a ``user_start`` skip before it): the marker
  ``"~"`` stands in the place of the first one left out, its value saying which
  (``-2``: the count; ``h``: the count and a window from ``h``; ``[h, skipped]``:
  the same with a skip; ``[h, skipped, 0]``: the window only).

A compacted record always holds the marker key ``"~"`` (``-1``, last, when nothing
was derived), so a record without it (written whole, by an earlier release or by a
script: ``retract``, ``repair``) reads as stored. In a compacted record a key of the
record's own that is an alias, or starts with ``~``, is stored with a ``~`` before it.

:func:`compact_json` checks its own work: the compacted record, encoded, decoded and
expanded, must encode to exactly the original's JSON (key for key, in order, types
included), else the record is stored whole. :func:`expand` is the one decoder every
reader of Redis audit records goes through (``RedisProtocol.parse_audit``). The
in-process store keeps records whole: it never calls these.

The check costs a second encode, a decode and an expand per record (5-6x a plain
encode), so a record of plain JSON values (every record the guard writes) is instead
compacted in one pass that proves it reads back (:func:`_proven`: keys and values of
exact JSON types, the left-out fields equal type for type to what the ranges rebuild,
``at`` read from isoformat()'s own shapes); anything else takes the byte check. Both
store the same bytes (``tests/stores/test_audit_compact_equal.py`` holds the byte-checked
implementation as it was, the reference). Which fields the ranges rebuild:
:mod:`~ctxguard.stores.audit_derive`.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from ctxguard._record_time import made_micros
from ctxguard.stores.audit_derive import derivation, derived, guard_derivation
from ctxguard.stores.records import encode_audit, encode_finite, too_deep

MARKER = "~"
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
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)


def compact(record: Mapping[str, Any]) -> Mapping[str, Any]:
    """``record`` as stored: compacted if that reads back exactly, else as it is."""
    return json.loads(compact_json(record))  # type: ignore[no-any-return]


def compact_json(record: Mapping[str, Any]) -> str:
    """The JSON stored for ``record``: compacted if that reads back exactly, else whole.

    A record of plain JSON values (the guard's own) is compacted in one pass that proves
    it reads back (:func:`_proven`); anything else takes the byte check
    (:func:`_checked_json`). Both store the same bytes for every record they both take.
    """
    try:
        stored = _proven(record)
        if stored is not None:
            return encode_finite(stored)  # (_proven found every number finite)
        return _checked_json(record)
    except RecursionError:  # the walks recurse: a record nested ~1,000 deep
        raise too_deep() from None


def _checked_json(record: Mapping[str, Any]) -> str:
    """The general path: the compacted JSON decoded and expanded must encode to
    ``record``'s JSON byte for byte, else the record is stored whole."""
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
            fields = derived(record.get("s"), value)
            if fields is None:  # damaged: shown as stored, not guessed at
                out[key] = value
            else:
                out.update(fields)
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
    marker, left_out, _ = derivation(record)
    for key, value in record.items():
        if key in left_out:
            if key == left_out[0]:
                out[MARKER] = marker
            continue
        if key == "at":
            _put_at(out, value, record)
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


def _proven(record: Mapping[str, Any]) -> dict[str, Any] | None:
    """What :func:`_compact` makes of ``record``, if it provably reads back; else None.

    The proof, for a record whose keys are ``str`` and whose values are plain JSON
    (``dict`` with ``str`` keys, ``list``, ``str``, ``int`` below 2**64 (JSON decoding
    reads no int past 4,300 digits), finite ``float``, ``bool``, ``None``, types exact, nested
    too): JSON decoding gives each value back exactly
    (type, order, every float), so :func:`expand` of the decoded text maps every key back
    (the alias table, the ``~`` escape and ``a``/``A`` are one-to-one, and never collide),
    gives ``at`` back (:func:`_micros` is only an integer when :func:`_iso` of it is
    ``at``), and rebuilds the fields the marker stands for from the same ``sent`` in their
    place (they stand together in the record). Those are required to equal the record's
    type for type (:func:`_same`, not ``==``: 42.0 == 42 and True == 1 in Python). The
    expanded record is then ``record`` exactly, and encodes to its bytes. Anything else
    (a derived field only ``==``, other types, keys JSON would make text) goes to the byte
    check, which then decides as it always did.
    """
    quick = guard_derivation(record)
    if quick is not None:
        marker, left_out = quick
    else:
        marker, left_out, rebuilt = derivation(record)
        for name in left_out:
            if not _same(record[name], rebuilt[name]):
                return None
    out: dict[str, Any] = {}
    for key, value in record.items():
        if type(key) is not str:
            return None
        if key in left_out:
            if key == left_out[0]:
                out[MARKER] = marker
            continue
        kind = type(value)
        if kind is int:
            if not -_BIG < value < _BIG:
                return None
        elif kind is not str and not _plain(value):
            return None
        if key == "at":
            _put_at(out, value, record)
            continue
        stored = _STORED.get(key)
        out[_stored_name(key) if stored is None else stored] = value
    if not left_out:
        out[MARKER] = -1
    return out


def _put_at(out: dict[str, Any], at: Any, record: Mapping[str, Any]) -> None:
    """``at`` as microseconds after the rid's own time (``a``), or since the epoch
    (``A``) for a record without a rid that tells one; as it is when it is not an
    ISO time :func:`_micros` reads back exactly ("at" is no alias)."""
    micros = _micros(at) if isinstance(at, str) else None
    if micros is None:
        out["at"] = at
        return
    base = _rid_micros(record.get("rid"))
    if base is None:
        out["A"] = micros
    else:
        out["a"] = micros - base


_STORED: dict[str, str] = {}  # a key of a record -> its name in the compacted record


def _stored_name(key: str) -> str:
    """As :func:`_compact` names ``key`` (not ``at``): its alias, or escaped, or as is."""
    name = ALIASES.get(key)
    if name is None:
        name = MARKER + key if key in NAMES or key.startswith(MARKER) else key
    if len(_STORED) < 1024:  # the guard's few keys; any others are named each time
        _STORED[key] = name
    return name


_SCALARS = frozenset({str, bool, type(None)})  # and int below _BIG, float if finite
_BIG = 1 << 64  # an int past this takes the byte check (JSON reads 4,300 digits at most)


def _plain(value: Any) -> bool:
    """``value`` is plain JSON (see :func:`_proven`): decoding its JSON gives it back."""
    kind = type(value)
    if kind in _SCALARS:
        return True
    if kind is int:
        return bool(-_BIG < value < _BIG)
    if kind is float:  # NaN/Infinity: the byte check's encode_audit refuses them
        return math.isfinite(value)
    if kind is list:
        for item in value:  # noqa: SIM110 (a loop: all() of a generator is slower here)
            if type(item) not in _SCALARS and not _plain(item):
                return False
        return True
    if kind is dict:
        for key, item in value.items():
            if type(key) is not str or (type(item) not in _SCALARS and not _plain(item)):
                return False
        return True
    return False


def _same(value: Any, plain: Any) -> bool:
    """``value`` is ``plain`` (plain JSON) exactly: types, key order, nested too."""
    if type(value) is not type(plain):
        return False
    if type(plain) is list:
        return len(value) == len(plain) and all(map(_same, value, plain))
    if type(plain) is dict:
        return (
            len(value) == len(plain)
            and all(type(k) is str and k == p for k, p in zip(value, plain, strict=True))
            and all(_same(value[k], v) for k, v in plain.items())
        )
    return bool(value == plain)


def _reads_back(stored: Mapping[str, Any], whole: str) -> str | None:
    """``stored``'s JSON if a reader of it sees exactly ``whole`` (the record's JSON)."""
    try:
        text = encode_audit(stored)
        return text if encode_audit(expand(json.loads(text))) == whole else None
    except (ValueError, TypeError, KeyError):
        return None


def _micros(at: str) -> int | None:
    """``at`` as microseconds since the epoch, if that gives ``at`` back exactly.

    ``isoformat()`` of a UTC time is ``YYYY-MM-DDTHH:MM:SS[.ffffff]+00:00`` (the fraction
    only when not 0): that text is read with integer arithmetic on its fields, the minute
    it starts with looked up (:func:`_minute`); any other text goes to ``fromisoformat``
    and must come back from :func:`_iso` unchanged."""
    made = made_micros(at)  # the text the guard made just now: its µs are known
    if made is not None:
        return made
    found = _CANONICAL.fullmatch(at)
    if found is not None:
        text, seconds, fraction = found.groups()
        minute = _MINUTES.get(text)
        if minute is None:
            minute = _minute(text)
        if minute != _NO_MINUTE and seconds < "60":
            if fraction is None:
                return minute + int(seconds) * 1_000_000
            if fraction != "000000":
                return minute + int(seconds) * 1_000_000 + int(fraction)
        return None  # no time isoformat() writes
    try:
        when = datetime.fromisoformat(at)
    except ValueError:
        return None
    if when.tzinfo is None or when.utcoffset() != timedelta(0):
        return None
    micros = (when - _EPOCH) // _US
    return micros if _iso(micros) == at else None


_CANONICAL = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d):(\d\d)(?:\.(\d{6}))?\+00:00", re.ASCII)
_MINUTES: dict[str, int] = {}  # "YYYY-MM-DDTHH:MM" -> its microseconds, or _NO_MINUTE
_NO_MINUTE = -(1 << 62)  # before year 1: no time's microseconds


def _minute(text: str) -> int:
    """The microseconds of the minute ``text`` (``YYYY-MM-DDTHH:MM``) names, if
    ``isoformat()`` writes it so; else ``_NO_MINUTE``."""
    try:
        when = datetime.fromisoformat(text + ":00+00:00")
        micros = (when - _EPOCH) // _US
        if _iso(micros) != text + ":00+00:00":
            micros = _NO_MINUTE
    except (ValueError, OverflowError):
        micros = _NO_MINUTE
    if len(_MINUTES) >= 256:
        _MINUTES.clear()  # a minute per turn in use; the rest is the odd record
    _MINUTES[text] = micros
    return micros


def _iso(micros: int) -> str:
    return (_EPOCH + timedelta(microseconds=micros)).isoformat()


def _rid_micros(rid: Any) -> int | None:
    """The time in a ULID rid (its first 10 digits: milliseconds), in microseconds
    (read two digits at a time: a pair that is not two Crockford digits is no ULID)."""
    if not isinstance(rid, str) or len(rid) != 26:
        return None
    pairs = _PAIRS
    a, b, c = pairs.get(rid[0:2]), pairs.get(rid[2:4]), pairs.get(rid[4:6])
    d, e = pairs.get(rid[6:8]), pairs.get(rid[8:10])
    if a is None or b is None or c is None or d is None or e is None:
        return None
    return ((((a << 10 | b) << 10 | c) << 10 | d) << 10 | e) * 1000


_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_PAIRS = {x + y: i << 5 | j for i, x in enumerate(_CROCKFORD) for j, y in enumerate(_CROCKFORD)}
