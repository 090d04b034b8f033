"""LlamaIndex ``CtxGuardLLM``: every model call's final input fitted to the guard's budget.

A ``FunctionAgent`` (or ``AgentWorkflow``, ``ReActAgent``, a chat engine) sends more
than its memory returns: its ``system_prompt``, the tool schemas and the current run's
tool calls and results. The wrapper sits where all of that meets, the LLM call, and
fits the messages the call would send with :func:`ctxguard.adapters._shared.fit` (the
guard's own policies run in memory, as the Pydantic AI capability and the gateway's
stateless mode do): pinned system messages first, tool call/result groups whole, the
window opening on a user turn, counted exactly with the guard's counter together with
the tool schemas and the reply reserved (``max_tokens``). A call that cannot fit raises
:class:`~ctxguard.errors.BudgetError`; nothing is stored by the wrapper (the memory
keeps the session). Built on a :class:`CtxGuardMemory`, a call it refuses takes back
what the memory stored of the request (the user's message the agent put before the
window that went into this call; see :mod:`ctxguard.adapters._llamaindex_memory`).
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from typing import Any

from ctxguard import _validate
from ctxguard.adapters import _shared
from ctxguard.adapters._llamaindex_convert import to_ctxguard, to_llamaindex
from ctxguard.adapters._llamaindex_memory import CtxGuardMemory
from ctxguard.errors import (
    ConfigError,
    CtxGuardError,
    InvalidInputError,
    MissingDependencyError,
    NotCopyableError,
)
from ctxguard.guard.aio import AsyncGuard
from ctxguard.guard.prepared import PreparedRequest
from ctxguard.guard.sync import Guard
from ctxguard.messages import Message

try:
    from llama_index.core.base.llms.types import (
        ChatMessage,
        ChatResponse,
        ChatResponseAsyncGen,
        ChatResponseGen,
        CompletionResponse,
        CompletionResponseAsyncGen,
        CompletionResponseGen,
        LLMMetadata,
    )
    from llama_index.core.bridge.pydantic import Field, PrivateAttr
    from llama_index.core.llms.function_calling import FunctionCallingLLM
    from llama_index.core.llms.llm import LLM, ToolSelection
    from llama_index.core.tools.types import BaseTool
except ImportError as exc:  # pragma: no cover - exercised in a subprocess test
    raise MissingDependencyError("ctxguard.adapters.llamaindex", "llamaindex") from exc

Source = Guard | AsyncGuard | CtxGuardMemory
Schemas = list[dict[str, Any]]


def tool_schemas(tools: Sequence[Any] | None) -> Schemas | None:
    """LlamaIndex tools as the OpenAI tool schemas the guard counts (None for none)."""
    out = []
    for index, tool in enumerate(_shared.check_tool_list(tools) or ()):
        if not isinstance(tool, BaseTool):
            raise InvalidInputError(
                f"tools[{index}] must be a LlamaIndex tool, got {_validate.type_name(tool)}"
            )
        out.append(tool.metadata.to_openai_tool())
    return out or None


def _kwarg_schemas(kwargs: dict[str, Any]) -> Schemas | None:
    """Tools passed to ``chat`` already in the OpenAI shape (what OpenAI-like LLMs
    prepare); other providers' shapes are counted where the tools were given."""
    tools = kwargs.get("tools")
    if not isinstance(tools, list) or not tools:
        return None
    shaped = all(isinstance(t, dict) and isinstance(t.get("function"), dict) for t in tools)
    return tools if shaped else None


def _with_user(
    user_msg: str | ChatMessage | None, chat_history: Sequence[ChatMessage] | None
) -> list[ChatMessage]:
    history = [] if chat_history is None else _shared.check_batch(chat_history, ChatMessage)
    if isinstance(user_msg, str):
        history.append(ChatMessage(role="user", content=user_msg))
    elif user_msg is not None:
        history.append(user_msg)
    return history


