"""A stored message record in few bytes, read back exactly.

Two compact forms, each standing for the record earlier releases wrote (``"created_at":
"<ISO 8601>"``), for times at UTC offset zero from 1970 (the ISO form stores those as
``Z`` and reads them back as UTC whatever their tzinfo was: the same datetime either way):

- ``"t": <microseconds since the epoch>``, last in the record (21 B less than the ISO
  ``created_at``), for any message;
- a *positional* record ``["u",<content>,"<id>",<time>]`` for a plain message (role
  system / developer / user / assistant as ``s`` / ``d`` / ``u`` / ``a``, str content,
  nothing else set): no key names at all. ``<time>`` is the µs since the epoch, or, for
  an id of the ULID layout (:func:`ulid_ms`, the one test writer and reader share), the
  µs minus the id's milliseconds * 1000 (a few digits for an id made with the message).

Other offsets, naive times and times before 1970 keep the ISO form. :func:`expand_record`
gives the ISO form back, text for text, before validation, so a compact record decodes
exactly as the record it stands for, and a damaged one fails the validation as any
damaged record does; a record written before (``created_at``, no top-level ``t``: the
model forbids extra keys) is left as it is, and a release before the positional form
fails on one (a JSON array is not a message) instead of reading a wrong message. Used by
:mod:`ctxguard.messages` (the record is the model's).
"""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime, timedelta

from pydantic_core import to_json

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MICROSECOND = timedelta(microseconds=1)
_ZERO = timedelta(0)
TIME_KEY = ',"t":'
TIME_KEY_BYTES = TIME_KEY.encode()
_TIME_TAIL = 27  # ',"t":' + at most 21 digits + '}'

ROLE_CODES = {"system": "s", "developer": "d", "user": "u", "assistant": "a"}
# the record's opening up to the content -> the ISO record's, as pydantic writes it
_HEADS = {f'["{code}",': f'{{"role":"{role}","content":' for role, code in ROLE_CODES.items()}
_CROCKFORD = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ"  # as ids.py
# Crockford digits to int()'s base-32 digits, every other byte to one int() refuses
_ULID_DIGITS = bytes(
    b"0123456789ABCDEFGHIJKLMNOPQRSTUV"[_CROCKFORD.index(b)] if b in _CROCKFORD else ord("!")
    for b in range(256)
)
# a positional record's end: a time of at most 24 digits (a longer one is no time),
# after a 26-character id with nothing to unescape (ULID-shaped if ulid_ms says so)
_POSITIONAL_TIME = re.compile(r",(-?[0-9]{1,24})\]\Z")
_ULID_TAIL = re.compile(r',"([^"\\]{26})",(-?[0-9]{1,24})\]\Z')
_STRING_TEXT = re.compile(r'[^"\\]*(?:\\.[^"\\]*)*', re.DOTALL)  # no unescaped quote


_MINUTE_US = 60_000_000
_minute: tuple[int, str] = (-1, "")  # a minute (µs // _MINUTE_US) and its "YYYY-MM-DDTHH:MM:"
_made: tuple[str | None, int] = (None, 0)  # the last text now_iso() made, and its µs


def now_iso() -> str:
    """``datetime.now(UTC).isoformat()``, from one read of the same clock (floored to µs,
    as ``datetime.now`` does), the minute's text made once per minute: an audit record's
    ``at`` (one per turn). The µs the text stands for are kept for :func:`made_micros`."""
    global _minute, _made
    micros = time.time_ns() // 1000
    minute, rest = divmod(micros, _MINUTE_US)
    known = _minute
    if known[0] != minute:
        head = (EPOCH + timedelta(microseconds=minute * _MINUTE_US)).isoformat()[:17]
        known = _minute = (minute, head)
    seconds, fraction = divmod(rest, 1_000_000)
    if fraction:  # (isoformat writes no fraction for a whole second)
        text = f"{known[1]}{seconds:02d}.{fraction:06d}+00:00"
    else:
        text = f"{known[1]}{seconds:02d}+00:00"
    _made = (text, micros)
    return text


