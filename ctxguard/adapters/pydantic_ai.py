"""Pydantic AI adapter: every model request within the served limit, and a ctxguard session.

>>> guard = Guard("redis://localhost:6379/0", limit=ServerLimit(url), counter="hf:...")
>>> model = OpenAIChatModel("qwen", provider=..., profile=model_profile(guard))  # doctest: +SKIP
>>> capability = CtxGuardCapability(guard, session_id="user-42")
>>> agent = Agent(model, capabilities=[capability])
>>> result = await agent.run("hi", message_history=await capability.aload())

* :class:`CtxGuardCapability` fits each request in ``prepare_model_request`` (the hook
  Pydantic AI documents for context-window fitting: it runs once per attempt, with the
  model that serves it). It counts the instructions, the tools' schemas and the
  history with the guard's counter and reserves the request's ``max_tokens`` (it sets
  ``max_tokens`` to the guard's reserve when the request has none, so the reserve
  holds). System prompt parts and instructions are pinned, a tool call and its return
  stay together, thinking and provider-specific parts are counted and never split.
  Only the request changes: the run's history (``result.all_messages()``) stays whole.
  The session gets the run's messages as they become final (once the next request
  fits, and the rest when the run ends), each response with the usage the model reported
  against ctxguard's count of what was sent (one ``usage`` audit record per call). A
  request the guard refuses stores nothing: the run fails with the session as it was.
* :func:`history_processor` is the same fit as a plain history processor, for
  ``capabilities=[ProcessHistory(history_processor(guard))]`` (no session, no usage).
  Pydantic AI replaces the run's history with a processor's result, so prefer the
  capability when the run's history should stay whole.
* :func:`model_profile` gives the served limit as the model's ``context_window``.

Messages round-trip losslessly through the session (see ``_pydantic_ai_parts``), each
stored once under a digest of its JSON (a message :meth:`~CtxGuardCapability.load` read
from another writer keeps its stored id), so passing a run's history to the next run
(``message_history=result.all_messages()`` or ``load()``) stores only what is new.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from ctxguard._nocopy import NotPicklable
from ctxguard._validate import type_name
from ctxguard.adapters import _served, _shared
from ctxguard.adapters._pydantic_ai_parts import (
    META_KEY,
    Pieces,
    dump,
    from_stored,
    load,
    to_pieces,
    window_messages,
)
from ctxguard.adapters._shared import GuardRef, Tools
from ctxguard.errors import ConfigError, InvalidInputError, MissingDependencyError
from ctxguard.guard.aio import AsyncGuard
from ctxguard.guard.prepared import PreparedRequest
from ctxguard.guard.sync import Guard
from ctxguard.messages import Message

try:
    from pydantic_ai import messages as pai
    from pydantic_ai.capabilities import AbstractCapability
    from pydantic_ai.capabilities.abstract import WrapRunHandler
    from pydantic_ai.models import ModelRequestContext
    from pydantic_ai.tools import RunContext, ToolDefinition
except ImportError as exc:  # pragma: no cover - exercised in a subprocess test
    raise MissingDependencyError("ctxguard.adapters.pydantic_ai", "pydantic-ai") from exc

History = list[pai.ModelMessage]


def model_profile(limit: _served.LimitLike) -> dict[str, int]:
    """``profile=`` for a Pydantic AI model: the served limit as its ``context_window``.

    ``context_window`` is prompt and output together, as a vLLM server's limit is.
    """
    return {"context_window": _served.served_limit(limit).tokens}


def openai_tools(tools: Sequence[ToolDefinition]) -> list[dict[str, Any]]:
    """Pydantic AI tool definitions as the OpenAI tool schemas the guard counts."""
    out = []
    for index, tool in enumerate(_shared.check_tool_list(tools) or ()):
        if not isinstance(tool, ToolDefinition):
            raise InvalidInputError(
                f"tools[{index}] must be a Pydantic AI ToolDefinition, got {type_name(tool)}"
            )
        function: dict[str, Any] = {"name": tool.name, "parameters": tool.parameters_json_schema}
        if tool.description:
            function["description"] = tool.description
        out.append({"type": "function", "function": function})
    return out


@dataclasses.dataclass(frozen=True)
class Fitted:
    """One fitted request: the window to send and the guard's account of it."""

    messages: History
    prepared: PreparedRequest


