"""LlamaIndex adapter: a chat store over ctxguard sessions, and a budgeted memory.

>>> store = CtxGuardChatStore("redis://localhost:6379/0")
>>> memory = CtxGuardMemory.from_defaults("redis://localhost:6379/0", session_id="s1",
...                                       limit=8192, max_tokens=512)   # doctest: +SKIP
>>> engine = SimpleChatEngine.from_defaults(llm=llm, memory=memory)     # doctest: +SKIP

* :class:`CtxGuardChatStore` implements ``BaseChatStore`` (keys are session ids)
  with native async methods. ``get_keys`` walks the namespace with SCAN, never KEYS.
* :class:`CtxGuardMemory` implements ``BaseMemory``: ``get()`` returns the window
  the guard chose (system pinned, tool pairs whole, within budget), not the whole
  history; ``get_all()`` returns everything.

The chat store and the memory stay in one module (past ~400 lines): the memory is built on
the store's conversion and argument checks, and LlamaIndex users import both from here.

Messages round-trip losslessly: tool calls (``additional_kwargs['tool_calls']`` or
``ToolCallBlock``) become OpenAI tool calls for counting and validity checks, and
whatever the OpenAI shape cannot hold rides in ``Message.metadata['llama_index']``.

``delete_last_message`` is one atomic, audited ``store.retract``. ``delete_message``
retracts the tail from that index (atomically, checking nothing was appended
meanwhile) and appends back the messages after it with their ids, so a reader
may briefly see the shorter history; summary and audit trail are kept.
"""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

from ctxguard.adapters import _shared
from ctxguard.adapters._shared import GuardRef
from ctxguard.errors import InvalidMessageError, MissingDependencyError
from ctxguard.guard.aio import AsyncGuard
from ctxguard.guard.prepared import PreparedRequest
from ctxguard.guard.sync import Guard
from ctxguard.messages import FunctionCall, ImagePart, Message, TextPart, ToolCall

try:
    from llama_index.core.base.llms.types import (
        ChatMessage,
        ImageBlock,
        TextBlock,
        ToolCallBlock,
    )
    from llama_index.core.bridge.pydantic import Field, PrivateAttr
    from llama_index.core.memory.types import BaseMemory
    from llama_index.core.storage.chat_store.base import BaseChatStore
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
    parts: list[TextPart | ImagePart] = []
    for block in blocks:
        if isinstance(block, TextBlock):
            parts.append(TextPart(text=block.text))
        elif isinstance(block, ImageBlock) and block.url is not None and role != "tool":
            parts.append(ImagePart.model_validate({"image_url": {"url": str(block.url)}}))
        else:
            return message.content or ""
    if not parts:
        return None if role == "assistant" else ""
    return parts


def _tool_calls_in(message: ChatMessage) -> list[ToolCall]:
    blocks = [b for b in message.blocks if isinstance(b, ToolCallBlock)]
    if blocks:
        return [_from_block(b) for b in blocks]
    raw = message.additional_kwargs.get("tool_calls") or []
    return [_from_openai(c.model_dump() if hasattr(c, "model_dump") else c) for c in raw]


def _from_block(block: ToolCallBlock) -> ToolCall:
    if not block.tool_call_id:
        raise InvalidMessageError(f"ToolCallBlock {block.tool_name!r} has no tool_call_id")
    return ToolCall(
        id=block.tool_call_id,
        function=FunctionCall(name=block.tool_name, arguments=_json_arguments(block.tool_kwargs)),
    )


def _from_openai(call: dict[str, Any]) -> ToolCall:
    function = call.get("function") or {}
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
    for meta in (small, full):
        candidate = base.model_copy(update={"metadata": {META_KEY: meta}} if meta else {})
        if to_llamaindex(candidate) == message:
            return meta
    raise InvalidMessageError(
        "LlamaIndex message does not survive a JSON round trip; ctxguard would change it, "
        "so it refuses to store it"
    )


# -- the chat store ------------------------------------------------------------------


