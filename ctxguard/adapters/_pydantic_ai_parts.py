"""Pydantic AI messages as ctxguard messages and back (imported by ``adapters.pydantic_ai``).

A Pydantic AI message becomes one or more ctxguard messages ("pieces"), so the
guard sees the chat shape providers check:

* a ``ModelRequest`` gives one piece per part: system prompts and the request's
  bookkeeping parts (instruction deltas, tool availability ...) as pinned system
  messages, user prompts and retry feedback as user messages, tool returns as tool
  messages answering the call before them;
* a ``ModelResponse`` is one assistant message, never split: its text, its tool calls,
  and its thinking and provider-specific parts (as text, so every counter counts them).

Only what is counted is in the pieces' content. The message itself travels whole,
as Pydantic AI's own JSON (``ModelMessagesTypeAdapter``), in the first piece's
``metadata['pydantic_ai']``, so the stored history reads back exactly; its id is a
digest of that JSON (:func:`content_id`). A window that
keeps only some pieces of a request (its pinned system prompt, say) gets that
request with those parts only.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Iterator, Sequence
from typing import Any, TypeGuard, cast

import pydantic

from ctxguard.adapters import _media, _shared
from ctxguard.errors import InvalidMessageError, MissingDependencyError
from ctxguard.messages import FunctionCall, ImagePart, Message, TextPart, ToolCall

try:
    from pydantic_ai import messages as pai
except ImportError as exc:  # pragma: no cover - exercised in a subprocess test
    raise MissingDependencyError("ctxguard.adapters.pydantic_ai", "pydantic-ai") from exc

META_KEY = "pydantic_ai"
STORED_ID = "ctxguard_id"  # Pydantic AI metadata: [stored id, digest] of a loaded message
Place = tuple[int, tuple[int, ...]]  # (message index, part indices) of one piece


@dataclasses.dataclass(frozen=True)
class Pieces:
    """A history as ctxguard messages, and where each one came from."""

    messages: list[Message]
    places: list[Place]


def to_pieces(history: Sequence[pai.ModelMessage], *, keep: bool = False, start: int = 0) -> Pieces:
    """``history`` as ctxguard messages; ``keep`` stores each message whole in its first
    piece. Messages before ``start`` give no pieces (they only say which calls are open)."""
    out = Pieces([], [])
    open_calls: set[str] = set()
    for index, message in enumerate(history):
        if isinstance(message, pai.ModelResponse):
            pieces = [(_response_piece(message, keep), tuple(range(len(message.parts))))]
            open_calls = {p.tool_call_id for p in message.parts if _is_call(p)}
        elif isinstance(message, pai.ModelRequest):
            pieces = list(_request_pieces(message, open_calls, f"history[{index}]"))
            open_calls = set()
        else:
            raise InvalidMessageError(
                f"history[{index}] must be a Pydantic AI ModelRequest or ModelResponse, "
                f"got {type(message).__name__}"
            )
        if index < start:
            continue
        whole = dump(message) if keep else None
        base = None if whole is None else _stored_id(message) or content_id(whole)
        for number, (piece, parts) in enumerate(pieces):
            meta: dict[str, Any] = {"parts": list(parts)}
            if whole is not None and number == 0:
                meta["message"] = whole
            update: dict[str, Any] = {"metadata": {META_KEY: meta}}
            if base is not None:
                update["id"] = base if number == 0 else f"{base}.{number}"
            out.messages.append(piece.model_copy(update=update))
            out.places.append((index, parts))
    return out


def _stored_id(message: pai.ModelMessage) -> str | None:
    """The id of the stored message :func:`from_stored` made ``message`` from (one not
    written by this adapter), so passing it back does not store it a second time; none
    once the message was changed (its digest no longer matches)."""
    found = (message.metadata or {}).get(STORED_ID)
    if not (isinstance(found, list) and len(found) == 2 and all(isinstance(f, str) for f in found)):
        return None
    unmarked = dataclasses.replace(message, metadata=None)
    return found[0] if content_id(dump(unmarked)) == found[1] else None


def dump(message: pai.ModelMessage) -> dict[str, Any]:
    """Pydantic AI's own JSON of one message (its serialisation boundary)."""
    data: dict[str, Any] = pai.ModelMessagesTypeAdapter.dump_python([message], mode="json")[0]
    return data


