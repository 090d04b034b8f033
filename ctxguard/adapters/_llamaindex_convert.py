"""LlamaIndex messages <-> ctxguard messages, and the argument checks both LlamaIndex rooms share.

Messages round-trip losslessly: tool calls (``additional_kwargs['tool_calls']`` or
``ToolCallBlock``) become OpenAI tool calls for counting and validity checks, and
whatever the OpenAI shape cannot hold rides in ``Message.metadata['llama_index']``.
Pydantic objects in ``additional_kwargs`` (``llama-index-llms-openai`` keeps the SDK's
``ChatCompletionMessageToolCall`` / ``ChoiceDeltaToolCall`` there) come back as their
JSON dicts, the form LlamaIndex's own chat stores give back and OpenAI clients accept.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel

from ctxguard._validate import show, type_name
from ctxguard.adapters import _media, _shared
from ctxguard.errors import InvalidMessageError, MissingDependencyError
from ctxguard.messages import FunctionCall, ImagePart, Message, TextPart, ToolCall

try:
    from llama_index.core.base.llms.types import (
        AudioBlock,
        ChatMessage,
        DocumentBlock,
        ImageBlock,
        TextBlock,
        ToolCallBlock,
        VideoBlock,
    )
except ImportError as exc:  # pragma: no cover - exercised in a subprocess test
    raise MissingDependencyError("ctxguard.adapters.llamaindex", "llamaindex") from exc

META_KEY = "llama_index"
_ROLES = {"system", "developer", "user", "assistant", "tool"}
_ALIASES = {"chatbot": "assistant", "model": "assistant"}


# -- conversion ------------------------------------------------------------------


def to_ctxguard(message: ChatMessage) -> Message:
    """A LlamaIndex ``ChatMessage`` as a ctxguard :class:`Message`; see :func:`to_llamaindex`."""
    role = _role(message)
    fields: dict[str, Any] = {"role": role, "content": _content_in(message, role)}
    kwargs = message.additional_kwargs
    if role == "tool":
        fields["tool_call_id"] = kwargs.get("tool_call_id")
        if not fields["tool_call_id"]:
            raise InvalidMessageError(
                "a LlamaIndex tool message needs additional_kwargs['tool_call_id'] "
                "(the id of the call it answers)"
            )
    calls = _tool_calls_in(message)
    if calls:
        fields["tool_calls"] = calls
    base = Message(**fields)
    meta = _extra_fields(message, base)
    return base.model_copy(update={"metadata": {META_KEY: meta}}) if meta else base


def to_llamaindex(message: Message) -> ChatMessage:
    """A ctxguard :class:`Message` (from any adapter or raw OpenAI dicts) as a ``ChatMessage``."""
    data = _generic(message)
    meta = dict(message.metadata.get(META_KEY) or {})
    if "ctxguard_truncated" in message.metadata:
        meta.pop("blocks", None)  # the guard shrank it: send what was counted
    data.update(meta)
    return ChatMessage.model_validate(data)


def _role(message: ChatMessage) -> str:
    role = str(message.role.value)
    role = _ALIASES.get(role, role)
    if role not in _ROLES:
        raise InvalidMessageError(
            f"LlamaIndex role {role!r} has no chat-completions equivalent ctxguard can "
            "store; use system, developer, user, assistant or tool"
        )
    return role


def _content_in(message: ChatMessage, role: str) -> str | list[TextPart | ImagePart] | None:
    blocks = [b for b in message.blocks if not isinstance(b, ToolCallBlock)]
    if len(blocks) == 1 and isinstance(blocks[0], TextBlock):
        return blocks[0].text
    if not any(isinstance(b, _MEDIA) for b in blocks):
        if any(not isinstance(b, TextBlock) for b in blocks):
            return message.content or ""  # thinking, citations: their text is what is counted
        return [TextPart(text=b.text) for b in blocks if isinstance(b, TextBlock)] or (
            None if role == "assistant" else ""
        )
    parts: list[TextPart | ImagePart] = []  # text and images (other blocks: as above)
    for index, block in enumerate(blocks):
        if isinstance(block, TextBlock):
            parts.append(TextPart(text=block.text))
        elif isinstance(block, _MEDIA):
            where = f"a {role} ChatMessage's blocks[{index}] ({type(block).__name__})"
            parts.append(_media_part(block, where, role))
    return parts


_MEDIA = (ImageBlock, AudioBlock, VideoBlock, DocumentBlock)


def _media_part(block: Any, where: str, role: str) -> ImagePart:
    """An image a chat message can hold as its ``image_url`` part (URL or data URL, as
    llama-index-llms-openai sends it); anything else refused (UncountableContentError)."""
    if not isinstance(block, ImageBlock) or role == "tool":  # a tool message holds text
        raise _media.uncountable(where, block.block_type)
    if block.url is not None:
        return _media.image_part(str(block.url))
    mime = block.image_mimetype or "image/png"
    if isinstance(block.image, bytes):  # LlamaIndex keeps it base64-encoded
        return _media.image_part(_media.data_url(block.image, mime, encoded=True))
    try:
        data = block.resolve_image(as_base64=True).read()
    except (OSError, ValueError) as exc:
        raise InvalidMessageError(
            f"{where} cannot be read ({type_name(exc)}): give a readable "
            "path, the image's bytes or a URL"
        ) from None
    return _media.image_part(_media.data_url(data, mime, encoded=True))


def _tool_calls_in(message: ChatMessage) -> list[ToolCall]:
    blocks = [b for b in message.blocks if isinstance(b, ToolCallBlock)]
    if blocks:
        return [_from_block(b) for b in blocks]
    raw = message.additional_kwargs.get("tool_calls") or []
    if not isinstance(raw, list | tuple):
        raise InvalidMessageError(
            f"additional_kwargs['tool_calls'] must be a list of OpenAI tool calls, got "
            f"{type_name(raw)}; wrap one call in a list"
        )
    return [
        _from_openai(c.model_dump() if hasattr(c, "model_dump") else c, i)
        for i, c in enumerate(raw)
    ]


def _from_block(block: ToolCallBlock) -> ToolCall:
    if not block.tool_call_id:
        raise InvalidMessageError(f"ToolCallBlock {block.tool_name!r} has no tool_call_id")
    return ToolCall(
        id=block.tool_call_id,
        function=FunctionCall(name=block.tool_name, arguments=_json_arguments(block.tool_kwargs)),
    )


def _from_openai(call: object, index: int) -> ToolCall:
    where = f"additional_kwargs['tool_calls'][{index}]"
    if not isinstance(call, dict):
        raise InvalidMessageError(
            f"{where} must be an OpenAI tool call (a dict with 'id' and 'function'), "
            f"got {type_name(call)}"
        )
    function = call.get("function") or {}
    if not isinstance(function, dict):
        raise InvalidMessageError(
            f"{where}['function'] must be a dict with 'name' and 'arguments', "
            f"got {type_name(function)}"
        )
    if not call.get("id"):
        raise InvalidMessageError(
            f"{where} ({show(function.get('name'))}) has no id; providers pair results by "
            "id, so give each tool call its 'id'"
        )
    return ToolCall(
        id=call["id"],
        function=FunctionCall(
            name=function.get("name", ""),
            arguments=_json_arguments(function.get("arguments") or "{}"),
        ),
    )


def _json_arguments(value: Any) -> str:
    if isinstance(value, str):
        try:
            json.loads(value)
        except ValueError:
            return json.dumps(value)  # not JSON: counted as a string, original kept in metadata
        return value
    return json.dumps(value, ensure_ascii=False)


def _generic(message: Message) -> dict[str, Any]:
    """The ``ChatMessage`` fields a ctxguard message implies (before its metadata)."""
    kwargs: dict[str, Any] = {}
    if message.tool_calls:
        kwargs["tool_calls"] = [c.model_dump(mode="json") for c in message.tool_calls]
    if message.tool_call_id is not None:
        kwargs["tool_call_id"] = message.tool_call_id
    if message.name is not None:
        kwargs["name"] = message.name
    return {
        "role": message.role,
        "additional_kwargs": kwargs,
        "blocks": [_block(p) for p in _parts(message.content)],
    }


def _parts(content: str | tuple[TextPart | ImagePart, ...] | None) -> tuple[Any, ...]:
    if content is None:
        return ()
    if isinstance(content, str):
        return (TextPart(text=content),)
    return content


def _block(part: TextPart | ImagePart) -> dict[str, Any]:
    if isinstance(part, TextPart):
        return {"block_type": "text", "text": part.text}
    return {"block_type": "image", "url": part.image_url.url}


def _extra_fields(message: ChatMessage, base: Message) -> dict[str, Any]:
    """The fields ``base`` cannot rebuild: the smallest set that round-trips."""
    try:
        full = json.loads(message.model_dump_json())
    except Exception as exc:  # pydantic raises several types for unserialisable values
        raise InvalidMessageError(f"LlamaIndex message is not JSON-serialisable ({exc})") from None
    generic = json.loads(ChatMessage.model_validate(_generic(base)).model_dump_json())
    small = {k: v for k, v in full.items() if generic.get(k) != v}
    expected = _plain_kwargs(message)
    for meta in (small, full):
        candidate = base.model_copy(update={"metadata": {META_KEY: meta}} if meta else {})
        if to_llamaindex(candidate) == expected:
            return meta
    raise InvalidMessageError(
        "LlamaIndex message does not survive a JSON round trip; ctxguard would change it, "
        "so it refuses to store it"
    )


def _plain_kwargs(message: ChatMessage) -> ChatMessage:
    """``message`` with the pydantic objects in its ``additional_kwargs`` as JSON dicts."""
    plain = {k: _plain(v) for k, v in message.additional_kwargs.items()}
    if plain == message.additional_kwargs:
        return message
    return message.model_copy(update={"additional_kwargs": plain})


def _plain(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


# -- argument checks ---------------------------------------------------------------


def _key(key: object) -> str:
    return _shared.check_key(key, "key (the chat store key is the session id)")


def _converted(key: object, messages: object) -> list[Message]:
    """Checked before any lock or I/O: a refused call stores nothing."""
    _key(key)
    return [to_ctxguard(m) for m in _shared.check_batch(messages, ChatMessage)]


def _checked_one(message: object) -> ChatMessage:
    _shared.check_message(message, ChatMessage)
    return message  # type: ignore[return-value]


def _converted_one(message: object) -> Message:
    _shared.check_message(message, ChatMessage)
    return to_ctxguard(message)  # type: ignore[arg-type]