class CtxGuardChatStore(BaseChatStore):
    """``BaseChatStore`` on ctxguard: one key is one session (memory://, Redis, Cluster)."""

    _ref: GuardRef = PrivateAttr()
    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)
    _alock: asyncio.Lock = PrivateAttr(default_factory=asyncio.Lock)

    def __init__(
        self, guard_or_url: Guard | AsyncGuard | str = "memory://", **guard_options: Any
    ) -> None:
        super().__init__()
        self._ref = GuardRef(guard_or_url, **guard_options)

    @classmethod
    def class_name(cls) -> str:
        return "CtxGuardChatStore"

    @property
    def ref(self) -> GuardRef:
        return self._ref

    def set_messages(self, key: str, messages: list[ChatMessage]) -> None:
        new = _converted(key, messages)
        with self._lock:
            _shared.replace(self._ref.sync(), key, new)

    def get_messages(self, key: str) -> list[ChatMessage]:
        _key(key)
        return [to_llamaindex(m) for m in _shared.read_all(self._ref.sync(), key)]

    def add_message(self, key: str, message: ChatMessage) -> None:
        self._ref.sync().append(_key(key), [_converted_one(message)])

    def delete_messages(self, key: str) -> list[ChatMessage] | None:
        _key(key)
        with self._lock:
            guard = self._ref.sync()
            found = _shared.read_all(guard, key)
            _shared.clear(guard, key)
        return [to_llamaindex(m) for m in found] or None

    def delete_message(self, key: str, idx: int) -> ChatMessage | None:
        """Remove message ``idx``: retract the tail from it, put back the rest.

        An index past the end (or negative) returns None, as LlamaIndex's stores do."""
        _key(key)
        _shared.check_index(idx, "idx")
        with self._lock:
            guard = self._ref.sync()
            removed = _shared.pop_tail(guard, key, idx)
            if not removed:
                return None
            if removed[1:]:
                guard.append(key, removed[1:])
        return to_llamaindex(removed[0])

    def delete_last_message(self, key: str) -> ChatMessage | None:
        """Remove the newest message (one atomic, audited retract)."""
        _key(key)
        with self._lock:
            removed = _shared.pop_newest(self._ref.sync(), key)
        return to_llamaindex(removed) if removed else None

    def get_keys(self) -> list[str]:
        return list(self._ref.sync().store.list_sessions())

    async def aset_messages(self, key: str, messages: list[ChatMessage]) -> None:
        new = _converted(key, messages)
        async with self._alock:
            await _shared.areplace(self._ref, key, new)

    async def aget_messages(self, key: str) -> list[ChatMessage]:
        _key(key)
        return [to_llamaindex(m) for m in await _shared.aread_all(self._ref, key)]

    async def async_add_message(self, key: str, message: ChatMessage) -> None:
        await _shared.aappend(self._ref, _key(key), [_converted_one(message)])

    async def adelete_messages(self, key: str) -> list[ChatMessage] | None:
        _key(key)
        async with self._alock:
            found = await _shared.aread_all(self._ref, key)
            await _shared.aclear(self._ref, key)
        return [to_llamaindex(m) for m in found] or None

    async def adelete_message(self, key: str, idx: int) -> ChatMessage | None:
        _key(key)
        _shared.check_index(idx, "idx")
        async with self._alock:
            removed = await _shared.apop_tail(self._ref, key, idx)
            if not removed:
                return None
            if removed[1:]:
                await _shared.aappend(self._ref, key, removed[1:])
        return to_llamaindex(removed[0])

    async def adelete_last_message(self, key: str) -> ChatMessage | None:
        _key(key)
        async with self._alock:
            removed = await _shared.apop_newest(self._ref, key)
        return to_llamaindex(removed) if removed else None

    async def aget_keys(self) -> list[str]:
        guard = self._ref.aio()
        if guard is None:
            return await asyncio.to_thread(self.get_keys)
        return [key async for key in guard.store.list_sessions()]


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


# -- the memory ----------------------------------------------------------------------