def load(data: Any) -> pai.ModelMessage:
    return pai.ModelMessagesTypeAdapter.validate_python([data])[0]


def content_id(data: Any) -> str:
    """The id a message is stored under: a digest of its JSON.

    Pydantic AI stamps every message with the time it was made, so two messages share
    an id only when they are the same message; a history passed to the next run (or
    a copy of it) is recognised, and nothing is stored twice.
    """
    return _shared.digest_id(data, "pai-")


# -- requests ----------------------------------------------------------------------


def _request_pieces(
    message: pai.ModelRequest, open_calls: set[str], where: str
) -> Iterator[tuple[Message, tuple[int, ...]]]:
    if not message.parts:  # an interrupted request: kept in the history, sends nothing
        yield Message(role="user", content=""), ()
    for index, part in enumerate(message.parts):
        yield _request_piece(part, open_calls, f"{where}.parts[{index}]"), (index,)


def _request_piece(part: Any, open_calls: set[str], where: str) -> Message:
    if isinstance(part, pai.SystemPromptPart):
        return Message(role="system", content=part.content)
    if isinstance(part, pai.UserPromptPart):
        return Message(role="user", content=_user_content(part.content, where))
    if isinstance(part, pai.BaseToolReturnPart):
        if part.files:  # sent beside the result's text (a user message of its own)
            kind = type(part.files[0]).__name__
            raise _media.uncountable(f"{where} ({type(part).__name__}) holding a {kind}", "file")
        text = part.model_response_str()
        if part.tool_call_id in open_calls:
            return Message(role="tool", content=text, tool_call_id=part.tool_call_id)
        return Message(role="user", content=text)  # answers no call in view: plain text
    if isinstance(part, pai.RetryFeedbackPart):
        return Message(role="user", content=part.model_response())
    if isinstance(part, pai.RetryPromptPart):  # deprecated: Pydantic AI upgrades it on load
        if part.tool_name and part.tool_call_id in open_calls:
            return Message(
                role="tool", content=part.model_response(), tool_call_id=part.tool_call_id
            )
        return Message(role="user", content=part.model_response())
    if isinstance(part, pai.SpeechPart):
        return Message(role="user", content=part.transcript or "")
    if isinstance(part, pai.CompactionPart):
        return Message(role="user", content=part.content or _json_text(part))
    if _CAPABILITY is not None and isinstance(part, _CAPABILITY):
        return _capability_piece(part)
    # instruction deltas and baselines, tool availability, capability loads, settings:
    # what the request tells the model about itself, pinned like the system prompt
    return Message(role="system", content=_text_or_json(part))


# Pydantic AI 2.78+: what a capability or the application tells the model mid-conversation
_CAPABILITY: Any = getattr(pai, "CapabilityPart", None)


def _capability_piece(part: Any) -> Message:
    """The application's own instruction (operator source) is pinned like a system
    prompt; anything else reaches the model in the conversation (Pydantic AI frames data
    in its kind's tag, and downgrades an instruction from another source to the user's
    turn), so it is a user message, its tag around it as it is counted."""
    rendering = getattr(part, "rendering", None)
    voice = getattr(rendering, "voice", None)
    source = getattr(getattr(part, "source", None), "source_kind", None)
    text = _text_or_json(part)
    if voice == "instruction" and source == "operator":
        return Message(role="system", content=text)
    tag = getattr(rendering, "tag", None)
    return Message(role="user", content=f"<{tag}>{text}</{tag}>" if tag else text)


