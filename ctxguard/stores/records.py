"""Stored records in and out, shared by every backend: messages, summaries, audit records.

A stored message record decodes once (cached); a damaged one raises
:class:`~ctxguard.errors.CorruptRecordError` naming it. Audit records carry a
``rid`` where the Lua scripts look for it (see :func:`with_rid`).
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import pydantic
import pydantic_core

from ctxguard import _record_time
from ctxguard._validate import MAX_JSON_DEPTH
from ctxguard.errors import CorruptRecordError, InvalidInputError
from ctxguard.ids import new_message_id
from ctxguard.messages import Message, plain_from_record
from ctxguard.stores.contract import Summary


@functools.lru_cache(maxsize=8192)
def decode_record(raw: str | bytes) -> Message:
    """Records are immutable and so are messages: consecutive turns fetch mostly the
    same window, so each record is validated once, not once per turn (a plain message's
    positional record without pydantic's pass: :func:`plain_from_record`)."""
    message = plain_from_record(raw)
    return Message.from_record(raw) if message is None else message


def decode_message(session_id: str, seq: int, raw: str | bytes) -> Message:
    """Decode one stored record, or raise :class:`CorruptRecordError` naming it."""
    try:
        return decode_record(raw)
    except (pydantic.ValidationError, ValueError, InvalidInputError) as exc:
        detail = str(exc).splitlines()[0][:200]
        raise CorruptRecordError(session_id, seq, detail) from None


def undecodable_message(raw: str | bytes, detail: str) -> Message:
    """A record a write removed that this version cannot read as a message (a newer
    ctxguard's), given back instead of an error raised after the write: its fields as
    far as they go, unvalidated (``Message.model_construct``), and
    ``metadata["ctxguard_undecodable"]`` saying why. (A record that is not JSON with a
    string id is refused by the script before it writes: see ``removed_tail`` in
    ``_lib.lua``.)"""
    try:
        data = json.loads(_record_time.expand_record(raw))
    except (ValueError, TypeError, IndexError, UnicodeDecodeError):
        data = None
    if isinstance(data, list):  # a positional record that did not expand
        data = {"id": data[2]} if len(data) > 2 else None
    fields = data if isinstance(data, dict) else {}
    found_id = fields.get("id")
    return Message.model_construct(
        role=fields.get("role"),
        content=fields.get("content"),
        id=found_id if isinstance(found_id, str) else "",
        metadata={"ctxguard_undecodable": detail},
    )


def decode_summary(session_id: str, raw: str | bytes | None) -> Summary | None:
    if raw is None:
        return None
    try:
        return Summary.model_validate_json(raw)
    except (pydantic.ValidationError, ValueError) as exc:
        raise CorruptRecordError(session_id, "summary", str(exc).splitlines()[0][:200]) from None


# an integer as _lib.lua's is_integer takes it: at most 15 digits, so that Lua's double
# holds it exactly (window_reads and integrity read meta fields and counts by it)
STORED_INTEGER = r"-?[0-9]{1,15}"
REQUEST_RECORD_HEAD = '{"turn":0,'
RID_PATTERN = r"[0-9A-Za-z_.:\-]{1,64}"
_RID = re.compile(RID_PATTERN)
# as record_rid in _lib.lua: the rid right after the opening brace or a leading "turn"
_RAW_RID = re.compile(r'\{(?:"turn":-?\d+,)?"rid":"(' + RID_PATTERN + ')"')


def with_rid(record: Mapping[str, Any]) -> Mapping[str, Any]:
    """``record`` with its audit record id (``rid``) where the stores look for it.

    Every audit record carries a rid, made once per logical record (the guard
    makes it; a record without one gets a new one here, before the first send),
    so a store writes a record at most once however often it is sent: a retry
    after a lost reply finds the rid in the trail and writes nothing. The rid
    goes first, or right after a leading ``turn`` (request records).
    """
    keys = iter(record)
    first = next(keys, None)
    second = next(keys, None)
    rid = record.get("rid")
    if rid is not None:
        if not isinstance(rid, str) or not _RID.fullmatch(rid):
            raise InvalidInputError(
                f"audit record rid {rid!r} is not 1-64 characters of A-Z a-z 0-9 _ . : -"
            )
        if first == "rid" or (first == "turn" and second == "rid"):
            return record
    out: dict[str, Any] = {"turn": record["turn"]} if first == "turn" else {}
    out["rid"] = rid if rid is not None else new_message_id()
    out.update((k, v) for k, v in record.items() if k not in out)
    return out


def audit_rid(raw: str) -> str | None:
    """The rid of an encoded audit record (as the Lua scripts read it), if it has one."""
    found = _RAW_RID.match(raw)
    return found.group(1) if found else None


def encode_audit(record: Mapping[str, Any]) -> str:
    """Compact JSON for an audit record (one per turn: pydantic-core's encoder is ~4x
    json's); request records (``turn`` first, 0) get numbered by the store.

    A NaN or infinite number anywhere in the record is refused (InvalidInputError):
    JSON has no such number, so the session could not be exported. Both encoders
    write them as the bare words ``NaN``/``Infinity``, so only a record whose JSON holds
    one of those words (in a number, or in some text) is walked to find out."""
    raw = encode_finite(record)
    if "NaN" in raw or "Infinity" in raw:
        refuse_non_finite(record)
    return raw


def too_deep() -> InvalidInputError:
    """The error for an audit record nested past what the encoders can walk (a
    ``RecursionError`` caught at the door, before anything is written)."""
    return InvalidInputError(
        f"an audit record is nested too deep to encode as JSON; flatten it (every other "
        f"door takes at most {MAX_JSON_DEPTH} levels)"
    )


def encode_finite(record: Mapping[str, Any]) -> str:
    """:func:`encode_audit` of a record already walked and found to hold finite numbers
    only (``audit_compact._proven``): without the search for ``NaN``/``Infinity``."""
    try:
        return pydantic_core.to_json(record, fallback=str).decode()
    except (pydantic_core.PydanticSerializationError, ValueError, UnicodeError):
        # e.g. a lone surrogate in a summarizer's error text: escaped JSON still round-trips
        try:
            return json.dumps(record, default=str, ensure_ascii=True, separators=(",", ":"))
        except RecursionError:
            raise too_deep() from None


def refuse_non_finite(record: Mapping[str, Any]) -> None:
    """InvalidInputError naming the first NaN or infinite number in ``record``, if any."""
    stack: list[tuple[object, str]] = [(record, "")]
    while stack:
        value, path = stack.pop()
        if isinstance(value, float) and not math.isfinite(value):
            raise InvalidInputError(
                f"audit record field {path[1:]!r} is {value!r}, not a finite number (JSON "
                "has none, so the session could not be exported); use a number or None"
            )
        if isinstance(value, Mapping):
            stack.extend((sub, f"{path}.{key}") for key, sub in reversed(list(value.items())))
        elif isinstance(value, list | tuple):
            stack.extend((sub, f"{path}[{i}]") for i, sub in reversed(list(enumerate(value))))


def decode_audit(session_id: str, index: int, raw: str | bytes) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise CorruptRecordError(session_id, f"audit {index}", str(exc)) from None
    if not isinstance(value, dict):
        raise CorruptRecordError(session_id, f"audit {index}", "not a JSON object")
    return value


def decode_audits(
    session_id: str,
    raw: Sequence[str | bytes],
    damaged: list[CorruptRecordError] | None = None,
) -> list[dict[str, Any]]:
    """Every record of an audit trail decoded; an undecodable one raises, or, when
    ``damaged`` is a list, is put there and left out (the rest are still read)."""
    out = []
    for index, item in enumerate(raw):
        try:
            out.append(decode_audit(session_id, index, item))
        except CorruptRecordError as exc:
            if damaged is None:
                raise
            damaged.append(exc)
    return out


def tokens_or_none(value: int) -> int | None:
    return None if value < 0 else value


def ms_to_datetime(ms: int | float) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC)