def made_micros(text: str) -> int | None:
    """The µs since the epoch of ``text`` when it is the text :func:`now_iso` made last
    (the compacted audit record's ``at``, without parsing it back); else None."""
    made = _made
    return made[1] if made[0] == text else None


def micros_of(created_at: datetime) -> int | None:
    """The µs since the epoch of a time the compact forms keep exactly, else None."""
    if created_at.utcoffset() != _ZERO:  # (naive: None)
        return None
    micros = (created_at - EPOCH) // MICROSECOND
    return micros if micros >= 0 else None


def time_suffix(created_at: datetime) -> str | None:
    """``,"t":<us>}`` for a time the compact form keeps exactly, else None."""
    micros = micros_of(created_at)
    return None if micros is None else f"{TIME_KEY}{micros}}}"


def ulid_ms(message_id: str) -> int | None:
    """The milliseconds of an id of the ULID layout (26 characters of ids.py's Crockford
    alphabet, the first 0-7: 48 bits of time, then 80), else None. The one test of a
    positional record's time: its writer and its reader both ask it."""
    if len(message_id) != 26:
        return None
    try:  # (a byte outside the alphabet, or any of a character past ASCII, is a "!")
        value = int(message_id.encode().translate(_ULID_DIGITS), 32)
    except ValueError:
        return None
    return value >> 80 if value >> 128 == 0 else None


def positional_time(message_id: str, micros: int) -> int:
    """The time a positional record holds for ``micros`` (see the module's docstring)."""
    ms = ulid_ms(message_id)
    return micros if ms is None else micros - ms * 1000


def positional_record(role: str, content: str, message_id: str, time: int) -> str:
    """``["<role code>",<content>,"<id>",<time>]`` for a plain message (``role`` in
    :data:`ROLE_CODES`, ``time`` from :func:`positional_time`); pydantic-core's JSON of
    each value, as the model's record has them (its serialisation errors raise)."""
    return to_json([ROLE_CODES[role], content, message_id, time]).decode()


def expand_record(raw: str | bytes) -> str | bytes:
    """A stored record in a compact form made the record it stands for (``"created_at"``
    in pydantic's ISO form); any other record as it is (earlier releases' records, and
    damaged ones for the validation to name)."""
    if isinstance(raw, str):
        if raw[:1] == "[":
            return _expand_positional(raw)
        at = raw.rfind(TIME_KEY, max(0, len(raw) - _TIME_TAIL))
        digits = raw[at + 5 : -1]
        if at < 0 or raw[-1] != "}" or not (digits.isascii() and digits.isdigit()):
            return raw
        return f'{raw[:at]},"created_at":"{_iso(int(digits))}"}}'
    if raw[:1] == b"[":
        try:
            text = raw.decode()
        except UnicodeDecodeError:
            return raw  # (the validation names it)
        out = _expand_positional(text)
        return raw if out is text else out.encode()
    at = raw.rfind(TIME_KEY_BYTES, max(0, len(raw) - _TIME_TAIL))
    tail = raw[at + 5 : -1]
    if at < 0 or raw[-1:] != b"}" or not (tail.isascii() and tail.isdigit()):
        return raw
    return b'%s,"created_at":"%s"}' % (raw[:at], _iso(int(tail)).encode())


def _expand_positional(raw: str) -> str:
    """``["u",<content>,"<id>",<time>]`` as its ISO record, read from the ends: the time
    after the last comma, the id the last JSON string (a ULID-shaped one the 26 characters
    between ``,"`` and ``",``; any other back to its unescaped opening quote), the content
    what lies between; anything else ``raw`` as it is (a JSON array: every validation
    refuses it)."""
    head = _HEADS.get(raw[:5])
    if head is None:
        return raw
    comma = raw.rfind(",")
    tail = _ULID_TAIL.match(raw, comma - 29) if comma > 35 else None
    if tail is not None:
        ms = ulid_ms(tail[1])
        if ms is not None:
            return _iso_text(raw, head, comma - 29, comma, ms * 1000 + int(tail[2]))
    time = _POSITIONAL_TIME.match(raw, comma) if comma > 5 else None
    if time is None or raw[comma - 1] != '"':
        return raw
    quote = comma - 1  # the id's opening quote: the first unescaped one before its end
    while True:
        quote = raw.rfind('"', 5, quote)
        if quote < 0:
            return raw
        if not _escaped(raw, quote):
            break
    if raw[quote - 1] != ",":
        return raw
    return _iso_text(raw, head, quote - 1, comma, int(time[1]))