def _user_content(content: Any, where: str) -> str | list[Any]:
    """Text as text; an image as its ``image_url`` part (a URL, or its bytes as a data
    URL, as Pydantic AI's OpenAI model sends it), for the counter to decide; any other
    file (a document, audio, video, an uploaded file) refused: UncountableContentError."""
    if isinstance(content, str):
        return content
    parts: list[TextPart | ImagePart] = []
    for index, item in enumerate(content):
        if isinstance(item, str):
            parts.append(TextPart(text=item))
        elif isinstance(item, pai.TextContent):
            parts.append(TextPart(text=item.content))
        elif not isinstance(item, pai.CachePoint):
            parts.append(_image(item, f"{where}.content[{index}] ({type(item).__name__})"))
    return parts or ""


def _image(item: Any, where: str) -> ImagePart:
    if isinstance(item, pai.ImageUrl):
        return _media.image_part(item.url)
    if isinstance(item, pai.BinaryContent) and item.is_image:
        return _media.image_part(item.data_uri)
    kind = str(getattr(item, "kind", "")).removesuffix("-url")  # audio, document, video
    if isinstance(item, pai.BinaryContent):
        kind = item.media_type.split("/")[0]
    raise _media.uncountable(where, kind if kind in ("audio", "document", "video") else "file")


# -- responses ---------------------------------------------------------------------


def _is_call(part: Any) -> TypeGuard[pai.ToolCallPart[Any]]:
    """A call the client answers (a native call is answered by the provider)."""
    return isinstance(part, pai.ToolCallPart) and not isinstance(part, pai.NativeToolCallPart)


def _response_piece(message: pai.ModelResponse, kept: bool = False) -> Message:
    """``kept``: stored with the message whole beside it, so a cut piece loses nothing."""
    texts: list[str] = []
    calls: list[ToolCall] = []
    for part in message.parts:
        if _is_call(part):
            calls.append(
                ToolCall(
                    id=part.tool_call_id,
                    function=FunctionCall(name=part.tool_name, arguments=_arguments(part)),
                )
            )
        elif isinstance(part, pai.TextPart):
            texts.append(part.content)
        elif isinstance(part, pai.ThinkingPart):
            texts.append(f"<think>\n{part.content}\n</think>")
        else:  # native tool calls and returns, files, compactions, speech: counted as sent
            texts.append(_text_or_json(part))
    text = "\n\n".join(texts) if texts or not calls else None
    plain = all(_is_call(p) or isinstance(p, pai.TextPart) for p in message.parts)
    # not only text: one text part, which the guard does not cut (see _shrunk)
    content = [TextPart(text=text)] if text and not (plain or kept) else text
    return Message(role="assistant", content=content, tool_calls=calls or None)


def _arguments(part: Any) -> str:
    raw = part.args_as_json_str()
    try:
        json.loads(raw)
    except ValueError:
        return json.dumps(raw)  # malformed arguments from a model: counted as the text they are
    return str(raw)


def _text_or_json(part: Any) -> str:
    if isinstance(part, pai.FilePart):  # sent as a file, not as its bytes in text
        return f"[file: {part.content.media_type}]"
    for attr in ("content", "transcript"):
        value = getattr(part, attr, None)
        if isinstance(value, str) and value:
            return value
    return _json_text(part)


@functools.cache
def _part_adapter(kind: str) -> pydantic.TypeAdapter[Any]:
    union = pai.ModelResponsePart if kind == "response" else pai.ModelRequestPart
    return pydantic.TypeAdapter(cast(Any, union))


def _json_text(part: Any) -> str:
    """A part with no text of its own, as Pydantic AI's JSON of it (less the timestamp);
    a file in it (a native tool's generated image, say) as ``[file: <media type>]``, as
    a FilePart is counted, never as its bytes in base64."""
    kind = "response" if isinstance(part, pai.NativeToolCallPart | pai.NativeToolReturnPart) else ""
    if isinstance(part, pai.BaseToolReturnPart):
        part = dataclasses.replace(part, content=_files_named(part.content))
    data = _part_adapter(kind or "request").dump_python(part, mode="json", exclude_none=True)
    data = {k: v for k, v in data.items() if k != "timestamp" and v not in ({}, [], "")}
    return json.dumps(data, ensure_ascii=False, sort_keys=True)


