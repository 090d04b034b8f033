"""The chat message model: what backends already hold, made typed and checked.

A :class:`Message` round-trips losslessly with OpenAI chat-completions message
dicts (:meth:`Message.from_openai` / :meth:`Message.to_openai`); ctxguard's own
fields (``id``, ``created_at``, ``metadata``) travel beside the OpenAI keys, and
OpenAI keys ctxguard does not model (``refusal``, ``audio``, ``reasoning_content``
...) are kept verbatim in ``extra``. Stored records are JSON, never pickle.

Past ~400 lines on purpose: ``_plain_message`` (the commonest dict built without
pydantic's pass) and ``plain_from_record`` (the positional record decoded without it)
must sit beside the model whose fields, defaults and record they reproduce, so a change
to one is seen next to the other.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from functools import lru_cache
from typing import Annotated, Any, Literal

import pydantic
from pydantic import BaseModel, ConfigDict, Field, Strict, field_validator, model_validator
from pydantic_core import PydanticSerializationError, SchemaValidator, TzInfo, from_json, to_json

from ctxguard._message_errors import describe as _describe
from ctxguard._message_errors import first_error as _first_error
from ctxguard._record_time import (
    EPOCH,
    MICROSECOND,
    ROLE_CODES,
    expand_record,
    micros_of,
    positional_record,
    positional_time,
    time_suffix,
    ulid_ms,
)
from ctxguard._validate import check_message_batch, json_problem, show
from ctxguard.errors import CtxGuardError, InvalidMessageError
from ctxguard.ids import MAX_ID_BYTES, new_message_id, new_message_id_ms, validate_id

Role = Literal["system", "developer", "user", "assistant", "tool"]
PINNED_ROLES = frozenset({"system", "developer"})

_OWN_KEYS = frozenset({"role", "content", "name", "tool_calls", "tool_call_id"})
_CTXGUARD_KEYS = frozenset({"id", "created_at", "metadata"})


class _Frozen(BaseModel):
    # strict: text fields take text only (bytes would come back as str)
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except pydantic.ValidationError as exc:
            what = type(self).__name__
            raise InvalidMessageError(f"invalid {what}: {_first_error(exc)}") from None


CacheControl = dict[str, Any] | None  # Anthropic-style prompt-cache marker: kept, not counted


class TextPart(_Frozen):
    type: Literal["text"] = "text"
    text: str
    cache_control: CacheControl = None


class ImageURL(_Frozen):
    url: str
    detail: Literal["auto", "low", "high"] | None = None


class ImagePart(_Frozen):
    type: Literal["image_url"] = "image_url"
    image_url: ImageURL
    cache_control: CacheControl = None


ContentPart = Annotated[TextPart | ImagePart, Field(discriminator="type")]


class FunctionCall(_Frozen):
    name: str
    arguments: str

    @field_validator("arguments")
    @classmethod
    def _arguments_are_json(cls, value: str) -> str:
        try:
            json.loads(value)
        except ValueError as exc:
            raise ValueError(
                f"function arguments must be a JSON string, got {show(value, 80)} ({exc})"
            ) from None
        except RecursionError:
            raise ValueError("function arguments are nested too deeply to be JSON") from None
        return value


class ToolCall(_Frozen):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(BaseModel):
    """One chat message. Immutable; build a new one to change it.

    Construction errors raise :class:`~ctxguard.errors.InvalidMessageError`.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    role: Role
    content: str | tuple[ContentPart, ...] | None = None
    name: Annotated[str, Strict()] | None = None
    tool_calls: tuple[ToolCall, ...] | None = None
    tool_call_id: Annotated[str, Strict()] | None = None
    id: Annotated[str, Strict()] = Field(default_factory=new_message_id)
    created_at: datetime = Field(default_factory=lambda: datetime.now(UTC))
    metadata: dict[str, Any] = Field(default_factory=dict)
    extra: dict[str, Any] = Field(default_factory=dict)

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except pydantic.ValidationError as exc:
            raise InvalidMessageError(_describe(exc, data)) from None

    @field_validator("id")
    @classmethod
    def _valid_id(cls, value: str, info: pydantic.ValidationInfo) -> str:
        # Fast path: printable ASCII has no control or surrogate characters and one
        # byte per character; everything else gets validate_id's full check (a stored
        # record's id the rule it was written under: see from_record).
        if value.isascii() and value.isprintable() and 0 < len(value) <= MAX_ID_BYTES:
            return value
        return validate_id(value, "message id", stored=info.context is _STORED)

    @field_validator("role", mode="before")
    @classmethod
    def _role_is_text(cls, value: Any) -> Any:
        if type(value) is not str:
            raise ValueError("role must be text")
        return value

    @field_validator("metadata", "extra")
    @classmethod
    def _json_values(cls, value: dict[str, Any], info: pydantic.ValidationInfo) -> dict[str, Any]:
        """Stored as JSON and read back: anything else (bytes, sets, NaN) would not round-trip."""
        if value:
            problem = json_problem(value, str(info.field_name))
            if problem is not None:
                raise ValueError(problem)
        return value

    @field_validator("content", mode="before")
    @classmethod
    def _content_type(cls, value: Any) -> Any:
        if value is None or isinstance(value, str):
            return value
        if isinstance(value, list | tuple):
            return tuple(value)
        raise ValueError(
            f"content must be a string, a list of content parts or None, got {type(value).__name__}"
        )

    @model_validator(mode="after")
    def _role_rules(self) -> Message:
        if self.role == "tool":
            if not self.tool_call_id:
                raise ValueError(
                    "a tool message needs tool_call_id (the id of the call it answers)"
                )
            if isinstance(self.content, tuple) and any(
                not isinstance(p, TextPart) for p in self.content
            ):
                raise ValueError("tool message content may only hold text parts")
        elif self.tool_call_id is not None:
            raise ValueError(f"tool_call_id is only allowed on tool messages, not {self.role}")
        if self.tool_calls is not None and self.role != "assistant":
            raise ValueError(f"tool_calls are only allowed on assistant messages, not {self.role}")
        if self.role in ("system", "developer", "user") and self.content is None:
            raise ValueError(f"a {self.role} message needs content")
        clash = _OWN_KEYS.intersection(self.extra) | _CTXGUARD_KEYS.intersection(self.extra)
        if clash:
            raise ValueError(f"extra must not repeat modelled keys: {sorted(clash)}")
        _made.last = (self, self._serialise())
        return self

    def _serialise(self, compact: bool = True) -> str:
        """The JSON record, made once: a message that cannot be stored is not a message.

        Lone surrogates, bytes or arbitrary objects in metadata fail here, at
        construction, as InvalidMessageError, instead of later inside a store.
        """
        try:
            if compact and self._plain() and isinstance(self.content, str):
                micros = micros_of(self.created_at)
                if micros is not None:  # the positional record (_record_time.py)
                    time = positional_time(self.id, micros)
                    return positional_record(self.role, self.content, self.id, time)
            # empty metadata / extra are left out (they decode to {}): on short
            # messages they were a tenth of what Redis stores per message
            empty = {name for name in ("metadata", "extra") if not getattr(self, name)}
            suffix = time_suffix(self.created_at) if compact else None
            if suffix is None:
                return self.model_dump_json(exclude_none=True, exclude=empty or None)
            empty.add("created_at")
            return self.model_dump_json(exclude_none=True, exclude=empty)[:-1] + suffix
        except (PydanticSerializationError, UnicodeError, ValueError, RecursionError) as exc:
            detail = str(exc).splitlines()[0][:160]
            if isinstance(exc, UnicodeError) or "surrogates not allowed" in detail:
                # (pydantic's words name Python's codec error: say what is wrong instead)
                detail = (
                    "a string holds a lone UTF-16 surrogate, \\ud800-\\udfff without its "
                    "pair, which is not Unicode text; send valid UTF-8 text"
                )
            raise ValueError(f"the message cannot be stored as JSON ({detail})") from None

    def _plain(self) -> bool:
        """A role with a code and nothing but content, id and time (content not checked)."""
        return (
            self.role in ROLE_CODES
            and self.name is None
            and self.tool_calls is None
            and self.tool_call_id is None
            and not self.metadata
            and not self.extra
        )

    # -- conversions -------------------------------------------------------

    @classmethod
    def from_openai(
        cls,
        data: Mapping[str, Any],
        *,
        id: str | None = None,  # noqa: A002 - mirrors the field name
        metadata: Mapping[str, Any] | None = None,
    ) -> Message:
        """Build from an OpenAI chat-completions message dict.

        Keys ctxguard does not model are kept in ``extra`` and given back by
        :meth:`to_openai`. ``id``, ``created_at`` and ``metadata`` keys in the dict
        are taken as ctxguard's own fields.
        """
        if type(data) is dict and len(data) == 2 and cls is Message and metadata is None:
            made = _plain_message(data, id)
            if made is not None:
                return made
        if not isinstance(data, Mapping):
            raise InvalidMessageError(
                f"a message must be a dict like {{'role': 'user', 'content': 'hi'}}, "
                f"got {type(data).__name__}"
            )
        try:
            fields = {k: v for k, v in data.items() if k in _OWN_KEYS or k in _CTXGUARD_KEYS}
            fields["extra"] = {k: v for k, v in data.items() if k not in fields}
        except Exception as exc:  # a mapping of the caller's whose reading raises
            raise InvalidMessageError(_raised("reading the message", exc)) from exc
        if id is not None:
            fields["id"] = id
        if metadata is not None:
            fields["metadata"] = dict(metadata)
        return cls(**fields)

    def to_openai(self) -> dict[str, Any]:
        """The OpenAI chat-completions dict for this message (no ctxguard fields)."""
        out: dict[str, Any] = {"role": self.role, "content": _content_out(self.content)}
        if self.name is not None:
            out["name"] = self.name
        if self.tool_calls is not None:
            out["tool_calls"] = [c.model_dump(mode="json") for c in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        out.update(self.extra)
        return out

    def to_record(self) -> str:
        """The JSON record stored for this message (never a cached copy: ``model_copy``
        with ``update`` skips validation, so a record made at construction could be stale)."""
        return self._serialise()

    @classmethod
    def from_record(cls, raw: str | bytes) -> Message:
        """Decode a stored record; raises pydantic or JSON errors for the store to wrap.

        Records are validated straight from JSON (same fields, validators and
        config), skipping the second, Python-side validation that the custom
        ``__init__`` would add. A record that fails is decoded again the usual
        way, so errors are exactly what :meth:`model_validate_json` raises.
        """
        raw = expand_record(raw)
        if cls is Message:
            try:
                return _record_validator().validate_json(  # type: ignore[no-any-return]
                    raw, context=_STORED
                )
            except pydantic.ValidationError:
                pass
        return cls.model_validate_json(raw, context=_STORED)

    @property
    def text(self) -> str:
        """The message's text (text parts joined); empty for non-text content."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content if isinstance(p, TextPart))

    @property
    def is_pinned_role(self) -> bool:
        return self.role in PINNED_ROLES


MessageLike = Message | Mapping[str, Any]

# the roles a plain ``{"role", "content": str}`` dict may take without the full validation
_PLAIN_ROLES = frozenset({"system", "developer", "user", "assistant"})
_PLAIN_FIELDS_SET = frozenset({"role", "content", "extra"})  # what from_openai's call sets
_setattr = object.__setattr__


def _plain_message(data: dict[str, Any], id: str | None) -> Message | None:  # noqa: A002
    """``Message(role=..., content=..., extra={}, [id=...])`` for the commonest dict, a
    ``{"role": <not tool>, "content": <str>}`` (most turns' user message and reply),
    without running pydantic's validation on it: for exactly this shape every check
    is one of the few below and passes (role a plain str among the four that need no
    tool fields, content a plain str, no metadata or extra, a printable ASCII id), so
    the instance is the one validation would build, field for field. Anything else,
    and a message whose JSON cannot be made (a lone surrogate), is None: the full
    path then builds it or raises its usual error (tests/test_messages.py pins both).
    """
    role = data.get("role")
    content = data.get("content")
    if type(role) is not str or role not in _PLAIN_ROLES or type(content) is not str:
        return None  # (a missing key is None here: two keys, not these two, go the full way)
    given = id is not None
    ms: int | None
    if id is None:  # default factories in field order: id, then time
        id, ms = new_message_id_ms()  # noqa: A001 - (ms: what ulid_ms reads from it)
    elif type(id) is not str or not (id.isascii() and id.isprintable()):
        return None  # (validate_id's full check, with its errors)
    elif not 0 < len(id) <= MAX_ID_BYTES:
        return None
    else:
        ms = ulid_ms(id)
    created_at = datetime.now(UTC)
    micros = (created_at - EPOCH) // MICROSECOND
    try:  # what _serialise makes of this shape: the positional record
        record = positional_record(role, content, id, micros if ms is None else micros - ms * 1000)
    except (PydanticSerializationError, UnicodeError, ValueError):
        return None  # the full path raises its InvalidMessageError
    fields_set = set(_PLAIN_FIELDS_SET)
    if given:
        fields_set.add("id")
    message = _plain_instance(role, content, id, created_at, fields_set)
    _made.last = (message, record)
    return message


def _plain_instance(
    role: str,
    content: str,
    message_id: str,
    created_at: datetime,
    fields_set: set[str],
) -> Message:
    """The instance pydantic's validation builds of a plain message (role, str content,
    id, time; every other field its default), made without the pass: the fields set is
    the caller's (what the validation was given)."""
    message = Message.__new__(Message)
    _setattr(
        message,
        "__dict__",
        {
            "role": role,
            "content": content,
            "name": None,
            "tool_calls": None,
            "tool_call_id": None,
            "id": message_id,
            "created_at": created_at,
            "metadata": {},
            "extra": {},
        },
    )
    _setattr(message, "__pydantic_fields_set__", fields_set)
    _setattr(message, "__pydantic_extra__", None)
    _setattr(message, "__pydantic_private__", None)
    return message


_CODE_ROLES = {code: role for role, code in ROLE_CODES.items()}
_RECORD_FIELDS_SET = frozenset({"role", "content", "id", "created_at"})  # a record's keys
_STORED_EPOCH = EPOCH.replace(tzinfo=TzInfo(0))  # pydantic's tzinfo of a parsed "...Z"


def plain_from_record(raw: str | bytes) -> Message | None:
    """The message a positional record (``["u",<content>,"<id>",<time>]``, see
    ``_record_time``) decodes to, built without pydantic's pass, ~5x faster: a cold
    window is dozens of records. Only for a record that is byte for byte what the writer
    makes of the values pydantic-core's own JSON parser reads from it (so the ISO record
    it expands to is the one those values make), with a plain role code, str content,
    an id the validation's fast path takes (printable ASCII, at most ``MAX_ID_BYTES``)
    and a time datetime can hold: for exactly these every check of the validation
    passes, and the instance is the one :meth:`Message.from_record` builds, field for
    field (the fields set, pydantic's ``TzInfo``). Anything else is None: the full
    decode then builds it or raises its usual error (tests/test_positional_record.py
    compares the two on every record it makes and on damaged ones)."""
    if type(raw) is str:
        try:
            raw = raw.encode()
        except UnicodeError:
            return None
    if raw[:2] != b'["':
        return None
    try:
        data = from_json(raw)
    except ValueError:
        return None
    if type(data) is not list or len(data) != 4:
        return None
    code, content, id_, time = data
    role = _CODE_ROLES.get(code) if type(code) is str else None
    if role is None or type(content) is not str or type(id_) is not str or type(time) is not int:
        return None
    if not (id_.isascii() and id_.isprintable() and 0 < len(id_) <= MAX_ID_BYTES):
        return None
    try:
        if to_json(data) != raw:
            return None  # not the writer's bytes (spacing, escapes, "-0"): the full way
        ms = ulid_ms(id_)
        created_at = _STORED_EPOCH + (time if ms is None else time + ms * 1000) * MICROSECOND
    except (OverflowError, PydanticSerializationError, ValueError):
        return None
    return _plain_instance(role, content, id_, created_at, set(_RECORD_FIELDS_SET))


def says_nothing(message: Message) -> bool:
    """An assistant message with no content, no tool calls and nothing else a server reads
    (a refusal, audio): OpenAI-style servers and Mistral's templates refuse it."""
    return (
        message.role == "assistant"
        and message.content is None
        and not message.tool_calls
        and not message.extra
    )


def iso_record(message: Message) -> str:
    """The record as earlier releases wrote it (``created_at`` in ISO form, in field
    order): what the CLI shows and exports."""
    return message._serialise(compact=False)


# The record the last message validated in this thread serialised to (its check that it
# can be stored), so that a message made to be appended now is not serialised twice.
_made = threading.local()


def record_of(message: Message) -> str:
    """``message.to_record()``; the JSON its validation just made when ``message`` is the
    one this thread validated last (nothing ran on it since: the same JSON), once."""
    last = getattr(_made, "last", None)
    if last is not None and last[0] is message:
        _made.last = None
        return last[1]  # type: ignore[no-any-return]
    return message.to_record()


# The validation context of a stored record: its id is held to the rule it was written
# under (a format character an older version took still reads back).
_STORED: dict[str, bool] = {"stored": True}


@lru_cache(maxsize=1)
def _record_validator() -> SchemaValidator:
    """Message's own core schema with ``custom_init`` off (see :meth:`Message.from_record`)."""

    def without_custom_init(schema: Any) -> Any:
        if isinstance(schema, dict):
            if schema.get("type") == "model" and schema.get("custom_init"):
                schema = {**schema, "custom_init": False}
            return {k: without_custom_init(v) for k, v in schema.items()}
        if isinstance(schema, list):
            return [without_custom_init(v) for v in schema]
        return schema

    # The model's own core config (extra="forbid" ...) travels inside its schema.
    return SchemaValidator(without_custom_init(Message.__pydantic_core_schema__))


def to_message(value: MessageLike) -> Message:
    """Accept a :class:`Message` or an OpenAI dict; anything else is a typed error."""
    if isinstance(value, Message):
        _made.last = None  # made by the caller, who may have changed its dicts since
        return value
    return Message.from_openai(value)


def to_messages(values: Iterable[MessageLike], what: str = "messages") -> list[Message]:
    """Convert a batch, failing on the first bad message with its index."""
    out: list[Message] = []
    try:
        for index, value in enumerate(check_message_batch(values, what)):
            try:
                out.append(to_message(value))
            except InvalidMessageError as exc:
                raise InvalidMessageError(f"message {index}: {exc}") from None
    except CtxGuardError:
        raise
    except Exception as exc:  # an iterable of the caller's that raises part way
        raise InvalidMessageError(_raised(f"{what}: iterating them", exc)) from exc
    return out


def _raised(doing: str, exc: Exception) -> str:
    from ctxguard._secrets import describe  # (only on this path: stores import this module)

    return f"{doing} raised {describe(exc, 200)}; nothing was stored"


def _content_out(content: str | tuple[TextPart | ImagePart, ...] | None) -> Any:
    if content is None or isinstance(content, str):
        return content
    return [p.model_dump(mode="json", exclude_none=True) for p in content]


def system(content: str, **kw: Any) -> Message:
    return Message(role="system", content=content, **kw)


def user(content: str, **kw: Any) -> Message:
    return Message(role="user", content=content, **kw)


def assistant(content: str | None, **kw: Any) -> Message:
    return Message(role="assistant", content=content, **kw)


def tool(content: str, tool_call_id: str, **kw: Any) -> Message:
    return Message(role="tool", content=content, tool_call_id=tool_call_id, **kw)
