"""The asynchronous guard: :class:`~ctxguard.guard.sync.Guard`'s twin for asyncio.

Same constructor, same methods (``await``-ed), same steps: it runs the flows of
:mod:`ctxguard.guard.flows` with awaits instead of blocking calls.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ctxguard._validate import check_state_arg, check_tail_args
from ctxguard.errors import ConfigError, SummarizerError
from ctxguard.guard import flows
from ctxguard.guard.base import GuardBase, report_background_failure
from ctxguard.guard.config import GuardConfig, is_async_callable
from ctxguard.guard.core import Tools
from ctxguard.guard.daemon_pool import DaemonPool
from ctxguard.guard.events import Observer
from ctxguard.guard.plan import SummaryRequest
from ctxguard.guard.prepared import PreparedRequest
from ctxguard.kv.limit import ContextLimit, LimitSource
from ctxguard.messages import MessageLike
from ctxguard.stores import open_async_store
from ctxguard.stores.base import AppendResult, AsyncSessionStore, ReplaceResult, Summary
from ctxguard.tokens._protocol import TokenCounter

SUMMARIZER_THREADS = 8  # a sync summarizer's calls at once (as Guard's)


class AsyncGuard(GuardBase):
    """Keeps every request of every session inside its token limit (asyncio)."""

    def __init__(
        self,
        store: str | AsyncSessionStore = "memory://",
        *,
        counter: str | TokenCounter = "approx",
        limit: int | ContextLimit | LimitSource,
        config: GuardConfig | None = None,
        namespace: str | None = None,
        tenant: str | None = None,
        observer: Observer | None = None,
        **settings: Any,
    ) -> None:
        super().__init__(
            counter=counter, limit=limit, config=config, settings=settings, observer=observer
        )
        self.store: AsyncSessionStore = (
            open_async_store(
                store,
                namespace=namespace,
                tenant=tenant,
                connect_timeout=self.config.connect_timeout,
                read_timeout=self.config.read_timeout,
            )
            if isinstance(store, str)
            else store
        )
        self._owns_store = isinstance(store, str)  # a store passed in stays the caller's
        self._check_store(self.store, want_async=True)
        self._foreign_store = self._foreign(self.store)
        if not self._foreign_store and callable(getattr(self.store, "state_token", None)):
            self.core.token_read = "state_token"
        self._background: set[asyncio.Task[Any]] = set()
        self._calls: DaemonPool | None = None  # a sync summarizer's calls (daemon_pool.py)
        self._summarizing: set[str] = set()

    async def append(self, session_id: str, messages: Iterable[MessageLike]) -> AppendResult:
        """Store messages (each counted once, now) without preparing a request."""
        self._prepare_args(session_id, messages, None, None, "messages")
        flow = flows.append(self.core, session_id, messages)
        return await self._run(self._observed("append", session_id, flow))

    async def replace_tail(
        self,
        session_id: str,
        start: int,
        messages: Iterable[MessageLike],
        *,
        expected_count: int | None = None,
        expected_state: str | None = None,
    ) -> ReplaceResult:
        """Replace messages ``start`` and later (0: the whole history) with ``messages``
        (each counted once, now), in one atomic write: a reader sees the history
        before or after, never a part of it. For a framework's ``set_messages``
        (``start=0``) or ``delete_message`` (the messages after the deleted one put
        back). With ``expected_count`` the session must still hold that many messages,
        with ``expected_state`` (the token ``store.read_with_token`` returned) it must
        not have been written since that read: a writer that removed and appended as
        many messages keeps the count, never the token (else :class:`ConflictError`,
        nothing written: read it again and retry). The removed messages'
        ids are freed, and a summary covering one of them is dropped; the audit trail
        and the turn numbers are kept, with a ``replace`` record of the removed and
        stored ids. A refused batch (a message the guard refuses, an id stored before
        ``start``, a full session) writes nothing."""
        self._prepare_args(session_id, messages, None, None, "messages")
        check_tail_args(start, expected_count)
        check_state_arg(expected_state)
        flow = flows.replace_tail(
            self.core, session_id, start, messages, expected_count, expected_state
        )
        return await self._run(self._observed("replace", session_id, flow))

    async def prepare(
        self,
        session_id: str,
        new_messages: Iterable[MessageLike] = (),
        *,
        max_tokens: int | None = None,
        tools: Tools | None = None,
    ) -> PreparedRequest:
        """Append ``new_messages`` and return the request to send, within budget."""
        self._prepare_args(session_id, new_messages, max_tokens, tools, "new_messages")
        flow = flows.prepare(self.core, session_id, new_messages, max_tokens, tools)
        return await self._run(self._observed("prepare", session_id, flow))

    async def complete(
        self,
        session_id: str,
        reply: MessageLike,
        *,
        prepared: PreparedRequest | None = None,
        usage: Mapping[str, Any] | None = None,
    ) -> AppendResult:
        """Store the model's reply; with ``usage`` the server's prompt_tokens is audited."""
        message, record = self._complete_args(session_id, reply, prepared, usage)
        flow = flows.complete(self.core, session_id, message, prepared, usage, record)
        observed = self._observed("complete", session_id, flow, usage=usage, prepared=prepared)
        return await self._run(observed)

    async def summarize(
        self, session_id: str, request: SummaryRequest
    ) -> tuple[Summary | None, str | None]:
        """Run the summarizer for ``request``, commit by compare-and-set, audit the outcome."""
        self._summarize_args(session_id, request)
        flow = flows.summarize(self.core, session_id, request)
        return await self._run(self._observed("summarize", session_id, flow))

    # -- running a flow -------------------------------------------------------------

    async def _run(self, flow: flows.Flow[flows.T]) -> flows.T:
        reply: Any = None
        error: Exception | None = None
        while True:
            try:
                op = flow.send(reply) if error is None else flow.throw(error)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
            try:
                if type(op) is flows.StoreCall:  # most ops: the store, directly
                    reply, error = await getattr(self.store, op.method)(*op.args), None
                else:
                    reply, error = await self._execute(op), None
            except Exception as exc:  # handed back to the flow, which decides
                reply, error = None, exc
                if self._foreign_store and isinstance(op, flows.StoreCall):
                    error = self._store_failed(self.store, op.method, exc)

    async def _execute(self, op: flows.Op) -> Any:
        if isinstance(op, flows.StoreCall):
            return await getattr(self.store, op.method)(*op.args)
        if isinstance(op, flows.ResolveLimit):
            aresolve = getattr(self.limit_source, "aresolve", None)
            return await aresolve() if aresolve is not None else self.limit_source.resolve()
        if isinstance(op, flows.CallSummarizer):
            return await self._call_summarizer(op.previous, op.messages)
        if isinstance(op, flows.Sleep):
            await asyncio.sleep(op.seconds)
            return None
        if op.session_id in self._summarizing or self._closed:
            return None  # one background summary per session at a time, none after aclose
        self._summarizing.add(op.session_id)
        task = asyncio.create_task(self.summarize(op.session_id, op.request))
        self._background.add(task)

        def done(finished: asyncio.Task[Any]) -> None:
            self._background.discard(finished)
            self._summarizing.discard(op.session_id)
            if not finished.cancelled():  # (retrieved: no "never retrieved" at collection)
                report_background_failure(op.session_id, finished.exception())

        task.add_done_callback(done)
        return None

    async def _call_summarizer(self, previous: str | None, messages: Sequence[Any]) -> str:
        fn = self.config.summarizer
        if fn is None:
            raise SummarizerError("no summarizer configured")
        acall = getattr(fn, "acall", None)
        if acall is not None:
            job = acall(previous, messages)
        elif is_async_callable(fn):
            job = fn(previous, messages)
        else:
            if self._calls is None:  # not asyncio.to_thread: a call that never returned
                # held asyncio.run's exit (it joins the default executor) and the process's
                self._calls = DaemonPool(SUMMARIZER_THREADS, "ctxguard-calls")
            context = contextvars.copy_context()  # (as asyncio.to_thread runs it)
            job = asyncio.get_running_loop().run_in_executor(
                self._calls, context.run, fn, previous, messages
            )
        try:
            return await asyncio.wait_for(job, timeout=self.config.summary_timeout)
        except TimeoutError:
            timeout = self.config.summary_timeout
            raise SummarizerError(f"summarizer timed out after {timeout}s") from None

    async def wait_for_summaries(self) -> None:
        """Wait until background summaries finish (tests, shutdown)."""
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)

    async def aclose(self) -> None:
        """Wait for background summaries, write pending audit records, then release the
        connections of the store this guard opened from a URL (a store passed in is left
        open: it is the caller's to close). A held record that cannot be written is
        raised, after the connections are released. Every later call but ``aclose()``
        (which does nothing then) raises :class:`GuardClosedError`."""
        if self._closed:
            return
        await self.wait_for_summaries()
        self._closed = True
        try:
            await self._run(flows.flush(self.core))
        finally:
            if self._calls is not None:
                self._calls.shutdown(wait=False, cancel_futures=True)
            if self._owns_store:
                try:
                    await self.store.close()
                except ConfigError:  # another running loop owns the store: nothing was
                    self._closed = False  # closed from here, and the guard stays usable
                    raise
