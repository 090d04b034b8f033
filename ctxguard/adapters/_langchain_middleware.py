"""``CtxGuardMiddleware`` for LangChain v1's ``create_agent`` (needs the ``langchain`` package).

Built on first access of ``ctxguard.adapters.langchain.CtxGuardMiddleware``, so the
adapter works with ``langchain-core`` alone.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from ctxguard._nocopy import NotPicklable
from ctxguard._validate import type_name
from ctxguard.adapters import _served, _shared
from ctxguard.adapters._langchain_messages import (
    openai_tools,
    stored_id,
    to_ctxguard,
    to_langchain,
)
from ctxguard.adapters._shared import GuardRef
from ctxguard.errors import ConfigError, InvalidIdError, MissingDependencyError
from ctxguard.guard.aio import AsyncGuard
from ctxguard.guard.prepared import PreparedRequest
from ctxguard.guard.sync import Guard
from ctxguard.ids import new_message_id
from ctxguard.messages import Message

try:
    from langchain_core.messages import AIMessage, BaseMessage
except ImportError as exc:  # pragma: no cover - exercised in a subprocess test
    raise MissingDependencyError("ctxguard.adapters.langchain", "langchain") from exc


@dataclass(frozen=True)
class _Fitted:
    request: Any  # the ModelRequest to hand on, with the fitted messages
    prepared: PreparedRequest


def _reserve(request: Any, max_tokens: int | None) -> int | None:
    """The output to reserve: the middleware's, else the call's or the model's ``max_tokens``
    (what the server will be asked for), else the guard's default."""
    if max_tokens is not None:
        return max_tokens
    for asked in ((request.model_settings or {}).get("max_tokens"), _model_max(request.model)):
        if isinstance(asked, int) and not isinstance(asked, bool) and asked >= 0:
            return asked
    return None


def _model_max(model: Any) -> object:
    bound = getattr(model, "kwargs", None)  # a RunnableBinding: model.bind(max_tokens=...)
    if isinstance(bound, dict) and "max_tokens" in bound:
        return bound["max_tokens"]
    return getattr(getattr(model, "bound", model), "max_tokens", None)


def _fit(guard: Guard | AsyncGuard, request: Any, max_tokens: int | None) -> _Fitted:
    max_tokens = _reserve(request, max_tokens)
    system = [request.system_message] if request.system_message is not None else []
    messages: list[BaseMessage] = system + list(request.messages)
    prepared, origins = _shared.fit(
        guard, [to_ctxguard(m) for m in messages], max_tokens, openai_tools(request.tools)
    )
    window = _shared.restore_window(prepared, origins, messages, to_langchain)
    if system and window and window[0] is system[0]:
        window = window[1:]
    return _Fitted(request.override(messages=window), prepared)


def _thread_session(thread: object) -> str | None:
    """The session of a run's ``thread_id`` (LangGraph takes any value; an int or a UUID is
    used as its text), or None when the run has no thread."""
    if thread is None:
        return None
    if isinstance(thread, int | uuid.UUID) and not isinstance(thread, bool):
        thread = str(thread)
    if not isinstance(thread, str):
        raise InvalidIdError(
            f"thread_id must be a str, an int or a UUID to name a ctxguard session, got "
            f"{type_name(thread)}; pass one in config={{'configurable': {{'thread_id': ...}}}} "
            "or give CtxGuardMiddleware a session_id"
        )
    return _shared.check_key(thread, "thread_id")


def _reply(response: Any) -> AIMessage | None:
    """The model's message in what the handler returned (a ModelResponse or an AIMessage)."""
    messages = response.result if hasattr(response, "result") else [response]
    reply = next((m for m in reversed(messages) if isinstance(m, AIMessage)), None)
    if reply is not None and not reply.id:
        reply.id = new_message_id()  # the agent's state keeps it: stored once, under this id
    return reply


def _reported(reply: AIMessage) -> dict[str, Any] | None:
    usage: dict[str, Any] = dict(reply.usage_metadata or {})
    return _served.usage(usage.get("input_tokens"), usage.get("output_tokens"))


