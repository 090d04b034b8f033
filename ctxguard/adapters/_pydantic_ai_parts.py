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
``metadata['pydantic_ai']``, so the stored history reads back exactly. A window that
keeps only some pieces of a request (its pinned system prompt, say) gets that
request with those parts only.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator, Sequence
from typing import Any

from ctxguard.errors import InvalidMessageError, MissingDependencyError
from ctxguard.ids import new_message_id
from ctxguard.messages import FunctionCall, ImagePart, Message, TextPart, ToolCall

try:
    from pydantic_ai import messages as pai
except ImportError as exc:  # pragma: no cover - exercised in a subprocess test
    raise MissingDependencyError("ctxguard.adapters.pydantic_ai", "pydantic-ai") from exc

META_KEY = "pydantic_ai"
ID_KEY = "ctxguard_id"  # in a Pydantic AI message's own metadata, once it is stored
Place = tuple[int, tuple[int, ...]]  # (message index, part indices) of one piece


@dataclasses.dataclass(frozen=True)
class Pieces:
    """A history as ctxguard messages, and where each one came from."""

    messages: list[Message]
    places: list[Place]


def to_pieces(
    history: Sequence[pai.ModelMessage], *, keep: bool = False, start: int = 0
) -> Pieces:
    """``history`` as ctxguard messages; ``keep`` stores each message whole in its first
    piece. Messages before ``start`` give no pieces (they only say which calls are open)."""
    out = Pieces([], [])
    open_calls: set[str] = set()
    for index, message in enumerate(history):
        if isinstance(message, pai.ModelResponse):
            pieces = [(_response_piece(message), tuple(range(len(message.parts))))]
            open_calls = {p.tool_call_id for p in message.parts if _is_call(p)}
        elif isinstance(message, pai.ModelRequest):
            pieces = list(_request_pieces(message, open_calls))
            open_calls = set()
        else:
            raise InvalidMessageError(
                f"history[{index}] must be a Pydantic AI ModelRequest or ModelResponse, "
                f"got {type(message).__name__}"
            )
        if index < start:
            continue
        base = _stored_id(message)
        for number, (piece, parts) in enumerate(pieces):
            meta: dict[str, Any] = {"parts": list(parts)}
            if keep and number == 0:
                meta["message"] = dump(message)
            update: dict[str, Any] = {"metadata": {META_KEY: meta}}
            if base is not None:
                update["id"] = base if number == 0 else f"{base}.{number}"
            out.messages.append(piece.model_copy(update=update))
            out.places.append((index, parts))
    return out


def dump(message: pai.ModelMessage) -> dict[str, Any]:
    """Pydantic AI's own JSON of one message (its serialisation boundary)."""
    data: dict[str, Any] = pai.ModelMessagesTypeAdapter.dump_python([message], mode="json")[0]
    return data


def load(data: Any) -> pai.ModelMessage:
    return pai.ModelMessagesTypeAdapter.validate_python([data])[0]


def _stored_id(message: pai.ModelMessage) -> str | None:
    value = (message.metadata or {}).get(ID_KEY)
    return value if isinstance(value, str) and value else None


def stamp(message: pai.ModelMessage) -> str:
    """The id ctxguard stores ``message`` under, minted (in its metadata) on first use."""
    found = _stored_id(message)
    if found is None:
        found = new_message_id()
        message.metadata = {**(message.metadata or {}), ID_KEY: found}
    return found


# -- requests ----------------------------------------------------------------------


def _request_pieces(
    message: pai.ModelRequest, open_calls: set[str]
) -> Iterator[tuple[Message, tuple[int, ...]]]:
    if not message.parts:  # an interrupted request: kept in the history, sends nothing
        yield Message(role="user", content=""), ()
    for index, part in enumerate(message.parts):
        yield _request_piece(part, open_calls), (index,)


