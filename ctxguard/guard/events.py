"""What an observer sees: one plain event per guard operation (the hook point).

A guard built with ``observer=`` runs each public operation (prepare, complete,
summarize, append) through :func:`observed`, a generator wrapped around the
operation's flow (:mod:`ctxguard.guard.flows`). It times every I/O request the flow
yields (so the sync and async guards report alike, from the one place) and, when
the operation ends, calls ``observer(event)`` once with an :class:`OperationEvent`:
the outcome, the result, every store call with its duration and error, and the
summaries made on the way. A guard without an observer never enters this module's
code: its cost is one attribute check per operation (and per summary).

Observers (Prometheus metrics, OpenTelemetry spans) live in :mod:`ctxguard.observe`;
anything callable with one event will do. An observer that raises is ignored (the
guard's answer never depends on it).
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from ctxguard.guard.prepared import PreparedRequest

Kind = Literal["prepare", "complete", "summarize", "append", "replace"]
CacheUse = Literal["hit", "stale", "miss"]
SummaryOutcome = Literal["committed", "failed", "lost_race"]


@dataclass(slots=True, unsafe_hash=True)
class StoreCallEvent:
    """One store call (``method`` as in the store protocol), timed by the monotonic clock.

    Hashed and compared by its fields like a frozen dataclass; not frozen only because a
    frozen one costs four times as much to make, and one is made per store call.
    """

    method: str
    start_ns: int
    end_ns: int
    error: str | None = None  # the exception's class name when the call raised

    @property
    def seconds(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9


@dataclass(frozen=True, slots=True)
class SummaryEvent:
    """One summarizer run: ``committed``, ``failed`` (with ``error``) or ``lost_race``."""

    session_id: str
    outcome: SummaryOutcome
    start_ns: int
    end_ns: int
    version: int | None
    covers_to: int
    error: str | None = None

    @property
    def seconds(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9


@dataclass(slots=True)
class OperationEvent:
    """One public guard operation, delivered to the observer when it ends.

    ``error`` is the exception the caller gets (None on success); ``result`` what
    the caller gets otherwise (a :class:`PreparedRequest` for ``prepare``).
    ``cache`` says whether a prepare was planned on the cached window and the
    store took it (``hit``), the session had changed (``stale``), or it was not
    cached (``miss``). ``usage`` is the server's usage given to ``complete`` and
    ``estimate`` the guard's prompt count for that request, when known. Times are
    ``time.monotonic_ns()``; ``wall_start_ns`` is ``time.time_ns()`` at the start.
    """

    kind: Kind
    session_id: str
    start_ns: int
    wall_start_ns: int
    end_ns: int = 0
    error: BaseException | None = None
    result: Any = None
    cache: CacheUse | None = None
    usage: Mapping[str, Any] | None = None
    estimate: int | None = None
    store_calls: list[StoreCallEvent] = field(default_factory=list)
    summaries: list[SummaryEvent] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9

    @property
    def prepared(self) -> PreparedRequest | None:
        return self.result if isinstance(self.result, PreparedRequest) else None

    @property
    def wall_end_ns(self) -> int:
        return self.wall_start_ns + (self.end_ns - self.start_ns)

    def wall(self, monotonic_ns: int) -> int:
        """A monotonic time of this operation as wall-clock ns (for span timestamps)."""
        return self.wall_start_ns + (monotonic_ns - self.start_ns)


Observer = Callable[[OperationEvent], None]

# the operation whose flow is running now (set only by observed(), around each step)
_CURRENT: contextvars.ContextVar[OperationEvent | None] = contextvars.ContextVar(
    "ctxguard_operation", default=None
)


def note_cache(use: CacheUse) -> None:
    """Tell the running operation how the window cache served it (observed guards only)."""
    event = _CURRENT.get()
    if event is not None:
        event.cache = use


def note_summary(summary: SummaryEvent) -> None:
    """Add a summary to the running operation (observed guards only)."""
    event = _CURRENT.get()
    if event is not None:
        event.summaries.append(summary)


def observed(
    flow: Any,
    observer: Observer,
    kind: Kind,
    session_id: str,
    *,
    usage: Mapping[str, Any] | None = None,
    estimate: int | None = None,
) -> Any:
    """Run ``flow`` unchanged, timing what it yields; report the operation at its end.

    The operation is made current (for :func:`note_cache` / :func:`note_summary`) once,
    for the whole flow: between its steps only the shell's own I/O runs in this context
    (an async guard's other operations run in their own tasks' contexts).
    """
    clock = time.monotonic_ns
    # positional: a third cheaper than by keyword (the fields' order is OperationEvent's)
    event = OperationEvent(
        kind, session_id, clock(), time.time_ns(), 0, None, None, None, usage, estimate, [], []
    )
    calls = event.store_calls
    send, throw = flow.send, flow.throw
    token = _CURRENT.set(event)
    reply: Any = None
    error: BaseException | None = None
    try:
        while True:
            try:
                op = send(reply) if error is None else throw(error)
            except StopIteration as stop:
                event.result = stop.value
                return stop.value
            method = getattr(op, "method", None)
            start = clock()
            try:
                reply = yield op
                error = None
            except Exception as exc:  # the shell's I/O failed: hand it to the flow
                reply, error = None, exc
            if method is not None:
                failed = None if error is None else type(error).__name__
                calls.append(StoreCallEvent(method, start, clock(), failed))
    except BaseException as exc:
        event.error = exc
        raise
    finally:
        event.end_ns = clock()
        _reset(token, event)
        # an observer's bug must not change the answer (not contextlib.suppress: a
        # context manager costs 0.2 µs per operation)
        try:  # noqa: SIM105
            observer(event)
        except Exception:
            pass


def _reset(token: contextvars.Token[OperationEvent | None], event: OperationEvent) -> None:
    if _CURRENT.get() is event:
        try:
            _CURRENT.reset(token)
        except ValueError:  # finalised in another context (an abandoned, collected flow)
            _CURRENT.set(None)


def now_ns() -> int:
    return time.monotonic_ns()