def middleware_class() -> type[Any]:
    try:
        from langchain.agents.middleware import AgentMiddleware
    except ImportError as exc:
        raise MissingDependencyError("CtxGuardMiddleware (langchain>=1.0)", "langchain") from exc

    class CtxGuardMiddleware(NotPicklable, AgentMiddleware):  # type: ignore[misc, unused-ignore]
        """``create_agent`` middleware: every model call gets a window within budget.

        Works in ``wrap_model_call``, so the agent's state (its whole history, kept
        by the checkpointer) is untouched; the system message and the tools'
        schemas are counted with the messages. Put it last in ``middleware=`` so it
        fits what the other middleware hand on. With a session (``session_id=``, or
        the run's ``thread_id``), the agent's messages are stored there (each once,
        by id) and each reply with the usage the model reported (``usage_metadata``)
        against ctxguard's count: one ``usage`` audit record per model call (a call's new
        messages and its reply in one append: a reply the guard refuses stores neither). The
        output reserved is ``max_tokens``, else the model's own ``max_tokens`` (as
        ``ChatOpenAI(max_tokens=...)`` sends it), else the guard's default.
        """

        def __init__(
            self,
            guard: Guard | AsyncGuard,
            *,
            max_tokens: int | None = None,
            session_id: str | None = None,
        ) -> None:
            super().__init__()
            if not isinstance(guard, Guard | AsyncGuard):
                raise ConfigError(
                    f"CtxGuardMiddleware needs a ctxguard Guard or AsyncGuard, got "
                    f"{type(guard).__name__}"
                )
            self.guard = guard
            self.max_tokens = _shared.check_optional_count(max_tokens, "max_tokens")
            self.session_id = None if session_id is None else _shared.check_key(session_id)
            self._ref = GuardRef(guard)
            self._seen = _served.SeenIds()

        def wrap_model_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
            session = self._session(request)  # refused before the model is called
            guard = None if session is None else self._sync_guard()
            fitted = _fit(self.guard, request, self.max_tokens)
            response = handler(fitted.request)
            reply = _reply(response)
            if session is not None and guard is not None and reply is not None:
                seen = self._seen.of(session)
                unseen, everything = self._unseen(request, seen), self._everything(request)
                stored, reported = to_ctxguard(reply), _reported(reply)
                _served.persist_reply(
                    guard, session, unseen, stored, fitted.prepared, reported, seen, everything
                )
            return response

        async def awrap_model_call(
            self, request: Any, handler: Callable[[Any], Awaitable[Any]]
        ) -> Any:
            session = self._session(request)  # refused before the model is called
            fitted = await asyncio.to_thread(_fit, self.guard, request, self.max_tokens)
            response = await handler(fitted.request)
            reply = _reply(response)
            if session is not None and reply is not None:
                seen = self._seen.of(session)
                unseen, everything = self._unseen(request, seen), self._everything(request)
                stored, reported = to_ctxguard(reply), _reported(reply)
                await _served.apersist_reply(
                    self._ref, session, unseen, stored, fitted.prepared, reported, seen, everything
                )
            return response

        def _sync_guard(self) -> Guard:
            if isinstance(self.guard, AsyncGuard):
                raise ConfigError(
                    "CtxGuardMiddleware was given an AsyncGuard, which a sync agent.invoke/"
                    "stream cannot use: run the agent with ainvoke/astream, or pass a Guard"
                )
            return self.guard

        def _session(self, request: Any) -> str | None:
            if self.session_id is not None:
                return self.session_id
            info = getattr(request.runtime, "execution_info", None)
            return _thread_session(getattr(info, "thread_id", None))

        @staticmethod
        def _history(request: Any) -> list[Any]:
            """The agent's messages (its state, as the checkpointer keeps them)."""
            state = request.state.get("messages") if isinstance(request.state, dict) else None
            return state if isinstance(state, list) else list(request.messages)

        @classmethod
        def _unseen(cls, request: Any, seen: set[str]) -> list[Message]:
            history = cls._history(request)
            return [to_ctxguard(m) for m in history if not m.id or stored_id(m.id) not in seen]

        @classmethod
        def _everything(cls, request: Any) -> Callable[[], list[Message]]:
            """All of them (read only when the session moved elsewhere: see SeenIds)."""
            return lambda: [to_ctxguard(m) for m in cls._history(request)]

    return CtxGuardMiddleware
