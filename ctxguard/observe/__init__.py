"""See and react: Prometheus metrics, OpenTelemetry spans, pressure-aware limits.

A room of its own that uses the guard through one hook point, ``observer=``
(:mod:`ctxguard.guard.events`)::

    from ctxguard.observe.metrics import PrometheusObserver, start_http_server
    from ctxguard.observe.tracing import TracingObserver
    from ctxguard.observe import fan_out

    guard = Guard(url, limit=..., observer=fan_out(PrometheusObserver(), TracingObserver()))

Nothing here is imported by ``import ctxguard``; ``prometheus_client`` (extra
``ctxguard[metrics]``) and ``opentelemetry-api`` (extra ``ctxguard[otel]``) load only
with the module that needs them.
"""

from __future__ import annotations

import contextlib

from ctxguard.guard.events import Observer, OperationEvent, StoreCallEvent, SummaryEvent

__all__ = ["Observer", "OperationEvent", "StoreCallEvent", "SummaryEvent", "fan_out"]


def fan_out(*observers: Observer) -> Observer:
    """One observer that hands each event to every one of ``observers`` in turn."""
    chosen = tuple(observers)

    def observe(event: OperationEvent) -> None:
        for observer in chosen:
            with contextlib.suppress(Exception):  # one observer's bug does not blind the rest
                observer(event)

    return observe
