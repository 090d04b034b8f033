"""OpenAI Agents SDK adapter: the ``Session`` protocol on ctxguard.

>>> session = CtxGuardSession("user-42", "redis://localhost:6379/0", limit=128_000)
>>> result = await Runner.run(agent, "hi", session=session,            # doctest: +SKIP
...     run_config=RunConfig(call_model_input_filter=session.model_input_filter()))

Items are stored one ctxguard message per item, except that consecutive call
items added together (parallel tool calls) share one assistant message, so the
guard sees the chat shape providers check: an assistant message with all its
tool calls, then the results. Each original item is kept verbatim in
``Message.metadata['agents']`` when the chat shape cannot rebuild it, so
``get_items`` returns exactly what ``add_items`` received (the conversion:
``adapters/_openai_agents_items.py``; compaction: ``adapters/_compaction.py``).

* ``get_items(limit=N)`` is the newest N items, oldest first, always from the raw
  history: the Runner relies on it to check and rewind the session's tail.
  Without ``limit``, ``session_settings.limit`` applies, as in the SDK's own
  sessions (``session_settings`` is a ``SessionSettings`` or a dict of its
  fields; unknown keys are a :class:`~ctxguard.errors.ConfigError`).
* ``get_items()`` with no limit is the whole history, or, with ``window=True``,
  the guard's budgeted window of it (system items pinned, call/output pairs whole).
  ``window=True`` refuses a guard with ``GuardConfig(commit="with_reply")`` (a
  :class:`~ctxguard.errors.ConfigError`): that setting writes a request's record with
  ``complete``, which a session never calls; ``add_items`` and the filter work with it.
* Every method takes the SDK's context-aware ``wrapper=`` keyword (the run's
  ``RunContextWrapper``); the session does not need the run context and
  ignores it.
* ``run_compaction`` (the Runner's post-turn hook) folds turns older than the
  newest ``compact_keep_turns`` user turns into the session's rolling summary
  with the guard's summarizer (see :mod:`ctxguard.adapters._compaction`).
* The Runner asks for history before it stores the new input, so the exact
  budget belongs in :meth:`CtxGuardSession.model_input_filter`: it fits every
  model call (instructions + history + new input + this run's tool turns).
* What is stored when: the Runner stores a run's input with ``add_items`` before
  its first model call (``Runner.run_streamed`` after it) and each turn's items
  before the next call, each at once. When the filter refuses a request (a
  :class:`~ctxguard.errors.CtxGuardError` such as ``BudgetError``), the session
  takes back everything the run stored, in one atomic, audited ``store.retract``
  that checks the session's state token is the one the run's last write left
  (another writer's write meanwhile: nothing is taken back). The run fails with the
  history as it was; the audit trail keeps the ``retract`` record. The run is the
  SDK's ``wrapper=`` (one ``RunContextWrapper`` per run); only items the refused
  request carries are taken back, never another run's.
* ``pop_item`` returns and removes the newest item in one atomic, audited write:
  a ``store.retract`` of the newest message, or, when that message held several
  items (parallel calls), ``Guard.replace_tail`` of it by the others, with its id
  (a reader never sees them gone). Either checks that nothing was appended since
  the message was read (:class:`~ctxguard.errors.ConflictError` otherwise).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Self

from ctxguard._nocopy import NotPicklable
from ctxguard._validate import check_tools, one_line, show
from ctxguard.adapters import _compaction, _shared
from ctxguard.adapters._loops import PerLoop
from ctxguard.adapters._openai_agents_items import (
    Item,
    _groups,
    _message_of,
    _plain,
    checked_items,
    items_to_messages,
    message_to_items,
)
from ctxguard.adapters._shared import GuardRef
from ctxguard.errors import (
    ConfigError,
    CtxGuardError,
    InvalidInputError,
    MissingDependencyError,
)
from ctxguard.guard.aio import AsyncGuard
from ctxguard.guard.prepared import PreparedRequest
from ctxguard.guard.sync import Guard
from ctxguard.messages import Message
from ctxguard.stores.contract import AppendResult

try:
    from agents.memory.session_settings import (
        SessionSettings,
        coerce_session_settings,
        resolve_session_limit,
    )
    from agents.run_config import ModelInputData
except ImportError as exc:  # pragma: no cover - exercised in a subprocess test
    raise MissingDependencyError("ctxguard.adapters.openai_agents", "agents") from exc

# -- the session ---------------------------------------------------------------------


class CtxGuardSession(NotPicklable):
    """An Agents SDK ``Session`` stored by ctxguard (memory://, Redis, Cluster).

    ``guard_or_url`` is a :class:`~ctxguard.guard.Guard`, an
    :class:`~ctxguard.guard.AsyncGuard` or a store URL (then ``limit``,
    ``counter``, ``namespace``, ``tenant`` build the guard). ``window=True``
    makes ``get_items()`` return the budgeted window, reserving ``max_tokens``
    for the reply. ``session_settings`` (a ``SessionSettings`` or a dict of its
    fields) sets the default ``limit`` of :meth:`get_items`, as in the SDK's sessions.
    ``compact_keep_turns`` and ``compact_threshold`` tune :meth:`run_compaction`.
    """

    session_settings: SessionSettings | None

    def __init__(
        self,
        session_id: str,
        guard_or_url: Guard | AsyncGuard | str = "memory://",
        *,
        window: bool = False,
        max_tokens: int | None = None,
        session_settings: SessionSettings | dict[str, Any] | None = None,
        compact_keep_turns: int = _compaction.KEEP_TURNS,
        compact_threshold: int = _compaction.THRESHOLD,
        **guard_options: Any,
    ) -> None:
        self.session_id = _shared.check_key(session_id)
        self.window = _shared.check_flag(window, "window")
        self.max_tokens = _shared.check_optional_count(max_tokens, "max_tokens")
        self.session_settings = _settings(session_settings) or SessionSettings()
        self.compaction = _compaction.Folding(compact_keep_turns, compact_threshold)
        self.ref = GuardRef(guard_or_url, **guard_options)
        if self.window:
            _shared.refuse_with_reply(
                self.ref.commit,
                "CtxGuardSession(window=True)",
                "get_items() prepares only to read the window and the Runner stores the "
                "reply with add_items(), never complete(), so its request record would "
                "never be written (window=False works)",
            )
        self.last_prepared: PreparedRequest | None = None
        self._locks: PerLoop[asyncio.Lock] = PerLoop(asyncio.Lock)
        self._run_writes = _RunWrites()

    def _lock(self) -> asyncio.Lock:
        """This session's lock on the running loop (an asyncio.Lock serves one loop; a
        session used from several, as ``Runner.run_sync`` in threads does, keeps one each)."""
        return self._locks.get()

    async def get_items(self, limit: int | None = None, *, wrapper: Any = None) -> list[Item]:
        if limit is not None and type(limit) is not int:
            raise InvalidInputError(
                one_line(f"limit must be an int (the newest N items) or None, got {show(limit)}")
            )
        self._run_writes.seen(wrapper)
        limit = resolve_session_limit(limit, self.session_settings)
        if limit is not None:
            if limit <= 0:
                return []
            messages = await _shared.aread_last(self.ref, self.session_id, limit)
            return _flatten(messages)[-limit:]
        if not self.window:
            return _flatten(await _shared.aread_all(self.ref, self.session_id))
        prepared = await _shared.aprepare(self.ref, self.session_id, (), self.max_tokens)
        self.last_prepared = prepared
        return _flatten(prepared.messages)

    async def add_items(self, items: list[Any], *, wrapper: Any = None) -> None:
        batch = _shared.check_batch(items, object, "items")
        messages = items_to_messages(batch)
        async with self._lock():
            result = await _shared.aappend(self.ref, self.session_id, messages)
            self._run_writes.note(wrapper, result, [_plain(i) for i in batch])

    async def pop_item(self, *, wrapper: Any = None) -> Item | None:
        """Remove and return the newest item (atomic retract; see the module docstring)."""
        self._run_writes.forget()
        async with self._lock():
            last = await _shared.asplit_newest(self.ref, self.session_id, _rest_of)
            return None if last is None else message_to_items(last)[-1]

    async def clear_session(self, *, wrapper: Any = None) -> None:
        self._run_writes.forget()
        async with self._lock():
            await _shared.aclear(self.ref, self.session_id)

    async def close(self) -> None:
        """Release the connections of the guards this session opened from a store URL:
        the Guard and the running loop's AsyncGuard (another loop's closes with that
        loop). A Guard or AsyncGuard passed in is yours and stays open. Idempotent; a
        later call opens a new guard. Awaited, as the SDK's own ``RedisSession.close``
        and ``AsyncSQLiteSession.close`` are; also ``async with session:``."""
        await self.ref.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def run_compaction(self, args: Any = None, *, wrapper: Any = None) -> None:
        """Fold old turns into the session's summary with the guard's summarizer.

        The Runner calls this after each turn it stores (when the model reports a
        response id, as the Responses API does; call it yourself otherwise). The
        raw history is kept whole; windows use the summary once they leave those
        turns out. Nothing happens while a tool call still waits for its output,
        without a summarizer, or (unless ``args["force"]``) before
        ``compact_threshold`` messages are there to fold. A failed summary is
        audited (``summary_failed``) and changes nothing.
        """
        force = _compaction.check_args(args)
        async with self._lock():
            await self.compaction.arun(self.ref, self.session_id, force=force)

    def model_input_filter(
        self, *, max_tokens: int | None = None, tools: Sequence[Any] | None = None
    ) -> Callable[[Any], Awaitable[Any]]:
        """A ``RunConfig.call_model_input_filter`` that fits every model call to the budget.

        ``tools`` are OpenAI tool schemas to count (the SDK does not hand them
        to the filter); ``max_tokens`` the output to reserve (else this
        session's, else the guard's default).
        """
        _shared.check_optional_count(max_tokens, "max_tokens")
        reserve = self.max_tokens if max_tokens is None else max_tokens
        guard = self.ref.any_guard()
        schemas = _shared.check_tool_list(tools) or None
        check_tools(schemas)

        async def fit_call(data: Any) -> Any:
            model_data = data.model_data
            instructions = model_data.instructions
            groups = _groups(checked_items(model_data.input, "input"))
            messages = [_message_of(g) for g in groups]
            if instructions:
                messages.insert(0, Message(role="system", content=instructions))
                groups.insert(0, [])
            try:
                prepared, origins = await _shared.afit(guard, messages, reserve, schemas)
            except CtxGuardError:
                await self._take_back(model_data.input)
                raise
            self.last_prepared = prepared
            window = _shared.restore_window(prepared, origins, groups, message_to_items)
            items = [item for group in window for item in group]
            return ModelInputData(input=items, instructions=instructions)

        return fit_call

    async def _take_back(self, sent: Sequence[Any]) -> None:
        """A request the guard refused stores nothing: take back what the run stored
        (the Runner stores the input before the model is called, the turn's items before
        the next call), in one atomic ``store.retract`` that checks nothing else was
        written since (else it is left as it is, nothing written). Only items the refused
        request carries are taken back (a concurrent run's are not)."""
        written = self._run_writes
        async with self._lock():
            if not written.count or written.token is None:
                return
            carried = [_plain(i) for i in sent]
            if any(item not in carried for item in written.items):
                return
            taken = await _shared.aretract_unchanged(
                self.ref, self.session_id, written.count, written.token
            )
            if taken:
                written.forget()


class _RunWrites:
    """What the current run stored through this session, to take back if a request of
    the run is refused: the messages appended (and their items) since the run's first
    ``add_items``, while each append came right after the previous one (the session's
    state token unchanged between them). The run is the Runner's ``RunContextWrapper``
    (one object per run, passed as ``wrapper=``); without one, each call is a run."""

    def __init__(self) -> None:
        self.run: object = None
        self.count = 0
        self.token: str | None = None
        self.items: list[Item] = []

    def forget(self) -> None:
        self.run, self.count, self.token, self.items = None, 0, None, []

    def seen(self, run: object) -> None:
        """A call of ``run``: another run's (or a call outside any) ends the one tracked
        (each run reads the history first, the streamed Runner before its first request)."""
        if run is None or run is not self.run:
            self.forget()

    def note(self, run: object, result: AppendResult | None, items: list[Item]) -> None:
        if result is None:  # (nothing to store: nothing changed)
            return
        if run is None or run is not self.run or result.token_before != self.token:
            self.forget()
            self.run = run
        self.count += len(result.stored)
        self.token = result.token_after
        self.items += items


def _rest_of(last: Message) -> list[Message]:
    """What stays of the newest message when its last item is popped: the other items
    (parallel calls), as one message with its id and time (none for a single item)."""
    items = message_to_items(last)
    rest = items_to_messages(items[:-1])
    return [m.model_copy(update={"id": last.id, "created_at": last.created_at}) for m in rest]


def _settings(value: object) -> SessionSettings | None:
    """``session_settings`` as the SDK's sessions take it, or a one-line ConfigError."""
    if value is None:
        return None
    try:
        return coerce_session_settings(value)  # type: ignore[arg-type]
    except (TypeError, ValueError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(
            one_line(f"session_settings must be a SessionSettings or a dict of its fields: {first}")
        ) from None


def _flatten(messages: Sequence[Message]) -> list[Item]:
    return [item for m in messages for item in message_to_items(m)]


__all__ = ["CtxGuardSession", "items_to_messages", "message_to_items"]
