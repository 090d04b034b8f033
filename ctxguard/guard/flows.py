"""What one guard operation does, as a generator of I/O requests (sans-I/O).

Each flow yields the I/O it needs (a store call, the limit, the summarizer)
and receives the result; exceptions from that I/O are thrown back into it.
:class:`~ctxguard.guard.sync.Guard` runs a flow with blocking calls and
:class:`~ctxguard.guard.aio.AsyncGuard` with awaits, so both execute the very
same steps in the same order (the httpx auth-flow pattern).
"""

from __future__ import annotations

from collections.abc import Generator, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from ctxguard.errors import StoreConnectionError
from ctxguard.guard.core import GuardCore, Speculation, Tools
from ctxguard.guard.plan import Budget, Plan, SummaryRequest
from ctxguard.guard.prepared import PreparedRequest
from ctxguard.kv.limit import ContextLimit
from ctxguard.messages import MessageLike
from ctxguard.stores.base import AppendResult, StoredMessage, Summary, WindowFetch, WindowHit

T = TypeVar("T")
MAX_REFETCH = 3


@dataclass(frozen=True, slots=True)
class StoreCall:
    """Call ``store.<method>(*args)``."""

    method: str
    args: tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class ResolveLimit:
    """Ask the limit source for the current :class:`ContextLimit`."""


@dataclass(frozen=True, slots=True)
class CallSummarizer:
    """Run the user's summarizer (with the configured timeout)."""

    previous: str | None
    messages: tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class StartBackground:
    """Run :func:`summarize` for ``request`` without waiting for it."""

    session_id: str
    request: SummaryRequest


Op = StoreCall | ResolveLimit | CallSummarizer | StartBackground
Flow = Generator[Op, Any, T]


def append(core: GuardCore, session_id: str, values: Iterable[MessageLike]) -> Flow[AppendResult]:
    new = core.encode_new(values)
    result: AppendResult = yield StoreCall("append", (session_id, new, core.write_options))
    core.cache.appended(session_id, new, result)
    return result


def prepare(
    core: GuardCore,
    session_id: str,
    values: Iterable[MessageLike],
    max_tokens: int | None,
    tools: Tools | None,
) -> Flow[PreparedRequest]:
    """Append the new messages and build the request that fits (see ARCHITECTURE.md)."""
    new = core.encode_new(values)
    yield from flush(core, session_id)
    limit: ContextLimit = yield ResolveLimit()
    budget = core.budget(limit, max_tokens, tools)
    options = core.write_options
    fast = core.speculate(session_id, new, budget, tools)
    fetch: WindowFetch
    if fast is not None:
        token = fast.fetch.token
        outcome: WindowHit | WindowFetch = yield StoreCall(
            "commit_if_unchanged",
            (session_id, token, budget.prompt, options, new, len(new), fast.write),
        )
        if isinstance(outcome, WindowHit):
            return _committed(core, session_id, fast, outcome, budget, tools)
        fetch = outcome  # the session changed: plan again on what the store sent
    else:
        fetch = yield StoreCall("fetch_window", (session_id, budget.prompt, options, new, len(new)))
    plan, recounts = core.plan(fetch, budget)
    for _ in range(MAX_REFETCH):
        again = core.refetch(fetch, plan, budget)
        if again is None:
            break
        yield StoreCall("set_token_counts", (session_id, core.counter.fingerprint, recounts))
        fetch = yield StoreCall("fetch_window", (session_id, again[0], options, (), again[1]))
        plan, recounts = core.plan(fetch, budget)
    folding = plan.summarize is not None
    if folding:
        plan, fetch = yield from _fold(core, session_id, plan, fetch, budget)
    total, sent = core.finalize(plan, budget, tools)
    record = core.audit_record(plan, sent, total, budget, fetch, tools)
    if recounts or folding:
        core.cache.evict(session_id)  # a summary or the recounts move the session's state on
    else:
        core.cache.put(session_id, fetch)
    if core.config.audit_mode == "with_reply":
        if recounts:
            yield StoreCall("record", (session_id, core.write(recounts, None)))
        core.hold(session_id, record)
        return core.prepared(session_id, 0, plan, sent, total, budget, tools, pending=record)
    turn: int = yield StoreCall("record", (session_id, core.write(recounts, record)))
    return core.prepared(session_id, turn, plan, sent, total, budget, tools)


