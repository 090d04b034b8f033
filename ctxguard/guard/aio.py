"""The asynchronous guard: :class:`Guard`'s twin for asyncio backends.

Same constructor, same methods (``await``-ed), same decisions: the logic is in
:class:`~ctxguard.guard.core.GuardCore`; only the I/O differs.
"""

from __future__ import annotations

import asyncio
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
from ctxguard.stores import open_async_store
from ctxguard.stores.base import AppendResult, AsyncSessionStore, RecordWrite, Summary, WindowFetch
from ctxguard.tokens._protocol import TokenCounter

MAX_REFETCH = 3


class AsyncGuard:
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
        **settings: Any,
    ) -> None:
        self.config = config or GuardConfig(**settings)
        self.store: AsyncSessionStore = (
            open_async_store(store, namespace=namespace, tenant=tenant)
            if isinstance(store, str)
            else store
        )
        spec = counter if isinstance(counter, str) else None
        self.core = GuardCore(make_counter(counter), self.config, spec)
        self.limit_source = make_limit(limit)
        self._background: set[asyncio.Task[Any]] = set()

    @property
    def counter(self) -> TokenCounter:
        return self.core.counter

    async def _limit(self) -> ContextLimit:
        aresolve = getattr(self.limit_source, "aresolve", None)
        if aresolve is not None:
            return await aresolve()  # type: ignore[no-any-return]
        return self.limit_source.resolve()

    async def append(self, session_id: str, messages: Iterable[MessageLike]) -> AppendResult:
        """Store messages (each counted once, now) without preparing a request."""
        return await self.store.append(
            session_id, self.core.encode_new(messages), self.core.write_options
        )

    async def prepare(
        self,
        session_id: str,
        new_messages: Iterable[MessageLike] = (),
        *,
        max_tokens: int | None = None,
        tools: Tools | None = None,
    ) -> PreparedRequest:
        """Append ``new_messages`` and return the request to send, within budget."""
        new = self.core.encode_new(new_messages)
        budget = self.core.budget(await self._limit(), max_tokens, tools)
        options = self.core.write_options
        fetch = await self.store.fetch_window(session_id, budget.prompt, options, new, len(new))
        plan, recounts = self.core.plan(fetch, budget)
        for _ in range(MAX_REFETCH):
            again = self.core.refetch(fetch, plan, budget)
            if again is None:
                break
            await self.store.set_token_counts(session_id, self.counter.fingerprint, recounts)
            fetch = await self.store.fetch_window(session_id, again[0], options, (), again[1])
            plan, recounts = self.core.plan(fetch, budget)
        if plan.summarize is not None:
            plan, fetch = await self._summarize_for(session_id, plan, fetch, budget)
        total = self.core.finalize(plan, budget, tools)
        record = self.core.audit_record(plan, total, budget, fetch, tools)
        turn = await self.store.record(session_id, self._write(recounts, record))
        return self.core.prepared(session_id, turn, plan, total, budget, tools)

    async def complete(
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
            return await self.store.append(session_id, new, self.core.write_options)
        record = self.core.usage_record(prepared, usage)
        write = self._write({}, record)
        return await self.store.append_with_audit(session_id, new, self.core.write_options, write)

    def _write(self, counts: Mapping[int, int], record: Mapping[str, Any] | None) -> RecordWrite:
        return RecordWrite(
            counter=self.counter.fingerprint,
            counts=counts,
            audit=record,
            retention=self.config.audit_retention,
            ttl=self.config.ttl_seconds or 0,
        )

    async def _summarize_for(
        self, session_id: str, plan: Plan, fetch: WindowFetch, budget: Budget
    ) -> tuple[Plan, WindowFetch]:
        request = plan.summarize
        assert request is not None
        if self.config.summary_mode == "background":
            task = asyncio.create_task(self.summarize(session_id, request))
            self._background.add(task)
            task.add_done_callback(self._background.discard)
            plan.decide("summary_started", covers_to=request.covers_to, mode="background")
            return plan, fetch
        summary, error = await self.summarize(session_id, request)
        if summary is None:
            plan.decide("summary_failed", error=error)
            return plan, fetch
        fetch = self.core.with_summary(fetch, summary)
        new_plan, _ = self.core.plan(fetch, budget)
        new_plan.decisions[:0] = [{"policy": "summary_committed", "version": summary.version}]
        return new_plan, fetch

    async def summarize(
        self, session_id: str, request: SummaryRequest
    ) -> tuple[Summary | None, str | None]:
        """Run the summarizer for ``request``, commit by compare-and-set, audit the outcome."""
        stored = await self.store.read(session_id, request.covers_from, request.covers_to)
        summary = None
        committed = False
        try:
            text = await self._call_summarizer(
                request.previous_text, self.core.summary_inputs(stored)
            )
            summary = self.core.accept_summary(text, request, stored)
            committed = await self.store.commit_summary(
                session_id, summary, request.previous_version
            )
            error = None if committed else "lost the compare-and-set race to another writer"
        except (CtxGuardError, Exception) as exc:
            error = f"{type(exc).__name__}: {exc}"
        record = self.core.summary_record(request, summary, error, committed)
        await self.store.record(session_id, self._write({}, record))
        return (summary if committed else None), error

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
            job = asyncio.to_thread(fn, previous, messages)
        try:
            return await asyncio.wait_for(job, timeout=self.config.summary_timeout)
        except TimeoutError:
            raise SummarizerError(
                f"summarizer timed out after {self.config.summary_timeout}s"
            ) from None

    async def wait_for_summaries(self) -> None:
        """Wait until background summaries finish (tests, shutdown)."""
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)

    async def aclose(self) -> None:
        await self.wait_for_summaries()
        await self.store.close()