def fit_history(
    guard: Guard | AsyncGuard,
    history: Sequence[pai.ModelMessage],
    *,
    instructions: str | None = None,
    max_tokens: int | None = None,
    tools: Tools | None = None,
) -> Fitted:
    """``history`` cut to the guard's budget; the messages are the caller's own where whole."""
    history = _shared.check_batch(history, object, "history")
    pieces = to_pieces(history)
    head = [Message(role="system", content=instructions)] if instructions else []
    prepared, origins = _shared.fit(guard, head + pieces.messages, max_tokens, tools)
    return Fitted(_window(history, pieces, prepared, origins, len(head)), prepared)


def _window(
    history: Sequence[pai.ModelMessage],
    pieces: Pieces,
    prepared: PreparedRequest,
    origins: list[int],
    skip: int,
) -> History:
    kept = [(m, o - skip) for m, o in zip(prepared.messages, origins, strict=True) if o >= skip]
    return window_messages(history, pieces, [m for m, _ in kept], [o for _, o in kept])


async def afit_history(
    guard: Guard | AsyncGuard,
    history: Sequence[pai.ModelMessage],
    *,
    instructions: str | None = None,
    max_tokens: int | None = None,
    tools: Tools | None = None,
) -> Fitted:
    """:func:`fit_history` off the event loop (counting may be slow)."""
    return await asyncio.to_thread(
        fit_history,
        guard,
        history,
        instructions=instructions,
        max_tokens=max_tokens,
        tools=tools,
    )


def _instructions(history: Sequence[pai.ModelMessage]) -> str | None:
    for message in reversed(history):
        if isinstance(message, pai.ModelRequest):
            return message.instructions
    return None


def history_processor(
    guard: Guard | AsyncGuard,
    *,
    max_tokens: int | None = None,
    tools: Sequence[ToolDefinition] | None = None,
) -> Callable[[History], Awaitable[History]]:
    """A Pydantic AI history processor that fits the history to ``guard``'s budget.

    The newest request's instructions are counted; ``tools`` are the agent's tool
    definitions (a processor is not told them), ``max_tokens`` the output to reserve.
    """
    schemas = openai_tools(tools or ())

    async def ctxguard_window(messages: History) -> History:
        fitted = await afit_history(
            guard,
            messages,
            instructions=_instructions(messages),
            max_tokens=max_tokens,
            tools=schemas or None,
        )
        return fitted.messages

    return ctxguard_window


# -- the capability ------------------------------------------------------------------