class CtxGuardMemory(BaseMemory):
    """``BaseMemory`` whose ``get()`` is the guard's budgeted window of the session.

    ``max_tokens`` is the output to reserve (the guard's default when None).
    ``get(initial_token_count=n)`` — what LlamaIndex chat engines pass for a
    system prompt they keep outside the memory — reserves ``n`` more tokens;
    for an exact count keep the system prompt in the memory instead (it is
    pinned). ``last_prepared`` keeps the last window's numbers and decisions.
    """

    session_id: str = Field(description="the ctxguard session id (LlamaIndex's chat_store_key)")
    max_tokens: int | None = Field(default=None, description="output tokens to reserve")
    _ref: GuardRef = PrivateAttr()
    _last: PreparedRequest | None = PrivateAttr(default=None)

    @classmethod
    def class_name(cls) -> str:
        return "CtxGuardMemory"

    @classmethod
    def from_defaults(  # type: ignore[override, unused-ignore]
        cls,
        guard_or_url: Guard | AsyncGuard | str = "memory://",
        *,
        session_id: str = "chat_history",
        max_tokens: int | None = None,
        chat_history: list[ChatMessage] | None = None,
        **guard_options: Any,
    ) -> CtxGuardMemory:
        guard_options.pop("llm", None)  # LlamaIndex passes it; the guard counts by its own counter
        _shared.check_key(session_id)
        _shared.check_optional_count(max_tokens, "max_tokens")
        if chat_history is not None:
            _shared.check_batch(chat_history, ChatMessage, "chat_history")
        memory = cls(session_id=session_id, max_tokens=max_tokens)
        memory._ref = GuardRef(guard_or_url, **guard_options)
        if chat_history:
            memory.set(chat_history)
        return memory

    @property
    def last_prepared(self) -> PreparedRequest | None:
        return self._last

    def get(self, input: str | None = None, **kwargs: Any) -> list[ChatMessage]:  # noqa: A002
        guard = self._ref.sync()
        reserve = self._reserve(guard, kwargs.get("initial_token_count", 0))
        return self._window(_shared.prepare(guard, self.session_id, (), reserve))

    async def aget(self, input: str | None = None, **kwargs: Any) -> list[ChatMessage]:  # noqa: A002
        reserve = self._reserve(self._ref.any_guard(), kwargs.get("initial_token_count", 0))
        return self._window(await _shared.aprepare(self._ref, self.session_id, (), reserve))

    def get_all(self) -> list[ChatMessage]:
        return [to_llamaindex(m) for m in _shared.read_all(self._ref.sync(), self.session_id)]

    async def aget_all(self) -> list[ChatMessage]:
        return [to_llamaindex(m) for m in await _shared.aread_all(self._ref, self.session_id)]

    def put(self, message: ChatMessage) -> None:
        self.put_messages([_checked_one(message)])

    async def aput(self, message: ChatMessage) -> None:
        await self.aput_messages([_checked_one(message)])

    def put_messages(self, messages: list[ChatMessage]) -> None:
        new = _converted(self.session_id, messages)
        if new:
            self._ref.sync().append(self.session_id, new)

    async def aput_messages(self, messages: list[ChatMessage]) -> None:
        await _shared.aappend(self._ref, self.session_id, _converted(self.session_id, messages))

    def set(self, messages: list[ChatMessage]) -> None:
        _shared.replace(self._ref.sync(), self.session_id, _converted(self.session_id, messages))

    async def aset(self, messages: list[ChatMessage]) -> None:
        await _shared.areplace(self._ref, self.session_id, _converted(self.session_id, messages))

    def reset(self) -> None:
        _shared.clear(self._ref.sync(), self.session_id)

    async def areset(self) -> None:
        await _shared.aclear(self._ref, self.session_id)

    def _reserve(self, guard: Guard | AsyncGuard, extra: object) -> int:
        count = _shared.check_optional_count(extra, "initial_token_count")
        base = guard.config.max_tokens if self.max_tokens is None else self.max_tokens
        return base + (count or 0)

    def _window(self, prepared: PreparedRequest) -> list[ChatMessage]:
        self._last = prepared
        return [to_llamaindex(m) for m in prepared.messages]


__all__ = ["CtxGuardChatStore", "CtxGuardMemory", "to_ctxguard", "to_llamaindex"]
