"""The synchronous guard: what a chatbot backend calls on every turn.

All decisions live in :class:`~ctxguard.guard.core.GuardCore`; this class only
talks to the store, the limit source and the summarizer.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ctxguard.errors import CtxGuardError, SummarizerError
from ctxguard.guard.config import GuardConfig, is_async_callable
from ctxguard.guard.core import GuardCore, Tools
from ctxguard.guard.plan import Budget, Plan, SummaryRequest
from ctxguard.guard.prepared import PreparedRequest
from ctxguard.guard.setup import make_counter, make_limit
from ctxguard.kv.limit import ContextLimit, LimitSource
from ctxguard.messages import MessageLike
from ctxguard.stores import open_store
from ctxguard.stores.base import AppendResult, RecordWrite, SessionStore, Summary, WindowFetch
from ctxguard.tokens._protocol import TokenCounter

MAX_REFETCH = 3


class Guard:
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
        **settings: Any,
    ) -> None:
        self.config = config or GuardConfig(**settings)
        self.store: SessionStore = (
            open_store(store, namespace=namespace, tenant=tenant)
            if isinstance(store, str)
            else store
        )
        spec = counter if isinstance(counter, str) else None
        self.core = GuardCore(make_counter(counter), self.config, spec)
        self.limit_source = make_limit(limit)
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._background: set[concurrent.futures.Future[Any]] = set()
        self._lock = threading.Lock()

    @property
    def counter(self) -> TokenCounter:
        return self.core.counter

    # -- the turn ---------------------------------------------------------------

    def append(self, session_id: str, messages: Iterable[MessageLike]) -> AppendResult:
        """Store messages (each counted once, now) without preparing a request."""
        return self.store.append(
            session_id, self.core.encode_new(messages), self.core.write_options
        )

    def prepare(
        self,
        session_id: str,
        new_messages: Iterable[MessageLike] = (),
        *,
        max_tokens: int | None = None,
        tools: Tools | None = None,
    ) -> PreparedRequest:
        """Append ``new_messages`` and return the request to send, within budget."""
        new = self.core.encode_new(new_messages)
        budget = self.core.budget(self.limit_source.resolve(), max_tokens, tools)
        options = self.core.write_options
        fetch = self.store.fetch_window(session_id, budget.prompt, options, new, len(new))
        plan, recounts = self.core.plan(fetch, budget)
        for _ in range(MAX_REFETCH):
            again = self.core.refetch(fetch, plan, budget)
            if again is None:
                break
            self.store.set_token_counts(session_id, self.counter.fingerprint, recounts)
            fetch = self.store.fetch_window(session_id, again[0], options, (), again[1])
            plan, recounts = self.core.plan(fetch, budget)
        if plan.summarize is not None:
            plan, fetch = self._summarize_for(session_id, plan, fetch, budget)
        total = self.core.finalize(plan, budget, tools)
        record = self.core.audit_record(plan, total, budget, fetch, tools)
        turn = self.store.record(session_id, self._write(recounts, record))
        return self.core.prepared(session_id, turn, plan, total, budget, tools)

    def complete(
        self,
        session_id: str,
        reply: MessageLike,
        *,
        prepared: PreparedRequest | None = None,
        usage: Mapping[str, Any] | None = None,
    ) -> AppendResult:
        """Store the model's reply; with ``usage`` the server's prompt_tokens is audited."""
        new = self.core.encode_new([reply])
        if prepared is None and usage is None:
            return self.store.append(session_id, new, self.core.write_options)
        record = self.core.usage_record(prepared, usage)
        return self.store.append_with_audit(
            session_id, new, self.core.write_options, self._write({}, record)
        )

    def _write(self, counts: Mapping[int, int], record: Mapping[str, Any] | None) -> RecordWrite:
        return RecordWrite(
            counter=self.counter.fingerprint,
            counts=counts,
            audit=record,
            retention=self.config.audit_retention,
            ttl=self.config.ttl_seconds or 0,
        )

    # -- summaries ----------------------------------------------------------------

    def _summarize_for(
        self, session_id: str, plan: Plan, fetch: WindowFetch, budget: Budget
    ) -> tuple[Plan, WindowFetch]:
        request = plan.summarize
        assert request is not None
        if self.config.summary_mode == "background":
            self._start_background(session_id, request)
            plan.decide("summary_started", covers_to=request.covers_to, mode="background")
            return plan, fetch
        summary, error = self.summarize(session_id, request)
        if summary is None:
            plan.decide("summary_failed", error=error)
            return plan, fetch
        fetch = self.core.with_summary(fetch, summary)
        new_plan, _ = self.core.plan(fetch, budget)
        new_plan.decisions[:0] = [{"policy": "summary_committed", "version": summary.version}]
        return new_plan, fetch

    def summarize(
        self, session_id: str, request: SummaryRequest
    ) -> tuple[Summary | None, str | None]:
        """Run the summarizer for ``request``, commit by compare-and-set, audit the outcome."""
        stored = self.store.read(session_id, request.covers_from, request.covers_to)
        summary = None
        committed = False
        try:
            text = self._call_summarizer(request.previous_text, self.core.summary_inputs(stored))
            summary = self.core.accept_summary(text, request, stored)
            committed = self.store.commit_summary(session_id, summary, request.previous_version)
            error = None if committed else "lost the compare-and-set race to another writer"
        except (CtxGuardError, Exception) as exc:
            error = f"{type(exc).__name__}: {exc}"
        record = self.core.summary_record(request, summary, error, committed)
        self.store.record(session_id, self._write({}, record))
        return (summary if committed else None), error

    def _call_summarizer(self, previous: str | None, messages: Sequence[Any]) -> str:
        fn = self.config.summarizer
        if fn is None:
            raise SummarizerError("no summarizer configured")
        pool = self._executor()
        future: concurrent.futures.Future[Any]
        if is_async_callable(fn):
            future = pool.submit(asyncio.run, fn(previous, messages))  # type: ignore[arg-type]
        else:
            future = pool.submit(fn, previous, messages)
        try:
            result = future.result(timeout=self.config.summary_timeout)
        except concurrent.futures.TimeoutError:
            raise SummarizerError(
                f"summarizer timed out after {self.config.summary_timeout}s"
            ) from None
        return result  # type: ignore[no-any-return]

    def _executor(self) -> concurrent.futures.ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(4, thread_name_prefix="ctxguard")
            return self._pool

    def _start_background(self, session_id: str, request: SummaryRequest) -> None:
        future = self._executor().submit(self.summarize, session_id, request)
        with self._lock:
            self._background.add(future)
        future.add_done_callback(self._background.discard)

    def wait_for_summaries(self, timeout: float | None = None) -> None:
        """Block until background summaries finish (tests, shutdown)."""
        concurrent.futures.wait(list(self._background), timeout=timeout)

    def close(self) -> None:
        self.wait_for_summaries()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        self.store.close()