@dataclasses.dataclass
class CtxGuardCapability(NotPicklable, AbstractCapability[Any]):
    """Fits every model request to the guard's budget and keeps the run in a session.

    ``session_id`` names the ctxguard session (default: the run's ``conversation_id``);
    ``max_tokens`` is the output reserved when the request sets none (default: the
    guard's). ``persist=False`` only fits (no session, no usage records).
    """

    guard: Guard | AsyncGuard
    session_id: str | None = None
    max_tokens: int | None = None
    persist: bool = True
    last: PreparedRequest | None = dataclasses.field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.guard, Guard | AsyncGuard):
            raise ConfigError(
                f"CtxGuardCapability needs a ctxguard Guard or AsyncGuard, got "
                f"{type(self.guard).__name__}"
            )
        self._ref = GuardRef(self.guard)
        if self.session_id is not None:
            _shared.check_key(self.session_id)
        _shared.check_optional_count(self.max_tokens, "max_tokens")
        _shared.check_flag(self.persist, "persist")
        self._seen = _served.SeenIds()  # per session: ids known to be stored
        self._held: dict[int, tuple[PreparedRequest, dict[str, Any] | None]] = {}
        self._stored_upto = 0  # this run's history, stored up to here

    @classmethod
    def get_serialization_name(cls) -> str | None:
        return None  # holds a guard: not spec-serialisable

    async def for_run(self, ctx: RunContext[Any]) -> CtxGuardCapability:
        run = dataclasses.replace(self)  # per-run state (the last request, usage held)
        run._seen = self._seen  # what is stored is known across runs
        return run

    # -- the session ------------------------------------------------------------------

    def load(self, session_id: str | None = None) -> History:
        """The session's whole history as Pydantic AI messages (for ``message_history``)."""
        sid = self._session(session_id)
        return from_stored(_shared.read_all(self._ref.sync(), sid))

    async def aload(self, session_id: str | None = None) -> History:
        return from_stored(await _shared.aread_all(self._ref, self._session(session_id)))

    def _session(self, session_id: str | None, ctx: RunContext[Any] | None = None) -> str:
        chosen = session_id or self.session_id or (ctx.conversation_id if ctx else None)
        if chosen is None:
            raise ConfigError("name the session: CtxGuardCapability(guard, session_id=...)")
        return _shared.check_key(chosen)

    # -- hooks ---------------------------------------------------------------------------

    async def prepare_model_request(
        self, ctx: RunContext[Any], request_context: ModelRequestContext
    ) -> ModelRequestContext:
        params = request_context.model_request_parameters
        settings = dict(request_context.model_settings or {})
        asked = settings.get("max_tokens")
        reserve = asked if isinstance(asked, int) else self.max_tokens
        tools = openai_tools([*params.function_tools, *params.output_tools])
        joined = pai.InstructionPart.join(params.instruction_parts or [])
        fitted = await afit_history(
            self.guard,
            request_context.messages,
            instructions=joined,
            max_tokens=reserve,
            tools=tools or None,
        )
        if self.persist:  # what the run made before this request is final: store it now,
            # once the request fits (a refused one stores nothing)
            await self._store(ctx, list(ctx.messages)[:-1])
        settings["max_tokens"] = fitted.prepared.reserved_output
        request_context.model_settings = settings  # type: ignore[assignment]
        request_context.messages = fitted.messages
        self.last = fitted.prepared
        return request_context

    async def after_model_request(
        self,
        ctx: RunContext[Any],
        *,
        request_context: ModelRequestContext,
        response: pai.ModelResponse,
    ) -> pai.ModelResponse:
        if self.persist and self.last is not None:
            reported = _served.usage(response.usage.input_tokens, response.usage.output_tokens)
            # the run appends (a final copy of) the response next: held by its place
            self._held[len(ctx.messages)] = (self.last, reported)
        return response

    async def wrap_run(self, ctx: RunContext[Any], *, handler: WrapRunHandler) -> Any:
        """Store the rest of the run once it ends. A run that fails (a request the guard
        refused, say) stores nothing more: the session ends at its last whole request."""
        result = await handler()
        if self.persist:
            await self._store(ctx, result.all_messages())
        return result

    async def _store(self, ctx: RunContext[Any], history: History) -> None:
        """Append the messages not stored yet; each response with the usage it reported."""
        session = self._session(None, ctx)
        seen = self._seen.of(session)
        start = self._stored_upto  # a prefix stored by this run already is not redone
        pieces = to_pieces(history, keep=True, start=start)
        self._stored_upto = max(start, len(history))

        upto = len(history)  # the messages a relay may lay back: those before a held reply

        def everything() -> list[Message]:  # (read only when the session moved elsewhere)
            return to_pieces(history[:upto], keep=True).messages

        batch: list[Message] = []
        for piece, (index, _) in zip(pieces.messages, pieces.places, strict=True):
            held = self._held.pop(index, None)
            if held is None:
                batch.append(piece)
                continue
            upto = index  # (the reply goes with the messages before it, then its usage)
            await _served.apersist_reply(self._ref, session, batch, piece, *held, seen, everything)
            batch = []
        upto = len(history)
        await _served.apersist(self._ref, session, batch, seen, everything)


__all__ = [
    "META_KEY",
    "CtxGuardCapability",
    "Fitted",
    "afit_history",
    "dump",
    "fit_history",
    "from_stored",
    "history_processor",
    "load",
    "model_profile",
    "openai_tools",
    "to_pieces",
]
