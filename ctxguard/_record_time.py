"""A stored message record's creation time in few bytes, read back exactly.

``"t": <microseconds since the epoch>``, last in the record (21 B less than
``"created_at": "<ISO 8601>"``: a fifth of a short message's record), for any time at
UTC offset zero, which the ISO form stores as ``Z`` and reads back as UTC whatever its
tzinfo was: the same datetime either way. Other offsets, naive times and times before
1970 keep the ISO form. :func:`expand_record` gives the ISO form back before
validation, so a compact record decodes exactly as the record it stands for, and a
record written before (``created_at``, no top-level ``t``: the model forbids extra
keys) is left as it is. Used by :mod:`ctxguard.messages` (the record is the model's).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MICROSECOND = timedelta(microseconds=1)
_ZERO = timedelta(0)
TIME_KEY = ',"t":'
TIME_KEY_BYTES = TIME_KEY.encode()
_TIME_TAIL = 27  # ',"t":' + at most 21 digits + '}'


def time_suffix(created_at: datetime) -> str | None:
    """``,"t":<us>}`` for a time the compact form keeps exactly, else None."""
    if created_at.utcoffset() != _ZERO:  # (naive: None)
        return None
    micros = (created_at - EPOCH) // MICROSECOND
    return f"{TIME_KEY}{micros}}}" if micros >= 0 else None


def expand_record(raw: str | bytes) -> str | bytes:
    """A stored record with a compact ``"t"`` made the record it stands for (``"created_at"``
    in pydantic's ISO form); any other record as it is (earlier releases' records, and
    damaged ones for the validation to name)."""
    if isinstance(raw, str):
        at = raw.rfind(TIME_KEY, max(0, len(raw) - _TIME_TAIL))
        digits = raw[at + 5 : -1]
        if at < 0 or raw[-1] != "}" or not (digits.isascii() and digits.isdigit()):
            return raw
        return f'{raw[:at]},"created_at":"{_iso(int(digits))}"}}'
    at = raw.rfind(TIME_KEY_BYTES, max(0, len(raw) - _TIME_TAIL))
    tail = raw[at + 5 : -1]
    if at < 0 or raw[-1:] != b"}" or not (tail.isascii() and tail.isdigit()):
        return raw
    return b'%s,"created_at":"%s"}' % (raw[:at], _iso(int(tail)).encode())


def _iso(micros: int) -> str:
    """The time as pydantic writes it (``isoformat``'s digits, a fraction only when not
    zero, ``Z``); past year 9999 a text the validation refuses."""
    try:
        return (EPOCH + micros * MICROSECOND).isoformat()[:-6] + "Z"
    except OverflowError:
        return "past year 9999"
