"""LangChain messages as ctxguard messages and back, and LangChain tools as OpenAI schemas.

Lossless: ``tool_calls`` travel as OpenAI tool calls (``args`` as a JSON string);
everything LangChain-only (``additional_kwargs``, ``response_metadata``,
``usage_metadata``, ``artifact``, ``status``, content blocks OpenAI cannot express)
rides in ``Message.metadata['langchain']`` and is never sent to a model.
Imported by :mod:`ctxguard.adapters.langchain`, which re-exports the public names.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ctxguard._secrets import describe
from ctxguard._validate import check_tools, one_line, show
from ctxguard.adapters import _media, _shared
from ctxguard.adapters._shared import Tools
from ctxguard.errors import InvalidInputError, InvalidMessageError, MissingDependencyError
from ctxguard.ids import validate_id
from ctxguard.messages import FunctionCall, ImagePart, Message, TextPart, ToolCall

try:
    from langchain_core.messages import (
        AIMessage,
        BaseMessage,
        ChatMessage,
        HumanMessage,
        SystemMessage,
        ToolMessage,
        convert_to_messages,
        message_chunk_to_message,
    )
    from langchain_core.prompt_values import PromptValue
    from langchain_core.utils.function_calling import convert_to_openai_tool
except ImportError as exc:  # pragma: no cover - exercised in a subprocess test
    raise MissingDependencyError("ctxguard.adapters.langchain", "langchain") from exc

META_KEY = "langchain"
_ROLE_OF = {"human": "user", "ai": "assistant", "system": "system", "tool": "tool"}
_CLASS_OF: dict[str, type[BaseMessage]] = {
    "human": HumanMessage,
    "ai": AIMessage,
    "system": SystemMessage,
    "tool": ToolMessage,
    "chat": ChatMessage,
}
_KIND_OF_ROLE = {
    "user": "human",
    "assistant": "ai",
    "system": "system",
    "developer": "system",
    "tool": "tool",
}
_REBUILT = ("content", "tool_calls", "tool_call_id", "name", "id", "type", "role")


# -- conversion ------------------------------------------------------------------


def to_ctxguard(message: BaseMessage) -> Message:
    """A LangChain message as a ctxguard :class:`Message`; :func:`to_langchain` inverts it."""
    message = message_chunk_to_message(message)
    role = _role(message)
    fields: dict[str, Any] = {"role": role, "content": _content_in(message.content, role)}
    if isinstance(message, ToolMessage):
        fields["tool_call_id"] = message.tool_call_id
    elif message.name:
        fields["name"] = message.name
    if isinstance(message, AIMessage) and message.tool_calls:
        fields["tool_calls"] = [_tool_call_in(c) for c in message.tool_calls]
    if message.id:
        fields["id"] = stored_id(message.id)
    base = Message(**fields)
    meta = _extra_fields(message, base)
    return base.model_copy(update={"metadata": {META_KEY: meta}}) if meta else base


def to_langchain(message: Message) -> BaseMessage:
    """A ctxguard :class:`Message` (stored by any adapter or by raw OpenAI dicts) as LangChain."""
    meta = dict(message.metadata.get(META_KEY) or {})
    kind = meta.pop("type", None) or _KIND_OF_ROLE[message.role]
    if "ctxguard_truncated" in message.metadata:
        meta.pop("content", None)  # the guard shrank it: send what was counted
    data: dict[str, Any] = {"content": _content_out(message.content), "id": message.id}
    if message.name is not None:
        data["name"] = message.name
    if kind == "ai" and message.tool_calls:
        data["tool_calls"] = [_tool_call_out(c) for c in message.tool_calls]
    if kind == "tool":
        data["tool_call_id"] = message.tool_call_id
    if kind == "chat":
        data["role"] = message.role
    if message.role == "developer" and "additional_kwargs" not in meta:
        data["additional_kwargs"] = {"__openai_role__": "developer"}
    data.update(meta)
    return _CLASS_OF[kind](**data)


def _role(message: BaseMessage) -> str:
    if isinstance(message, ChatMessage):
        return str(message.role)
    if message.type == "system" and message.additional_kwargs.get("__openai_role__") == "developer":
        return "developer"
    if message.type not in _ROLE_OF:
        raise InvalidMessageError(
            f"LangChain {type(message).__name__} (type {message.type!r}) has no chat role "
            "ctxguard can store; use HumanMessage, AIMessage, SystemMessage or ToolMessage"
        )
    return _ROLE_OF[message.type]


def stored_id(value: str) -> str:
    """The ctxguard id of a LangChain message id: itself, or, when ctxguard cannot take it
    (too long, a control character), an id derived from it, the same every time (so a
    message passed again is recognised and stored once; its own id rides in metadata)."""
    try:
        return validate_id(value)
    except ValueError:
        return _shared.digest_id(value, "lc-")


def _tool_call_in(call: Any) -> ToolCall:
    if not call.get("id"):
        raise InvalidMessageError(
            f"tool call {call.get('name')!r} has no id; providers pair results by id, "
            "so ctxguard cannot store it"
        )
    arguments = json.dumps(call.get("args") or {}, ensure_ascii=False)
    return ToolCall(id=call["id"], function=FunctionCall(name=call["name"], arguments=arguments))


def _tool_call_out(call: ToolCall) -> dict[str, Any]:
    args = json.loads(call.function.arguments or "{}")
    if not isinstance(args, dict):
        args = {"arguments": args}
    return {"name": call.function.name, "args": args, "id": call.id, "type": "tool_call"}


def _content_in(content: str | list[Any], role: str) -> str | list[Any]:
    """OpenAI-expressible content as is; anything else as its text (the block list is kept)."""
    if isinstance(content, str):
        return content
    urls = [_image_url(block, role, index) for index, block in enumerate(content)]
    if any(urls):
        return [_text_or_image(block, url) for block, url in zip(content, urls, strict=True)]
    parts: list[TextPart | ImagePart] = []
    for block in content:
        part = _part(block, role)
        if part is None:
            return _text_of(content)
        parts.append(part)
    return parts


def _part(block: Any, role: str) -> TextPart | ImagePart | None:
    if not isinstance(block, dict):
        return None
    try:
        if block.get("type") == "text" and set(block) == {"type", "text"}:
            return TextPart(text=block["text"])
    except ValueError:
        return None
    return None


# content blocks that are not text (OpenAI's, LangChain's standard ones, Anthropic's)
_MEDIA = {
    "image_url": "image",
    "image": "image",
    "file": "file",
    "document": "file",
    "audio": "audio",
    "input_audio": "audio",
    "video": "video",
}


def _image_url(block: Any, role: str, index: int) -> str | None:
    """The URL (or data URL) of an image block a chat message can hold as an ``image_url``
    part; None for a block that is not an image, a file or audio. Any other such block
    (a file, audio, an image by file id or in a tool result) is refused
    (UncountableContentError): kept as the text beside it, it would count as nothing."""
    kind = block.get("type") if isinstance(block, dict) else None
    if not isinstance(kind, str) or kind not in _MEDIA:
        return None
    url = _url_of(block) if _MEDIA[kind] == "image" and role != "tool" else None
    if url is None:
        raise _media.uncountable(
            f"a {role} message's content[{index}] ({kind} block)", _MEDIA[kind]
        )
    return url


def _url_of(block: dict[str, Any]) -> str | None:
    inner = block.get("image_url")  # OpenAI: {"url": ...} (LangChain takes a bare string too)
    if isinstance(inner, dict):
        inner = inner.get("url")
    source = block.get("source")  # Anthropic: {"type": "url" | "base64", ...}
    source = source if isinstance(source, dict) else {}
    mime = block.get("mime_type") or source.get("media_type") or "image/png"
    for url in (inner, block.get("url"), source.get("url")):
        if isinstance(url, str) and url:
            return url
    for data in (block.get("base64"), block.get("data"), source.get("data")):
        if isinstance(data, str) and data and isinstance(mime, str):
            return _media.data_url(data.encode("ascii", "replace"), mime, encoded=True)
    return None  # a file id: nothing the guard can pass on


def _text_or_image(block: Any, url: str | None) -> TextPart | ImagePart:
    if url is not None:
        try:  # an OpenAI part as it is (its detail, cache_control)
            return ImagePart.model_validate(block)
        except ValueError:
            return _media.image_part(url)
    if isinstance(block, str):
        return TextPart(text=block)
    text = block.get("text") if isinstance(block, dict) else None
    return TextPart(text=text if isinstance(text, str) else "")


def _text_of(content: list[Any]) -> str:
    texts = [b.get("text") if isinstance(b, dict) else b for b in content]
    return "".join(t for t in texts if isinstance(t, str))


def _content_out(content: str | tuple[TextPart | ImagePart, ...] | None) -> str | list[Any]:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return [p.model_dump(mode="json", exclude_none=True) for p in content]


def _extra_fields(message: BaseMessage, base: Message) -> dict[str, Any]:
    """The LangChain fields ``base`` cannot rebuild: the smallest set that round-trips."""
    try:
        data = message.model_dump(mode="json")
    except Exception as exc:  # pydantic raises several types for unserialisable values
        raise InvalidMessageError(
            f"LangChain {type(message).__name__} holds a value that is not JSON ({exc}); "
            "ctxguard stores JSON only"
        ) from None
    defaults = {
        name: field.get_default(call_default_factory=True)
        for name, field in type(message).model_fields.items()
    }
    rebuilt = set(_REBUILT) - ({"name"} if message.type == "tool" else set())
    small = {k: v for k, v in data.items() if k not in rebuilt and v != defaults.get(k)}
    if _content_out(base.content) != message.content:
        small["content"] = data["content"]
    if message.type != _KIND_OF_ROLE[base.role]:
        small["type"] = message.type
    if message.id != base.id:
        small["id"] = message.id
    if _rebuilds(message, base, small):
        return small
    full = {k: v for k, v in data.items() if k != "role"}
    if not _rebuilds(message, base, full):
        raise InvalidMessageError(
            f"LangChain {type(message).__name__} {message.id!r} does not survive a JSON "
            "round trip; ctxguard would change it, so it refuses to store it"
        )
    return full


def _rebuilds(message: BaseMessage, base: Message, meta: dict[str, Any]) -> bool:
    candidate = base.model_copy(update={"metadata": {META_KEY: meta}})
    try:
        return bool(to_langchain(candidate) == message)
    except (ValueError, TypeError):
        return False


# -- tools and prompt values ---------------------------------------------------------


def openai_tools(tools: Sequence[Any] | None) -> Tools | None:
    """LangChain tools, functions or schemas as OpenAI tool schemas (what gets counted)."""
    listed = _shared.check_tool_list(tools)
    if not listed:
        return None
    schemas = []
    for index, tool in enumerate(listed):
        try:
            schemas.append(convert_to_openai_tool(tool))
        except (ValueError, TypeError, AttributeError, KeyError) as exc:
            raise InvalidInputError(
                one_line(
                    f"tools[{index}] is not a tool LangChain can convert ({exc}); pass a "
                    "BaseTool, a function or an OpenAI tool schema"
                )
            ) from None
    check_tools(schemas)
    return schemas


def as_messages(value: Any, what: str = "messages") -> list[BaseMessage]:
    """What a chat model takes as input, as a message list: a prompt value, a string, a
    message, or a list of message-likes (messages, ``(role, content)`` tuples,
    ``{"role": ..., "content": ...}`` dicts, strings), converted by LangChain's
    ``convert_to_messages``. The messages given are returned as they are (the same objects).
    """
    if isinstance(value, str):
        return [HumanMessage(content=value)]
    if isinstance(value, BaseMessage):
        return [value]
    if isinstance(value, PromptValue):
        return value.to_messages()
    if isinstance(value, Mapping | bytes | bytearray) or not isinstance(value, Iterable):
        hint = (
            " (pass its 'messages' list)"
            if isinstance(value, Mapping) and "messages" in value
            else ""
        )
        raise InvalidMessageError(
            f"{what}: expected a prompt value, a string or a list of messages, got "
            f"{show(value)}{hint}"
        )
    out: list[BaseMessage] = []
    for index, item in enumerate(value):
        try:
            out.extend(convert_to_messages([item]))
        except (ValueError, TypeError, KeyError, AttributeError, NotImplementedError) as exc:
            raise InvalidMessageError(
                one_line(
                    f"{what}[{index}] is {show(item)}, not a message LangChain can convert: pass "
                    "a BaseMessage, a (role, content) tuple, a {'role': ..., 'content': ...} "
                    f"dict or a string ({describe(exc, 120)})"
                )
            ) from None
    return out