def _user(prompt: object) -> ChatMessage:
    """A completion prompt as the one user message it is counted as."""
    if not isinstance(prompt, str):
        raise InvalidInputError(
            _validate.one_line(f"prompt must be a str, got {_validate.show(prompt)}")
        )
    return ChatMessage(role="user", content=prompt)


class CtxGuardLLM(FunctionCallingLLM):
    """Wraps a LlamaIndex LLM; every call's final input fits the guard's limit.

    ``CtxGuardLLM(llm, guard_or_memory)``: the guard (or the :class:`CtxGuardMemory`
    whose guard to share) gives the counter, the limit and the window settings.
    The reply reserved is the call's ``max_tokens``, else ``max_tokens`` here, else
    the wrapped LLM's ``max_tokens``, else the memory's, else the guard's default.
    Tool calls are the wrapped LLM's (``get_tool_calls_from_response`` and ``metadata`` delegate).
    ``last_prepared`` holds the last call's numbers and decisions.
    """

    max_tokens: int | None = Field(default=None, description="output tokens to reserve")
    _llm: LLM = PrivateAttr()
    _source: Source = PrivateAttr()
    _last: PreparedRequest | None = PrivateAttr(default=None)

    def __init__(
        self, llm: LLM, guard: Source, *, max_tokens: int | None = None, **kwargs: Any
    ) -> None:
        if not isinstance(llm, LLM):
            raise ConfigError(f"CtxGuardLLM wraps a LlamaIndex LLM, got {_validate.type_name(llm)}")
        if not isinstance(guard, Guard | AsyncGuard | CtxGuardMemory):
            raise ConfigError(
                "CtxGuardLLM needs a ctxguard Guard, an AsyncGuard or a CtxGuardMemory, "
                f"got {_validate.type_name(guard)}"
            )
        _shared.check_optional_count(max_tokens, "max_tokens")
        kwargs.setdefault("system_prompt", llm.system_prompt)  # predict() adds it once
        kwargs.setdefault("callback_manager", llm.callback_manager)
        super().__init__(max_tokens=max_tokens, **kwargs)
        self._llm = llm
        self._source = guard

    @classmethod
    def class_name(cls) -> str:
        return "CtxGuardLLM"

    def _check_picklable(self) -> None:
        if isinstance(self._source, Guard | AsyncGuard):  # (LlamaIndex drops it, silently)
            raise NotCopyableError(
                "CtxGuardLLM on a Guard",
                "that guard's connections",
                "build it on a CtxGuardMemory (rebuilt from its fields when unpickled), "
                "or make one per process",
                how="deep-copied",
            )

    def __getstate__(self) -> dict[Any, Any]:
        self._check_picklable()
        return super().__getstate__()

    def __deepcopy__(self, memo: dict[int, Any] | None = None) -> CtxGuardLLM:
        """As pickled: the wrapped LLM copied, the memory rebuilt from its fields."""
        self._check_picklable()
        copied: CtxGuardLLM = pickle.loads(pickle.dumps(self))
        return copied

    @property
    def llm(self) -> LLM:
        return self._llm

    @property
    def source(self) -> Source:
        """The guard (or memory) whose counter, limit and settings fit the calls."""
        return self._source

    @property
    def metadata(self) -> LLMMetadata:
        return self._llm.metadata

    @property
    def last_prepared(self) -> PreparedRequest | None:
        return self._last

    # -- fitting -----------------------------------------------------------------------

    def _guard(self) -> Guard | AsyncGuard:
        if isinstance(self._source, CtxGuardMemory):
            return self._source.ref.any_guard()
        return self._source

    def _reserve(self, kwargs: dict[str, Any]) -> int | None:
        for value in (kwargs.get("max_tokens"), self.max_tokens):
            if value is not None:
                return _shared.check_optional_count(value, "max_tokens")
        inner = getattr(self._llm, "max_tokens", None)
        if type(inner) is int and inner > 0:
            return inner
        return self._source.max_tokens if isinstance(self._source, CtxGuardMemory) else None

    def _inputs(self, messages: object) -> tuple[list[ChatMessage], list[Message]]:
        given = _shared.check_batch(messages, ChatMessage)
        return given, [to_ctxguard(m) for m in given]

    def _window(
        self, given: list[ChatMessage], fitted: tuple[PreparedRequest, list[int]]
    ) -> list[ChatMessage]:
        prepared, origins = fitted
        self._last = prepared
        return _shared.restore_window(prepared, origins, given, to_llamaindex)

    def fit(
        self, messages: Sequence[ChatMessage], tools: Schemas | None, kwargs: dict[str, Any]
    ) -> list[ChatMessage]:
        """``messages`` as the window to send: the caller's own objects where whole."""
        given, converted = self._inputs(messages)
        reserve = self._reserve(kwargs)
        try:
            fitted = _shared.fit(self._guard(), converted, reserve, tools)
        except CtxGuardError:
            if isinstance(self._source, CtxGuardMemory):  # what it stored for the call
                self._source._take_back_request()
            raise
        return self._window(given, fitted)

    async def afit(
        self, messages: Sequence[ChatMessage], tools: Schemas | None, kwargs: dict[str, Any]
    ) -> list[ChatMessage]:
        """:meth:`fit` off the event loop."""
        given, converted = self._inputs(messages)
        reserve = self._reserve(kwargs)
        try:
            fitted = await _shared.afit(self._guard(), converted, reserve, tools)
        except CtxGuardError:
            if isinstance(self._source, CtxGuardMemory):
                await self._source._atake_back_request()
            raise
        return self._window(given, fitted)

    def _fit_prompt(self, prompt: str, kwargs: dict[str, Any]) -> str:
        return self._prompt(prompt, self.fit([_user(prompt)], None, kwargs))

    async def _afit_prompt(self, prompt: str, kwargs: dict[str, Any]) -> str:
        return self._prompt(prompt, await self.afit([_user(prompt)], None, kwargs))

    def _prompt(self, prompt: str, window: list[ChatMessage]) -> str:
        if self._last is not None and "ctxguard_truncated" in self._last.messages[0].metadata:
            return str(window[0].content or "")
        return prompt

    def _function_llm(self) -> FunctionCallingLLM:
        if not isinstance(self._llm, FunctionCallingLLM):
            raise ConfigError(
                f"{type(self._llm).__name__} is not a FunctionCallingLLM: it cannot take tools"
            )
        return self._llm

    # -- plain calls -------------------------------------------------------------------

    def chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        window = self.fit(messages, _kwarg_schemas(kwargs), kwargs)
        return self._llm.chat(window, **kwargs)

    async def achat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        window = await self.afit(messages, _kwarg_schemas(kwargs), kwargs)
        return await self._llm.achat(window, **kwargs)

    def stream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseGen:
        window = self.fit(messages, _kwarg_schemas(kwargs), kwargs)
        return self._llm.stream_chat(window, **kwargs)

    async def astream_chat(
        self, messages: Sequence[ChatMessage], **kwargs: Any
    ) -> ChatResponseAsyncGen:
        window = await self.afit(messages, _kwarg_schemas(kwargs), kwargs)
        return await self._llm.astream_chat(window, **kwargs)

    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        return self._llm.complete(self._fit_prompt(prompt, kwargs), formatted, **kwargs)

    async def acomplete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponse:
        fitted = await self._afit_prompt(prompt, kwargs)
        return await self._llm.acomplete(fitted, formatted, **kwargs)

    def stream_complete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponseGen:
        return self._llm.stream_complete(self._fit_prompt(prompt, kwargs), formatted, **kwargs)

    async def astream_complete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponseAsyncGen:
        fitted = await self._afit_prompt(prompt, kwargs)
        return await self._llm.astream_complete(fitted, formatted, **kwargs)

    # -- tool calling (what FunctionAgent calls) ---------------------------------------

    def chat_with_tools(
        self,
        tools: Sequence[BaseTool],
        user_msg: str | ChatMessage | None = None,
        chat_history: list[ChatMessage] | None = None,
        verbose: bool = False,
        allow_parallel_tool_calls: bool = False,
        tool_required: bool = False,
        **kwargs: Any,
    ) -> ChatResponse:
        window = self.fit(_with_user(user_msg, chat_history), tool_schemas(tools), kwargs)
        return self._function_llm().chat_with_tools(
            tools,
            chat_history=window,
            verbose=verbose,
            allow_parallel_tool_calls=allow_parallel_tool_calls,
            tool_required=tool_required,
            **kwargs,
        )

    async def achat_with_tools(
        self,
        tools: Sequence[BaseTool],
        user_msg: str | ChatMessage | None = None,
        chat_history: list[ChatMessage] | None = None,
        verbose: bool = False,
        allow_parallel_tool_calls: bool = False,
        tool_required: bool = False,
        **kwargs: Any,
    ) -> ChatResponse:
        window = await self.afit(_with_user(user_msg, chat_history), tool_schemas(tools), kwargs)
        return await self._function_llm().achat_with_tools(
            tools,
            chat_history=window,
            verbose=verbose,
            allow_parallel_tool_calls=allow_parallel_tool_calls,
            tool_required=tool_required,
            **kwargs,
        )

    def stream_chat_with_tools(
        self,
        tools: Sequence[BaseTool],
        user_msg: str | ChatMessage | None = None,
        chat_history: list[ChatMessage] | None = None,
        verbose: bool = False,
        allow_parallel_tool_calls: bool = False,
        tool_required: bool = False,
        **kwargs: Any,
    ) -> ChatResponseGen:
        window = self.fit(_with_user(user_msg, chat_history), tool_schemas(tools), kwargs)
        return self._function_llm().stream_chat_with_tools(
            tools,
            chat_history=window,
            verbose=verbose,
            allow_parallel_tool_calls=allow_parallel_tool_calls,
            tool_required=tool_required,
            **kwargs,
        )

    async def astream_chat_with_tools(
        self,
        tools: Sequence[BaseTool],
        user_msg: str | ChatMessage | None = None,
        chat_history: list[ChatMessage] | None = None,
        verbose: bool = False,
        allow_parallel_tool_calls: bool = False,
        tool_required: bool = False,
        **kwargs: Any,
    ) -> ChatResponseAsyncGen:
        window = await self.afit(_with_user(user_msg, chat_history), tool_schemas(tools), kwargs)
        return await self._function_llm().astream_chat_with_tools(
            tools,
            chat_history=window,
            verbose=verbose,
            allow_parallel_tool_calls=allow_parallel_tool_calls,
            tool_required=tool_required,
            **kwargs,
        )

    def _prepare_chat_with_tools(
        self,
        tools: Sequence[BaseTool],
        user_msg: str | ChatMessage | None = None,
        chat_history: list[ChatMessage] | None = None,
        verbose: bool = False,
        allow_parallel_tool_calls: bool = False,
        tool_required: bool = False,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """The wrapped LLM's chat arguments, its messages fitted with the tools counted."""
        window = self.fit(_with_user(user_msg, chat_history), tool_schemas(tools), kwargs)
        return self._function_llm()._prepare_chat_with_tools_compat(
            tools,
            chat_history=window,
            verbose=verbose,
            allow_parallel_tool_calls=allow_parallel_tool_calls,
            tool_required=tool_required,
            **kwargs,
        )

    def get_tool_calls_from_response(
        self, response: ChatResponse, error_on_no_tool_call: bool = True, **kwargs: Any
    ) -> list[ToolSelection]:
        return self._function_llm().get_tool_calls_from_response(
            response, error_on_no_tool_call=error_on_no_tool_call, **kwargs
        )
