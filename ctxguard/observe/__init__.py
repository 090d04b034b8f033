"""See and react: Prometheus metrics, OpenTelemetry spans, pressure-aware limits.

A room of its own that uses the guard through one hook point, ``observer=``
(:mod:`ctxguard.guard.events`)::

    from ctxguard.observe.metrics import PrometheusObserver, start_http_server
    from ctxguard.observe.tracing import TracingObserver
    from ctxguard.observe import background

    guard = Guard(url, limit=..., observer=background(PrometheusObserver(), TracingObserver()))

``background(...)`` (:mod:`ctxguard.observe.background`, recommended) delivers each event
on a thread of its own, in the caller's context, while the caller waits on its next I/O:
the request path only enqueues it. Prometheus reads stay exact (each collect flushes it
first). ``fan_out(...)`` calls the observers inline, on the caller's thread, in turn.

Nothing here is imported by ``import ctxguard``; ``prometheus_client`` (extra
``ctxguard[metrics]``) and ``opentelemetry-api`` (extra ``ctxguard[otel]``) load only
with the module that needs them.
"""

from __future__ import annotations

import contextlib
import copy
import pickle
from typing import Any, SupportsIndex

from ctxguard.errors import ConfigError, NotCopyableError
from ctxguard.guard.events import Observer, OperationEvent, StoreCallEvent, SummaryEvent
from ctxguard.observe.background import BackgroundObserver, background

__all__ = [
    "BackgroundObserver",
    "FanOut",
    "Observer",
    "OperationEvent",
    "StoreCallEvent",
    "SummaryEvent",
    "background",
    "fan_out",
]


def fan_out(*observers: Observer) -> FanOut:
    """One observer that hands each event to every one of ``observers`` in turn (inline;
    its ``observers`` attribute names them, so ``background(fan_out(a, b))`` is
    ``background(a, b)``)."""
    chosen = tuple(observers)
    for observer in chosen:  # (a non-callable one was skipped silently, at every event)
        if not callable(observer):
            raise ConfigError(
                "observers must be callables taking one OperationEvent, "
                f"got {type(observer).__name__}"
            )
    return FanOut(chosen)


class FanOut:
    """What :func:`fan_out` returns. It copies and pickles as its observers do: whole
    when each of them does (a copy holds copies of them, a shallow copy the same ones);
    when one refuses (it holds a guard, a connection or a thread: ``NotCopyableError``,
    or it is a lambda pickle cannot name), a :class:`~ctxguard.errors.NotCopyableError`
    naming that observer's type."""

    __slots__ = ("observers",)
    observers: tuple[Observer, ...]

    def __init__(self, observers: tuple[Observer, ...]) -> None:
        self.observers = observers

    def __call__(self, event: OperationEvent) -> None:
        for observer in self.observers:
            with contextlib.suppress(Exception):  # one observer's bug does not blind the rest
                observer(event)

    def __repr__(self) -> str:
        return f"fan_out({', '.join(type(o).__name__ for o in self.observers)})"

    def __eq__(self, other: object) -> bool:
        return type(other) is FanOut and other.observers == self.observers

    def __hash__(self) -> int:
        return hash((FanOut, self.observers))

    def _refuse(self, observer: object, how: str) -> NotCopyableError:
        return NotCopyableError(
            "FanOut",
            f"an observer that refuses it ({type(observer).__name__})",
            "make fan_out(...) again in each process from the same settings",
            how=how,
        )

    def _how(self, *, deep_refused: bool) -> str:
        """What of it is refused besides pickling, as the error says it."""
        try:
            self.__copy__()
            if not deep_refused:
                copy.deepcopy(self)
        except NotCopyableError:
            return "copied" if self._shallow_refused() else "deep-copied"
        return "deep-copied" if deep_refused else "sent to another process"

    def _shallow_refused(self) -> bool:
        try:
            self.__copy__()
        except NotCopyableError:
            return True
        return False

    def __copy__(self) -> FanOut:
        for observer in self.observers:
            try:
                copy.copy(observer)  # (what it would refuse; the copy shares the originals)
            except NotCopyableError:
                raise self._refuse(observer, "copied") from None
        return FanOut(self.observers)

    def __deepcopy__(self, memo: dict[int, Any]) -> FanOut:
        copied: list[Observer] = []
        for observer in self.observers:
            try:
                copied.append(copy.deepcopy(observer, memo))
            except NotCopyableError:
                raise self._refuse(observer, self._how(deep_refused=True)) from None
        return FanOut(tuple(copied))

    def __reduce_ex__(self, protocol: SupportsIndex) -> tuple[Any, ...]:
        for observer in self.observers:
            try:
                pickle.dumps(observer, protocol.__index__())
            except Exception:  # NotCopyableError, or pickle's own (a lambda, a local class)
                raise self._refuse(observer, self._how(deep_refused=False)) from None
        return (FanOut, (self.observers,))