def _committed(
    core: GuardCore,
    session_id: str,
    fast: Speculation,
    hit: WindowHit,
    budget: Budget,
    tools: Tools | None,
) -> PreparedRequest:
    """The store took the request planned on the cached window (see window_cache)."""
    core.committed(session_id, fast, hit)
    if core.config.audit_mode == "with_reply":
        core.hold(session_id, fast.record)
        return core.prepared(
            session_id, 0, fast.plan, fast.sent, fast.total, budget, tools, fast.record
        )
    return core.prepared(session_id, hit.turn, fast.plan, fast.sent, fast.total, budget, tools)


def flush(core: GuardCore, session_id: str | None = None) -> Flow[None]:
    """Write request records still held for ``complete`` (one session, or all).

    A record whose write fails is held again with those after it (a retry writes
    each once, by its rid), and the error goes on to the caller.
    """
    records = core.release(session_id)
    for index, record in enumerate(records):
        held = {**record, "completed": False}
        try:
            yield StoreCall("record", (str(record["session"]), core.write({}, held)))
        except BaseException:
            core.put_back(records[index:])
            raise


def _fold(
    core: GuardCore, session_id: str, plan: Plan, fetch: WindowFetch, budget: Budget
) -> Flow[tuple[Plan, WindowFetch]]:
    """Summarize what the plan asks for: in the background, or now and re-plan."""
    request = plan.summarize
    assert request is not None
    if core.config.summary_mode == "background":
        yield StartBackground(session_id, request)
        plan.decide("summary_started", covers_to=request.covers_to, mode="background")
        return plan, fetch
    summary, error = yield from summarize(core, session_id, request)
    if summary is None:
        plan.decide("summary_failed", error=error)
        return plan, fetch
    fetch = core.with_summary(fetch, summary)
    new_plan, _ = core.plan(fetch, budget)
    new_plan.decisions[:0] = [{"policy": "summary_committed", "version": summary.version}]
    return new_plan, fetch


def summarize(
    core: GuardCore, session_id: str, request: SummaryRequest
) -> Flow[tuple[Summary | None, str | None]]:
    """Run the summarizer, commit by compare-and-set, audit the outcome; never raise."""
    stored: list[StoredMessage] = yield StoreCall(
        "read", (session_id, request.covers_from, request.covers_to)
    )
    summary = None
    committed = False
    try:
        text = yield CallSummarizer(request.previous_text, tuple(core.summary_inputs(stored)))
        summary = core.accept_summary(text, request, stored)
        try:
            committed = yield StoreCall(
                "commit_summary", (session_id, summary, request.previous_version)
            )
        except StoreConnectionError:
            # the reply was lost, not necessarily the commit: read back what is stored
            current: Summary | None = yield StoreCall("get_summary", (session_id,))
            committed = core.is_summary(current, summary)
            if not committed:
                raise
        error = None if committed else "lost the compare-and-set race to another writer"
        core.cache.evict(session_id)
    except Exception as exc:  # a summarizer may raise anything; it never becomes content
        error = f"{type(exc).__name__}: {exc}"
    record = core.summary_record(request, summary, error, committed)
    yield StoreCall("record", (session_id, core.write({}, record)))
    return (summary if committed else None), error


def complete(
    core: GuardCore,
    session_id: str,
    reply: MessageLike,
    prepared: PreparedRequest | None,
    usage: Mapping[str, Any] | None,
) -> Flow[AppendResult]:
    """Store the reply; with usage or the prepared request, audit the server's count too."""
    new = core.encode_new([reply])
    held = core.take(session_id, None if prepared is None else prepared.pending_audit)
    if held is not None:
        write = core.write({}, core.with_usage(held, usage))
    elif prepared is None and usage is None:
        result: AppendResult = yield StoreCall("append", (session_id, new, core.write_options))
        core.cache.appended(session_id, new, result)
        return result
    else:
        write = core.write({}, core.usage_record(prepared, usage, new[0].message.id))
    try:
        result = yield StoreCall("append_with_audit", (session_id, new, core.write_options, write))
    except BaseException:
        if held is not None:  # kept until written: a retried complete writes it, once
            core.put_back([held])
        raise
    core.cache.appended(session_id, new, result)
    return result
