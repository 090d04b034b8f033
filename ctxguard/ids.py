"""Identifier rules and time-ordered message ids.

Ids end up inside Redis keys, log lines and HTML reports, so they are checked
once, here: non-empty, at most 256 UTF-8 bytes, no control characters, no format
characters (Unicode category Cf: zero-width spaces, bidi overrides, which make one id
look like another) and no line or paragraph separators (U+2028/U+2029, which end a
line in many log readers).
Generated message ids sort by creation time (ULID layout: 48-bit milliseconds
then 80 bits that increase monotonically within one millisecond), so a store
that orders by id and one that orders by arrival agree for a single writer.
"""

from __future__ import annotations

import os
import re
import threading
import time
import unicodedata

from ctxguard._validate import show
from ctxguard.errors import InvalidIdError

MAX_ID_BYTES = 256
_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_PAIRS = tuple(a + b for a in _CROCKFORD for b in _CROCKFORD)  # index: 10 bits
_RAND_SHIFTS = tuple(range(70, -1, -10))
_NAME_RE = re.compile(r"[A-Za-z0-9_.\-]{1,64}")  # fullmatch: "$" matches before a final \n

# Unicode categories an id may not hold: what each is called in the error.
_REFUSED = {
    "Cc": "control character",
    "Cs": "surrogate",
    "Cf": "format character",
    "Zl": "line separator",
    "Zp": "paragraph separator",
}
_STORED_REFUSED = ("Cc", "Cs")  # the rule before Cf/Zl/Zp: what stored records may hold
# what a write under such a session id is told: the session it names may be one an older
# version stored, which stays readable (KeySpace.session_keys(stored=True))
_OLDER_SESSION = (
    "; a session an older version stored under one can still be read and deleted "
    "(ctxguard show/export/delete)"
)

_lock = threading.Lock()
_last_ms = -1
_last_rand = 0
_last_prefix = ""


def validate_id(value: object, what: str = "id", *, stored: bool = False) -> str:
    """Return ``value`` if it is an acceptable id, else raise :class:`InvalidIdError`.

    ``stored``: an id read back from a record an older version wrote, or the id of a
    session read or deleted, held to the rule of that version (control characters only),
    so what it stored still reads and can be removed; every write uses the full rule."""
    if not isinstance(value, str):
        raise InvalidIdError(f"{what} must be a string, got {type(value).__name__}")
    if not value:
        raise InvalidIdError(f"{what} is empty; pass a non-empty string")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise InvalidIdError(f"{what} is not valid Unicode text (lone surrogate)") from exc
    if size > MAX_ID_BYTES:
        raise InvalidIdError(
            f"{what} is {size} bytes; the limit is {MAX_ID_BYTES} UTF-8 bytes. "
            "Use a shorter id (a hash of a long key works)."
        )
    for index, char in enumerate(value):
        kind = unicodedata.category(char)
        if kind in _REFUSED and (not stored or kind in _STORED_REFUSED):
            older = kind not in _STORED_REFUSED and what == "session id"
            raise InvalidIdError(
                f"{what} contains {_REFUSED[kind]} {char!r} (U+{ord(char):04X}) at index "
                f"{index}; ids must be printable text without control, format "
                "(zero-width, bidi) or line/paragraph separator characters"
                + (_OLDER_SESSION if older else "")
            )
    return value


def validate_name(value: object, what: str) -> str:
    """Namespaces and tenants: 1-64 characters of ``A-Z a-z 0-9 _ . -``.

    They become literal key prefixes and SCAN patterns, so they must never hold
    a separator or a glob character.
    """
    if not isinstance(value, str) or not _NAME_RE.fullmatch(value):
        raise InvalidIdError(
            f"{what} {show(value)} is not allowed: use 1-64 characters from A-Z a-z 0-9 _ . -"
        )
    return value


def new_message_id() -> str:
    """A 26-character, time-ordered, unique id (ULID layout, monotonic per process)."""
    return new_message_id_ms()[0]


def new_message_id_ms() -> tuple[str, int]:
    """:func:`new_message_id` and the milliseconds its first 10 characters hold (what
    ``_record_time.ulid_ms`` reads from it), for a record that stores its time beside it."""
    global _last_ms, _last_rand, _last_prefix
    with _lock:
        now_ms = time.time_ns() // 1_000_000
        if now_ms <= _last_ms:
            _last_rand = (_last_rand + 1) & ((1 << 80) - 1)
        else:
            _last_ms = now_ms
            _last_rand = int.from_bytes(os.urandom(10), "big") >> 1
            # the time's 10 digits (48 bits after two zero bits), made once per millisecond
            _last_prefix = "".join(
                [_PAIRS[(now_ms >> shift) & 1023] for shift in (40, 30, 20, 10, 0)]
            )
        prefix, rand, ms = _last_prefix, _last_rand, _last_ms
    # the 80 random bits: 16 Crockford digits of 5 bits, written two at a time
    return prefix + "".join([_PAIRS[(rand >> shift) & 1023] for shift in _RAND_SHIFTS]), ms
