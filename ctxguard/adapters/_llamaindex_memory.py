"""LlamaIndex ``BaseMemory`` on ctxguard: ``get()`` is the guard's budgeted window.

What is stored when: ``put``/``aput`` (``put_messages``) store at once. A
``FunctionAgent``/``AgentWorkflow`` (``aput(user_msg)`` then ``aget()``) and the chat
engines (``put`` then ``get``) store the user's message before the guard fits the window
that sends it; when ``get``/``aget`` is refused (a
:class:`~ctxguard.errors.CtxGuardError` such as ``BudgetError``), the memory takes back
what it stored of that request, the messages put since the last put that began with a
user message (what an agent puts after its last ``get``, its steps and answer, answered
the request before and stays), in one atomic, audited ``store.retract`` that checks the
session's state token is the one the last put left (another write meanwhile: nothing is
taken back). The request fails with the history as it was; the audit trail keeps the
guard's ``refused`` record and the ``retract``. A later call of the same request refused
(nothing put since the window: :class:`CtxGuardLLM` built on this memory refusing the
call the window went into, or the agent's next step) takes back what that window's
request stored the same way (the fitted windows' ``request`` records stay).

A guard with ``GuardConfig(commit="with_reply")`` is refused when the memory is built (a
:class:`~ctxguard.errors.ConfigError`): that setting writes a request's record with
``complete``, which a memory never calls (the chat store and :class:`CtxGuardLLM` work
with it).

The memory survives its own serialisation (``to_dict``/``from_dict``, a
workflow ``Context`` saved with ``JsonSerializer``, pickle): see
:mod:`ctxguard.adapters._llamaindex_fields` (shared with the chat store).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Self

from ctxguard.adapters import _llamaindex_fields as fields
from ctxguard.adapters import _shared
from ctxguard.adapters._closing import ClosesOwnGuard
from ctxguard.adapters._llamaindex_convert import _checked_one, _converted, to_llamaindex
from ctxguard.adapters._shared import GuardRef
from ctxguard.errors import CtxGuardError, InvalidInputError, MissingDependencyError
from ctxguard.guard.aio import AsyncGuard
from ctxguard.guard.prepared import PreparedRequest
from ctxguard.guard.sync import Guard
from ctxguard.messages import Message
from ctxguard.stores.contract import AppendResult

try:
    from llama_index.core.base.llms.types import ChatMessage
    from llama_index.core.bridge.pydantic import Field, PrivateAttr, ValidationError
    from llama_index.core.memory.types import BaseMemory
except ImportError as exc:  # pragma: no cover - exercised in a subprocess test
    raise MissingDependencyError("ctxguard.adapters.llamaindex", "llamaindex") from exc


class CtxGuardMemory(BaseMemory, fields.StoreFields, ClosesOwnGuard):
    """``BaseMemory`` whose ``get()`` is the guard's budgeted window of the session.

    ``max_tokens`` is the output to reserve (the guard's default when None).
    ``get(initial_token_count=n)`` reserves ``n`` more tokens: LlamaIndex chat
    engines pass the size of a system prompt they keep outside the memory,
    counted with :attr:`tokenizer_fn` (the guard's counter, the prompt counted
    as one system message). With a template whose counts do not add up
    (``counter.additive`` false), keep the system prompt in the memory (it is
    pinned) for an exact count. ``last_prepared`` keeps the last window's
    numbers and decisions. Build it with :meth:`from_defaults`; built directly,
    the fields below open the guard.
    """

    session_id: str = Field(
        default="chat_history", description="the ctxguard session id (LlamaIndex's chat_store_key)"
    )
    max_tokens: int | None = Field(default=None, description="output tokens to reserve")
    _last: PreparedRequest | None = PrivateAttr(default=None)
    _asked: _Asked = PrivateAttr(default_factory=lambda: _Asked())
    _sent: _Asked = PrivateAttr(default_factory=lambda: _Asked())

    def __init__(self, /, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise _refusal(exc) from None

    @classmethod
    def model_validate(cls, obj: Any, *args: Any, **kwargs: Any) -> Self:
        try:
            return super().model_validate(obj, *args, **kwargs)
        except ValidationError as exc:
            raise _refusal(exc) from None

    @classmethod
    def model_validate_json(cls, json_data: Any, *args: Any, **kwargs: Any) -> Self:
        try:
            return super().model_validate_json(json_data, *args, **kwargs)
        except ValidationError as exc:
            raise _refusal(exc) from None

    def model_post_init(self, context: Any, /) -> None:
        _shared.refuse_with_reply(
            self.settings.get("commit"),
            "CtxGuardMemory",
            "get() prepares only to read the window and an agent put()s the reply, never "
            "complete()s it, so the window's request record would never be written",
        )
        _shared.check_key(self.session_id)
        _shared.check_optional_count(self.max_tokens, "max_tokens")
        _shared.check_optional_count(self.limit, "limit")
        fields.hide_credentials(self, "CtxGuardMemory.from_defaults")

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
        ref = GuardRef(guard_or_url, **guard_options)
        described = fields.describe(guard_or_url, guard_options)
        memory = cls(session_id=session_id, max_tokens=max_tokens, **described)
        memory._ref = ref
        fields.remember(memory.handle, ref)
        if chat_history:
            memory.set(chat_history)
        return memory

    @property
    def ref(self) -> GuardRef:
        """The guard this memory works through (found again or opened from the fields)."""
        if self._ref is None:
            self._ref = fields.find_or_reopen(
                self.handle, self.model_dump(), "CtxGuardMemory.from_defaults"
            )
        return self._ref

    @property
    def tokenizer_fn(self) -> Callable[[str], list[int]]:
        """What LlamaIndex chat engines count a system prompt with: one entry per token,
        the text counted as a system message by the guard's counter."""
        counter = self.ref.any_guard().counter

        def tokens(text: str) -> list[int]:
            return [0] * counter.count_message(Message(role="system", content=text)) if text else []

        return tokens

    @property
    def last_prepared(self) -> PreparedRequest | None:
        return self._last

    def get(self, input: str | None = None, **kwargs: Any) -> list[ChatMessage]:  # noqa: A002
        guard = self.ref.sync()
        reserve: int | None = None  # (a refused reserve is no empty memory)
        try:
            reserve = self._reserve(guard, kwargs.get("initial_token_count", 0))
            prepared = _shared.prepare(guard, self.session_id, (), reserve)
        except CtxGuardError as exc:
            if _empty(exc, reserve) and not _shared.read_all(guard, self.session_id):
                return []  # an empty memory, as every LlamaIndex memory answers
            self._take_back_request()
            raise
        self._fitted()
        return self._window(prepared)

    async def aget(self, input: str | None = None, **kwargs: Any) -> list[ChatMessage]:  # noqa: A002
        reserve: int | None = None
        try:
            reserve = self._reserve(self.ref.any_guard(), kwargs.get("initial_token_count", 0))
            prepared = await _shared.aprepare(self.ref, self.session_id, (), reserve)
        except CtxGuardError as exc:
            if _empty(exc, reserve) and not await _shared.aread_all(self.ref, self.session_id):
                return []
            await self._atake_back_request()
            raise
        self._fitted()
        return self._window(prepared)

    def _fitted(self) -> None:
        """A window fitted: what was put for it is its request's (:attr:`_sent`)."""
        if self._asked.count:
            self._sent = self._asked
        self._asked = _Asked()

    def _request(self) -> _Asked:
        """What this memory stored of the request being refused, forgotten: what was put
        since the last window, else (nothing put since) what the last window's request
        stored (a later call of the same request refused: an agent's next step, or
        :class:`CtxGuardLLM` refusing the call the window went into)."""
        asked = self._asked if self._asked.count else self._sent
        self._asked, self._sent = _Asked(), _Asked()
        return asked

    def _take_back_request(self) -> None:
        """Take back what the refused request stored (one retract; nothing when the
        session changed since its last put)."""
        asked = self._request()
        if asked.count and asked.token is not None:
            guard = self.ref.sync()
            _shared.retract_unchanged(guard, self.session_id, asked.count, asked.token)

    async def _atake_back_request(self) -> None:
        """Async :meth:`_take_back_request`."""
        asked = self._request()
        if asked.count and asked.token is not None:
            await _shared.aretract_unchanged(self.ref, self.session_id, asked.count, asked.token)

    def get_all(self) -> list[ChatMessage]:
        return [to_llamaindex(m) for m in _shared.read_all(self.ref.sync(), self.session_id)]

    async def aget_all(self) -> list[ChatMessage]:
        return [to_llamaindex(m) for m in await _shared.aread_all(self.ref, self.session_id)]

    def put(self, message: ChatMessage) -> None:
        self.put_messages([_checked_one(message)])

    async def aput(self, message: ChatMessage) -> None:
        await self.aput_messages([_checked_one(message)])

    def put_messages(self, messages: list[ChatMessage]) -> None:
        new = _converted(self.session_id, messages)
        if new:
            self._asked.note(new, self.ref.sync().append(self.session_id, new))

    async def aput_messages(self, messages: list[ChatMessage]) -> None:
        new = _converted(self.session_id, messages)
        self._asked.note(new, await _shared.aappend(self.ref, self.session_id, new))

    def set(self, messages: list[ChatMessage]) -> None:
        _shared.replace(self.ref.sync(), self.session_id, _converted(self.session_id, messages))

    async def aset(self, messages: list[ChatMessage]) -> None:
        await _shared.areplace(self.ref, self.session_id, _converted(self.session_id, messages))

    def reset(self) -> None:
        _shared.clear(self.ref.sync(), self.session_id)

    async def areset(self) -> None:
        await _shared.aclear(self.ref, self.session_id)

    def _guard_ref(self) -> GuardRef | fields.NothingOpen:  # ClosesOwnGuard: close(), with
        # copies of this object share the guard, and open a new one when next used
        return fields.to_close(self._ref, self.handle)

    def _reserve(self, guard: Guard | AsyncGuard, extra: object) -> int:
        count = _shared.check_optional_count(extra, "initial_token_count")
        base = guard.config.max_tokens if self.max_tokens is None else self.max_tokens
        return base + (count or 0)

    def _window(self, prepared: PreparedRequest) -> list[ChatMessage]:
        self._last = prepared
        return [to_llamaindex(m) for m in prepared.messages]


class _Asked:
    """What this memory stored of the request a ``get`` is to fit: the messages put since
    a put that began with a user message (a new request: what came before it, such as
    an agent's steps put after its last ``get``, answered the request before), while
    each put came right after the previous one (the state token unchanged between)."""

    def __init__(self) -> None:
        self.count = 0
        self.token: str | None = None

    def note(self, new: Sequence[Message], result: AppendResult | None) -> None:
        if result is None:
            return
        if new and new[0].role == "user":
            self.count = 0
        elif not self.count or result.token_before != self.token:
            self.count, self.token = 0, None  # (not a request's: nothing to take back)
            return
        self.count += len(result.stored)
        self.token = result.token_after


def _empty(exc: CtxGuardError, reserve: int | None) -> bool:
    """Whether the guard's refusal may mean an empty session (nothing to send): the
    window's, not the reserve's (a bad ``initial_token_count``)."""
    return isinstance(exc, InvalidInputError) and reserve is not None


def _refusal(exc: ValidationError) -> InvalidInputError:
    return fields.refusal(exc, "CtxGuardMemory", "from_defaults()")
