"""Reading an import file: every line parsed into a typed model before anything is written.

Two formats are accepted, told apart by the first non-empty line:

* a ``ctxguard export`` file (first line ``{"type": "header", "format":
  "ctxguard-export", "version": 1}``), restored session by session;
* plain OpenAI chat JSONL, one ``{"messages": [...], "tools": [...]}`` object per
  line (the fine-tuning / batch layout): each line becomes a new session with a
  generated id. ``tools`` are checked but not stored (sessions hold messages).

Anything wrong (missing or unreadable file, bytes that are not UTF-8, a line
that is not JSON, a field of the wrong type) raises :class:`ImportFileError`
naming the file, the line and the field, so the command can refuse the whole
file with one line and exit 2 before it writes anything.

Kept whole a little past ~400 lines: the byte, JSON and model checks of both formats
name the same file and line, and every refusal must come before the first write.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass, field
from datetime import datetime
from typing import Annotated, Any, Literal

import pydantic
from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr

from ctxguard._secrets import redact_text
from ctxguard.errors import InvalidInputError
from ctxguard.ids import new_message_id, validate_id
from ctxguard.messages import Message
from ctxguard.stores.audit_context import audit_arg
from ctxguard.stores.base import NewMessage, Summary

FORMAT = "ctxguard-export"
VERSION = 1
MAX_TOKENS = 2**40  # far above any context; keeps counts exact in Lua's doubles
MAX_TTL = 2**31  # seconds; Redis refuses larger EXPIRE values on some versions
EXPECTED = (
    'expected a ctxguard export (first line {"type": "header", "format": "ctxguard-export", '
    '"version": 1}) or OpenAI chat JSONL (one {"messages": [...]} object per line)'
)


class ImportFileError(InvalidInputError):
    """The import file cannot be used; nothing was written."""


# -- the export format, one model per line type -------------------------------------


class _Line(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class HeaderLine(_Line):
    type: Literal["header"]
    format: Literal["ctxguard-export"]
    version: Literal[1]


class SessionLine(_Line):
    type: Literal["session"]
    session_id: StrictStr
    counter: StrictStr | None = None
    ttl_seconds: Annotated[StrictInt, Field(ge=0, le=MAX_TTL)] | None = None
    created_at: datetime | None = None
    summary: Summary | None = None


class MessageLine(_Line):
    type: Literal["message"]
    session_id: StrictStr
    seq: Annotated[StrictInt, Field(ge=0)] | None = None
    tokens: Annotated[StrictInt, Field(ge=0, le=MAX_TOKENS)] | None = None
    message: dict[str, Any]


class AuditLine(_Line):
    type: Literal["audit"]
    session_id: StrictStr
    index: Annotated[StrictInt, Field(ge=0)] | None = None
    record: dict[str, Any]


ExportLine = Annotated[
    HeaderLine | SessionLine | MessageLine | AuditLine, Field(discriminator="type")
]
_EXPORT_LINE: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(ExportLine)

_Count = Annotated[StrictInt, Field(ge=0, le=MAX_TOKENS)]
_Position = Annotated[StrictInt, Field(ge=0)]
_Range = Annotated[list[_Position], Field(min_length=2, max_length=2)]


class RequestRecord(BaseModel):
    """The fields of a request record that import, show, audit, replay and report
    compute with (a stored record that does not fit is reported as damaged)."""

    model_config = ConfigDict(extra="allow", strict=True)

    turn: Annotated[StrictInt, Field(ge=1, le=MAX_TOKENS)]
    tokens: _Count | None = None
    limit: _Count | None = None
    reserved_output: _Count | None = None
    safety_margin: _Count | None = None
    sent_ids: list[StrictStr] | None = None
    sent: list[_Range] | None = None
    dropped: list[_Range] | None = None
    decisions: list[dict[str, Any]] | None = None
    policy: dict[str, Any] | None = None
    counter: StrictStr | None = None
    counter_spec: StrictStr | None = None
    message_count: _Count | None = None
    summary_version: _Position | None = None
    summary_at: _Position | None = None
    sent_digest: StrictStr | None = None


class UsageRecord(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    of_turn: _Position | None = None


_RECORD_MODELS: dict[str, type[BaseModel]] = {"request": RequestRecord, "usage": UsageRecord}


# -- the OpenAI chat format ---------------------------------------------------------


class ChatLine(BaseModel):
    """One OpenAI chat example: ``messages`` and optionally ``tools`` (other keys ignored)."""

    model_config = ConfigDict(extra="ignore", strict=True)

    messages: Annotated[list[dict[str, Any]], Field(min_length=1)]
    tools: list[dict[str, Any]] | None = None


# -- what the file holds ------------------------------------------------------------


@dataclass
class Incoming:
    """One session as read from an import file, validated."""

    session_id: str
    line: int
    counter: str | None = None
    ttl_seconds: int | None = None
    created_at: datetime | None = None
    summary: Summary | None = None
    messages: list[NewMessage] = field(default_factory=list)
    message_lines: list[int] = field(default_factory=list)  # each message's line in the file
    audit: list[dict[str, Any]] = field(default_factory=list)
    generated: bool = False  # an OpenAI-format line: the id was made here

    @property
    def turns(self) -> int:
        return max((int(r["turn"]) for r in self.audit if r.get("kind") == "request"), default=0)


@dataclass
class ImportFile:
    name: str
    format: Literal["ctxguard-export", "openai-jsonl"]
    sessions: list[Incoming]


def read_import_file(path: str) -> ImportFile:
    """Read and validate the whole file; raises :class:`ImportFileError` on any problem."""
    name = "stdin" if path == "-" else path
    data = _read_bytes(path, name)
    text = _decode(data, name)
    lines = [(n, line) for n, line in enumerate(text.split("\n"), 1) if line.strip()]
    if not lines:
        raise ImportFileError(f"{name} is empty: nothing to import; {EXPECTED}")
    first_number, first = lines[0]
    head = _json_object(name, first_number, first)
    if head.get("type") == "header":
        return ImportFile(name, "ctxguard-export", _read_export(name, lines))
    if "messages" in head and "type" not in head:
        return ImportFile(name, "openai-jsonl", _read_chat(name, lines))
    raise ImportFileError(f"{name}: line {first_number}: not a known format; {EXPECTED}")


def _read_bytes(path: str, name: str) -> bytes:
    try:
        if path == "-":
            return _read_text_bytes(sys.stdin.buffer, name)
        with open(path, "rb") as handle:
            return _read_text_bytes(handle, name)
    except OSError as exc:
        raise ImportFileError(f"cannot read {name}: {exc.strerror or exc}") from None


def _read_text_bytes(handle: Any, name: str) -> bytes:
    """All of ``handle``, up to a NUL byte (JSON text holds none): a device that never
    ends (``/dev/zero``, ``/dev/full``) was read until memory ran out."""
    chunks: list[bytes] = []
    while chunk := handle.read(1 << 20):
        if (nul := chunk.find(b"\0")) >= 0:
            line = b"".join(chunks).count(b"\n") + chunk.count(b"\n", 0, nul) + 1
            text = "a NUL byte: not text (a device or a binary file?)"
            raise ImportFileError(f"{name}: line {line}: {text}; export files are UTF-8 JSON Lines")
        chunks.append(chunk)
    return b"".join(chunks)


def _decode(data: bytes, name: str) -> str:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise ImportFileError(
            f"{name}: line {line}, byte {column}: not UTF-8 text (byte 0x{data[exc.start]:02x}); "
            "export files are UTF-8 JSON Lines"
        ) from None
    return text.removeprefix("\ufeff")


def _json_object(name: str, number: int, line: str) -> dict[str, Any]:
    try:
        value = json.loads(
            line, parse_constant=_no_constant, parse_float=_finite, parse_int=_whole_number
        )
    except (ValueError, RecursionError) as exc:
        raise ImportFileError(f"{name}: line {number}: not JSON ({_first_line(exc)})") from None
    if not isinstance(value, dict):
        raise ImportFileError(
            f"{name}: line {number}: a JSON {type(value).__name__}, not an object; {EXPECTED}"
        )
    return value


MAX_DIGITS = 4000


def _no_constant(token: str) -> Any:
    raise ValueError(f"{token} is not a JSON number")


def _whole_number(token: str) -> int:
    # (past Python's 4,300 digits json.loads said "use sys.set_int_max_str_digits()")
    if len(token.lstrip("-")) > MAX_DIGITS:
        raise ValueError(
            f"a number of {len(token.lstrip('-')):,} digits; at most {MAX_DIGITS:,} are taken"
        )
    return int(token)


def _finite(token: str) -> float:
    value = float(token)
    if not math.isfinite(value):  # 1e400: beyond a double, JSON cannot write it back
        raise ValueError(f"{token} is beyond the range of a JSON number")
    return value


def _first_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0][:160]


def _field_error(name: str, number: int, exc: pydantic.ValidationError, skip: int = 0) -> str:
    """One line for the first error: the file, the line, the field and what was wrong."""
    return f"{name}: line {number}: {_problem(exc, skip)}"


def _problem(exc: pydantic.ValidationError, skip: int = 0) -> str:
    """The first error in one line: the field and what was wrong."""
    err = exc.errors(include_url=False)[0]
    loc = [str(p) for p in err["loc"]][skip:]
    where = f"field {'.'.join(loc)}: " if loc else ""
    value = "" if err["type"] == "missing" else f" (got {_preview(err.get('input'))})"
    more = len(exc.errors()) - 1
    tail = f"; and {more} more problem(s) on this line" if more > 0 else ""
    return f"{where}{err['msg']}{value}{tail}"


def _preview(value: Any) -> str:
    if isinstance(value, str):  # (before its quotes are escaped: '\\"api_key\\": ...')
        value = redact_text(value)
    text = json.dumps(value, default=str, ensure_ascii=True)
    return redact_text(text, 40)  # hidden before the cut: no piece of a secret survives it


# -- the export format ------------------------------------------------------------


def _read_export(name: str, lines: list[tuple[int, str]]) -> list[Incoming]:
    sessions: dict[str, Incoming] = {}
    seen_ids: dict[str, dict[str, int]] = {}
    for position, (number, raw) in enumerate(lines):
        _json_object(name, number, raw)  # not JSON, or not an object: said plainly
        try:
            item = _EXPORT_LINE.validate_json(raw, strict=True)
        except pydantic.ValidationError as exc:
            # the first loc element is the line type the union picked
            skip = 1 if exc.errors()[0]["type"] != "union_tag_invalid" else 0
            raise ImportFileError(_field_error(name, number, exc, skip)) from None
        if isinstance(item, HeaderLine):
            if position != 0:
                raise ImportFileError(f"{name}: line {number}: a second header line")
            continue
        if position == 0:
            raise ImportFileError(f"{name}: line {number}: no header line first; {EXPECTED}")
        sid = _session_id(name, number, item.session_id)
        if isinstance(item, SessionLine):
            if sid in sessions:
                raise ImportFileError(
                    f"{name}: line {number}: session {sid!r} repeats line {sessions[sid].line}"
                )
            sessions[sid] = Incoming(
                sid, number, item.counter, item.ttl_seconds, item.created_at, item.summary
            )
            seen_ids[sid] = {}
            continue
        incoming = sessions.get(sid)
        if incoming is None:
            raise ImportFileError(
                f"{name}: line {number}: {item.type} line before the session line of {sid!r}"
            )
        if isinstance(item, MessageLine):
            message = _message(name, number, item.message, "field message")
            first = seen_ids[sid].setdefault(message.id, number)
            if first != number:
                raise ImportFileError(
                    f"{name}: line {number}: message id {message.id!r} repeats line {first}"
                )
            if item.tokens is not None and incoming.counter is None:
                # a store keeps counts only with the counter that made them (an export
                # never writes one without the other): they would be dropped silently
                raise ImportFileError(
                    f"{name}: line {number}: field tokens: session {sid!r} has no counter "
                    f"(line {incoming.line}), so its token counts cannot be kept; set the "
                    'session line\'s "counter" to the counter that made them, or remove "tokens"'
                )
            incoming.messages.append(NewMessage(message, item.tokens))
            incoming.message_lines.append(number)
        else:
            incoming.audit.append(_audit_record(name, number, item.record))
    for incoming in sessions.values():
        _check_summary(name, incoming)
    return list(sessions.values())


def _session_id(name: str, number: int, value: str) -> str:
    try:
        return validate_id(value, "session id")
    except InvalidInputError as exc:
        raise ImportFileError(f"{name}: line {number}: field session_id: {exc}") from None


def _message(name: str, number: int, data: dict[str, Any], where: str) -> Message:
    try:
        return Message(**data)
    except InvalidInputError as exc:
        raise ImportFileError(f"{name}: line {number}: {where}: {exc}") from None


def _audit_record(name: str, number: int, record: dict[str, Any]) -> dict[str, Any]:
    kind = record.get("kind")
    if not isinstance(kind, str):
        raise ImportFileError(
            f"{name}: line {number}: field record.kind: must be a string (got {_preview(kind)})"
        )
    problem = record_problem(record)
    if problem is not None:
        raise ImportFileError(f"{name}: line {number}: {problem}")
    try:
        audit_arg(record)  # what the store checks as it writes (the rid...), checked now
    except InvalidInputError as exc:
        raise ImportFileError(f"{name}: line {number}: field record: {exc}") from None
    return record


def record_problem(record: dict[str, Any]) -> str | None:
    """What is wrong with the typed fields of an audit record of a known kind
    (``field record (request).turn: ...``), or None."""
    kind = record.get("kind")
    model = _RECORD_MODELS.get(kind) if isinstance(kind, str) else None
    if model is None:
        return None
    try:
        model.model_validate(record, strict=True)
    except pydantic.ValidationError as exc:
        text = _problem(exc)
        field_name = text.removeprefix("field ")
        return f"field record ({kind}).{field_name}" if field_name != text else text
    return None


def _check_summary(name: str, incoming: Incoming) -> None:
    """A summary stands for messages [0, covers_to): they must be in the file."""
    summary = incoming.summary
    if summary is None:
        return
    held = len(incoming.messages)
    if summary.version < 1 or not 0 < summary.covers_to <= held:
        raise ImportFileError(
            f"{name}: line {incoming.line}: field summary: version {summary.version} covering "
            f"[0, {summary.covers_to}) does not fit the {held} message(s) of "
            f"session {incoming.session_id!r} in the file"
        )


# -- the OpenAI chat format ----------------------------------------------------------


def _read_chat(name: str, lines: list[tuple[int, str]]) -> list[Incoming]:
    out: list[Incoming] = []
    for number, raw in lines:
        data = _json_object(name, number, raw)
        try:
            chat = ChatLine.model_validate(data, strict=True)
        except pydantic.ValidationError as exc:
            raise ImportFileError(_field_error(name, number, exc) + f"; {EXPECTED}") from None
        messages = []
        for index, item in enumerate(chat.messages):
            try:
                message = Message.from_openai(item, id=new_message_id())
            except InvalidInputError as exc:
                raise ImportFileError(f"{name}: line {number}: messages.{index}: {exc}") from None
            messages.append(NewMessage(message))
        session_id = "import-" + new_message_id()
        out.append(Incoming(session_id, number, messages=messages, generated=True))
    return out
