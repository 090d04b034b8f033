"""LangChain adapter: a chat message history on ctxguard, and budgeted windows for chains.

>>> history = CtxGuardChatMessageHistory("redis://localhost:6379/0", "s1", limit=8192)
>>> chain = prompt | history.window_runnable(max_tokens=512) | model      # doctest: +SKIP
>>> RunnableWithMessageHistory(chain, lambda sid: CtxGuardChatMessageHistory(url, sid))

* :class:`CtxGuardChatMessageHistory` keeps LangChain's contract: ``messages`` is the
  whole history, oldest first; ``clear()`` removes the session. Messages round-trip
  losslessly: ``tool_calls`` travel as OpenAI tool calls (``args`` as a JSON string),
  everything LangChain-only (``additional_kwargs``, ``response_metadata``,
  ``usage_metadata``, ``artifact``, ``status``, content blocks OpenAI cannot express)
  rides in ``Message.metadata['langchain']`` and is never sent to a model. A message
  whose ``id`` is already stored is not stored twice.
* :meth:`~CtxGuardChatMessageHistory.budgeted_messages` appends new messages and
  returns the window the guard chose (system pinned, tool pairs whole, within budget).
* :func:`window_runnable` fits a prompt a chain assembled (system + history + the new
  input) into the budget, so it also works behind ``RunnableWithMessageHistory``.
* ``CtxGuardMiddleware`` (needs ``langchain>=1.0``) does the same for ``create_agent``
  through ``wrap_model_call``: it changes what the model is sent, never the agent state.

Kept whole past ~400 lines for now: it is imported only on use, and its one clean seam
(the message conversion, ``to_ctxguard``/``to_langchain``) is left for a later split.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from ctxguard._validate import check_tools, one_line, type_name
from ctxguard.adapters import _shared
from ctxguard.adapters._shared import GuardRef, Tools
from ctxguard.errors import InvalidInputError, InvalidMessageError, MissingDependencyError
from ctxguard.guard.aio import AsyncGuard
from ctxguard.guard.prepared import PreparedRequest
from ctxguard.guard.sync import Guard
from ctxguard.ids import validate_id
from ctxguard.messages import FunctionCall, ImagePart, Message, TextPart, ToolCall

try:
    from langchain_core.chat_history import BaseChatMessageHistory
    from langchain_core.messages import (
        AIMessage,
        BaseMessage,
        ChatMessage,
        HumanMessage,
        SystemMessage,
        ToolMessage,
        message_chunk_to_message,
    )
    from langchain_core.prompt_values import PromptValue
    from langchain_core.runnables import Runnable, RunnableLambda
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
    if message.id and _valid_id(message.id):
        fields["id"] = message.id
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


def _valid_id(value: str) -> bool:
    try:
        validate_id(value)
    except ValueError:
        return False
    return True


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
        if block.get("type") == "image_url" and role != "tool":
            return ImagePart.model_validate(block)
    except ValueError:
        return None
    return None


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


# -- the chat message history --------------------------------------------------------


class CtxGuardChatMessageHistory(BaseChatMessageHistory):
    """LangChain chat history backed by a ctxguard session (memory://, Redis, Cluster).

    ``guard_or_url`` is a :class:`~ctxguard.guard.Guard`, an
    :class:`~ctxguard.guard.AsyncGuard` or a store URL; with a URL, ``limit``,
    ``counter``, ``namespace`` and ``tenant`` build the guard (``limit`` is only
    needed for budgeted windows). ``max_tokens`` is the output reserved by
    :meth:`budgeted_messages` and :meth:`window_runnable` when they are not told.
    """

    def __init__(
        self,
        guard_or_url: Guard | AsyncGuard | str,
        session_id: str,
        *,
        max_tokens: int | None = None,
        **guard_options: Any,
    ) -> None:
        super().__init__()
        self.ref = GuardRef(guard_or_url, **guard_options)
        self.session_id = _shared.check_key(session_id)
        self.max_tokens = _shared.check_optional_count(max_tokens, "max_tokens")
        self.last_prepared: PreparedRequest | None = None

    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]
        """Every stored message, oldest first (LangChain's order)."""
        return [to_langchain(m) for m in _shared.read_all(self.ref.sync(), self.session_id)]

    async def aget_messages(self) -> list[BaseMessage]:
        return [to_langchain(m) for m in await _shared.aread_all(self.ref, self.session_id)]

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        """Append in one atomic store call; messages with an already-stored id are skipped."""
        converted = [to_ctxguard(m) for m in _shared.check_batch(messages, BaseMessage)]
        if converted:
            self.ref.sync().append(self.session_id, converted)

    async def aadd_messages(self, messages: Sequence[BaseMessage]) -> None:
        batch = _shared.check_batch(messages, BaseMessage)
        await _shared.aappend(self.ref, self.session_id, [to_ctxguard(m) for m in batch])

    def add_message(self, message: BaseMessage) -> None:
        _shared.check_message(message, BaseMessage)
        self.add_messages([message])

    def add_user_message(self, message: HumanMessage | str) -> None:
        _check_text_or(message, HumanMessage)
        super().add_user_message(message)

    def add_ai_message(self, message: AIMessage | str) -> None:
        _check_text_or(message, AIMessage)
        super().add_ai_message(message)

    def clear(self) -> None:
        """Remove the session: messages, token counts, summary and audit records."""
        _shared.clear(self.ref.sync(), self.session_id)

    async def aclear(self) -> None:
        await _shared.aclear(self.ref, self.session_id)

    # -- budgeted windows --------------------------------------------------------------

    def budgeted_messages(
        self,
        new_messages: Sequence[BaseMessage] = (),
        *,
        max_tokens: int | None = None,
        tools: Sequence[Any] | None = None,
    ) -> list[BaseMessage]:
        """Append ``new_messages`` and return the window to send, within budget.

        ``self.last_prepared`` keeps the :class:`~ctxguard.guard.PreparedRequest`
        (token count, dropped ranges, decisions) for logging or ``guard.complete``.
        """
        new = [
            to_ctxguard(m) for m in _shared.check_batch(new_messages, BaseMessage, "new_messages")
        ]
        reserve, schemas = self._reserve(max_tokens), openai_tools(tools)
        prepared = _shared.prepare(self.ref.sync(), self.session_id, new, reserve, schemas)
        return self._window(prepared)

    async def abudgeted_messages(
        self,
        new_messages: Sequence[BaseMessage] = (),
        *,
        max_tokens: int | None = None,
        tools: Sequence[Any] | None = None,
    ) -> list[BaseMessage]:
        new = [
            to_ctxguard(m) for m in _shared.check_batch(new_messages, BaseMessage, "new_messages")
        ]
        reserve, schemas = self._reserve(max_tokens), openai_tools(tools)
        prepared = await _shared.aprepare(self.ref, self.session_id, new, reserve, schemas)
        return self._window(prepared)

    def window_runnable(
        self, *, max_tokens: int | None = None, tools: Sequence[Any] | None = None
    ) -> Runnable[Any, list[BaseMessage]]:
        """A chain step that fits the prompt it receives with this history's guard."""
        openai_tools(tools)  # refuses tools it cannot convert now, not at the first call
        return window_runnable(
            self.ref.any_guard(), max_tokens=self._reserve(max_tokens), tools=tools
        )

    def _reserve(self, max_tokens: int | None) -> int | None:
        _shared.check_optional_count(max_tokens, "max_tokens")
        return self.max_tokens if max_tokens is None else max_tokens

    def _window(self, prepared: PreparedRequest) -> list[BaseMessage]:
        self.last_prepared = prepared
        return [to_langchain(m) for m in prepared.messages]


# -- fitting prompts a chain assembles ----------------------------------------------


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


def _check_text_or(message: object, kind: type[BaseMessage]) -> None:
    if not isinstance(message, str | kind):
        raise InvalidMessageError(
            f"message must be a str or a {kind.__name__}, got {type_name(message)}"
        )


def as_messages(value: Any) -> list[BaseMessage]:
    """What a chain hands on (prompt value, message list, a string) as a message list."""
    if isinstance(value, PromptValue):
        return value.to_messages()
    if isinstance(value, str):
        return [HumanMessage(content=value)]
    if isinstance(value, BaseMessage):
        return [value]
    return list(value)


def fit_messages(
    guard: Guard | AsyncGuard,
    messages: Sequence[BaseMessage],
    *,
    max_tokens: int | None = None,
    tools: Sequence[Any] | None = None,
) -> list[BaseMessage]:
    """``messages`` cut to the guard's budget by its policies; the objects are the caller's own."""
    prepared, origins = _shared.fit(
        guard, [to_ctxguard(m) for m in messages], max_tokens, openai_tools(tools)
    )
    return _shared.restore_window(prepared, origins, messages, to_langchain)


async def afit_messages(
    guard: Guard | AsyncGuard,
    messages: Sequence[BaseMessage],
    *,
    max_tokens: int | None = None,
    tools: Sequence[Any] | None = None,
) -> list[BaseMessage]:
    prepared, origins = await _shared.afit(
        guard, [to_ctxguard(m) for m in messages], max_tokens, openai_tools(tools)
    )
    return _shared.restore_window(prepared, origins, messages, to_langchain)


def window_runnable(
    guard: Guard | AsyncGuard,
    *,
    max_tokens: int | None = None,
    tools: Sequence[Any] | None = None,
) -> Runnable[Any, list[BaseMessage]]:
    """A Runnable (sync and async) that fits a prompt to ``guard``'s budget.

    Put it between the prompt and the model. ``tools`` are the tools bound to
    the model (their schemas count against the budget); ``max_tokens`` the
    output to reserve.
    """

    def run(value: Any) -> list[BaseMessage]:
        return fit_messages(guard, as_messages(value), max_tokens=max_tokens, tools=tools)

    async def arun(value: Any) -> list[BaseMessage]:
        return await afit_messages(guard, as_messages(value), max_tokens=max_tokens, tools=tools)

    return RunnableLambda(run, afunc=arun, name="ctxguard_window")


# -- LangChain v1 agent middleware (needs the `langchain` package) ---------------------


def _middleware_class() -> type[Any]:
    try:
        from langchain.agents.middleware import AgentMiddleware
    except ImportError as exc:
        raise MissingDependencyError("CtxGuardMiddleware (langchain>=1.0)", "langchain") from exc

    class CtxGuardMiddleware(AgentMiddleware):  # type: ignore[misc, unused-ignore]
        """``create_agent`` middleware: every model call gets a window within budget.

        Works in ``wrap_model_call`` so the agent's state (its full history,
        kept by the checkpointer) is untouched; the system message and the
        tools' schemas are counted with the messages.
        """

        def __init__(self, guard: Guard | AsyncGuard, *, max_tokens: int | None = None) -> None:
            super().__init__()
            self.guard = guard
            self.max_tokens = max_tokens

        def wrap_model_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
            messages = _with_system(request)
            fitted = fit_messages(
                self.guard, messages, max_tokens=self.max_tokens, tools=request.tools
            )
            return handler(_without_system(request, fitted))

        async def awrap_model_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
            messages = _with_system(request)
            fitted = await afit_messages(
                self.guard, messages, max_tokens=self.max_tokens, tools=request.tools
            )
            return await handler(_without_system(request, fitted))

    return CtxGuardMiddleware


def _with_system(request: Any) -> list[BaseMessage]:
    system = [request.system_message] if request.system_message is not None else []
    return system + list(request.messages)


def _without_system(request: Any, fitted: list[BaseMessage]) -> Any:
    if request.system_message is not None and fitted and fitted[0] is request.system_message:
        fitted = fitted[1:]
    return request.override(messages=fitted)


_lazy: dict[str, type[Any]] = {}


def __getattr__(name: str) -> Any:
    if name == "CtxGuardMiddleware":
        if name not in _lazy:
            _lazy[name] = _middleware_class()
        return _lazy[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "CtxGuardChatMessageHistory",
    "CtxGuardMiddleware",  # noqa: F822 - built on first access (needs langchain>=1.0)
    "afit_messages",
    "as_messages",
    "fit_messages",
    "openai_tools",
    "to_ctxguard",
    "to_langchain",
    "window_runnable",
]
