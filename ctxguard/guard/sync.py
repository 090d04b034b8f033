"""The synchronous guard: what a chatbot backend calls on every turn.

Every step lives in :mod:`ctxguard.guard.flows` (and the decisions in
:class:`~ctxguard.guard.core.GuardCore`); this class only runs a flow's I/O
with blocking calls.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ctxguard._validate import check_state_arg, check_tail_args, check_timeout
from ctxguard.errors import GuardClosedError, SummarizerError
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
from ctxguard.stores import open_store
from ctxguard.stores.base import AppendResult, ReplaceResult, SessionStore, Summary
from ctxguard.tokens._protocol import TokenCounter

BACKGROUND_SUMMARIES = 4  # background summaries running at once (one guard)


class Guard(GuardBase):
    """Keeps every request of every session inside its token limit.

    >>> guard = Guard("memory://", counter="approx", limit=8192)
    >>> req = guard.prepare("s1", [{"role": "user", "content": "hi"}], max_tokens=256)
    >>> req.tokens + req.reserved_output <= req.limit
    True
    """

    def __init__(
        self,
        store: str | SessionStore = "memory://",
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
        self.store: SessionStore = (
            open_store(
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
        self._check_store(self.store, want_async=False)
        self._foreign_store = self._foreign(self.store)
        if not self._foreign_store and callable(getattr(self.store, "state_token", None)):
            sends = callable(getattr(self.store, "send_state_token", None))
            self.core.token_read = "send" if sends else "state_token"
        # background summaries and summarizer calls in pools of their own: a background
        # summary waits for its summarizer call, so with one pool of 4, four summaries
        # at once held every thread, their calls queued behind them, and each failed
        # ("summarizer timed out") after summary_timeout with its summarizer never run
        # (daemon threads: a summarizer call that never returns must not hold the process)
        self._pools: dict[str, DaemonPool] = {}
        self._background: set[concurrent.futures.Future[Any]] = set()
        self._summarizing: set[str] = set()
        self._lock = threading.Lock()

    def append(self, session_id: str, messages: Iterable[MessageLike]) -> AppendResult:
        """Store messages (each counted once, now) without preparing a request."""
        self._prepare_args(session_id, messages, None, None, "messages")
        flow = flows.append(self.core, session_id, messages)
        return self._run(self._observed("append", session_id, flow))

    def replace_tail(
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
        return self._run(self._observed("replace", session_id, flow))

    def prepare(
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
        return self._run(self._observed("prepare", session_id, flow))

    def complete(
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
        return self._run(observed)

    def summarize(
        self, session_id: str, request: SummaryRequest
    ) -> tuple[Summary | None, str | None]:
        """Run the summarizer for ``request``, commit by compare-and-set, audit the outcome."""
        self._summarize_args(session_id, request)
        flow = flows.summarize(self.core, session_id, request)
        return self._run(self._observed("summarize", session_id, flow))

    # -- running a flow -------------------------------------------------------------

    def _run(self, flow: flows.Flow[flows.T]) -> flows.T:
        reply: Any = None
        error: Exception | None = None
        while True:
            try:
                op = flow.send(reply) if error is None else flow.throw(error)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
            try:
                if type(op) is flows.StoreCall:  # most ops: the store, directly
                    reply, error = getattr(self.store, op.method)(*op.args), None
                else:
                    reply, error = self._execute(op), None
            except Exception as exc:  # handed back to the flow, which decides
                reply, error = None, exc
                if self._foreign_store and isinstance(op, flows.StoreCall):
                    error = self._store_failed(self.store, op.method, exc)

    def _execute(self, op: flows.Op) -> Any:
        if isinstance(op, flows.StoreCall):
            return getattr(self.store, op.method)(*op.args)
        if isinstance(op, flows.ResolveLimit):
            return self.limit_source.resolve()
        if isinstance(op, flows.CallSummarizer):
            return self._call_summarizer(op.previous, op.messages)
        if isinstance(op, flows.Sleep):
            time.sleep(op.seconds)
            return None
        self._start_background(op.session_id, op.request)
        return None

    def _call_summarizer(self, previous: str | None, messages: Sequence[Any]) -> str:
        fn = self.config.summarizer
        if fn is None:
            raise SummarizerError("no summarizer configured")
        pool = self._executor("calls")
        future: concurrent.futures.Future[Any]
        if is_async_callable(fn):
            future = pool.submit(asyncio.run, fn(previous, messages))
        else:
            future = pool.submit(fn, previous, messages)
        try:
            return future.result(timeout=self.config.summary_timeout)  # type: ignore[no-any-return]
        except concurrent.futures.TimeoutError:
            timeout = self.config.summary_timeout
            raise SummarizerError(f"summarizer timed out after {timeout}s") from None

    def _executor(self, kind: str) -> DaemonPool:
        """The pool for ``kind``: "background" summaries (4 at once), summarizer "calls"
        (theirs and 4 more, for calls made inline by callers' threads)."""
        with self._lock:
            if self._closed:  # (a call that began before close(): its pool is shut down)
                raise GuardClosedError(type(self).__name__)
            pool = self._pools.get(kind)
            if pool is None:
                size = BACKGROUND_SUMMARIES if kind == "background" else 2 * BACKGROUND_SUMMARIES
                pool = self._pools[kind] = DaemonPool(size, f"ctxguard-{kind}")
            return pool

    def _start_background(self, session_id: str, request: SummaryRequest) -> None:
        """One background summary per session at a time; the next prepare asks again."""
        with self._lock:
            if session_id in self._summarizing or self._closed:
                return
            self._summarizing.add(session_id)
        future = self._executor("background").submit(self.summarize, session_id, request)
        with self._lock:
            self._background.add(future)

        def done(f: concurrent.futures.Future[Any]) -> None:
            with self._lock:
                self._background.discard(f)
                self._summarizing.discard(session_id)
            if not f.cancelled():
                report_background_failure(session_id, f.exception())

        future.add_done_callback(done)

    def wait_for_summaries(self, timeout: float | None = None) -> None:
        """Block until background summaries finish (tests, shutdown)."""
        check_timeout(timeout)
        concurrent.futures.wait(list(self._background), timeout=timeout)

    def close(self) -> None:
        """Wait for background summaries, write pending audit records, then release the
        connections of the store this guard opened from a URL (a store passed in is left
        open: it is the caller's to close). A held record that cannot be written is
        raised, after the connections are released. Every later call but ``close()``
        (which does nothing then) raises :class:`GuardClosedError`."""
        if self._closed:
            return
        self.wait_for_summaries()
        with self._lock:
            self._closed = True
        try:
            self._run(flows.flush(self.core))
        finally:
            for pool in self._pools.values():
                pool.shutdown(wait=False, cancel_futures=True)
            if self._owns_store:
                self.store.close()
