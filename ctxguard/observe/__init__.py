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

from ctxguard.errors import ConfigError
from ctxguard.guard.events import Observer, OperationEvent, StoreCallEvent, SummaryEvent
from ctxguard.observe.background import BackgroundObserver, background

__all__ = [
    "BackgroundObserver",
    "Observer",
    "OperationEvent",
    "StoreCallEvent",
    "SummaryEvent",
    "background",
    "fan_out",
]


def fan_out(*observers: Observer) -> Observer:
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

    def observe(event: OperationEvent) -> None:
        for observer in chosen:
            with contextlib.suppress(Exception):  # one observer's bug does not blind the rest
                observer(event)

    observe.observers = chosen  # type: ignore[attr-defined]
    return observe
