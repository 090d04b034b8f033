"""LangChain adapter: budgeted model calls for agents and chains, and a chat message history.

>>> guard = Guard("redis://localhost:6379/0", limit=ServerLimit(url), counter="hf:...")
>>> model = ChatOpenAI(base_url=url, model="qwen", profile=model_profile(guard))  # doctest: +SKIP
>>> agent = create_agent(model, tools, middleware=[CtxGuardMiddleware(guard)])

* ``CtxGuardMiddleware`` (``langchain>=1.0``, in ``_langchain_middleware``) fits every
  model call of ``create_agent`` in ``wrap_model_call`` (system message and tool schemas
  counted; the agent's state untouched) and, given a session (``session_id=`` or the
  run's ``thread_id``), stores the conversation there and the usage the model reported
  (``usage_metadata``) against ctxguard's count, one ``usage`` audit record per call.
* :func:`model_profile` gives the served limit as the chat model's ``profile``
  (``max_input_tokens``), for LangChain's own ``SummarizationMiddleware`` fractions.
* :func:`token_counter` is an exact counter (the guard's) for LangChain's own
  ``trim_messages``, ``SummarizationMiddleware`` and ``ContextEditingMiddleware``.
* :func:`window_runnable` fits a prompt a chain assembled (system + history + the new
  input) into the budget, so it also works behind ``RunnableWithMessageHistory``.
* :class:`CtxGuardChatMessageHistory` keeps LangChain's ``BaseChatMessageHistory``
  contract (deprecated upstream, kept for chains): ``messages`` is the whole history,
  oldest first; ``clear()`` removes the session. Messages round-trip losslessly
  (``_langchain_messages``). A message whose ``id`` is already stored is not stored
  twice. :meth:`~CtxGuardChatMessageHistory.budgeted_messages` appends new messages and
  returns the window the guard chose. It refuses a guard with
  ``GuardConfig(commit="with_reply")`` (a :class:`~ctxguard.errors.ConfigError`): that
  setting leaves the new messages to ``complete``, which a chat history never calls.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ctxguard._nocopy import NotPicklable
from ctxguard._validate import type_name
from ctxguard.adapters import _served, _shared
from ctxguard.adapters._closing import ClosesOwnGuard
from ctxguard.adapters._langchain_messages import (
    META_KEY,
    as_messages,
    openai_tools,
    to_ctxguard,
    to_langchain,
)
from ctxguard.adapters._shared import GuardRef
from ctxguard.errors import ConfigError, InvalidMessageError, MissingDependencyError
from ctxguard.guard.aio import AsyncGuard
from ctxguard.guard.prepared import PreparedRequest
from ctxguard.guard.sync import Guard
from ctxguard.tokens._protocol import TokenCounter

try:
    from langchain_core.chat_history import BaseChatMessageHistory
    from langchain_core.language_models import LanguageModelInput
    from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, convert_to_messages
    from langchain_core.runnables import Runnable, RunnableLambda
except ImportError as exc:  # pragma: no cover - exercised in a subprocess test
    raise MissingDependencyError("ctxguard.adapters.langchain", "langchain") from exc


# -- the chat message history --------------------------------------------------------


class CtxGuardChatMessageHistory(NotPicklable, BaseChatMessageHistory, ClosesOwnGuard):
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
        _shared.refuse_with_reply(
            self.ref.commit,
            "CtxGuardChatMessageHistory",
            "budgeted_messages() leaves its new messages to complete(), and a chat history "
            "stores the reply with add_messages(), so they would never be stored",
        )
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

    # -- closing the guard opened from a URL -------------------------------------------

    def _guard_ref(self) -> GuardRef:  # ClosesOwnGuard: close(), aclose(), with
        return self.ref


# -- fitting prompts a chain assembles ----------------------------------------------


# -- fitting prompts a chain assembles ----------------------------------------------


def _check_text_or(message: object, kind: type[BaseMessage]) -> None:
    if not isinstance(message, str | kind):
        raise InvalidMessageError(
            f"message must be a str or a {kind.__name__}, got {type_name(message)}"
        )


def fit_messages(
    guard: Guard | AsyncGuard,
    messages: LanguageModelInput | BaseMessage,
    *,
    max_tokens: int | None = None,
    tools: Sequence[Any] | None = None,
) -> list[BaseMessage]:
    """``messages`` cut to the guard's budget by its policies; the messages given are
    returned as they are (the caller's own objects, unless the guard shrank one).

    ``messages`` is what a chat model takes (see :func:`as_messages`): a list of messages,
    ``(role, content)`` tuples or ``{"role", "content"}`` dicts, a string, a prompt value.
    """
    given = as_messages(messages)
    prepared, origins = _shared.fit(
        guard, [to_ctxguard(m) for m in given], max_tokens, openai_tools(tools)
    )
    return _shared.restore_window(prepared, origins, given, to_langchain)


async def afit_messages(
    guard: Guard | AsyncGuard,
    messages: LanguageModelInput | BaseMessage,
    *,
    max_tokens: int | None = None,
    tools: Sequence[Any] | None = None,
) -> list[BaseMessage]:
    """Async :func:`fit_messages` (the counting runs in a thread)."""
    given = as_messages(messages)
    prepared, origins = await _shared.afit(
        guard, [to_ctxguard(m) for m in given], max_tokens, openai_tools(tools)
    )
    return _shared.restore_window(prepared, origins, given, to_langchain)


def window_runnable(
    guard: Guard | AsyncGuard,
    *,
    max_tokens: int | None = None,
    tools: Sequence[Any] | None = None,
) -> Runnable[Any, list[BaseMessage]]:
    """A Runnable (sync and async) that fits a prompt to ``guard``'s budget.

    Put it between the prompt and the model: it takes what the model would (a prompt
    value, a list of message-likes, a string). ``tools`` are the tools bound to the
    model (their schemas count against the budget); ``max_tokens`` the output to reserve.
    """

    def run(value: Any) -> list[BaseMessage]:
        return fit_messages(guard, value, max_tokens=max_tokens, tools=tools)

    async def arun(value: Any) -> list[BaseMessage]:
        return await afit_messages(guard, value, max_tokens=max_tokens, tools=tools)

    return RunnableLambda(run, afunc=arun, name="ctxguard_window")


# -- the served limit and exact counts, for LangChain's own tools -----------------------


def model_profile(limit: _served.LimitLike, *, max_tokens: int | None = None) -> dict[str, int]:
    """``profile=`` for a chat model (``ChatOpenAI`` pointed at vLLM): the served limit.

    ``max_input_tokens`` is the limit less the output reserved on every request
    (``max_tokens``, by default the guard's own reserve and safety margin), since vLLM
    admits a request only when prompt + max_tokens fit.
    """
    _shared.check_optional_count(max_tokens, "max_tokens")
    served = _served.served_limit(limit).tokens
    reserve = max_tokens
    if reserve is None and isinstance(limit, Guard | AsyncGuard):
        reserve = limit.config.max_tokens + limit.config.safety_margin
    left = served - (reserve or 0)
    if left < 1:
        raise ConfigError(f"max_tokens={reserve} leaves no input room in the {served}-token limit")
    return {"max_input_tokens": left}


def token_counter(
    guard_or_counter: Guard | AsyncGuard | TokenCounter, *, tools: Sequence[Any] | None = None
) -> Callable[[Iterable[Any]], int]:
    """An exact counter for LangChain's ``trim_messages``, ``SummarizationMiddleware`` and
    ``ContextEditingMiddleware``: the guard's count of those messages sent as a request
    (with ``tools``' schemas), the same count ctxguard budgets with."""
    counter = (
        guard_or_counter.counter
        if isinstance(guard_or_counter, Guard | AsyncGuard)
        else guard_or_counter
    )
    if not callable(getattr(counter, "count_request", None)):
        raise ConfigError(
            f"token_counter needs a Guard, an AsyncGuard or a TokenCounter, got "
            f"{type_name(guard_or_counter)}"
        )
    schemas = openai_tools(tools)

    def count_tokens(messages: Iterable[Any]) -> int:
        if type(messages) is list or type(messages) is tuple:
            try:  # (one call: trim_messages counts again and again)
                given = convert_to_messages(messages)
            except (ValueError, TypeError, KeyError, AttributeError, NotImplementedError):
                given = as_messages(messages)  # InvalidMessageError naming the item
        else:  # a bare string is one human message, as a chat model takes it (LangChain's
            given = as_messages(messages)  # convert_to_messages made one per character)
        batch = [to_ctxguard(m) for m in given]
        return int(counter.count_request(batch, tools=schemas))

    return count_tokens


# -- LangChain v1 agent middleware (needs the `langchain` package) ---------------------

_lazy: dict[str, type[Any]] = {}


def __getattr__(name: str) -> Any:
    if name == "CtxGuardMiddleware":
        if name not in _lazy:
            from ctxguard.adapters._langchain_middleware import middleware_class

            _lazy[name] = middleware_class()
        return _lazy[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "META_KEY",
    "CtxGuardChatMessageHistory",
    "CtxGuardMiddleware",  # noqa: F822 - built on first access (needs langchain>=1.0)
    "afit_messages",
    "as_messages",
    "fit_messages",
    "model_profile",
    "openai_tools",
    "to_ctxguard",
    "to_langchain",
    "token_counter",
    "window_runnable",
]