def _files_named(value: Any) -> Any:
    """``value`` with each BinaryContent in it (in lists, tuples and dict values) as its
    ``[file: <media type>]`` placeholder."""
    if isinstance(value, pai.BinaryContent):
        return f"[file: {value.media_type}]"
    if isinstance(value, list | tuple):
        return [_files_named(item) for item in value]
    if isinstance(value, dict):
        return {key: _files_named(item) for key, item in value.items()}
    return value


# -- back --------------------------------------------------------------------------


def from_stored(messages: Sequence[Message]) -> list[pai.ModelMessage]:
    """A stored history (this adapter's pieces, or any other messages) as Pydantic AI's."""
    out: list[pai.ModelMessage] = []
    names: dict[str, str] = {}
    for message in messages:
        meta = message.metadata.get(META_KEY)
        if isinstance(meta, dict):
            if "message" in meta:
                out.append(load(meta["message"]))
            continue  # a later piece of the message before
        converted = _generic(message, names)
        mark = [message.id, content_id(dump(converted))]
        converted = dataclasses.replace(converted, metadata={STORED_ID: mark})
        if message.tool_calls:
            names.update({c.id: c.function.name for c in message.tool_calls})
        out.append(converted)
    return out


def _generic(message: Message, names: dict[str, str]) -> pai.ModelMessage:
    """Messages not written by this adapter (OpenAI dicts, a ctxguard summary)."""
    if message.role == "assistant":
        parts: list[Any] = [pai.TextPart(content=message.text)] if message.text else []
        for call in message.tool_calls or ():
            parts.append(
                pai.ToolCallPart(call.function.name, call.function.arguments, tool_call_id=call.id)
            )
        return pai.ModelResponse(parts=parts)
    if message.role in ("system", "developer"):
        return pai.ModelRequest(parts=[pai.SystemPromptPart(message.text)])
    if message.role == "tool":
        call_id = message.tool_call_id or ""
        name = names.get(call_id, "tool")
        return pai.ModelRequest(
            parts=[pai.ToolReturnPart(name, message.text, tool_call_id=call_id)]
        )
    return pai.ModelRequest(parts=[pai.UserPromptPart(message.text)])


def window_messages(
    history: Sequence[pai.ModelMessage],
    pieces: Pieces,
    kept: Sequence[Message],
    origins: Sequence[int],
) -> list[pai.ModelMessage]:
    """The fitted window as Pydantic AI messages: the caller's own objects where whole,
    a request with only the parts kept where the window kept some of its pieces."""
    chosen: dict[int, list[tuple[tuple[int, ...], Message]]] = {}
    for message, origin in zip(kept, origins, strict=True):
        index, numbers = pieces.places[origin]
        chosen.setdefault(index, []).append((numbers, message))
    out: list[pai.ModelMessage] = []
    for index in sorted(chosen):
        original, picked = history[index], chosen[index]
        total = sum(1 for i, _ in pieces.places if i == index)
        if len(picked) == total and not any(_was_shrunk(m) for _, m in picked):
            out.append(original)
            continue
        if isinstance(original, pai.ModelResponse):  # one piece: cut, so its text was cut
            text = pai.TextPart(content=picked[0][1].text)
            kept_parts: Any = [text, *(p for p in original.parts if _is_call(p))]
        else:
            kept_parts = [_shrunk(original.parts[p], m) for ps, m in picked for p in ps]
        out.append(dataclasses.replace(original, parts=kept_parts))
    return out


def _was_shrunk(piece: Message) -> bool:
    return "ctxguard_truncated" in piece.metadata


def _shrunk(part: Any, piece: Message) -> Any:
    """A part whose piece the guard shortened, with the text that was counted. (A
    response is one piece, cut only when all its parts are text or calls: its text
    parts are sent as the one cut text; with thinking, native or file parts its content
    is one text part, which the guard refuses to cut, MessageTooLongError.)"""
    if not _was_shrunk(piece):
        return part
    if isinstance(part, pai.BaseToolReturnPart | pai.UserPromptPart | pai.SystemPromptPart):
        return dataclasses.replace(part, content=piece.text)
    return part