def _iso_text(raw: str, head: str, end: int, comma: int, micros: int) -> str:
    """The ISO record of ``raw``, whose content is ``raw[5:end]`` and id ``raw[end+1:comma]``;
    ``raw`` itself when the content is not one JSON string (a damaged record)."""
    if end < 7 or raw[5] != '"' or raw[end - 1] != '"':
        return raw
    if raw[end - 2] == "\\" and _escaped(raw, end - 1):
        return raw
    if raw.find('"', 6, end - 1) >= 0 and _STRING_TEXT.fullmatch(raw, 6, end - 1) is None:
        return raw  # an unescaped quote inside: not one string (two elements, or worse)
    return f'{head}{raw[5:end]},"id":{raw[end + 1 : comma]},"created_at":"{_iso(micros)}"}}'


def _escaped(text: str, at: int) -> bool:
    """Whether the quote at ``text[at]`` is escaped (an odd run of backslashes before it)."""
    before = at - 1
    while text[before] == "\\":
        before -= 1
    return (at - before) % 2 == 0


def _iso(micros: int) -> str:
    """The time as pydantic writes it (``isoformat``'s digits, a fraction only when not
    zero, ``Z``); before year 1 or past year 9999 a text the validation refuses."""
    try:
        return (EPOCH + micros * MICROSECOND).isoformat()[:-6] + "Z"
    except OverflowError:
        return "out of range"


_ROLE_NAMES = {code: role for role, code in ROLE_CODES.items()}
_T_TAIL = re.compile(r',"t":[0-9]+\}\Z')
_ISO_TIME = re.compile(r',"created_at":"[^"]*"')
_ANY_TIME = re.compile(r",-?[0-9]+\]\Z")


def comparable_record(record: str, message_id: str) -> str:
    """A stored message record without its time and its metadata (ctxguard's annotations,
    never sent to a model), one form whatever form it was stored in: what two records of
    "the same message" (a retry, maybe made at another time) share.

    The object form without ``"t"``, ``"created_at"`` and ``"metadata"``; a positional
    record (of ``message_id``) as that object form (``{"role":..,"content":..,"id":..}``);
    anything else as it is. ``_reuse.lua``'s ``comparable`` does exactly this on Redis
    (the two are compared in tests/stores/test_id_reuse.py)."""
    quoted = to_json(message_id).decode()
    if record[:1] == "[":
        comma = record.rfind(",")
        role = _ROLE_NAMES.get(record[2:3])
        tail = "," + quoted
        body = record[:comma]
        if (
            role is None
            or record[:2] != '["'
            or record[3:5] != '",'
            or not _ANY_TIME.match(record, comma)
            or not body.endswith(tail)
            or len(body) - len(tail) < 5
        ):
            return record
        content = body[5 : len(body) - len(tail)]
        return f'{{"role":"{role}","content":{content},"id":{quoted}}}'
    found = _T_TAIL.search(record, max(0, len(record) - _TIME_TAIL))
    if found is not None:
        record = record[: found.start()] + "}"
    else:
        record = _ISO_TIME.sub("", record, count=1)
    head = '"id":' + quoted
    start = record.find(head + ',"metadata":{')
    if start < 0:
        return record
    depth, text, i = 0, False, start + len(head) + 12
    while i < len(record):  # to the end of the metadata object (as the script scans)
        c = record[i]
        if text:
            if c == "\\":
                i += 1
            elif c == '"':
                text = False
        elif c == '"':
            text = True
        elif c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
            if depth == 0:
                return record[: start + len(head)] + record[i + 1 :]
        i += 1
    return record