def _request_piece(part: Any, open_calls: set[str]) -> Message:
    if isinstance(part, pai.SystemPromptPart):
        return Message(role="system", content=part.content)
    if isinstance(part, pai.UserPromptPart):
        return Message(role="user", content=_user_content(part.content))
    if isinstance(part, pai.BaseToolReturnPart):
        text = part.model_response_str()
        if part.tool_call_id in open_calls:
            return Message(role="tool", content=text, tool_call_id=part.tool_call_id)
        return Message(role="user", content=text)  # answers no call in view: plain text
    if isinstance(part, pai.RetryFeedbackPart):
        return Message(role="user", content=part.model_response())
    if isinstance(part, pai.SpeechPart):
        return Message(role="user", content=part.transcript or "")
    if isinstance(part, pai.CompactionPart):
        return Message(role="user", content=part.content or _json_text(part))
    # instruction deltas and baselines, tool availability, capability loads, settings:
    # what the request tells the model about itself, pinned like the system prompt
    return Message(role="system", content=_text_or_json(part))


def _user_content(content: Any) -> str | list[Any]:
    if isinstance(content, str):
        return content
    parts: list[TextPart | ImagePart] = []
    for item in content:
        if isinstance(item, str):
            parts.append(TextPart(text=item))
        elif isinstance(item, pai.TextContent):
            parts.append(TextPart(text=item.content))
        elif isinstance(item, pai.ImageUrl):
            parts.append(ImagePart(image_url={"url": item.url}))
        elif isinstance(item, pai.BinaryContent) and item.is_image:
            parts.append(ImagePart(image_url={"url": item.data_uri}))
        elif isinstance(item, pai.CachePoint):
            continue
        else:  # audio, video, documents, uploaded files: named, so the turn keeps its shape
            parts.append(TextPart(text=f"[{type(item).__name__}: {_identifier(item)}]"))
    return parts or ""


def _identifier(item: Any) -> str:
    for attr in ("url", "identifier", "file_id"):
        value = getattr(item, attr, None)
        if isinstance(value, str):
            return value
    return type(item).__name__


# -- responses ---------------------------------------------------------------------


def _is_call(part: Any) -> bool:
    return isinstance(part, pai.ToolCallPart) and not isinstance(part, pai.NativeToolCallPart)


def _response_piece(message: pai.ModelResponse) -> Message:
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
    content = "\n\n".join(texts) if texts or not calls else None
    return Message(role="assistant", content=content, tool_calls=calls or None)


def _arguments(part: Any) -> str:
    raw = part.args_as_json_str()
    try:
        json.loads(raw)
    except ValueError:
        return json.dumps(raw)  # malformed arguments from a model: counted as the text they are
    return str(raw)


def _text_or_json(part: Any) -> str:
    for attr in ("content", "transcript"):
        value = getattr(part, attr, None)
        if isinstance(value, str) and value:
            return value
    return _json_text(part)


def _json_text(part: Any) -> str:
    data = dataclasses.asdict(part) if dataclasses.is_dataclass(part) else {}
    data = {k: v for k, v in data.items() if k not in ("timestamp", "part_kind") and v}
    return json.dumps(data, default=str, ensure_ascii=False, sort_keys=True)


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
        index, parts = pieces.places[origin]
        chosen.setdefault(index, []).append((parts, message))
    out: list[pai.ModelMessage] = []
    for index in sorted(chosen):
        original, picked = history[index], chosen[index]
        total = sum(1 for i, _ in pieces.places if i == index)
        if len(picked) == total and not any(_was_shrunk(m) for _, m in picked):
            out.append(original)
            continue
        parts = [_shrunk(original.parts[p], m) for ps, m in picked for p in ps]
        out.append(dataclasses.replace(original, parts=parts))  # type: ignore[type-var]
    return out


def _was_shrunk(piece: Message) -> bool:
    return "ctxguard_truncated" in piece.metadata


def _shrunk(part: Any, piece: Message) -> Any:
    """A part whose piece the guard shortened, with the text that was counted."""
    if not _was_shrunk(piece):
        return part
    if isinstance(part, pai.BaseToolReturnPart | pai.UserPromptPart | pai.SystemPromptPart):
        return dataclasses.replace(part, content=piece.text)
    return part
