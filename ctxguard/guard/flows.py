"""What one guard operation does, as a generator of I/O requests (sans-I/O).

Each flow yields the I/O it needs (a store call, the limit, the summarizer)
and receives the result; exceptions from that I/O are thrown back into it.
:class:`~ctxguard.guard.sync.Guard` runs a flow with blocking calls and
:class:`~ctxguard.guard.aio.AsyncGuard` with awaits, so both execute the very
same steps in the same order (the httpx auth-flow pattern).

Kept whole at ~460 lines on purpose: one flow per public operation, so every I/O step
a shell can take is in one file (``commit="with_reply"``'s prepare ending and complete
are in :mod:`ctxguard.guard.unstored`, which these flows hand over to).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ctxguard._secrets import describe
from ctxguard.errors import (
    BudgetError,
    ConflictError,
    CorruptRecordError,
    CtxGuardError,
    InvalidInputError,
    InvalidMessageError,
    MessageTooLongError,
    StoreConnectionError,
    TemplateRefusedError,
)
from ctxguard.guard import events, unstored
from ctxguard.guard.core import GuardCore, Speculation, Tools, newest_sent
from ctxguard.guard.ops import (  # (the shells take these from here)
    FRESH_REPLANS as FRESH_REPLANS,
)
from ctxguard.guard.ops import (
    MAX_COMMITS as MAX_COMMITS,
)
from ctxguard.guard.ops import (
    CallSummarizer as CallSummarizer,
)
from ctxguard.guard.ops import (
    Flow as Flow,
)
from ctxguard.guard.ops import (
    Op as Op,
)
from ctxguard.guard.ops import (
    ResolveLimit as ResolveLimit,
)
from ctxguard.guard.ops import (
    Sleep as Sleep,
)
from ctxguard.guard.ops import (
    StartBackground as StartBackground,
)
from ctxguard.guard.ops import (
    StoreCall as StoreCall,
)
from ctxguard.guard.ops import (
    T as T,
)
from ctxguard.guard.ops import backoff
from ctxguard.guard.plan import Budget, Plan, SummaryRequest
from ctxguard.guard.prepared import PreparedRequest
from ctxguard.kv.limit import ContextLimit
from ctxguard.messages import MessageLike
from ctxguard.stores.base import (
    AppendResult,
    NewMessage,
    RecordWrite,
    ReplaceResult,
    StoredMessage,
    Summary,
    WindowFetch,
    WindowHit,
)

MAX_REFETCH = 3
# refusals found while planning: audited, nothing stored
REFUSALS = (BudgetError, TemplateRefusedError, InvalidMessageError)


def append(core: GuardCore, session_id: str, values: Iterable[MessageLike]) -> Flow[AppendResult]:
    new = core.encode_new(values)
    core.check_call_ids(new)
    result: AppendResult = yield StoreCall("append", (session_id, new, core.write_options))
    core.cache.appended(session_id, new, result)
    return result


def replace_tail(
    core: GuardCore,
    session_id: str,
    start: int,
    values: Iterable[MessageLike],
    expected_count: int | None,
    expected_state: str | None = None,
) -> Flow[ReplaceResult]:
    new = core.encode_new(values)  # counted once; a refusal here writes nothing
    core.check_call_ids(new)
    try:
        args: tuple[Any, ...] = (session_id, start, new, expected_count, core.write_options)
        if expected_state is not None:  # (a store without it still takes the call)
            args = (*args, expected_state)
        result: ReplaceResult = yield StoreCall("replace_tail", args)
    finally:
        core.cache.evict(session_id)  # the cached window's messages may be gone
    return result


def prepare(
    core: GuardCore,
    session_id: str,
    values: Iterable[MessageLike],
    max_tokens: int | None,
    tools: Tools | None,
) -> Flow[PreparedRequest]:
    """Build the request that fits, then store the new messages with its audit record.

    The new messages are stored only with a request that can be sent: the window
    is fetched as if they were appended, planned and counted, and then committed
    in one atomic step if the session did not change meanwhile (else planned
    again on what the store sends back). A refused prepare stores nothing and
    leaves a ``refused`` audit record in an existing session (see docs/turn.md).
    """
    try:
        new = core.encode_new(values)
    except MessageTooLongError as exc:
        yield from _refused(core, session_id, (), exc)
        raise
    try:
        return (yield from _prepare(core, session_id, new, max_tokens, tools))
    except REFUSALS as exc:
        yield from _refused(core, session_id, new, exc)
        raise


def _prepare(
    core: GuardCore,
    session_id: str,
    new: list[NewMessage],
    max_tokens: int | None,
    tools: Tools | None,
) -> Flow[PreparedRequest]:
    core.check_batch(new)
    limit: ContextLimit = yield ResolveLimit()
    budget = core.budget(limit, max_tokens, tools)
    options = core.write_options
    stale = False
    if core.config.commit == "with_reply":
        fast, stale = yield from unstored.speculate(core, session_id, new, budget, tools)
        if fast is not None:
            if core.observer is not None:
                events.note_cache("hit")
            return unstored.prepared(core, session_id, fast, budget, tools, new)
    else:
        fast = core.speculate(session_id, new, budget, tools)
    fetch: WindowFetch
    if fast is not None:
        token = fast.fetch.token
        outcome: WindowHit | WindowFetch = yield StoreCall(
            "commit_if_unchanged",
            (session_id, token, budget.prompt, options, new, len(new), fast.write),
        )
        if isinstance(outcome, WindowHit):
            if core.observer is not None:
                events.note_cache("hit")
            yield from _flush_after(core, session_id)
            return _committed(core, session_id, fast, outcome, budget, tools)
        fetch = outcome  # the session changed: plan again on what the store sent
        if core.observer is not None:
            events.note_cache("stale")
    else:
        if core.observer is not None:
            events.note_cache("stale" if stale else "miss")
        fetch = yield StoreCall("fetch_window", (session_id, budget.prompt, options, new, len(new)))
    folded = False
    required = newest_sent(new)
    for attempt in range(MAX_COMMITS):
        if attempt >= FRESH_REPLANS:
            # others keep writing to this session: let them through, then read it afresh
            # (what the last commit sent back is older than the wait: planning on it
            # would lose again, and a writer that waited would never win)
            yield backoff(attempt)
            fetch = yield StoreCall(
                "fetch_window", (session_id, budget.prompt, options, new, len(new))
            )
        plan, recounts, fetch = yield from _plan(core, session_id, fetch, budget, new)
        core.check_required(plan, required)  # (before a summary is committed)
        summary_started = None
        if plan.summarize is not None and not folded:
            if core.config.summary_mode == "background":
                summary_started = request = plan.summarize
                plan.decide("summary_started", covers_to=request.covers_to, mode="background")
            elif plan.summarize.covers_to <= fetch.info.message_count - len(core.fresh(fetch, new)):
                folded = True  # (a summary of messages not stored yet waits for the next turn)
                # the request as planned must be one the counter accepts before a summary
                # is committed for it: a refused request stores nothing, summary included
                core.finalize(plan, budget, tools, required)
                folding = yield from _fold(core, session_id, plan, budget, new)
                if isinstance(folding, Plan):
                    plan = folding  # the summary failed: the plan stands, with the reason
                else:
                    fetch = folding  # committed: plan again on the session with it
                    plan, recounts, fetch = yield from _plan(core, session_id, fetch, budget, new)
                    version = fetch.info.summary_version
                    plan.decisions[:0] = [{"policy": "summary_committed", "version": version}]
        total, sent = core.finalize(plan, budget, tools, required)
        record = core.audit_record(plan, sent, total, budget, fetch, tools)
        if core.config.commit == "with_reply":  # stored by complete, with the reply
            if summary_started is not None:
                yield StartBackground(session_id, summary_started)
            late = Speculation(fetch, plan, sent, total, record, None, [])
            keep = not (recounts or folded)
            return unstored.prepared(core, session_id, late, budget, tools, new, recounts, keep)
        with_reply = core.config.audit_mode == "with_reply"
        write = core.write(recounts, None if with_reply else record)
        fresh = core.fresh(fetch, new)
        if not fresh:
            # nothing to store: the request stands whatever was written since the fetch
            turn = yield from _record(core, session_id, fetch, write, bool(recounts) or folded)
            yield from _flush_after(core, session_id)
            core.prefix.committed(session_id, record["rid"])
            if summary_started is not None:
                yield StartBackground(session_id, summary_started)
            if with_reply:
                core.hold(session_id, record)
                return core.prepared(session_id, 0, plan, sent, total, budget, tools, record)
            return core.prepared(session_id, turn, plan, sent, total, budget, tools)
        committed = yield StoreCall(
            "commit_if_unchanged",
            (session_id, fetch.token or "", budget.prompt, options, fresh, len(new), write),
        )
        if isinstance(committed, WindowFetch):
            fetch = committed  # another writer came first: plan again on what it left
            continue
        if recounts or folded:
            core.cache.evict(session_id)  # the cached copy would lack the counts just written
        else:
            core.committed(session_id, fetch, committed)
        yield from _flush_after(core, session_id)
        core.prefix.committed(session_id, record["rid"])
        if summary_started is not None:
            yield StartBackground(session_id, summary_started)
        if with_reply:
            core.hold(session_id, record)
            return core.prepared(
                session_id, 0, plan, sent, total, budget, tools, record, write=committed
            )
        return core.prepared(
            session_id, committed.turn, plan, sent, total, budget, tools, write=committed
        )
    raise ConflictError(
        f"session {session_id!r} changed under {MAX_COMMITS} attempts to commit this request "
        "(other writers); nothing was stored: retry the prepare"
    )


def _plan(
    core: GuardCore, session_id: str, fetch: WindowFetch, budget: Budget, new: list[NewMessage]
) -> Flow[tuple[Plan, dict[int, int], WindowFetch]]:
    """Plan on ``fetch``, fetching further when it stopped short; writes nothing."""
    plan, recounts = core.plan(fetch, budget)
    for _ in range(MAX_REFETCH):
        again = core.refetch(fetch, plan, budget)
        if again is None:
            break
        fresh = core.fresh(fetch, new)
        token = fetch.token
        fetch = yield StoreCall(
            "fetch_window", (session_id, again[0], core.write_options, fresh, again[1])
        )
        # counts made on the same state are reused; after any change they are made again
        plan, recounts = core.plan(fetch, budget, recounts if fetch.token == token else None)
    core.check_new(session_id, fetch, new, budget)
    return plan, recounts, fetch


def _record(
    core: GuardCore, session_id: str, fetch: WindowFetch, write: RecordWrite, changed: bool
) -> Flow[int]:
    """Write recounts and the request record of a prepare that stores no message."""
    if changed:
        core.cache.evict(session_id)  # a summary or the recounts move the session's state on
    else:
        core.cache.put(session_id, fetch)
    if write.audit is None and not write.counts:
        return 0
    turn: int = yield StoreCall("record", (session_id, write))
    return turn


def _refused(
    core: GuardCore, session_id: str, new: Sequence[NewMessage], exc: CtxGuardError
) -> Flow[None]:
    """Audit a refused prepare in an existing session (it creates none); never raises."""
    record = core.refusal_record(exc, new)
    retention, ttl = core.config.audit_retention, core.config.ttl_seconds or 0
    with contextlib.suppress(CtxGuardError):  # the refusal is the answer; a lost record
        yield StoreCall("add_audit", (session_id, record, retention, ttl))  # must not hide it


def _committed(
    core: GuardCore,
    session_id: str,
    fast: Speculation,
    hit: WindowHit,
    budget: Budget,
    tools: Tools | None,
) -> PreparedRequest:
    """The store took the request planned on the cached window (see window_cache)."""
    core.committed(session_id, fast.fetch, hit, fast.items, fast.plan.plain)
    core.prefix.committed(session_id, fast.record["rid"])
    if core.config.audit_mode == "with_reply":
        core.hold(session_id, fast.record)
        return core.prepared(
            session_id, 0, fast.plan, fast.sent, fast.total, budget, tools, fast.record, write=hit
        )
    return core.prepared(
        session_id, hit.turn, fast.plan, fast.sent, fast.total, budget, tools, write=hit
    )


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


def _flush_after(core: GuardCore, session_id: str) -> Flow[None]:
    """Write the session's held records once this prepare's request is stored (a prepare
    refused late, or ending in ``ConflictError``, leaves them held for ``complete``); a
    failed write leaves them held too (:func:`flush`): the stored request goes out."""
    with contextlib.suppress(CtxGuardError):
        yield from flush(core, session_id)


def _fold(
    core: GuardCore, session_id: str, plan: Plan, budget: Budget, new: list[NewMessage]
) -> Flow[Plan | WindowFetch]:
    """Summarize what the plan asks for, now: the plan with the failure noted, or
    (committed) the session fetched again, the summary in it."""
    request = plan.summarize
    assert request is not None
    summary, error = yield from summarize(core, session_id, request)
    if summary is None:
        plan.decide("summary_failed", error=error)
        return plan
    fetch: WindowFetch = yield StoreCall(
        "fetch_window", (session_id, budget.prompt, core.write_options, new, len(new))
    )
    return fetch


def summarize(
    core: GuardCore, session_id: str, request: SummaryRequest
) -> Flow[tuple[Summary | None, str | None]]:
    """Run the summarizer, commit by compare-and-set, audit the outcome. A summarizer's
    failure and a lost race are outcomes (returned, and audited); what raises is the
    store: a damaged session (CorruptRecordError, before anything is written: no
    failure record goes into it either) and a failed write of the record."""
    start = time.monotonic_ns() if core.observer is not None else 0
    stored: list[StoredMessage] = yield StoreCall(
        "read", (session_id, request.covers_from, request.covers_to)
    )
    summary = None
    committed = False
    damaged: CorruptRecordError | None = None
    try:
        text = yield CallSummarizer(request.previous_text, tuple(core.summary_inputs(stored)))
        summary = core.accept_summary(text, request, stored)
        try:
            committed = yield StoreCall(
                "commit_summary", (session_id, summary, request.previous_version)
            )
        except CorruptRecordError as exc:
            damaged = exc
            raise
        except StoreConnectionError:
            # the reply was lost, not necessarily the commit: read back what is stored
            current: Summary | None = yield StoreCall("get_summary", (session_id,))
            committed = core.is_summary(current, summary)
            if not committed:
                raise
        error = None if committed else "lost the compare-and-set race to another writer"
        core.cache.evict(session_id)
    except Exception as exc:  # a summarizer may raise anything; it never becomes content
        if exc is damaged:
            raise
        error = describe(exc)  # the summarizer's text, redacted: it goes into the trail
    record = core.summary_record(request, summary, error, committed)
    yield StoreCall("record", (session_id, core.write({}, record)))
    if core.observer is not None:
        outcome: events.SummaryOutcome = (
            "committed" if committed else "failed" if summary is None else "lost_race"
        )
        version = summary.version if summary is not None else None
        events.note_summary(
            events.SummaryEvent(
                session_id, outcome, start, time.monotonic_ns(), version, request.covers_to, error
            )
        )
    return (summary if committed else None), error


def complete(
    core: GuardCore,
    session_id: str,
    reply: MessageLike,
    prepared: PreparedRequest | None,
    usage: Mapping[str, Any] | None,
    record: str = "",
) -> Flow[AppendResult]:
    """Store the reply; with the server's usage, audit its count against the estimate too.

    Without usage nothing is audited here: the request record already holds the
    estimate, and a record that repeated it would halve what the capped trail covers.
    ``record``: the reply's JSON when the guard made the Message (see ``encode_new``).
    """
    new = core.encode_new([reply], record=record)
    core.check_call_ids(new)
    if prepared is not None and prepared.unstored is not None:
        return (yield from unstored.complete(core, session_id, new[0], prepared, usage))
    if prepared is None and core.config.commit == "with_reply":
        raise InvalidInputError(
            'complete() without prepared=: with commit="with_reply" the new messages are '
            "stored with the reply; pass the PreparedRequest prepare() returned (nothing "
            "was stored)"
        )
    held = core.take(session_id, None if prepared is None else prepared.pending_audit)
    if held is not None:
        write = core.write({}, core.with_usage(held, usage))
    elif usage is None:
        result: AppendResult = yield StoreCall("append", (session_id, new, core.write_options))
        core.cache.appended(session_id, new, result)
        core.replied(session_id, new[0].message, result)
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
    core.replied(session_id, new[0].message, result)
    return result
