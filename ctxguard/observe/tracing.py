"""OpenTelemetry spans of the guard (extra ``ctxguard[otel]``: ``opentelemetry-api``).

One span per operation (``ctxguard prepare`` / ``complete`` / ``summarize`` /
``append``), a child span per summary and per store call, made when the operation
ends with the times it really had (the guard's hot path never touches
OpenTelemetry). The operation span's parent is whatever span is current where the
guard was called (the caller's request handler, say).

Attributes follow the GenAI semantic conventions where they apply
(``gen_ai.conversation.id`` = the session, ``gen_ai.request.max_tokens``,
``gen_ai.usage.input_tokens`` / ``output_tokens`` from the server's usage,
``gen_ai.conversation.compacted`` when a summary or a drop changed the window) plus
``ctxguard.*`` for limit, budget, tokens, dropped messages and summary version.
Message content is recorded (``gen_ai.input.messages``) only when
``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`` is true (or
``capture_content=True``).
"""

from __future__ import annotations

import json
import os
from typing import Any

from ctxguard._nocopy import NotPicklable
from ctxguard.errors import ConfigError, MissingDependencyError
from ctxguard.guard.events import OperationEvent, StoreCallEvent, SummaryEvent
from ctxguard.observe.usage_counts import UsageCounts

try:
    from opentelemetry import trace
    from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer, TracerProvider
except ImportError:  # the extra is not installed: say which one
    raise MissingDependencyError("OpenTelemetry spans (ctxguard.observe.tracing)", "otel") from None

CAPTURE_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
SCOPE = "ctxguard"


def capture_from_env() -> bool:
    return os.environ.get(CAPTURE_ENV, "").strip().lower() in ("true", "1", "yes")


class TracingObserver(NotPicklable):
    """Makes the spans of each guard operation on ``tracer_provider`` (the global one if None).

    ``store_spans=False`` leaves out the per-store-call child spans (the operation span
    still says how the window cache served it); each span costs the SDK tens of µs.
    An operation span the sampler drops makes no child spans (children follow their
    parent, as with the SDK's default parent-based sampler).
    """

    _holds = "its OpenTelemetry tracer"
    _advice = "make one per process from the same tracer provider"

    def __init__(
        self,
        tracer_provider: TracerProvider | None = None,
        capture_content: bool | None = None,
        *,
        store_spans: bool = True,
    ) -> None:
        if tracer_provider is not None and not isinstance(tracer_provider, TracerProvider):
            raise ConfigError(
                "tracer_provider must be an OpenTelemetry TracerProvider or None, "
                f"got {type(tracer_provider).__name__}"
            )
        for name, value in (("capture_content", capture_content), ("store_spans", store_spans)):
            # a truthy "false" would record every message's content in the spans
            if not isinstance(value, bool) and not (name == "capture_content" and value is None):
                raise ConfigError(f"{name} must be True or False, got {type(value).__name__}")
        self.tracer: Tracer = trace.get_tracer(SCOPE, tracer_provider=tracer_provider)
        self.capture_content = capture_from_env() if capture_content is None else capture_content
        self.store_spans = store_spans  # False: one span per operation (and summary), half the cost
        kinds = ("prepare", "complete", "summarize", "append", "replace")
        self._names = {kind: f"ctxguard {kind}" for kind in kinds}
        self._store_names: dict[str, str] = {}
        self._counts = UsageCounts("TracingObserver")

    def __call__(self, event: OperationEvent) -> None:
        # the attributes go in at the start (one pass through the SDK's attribute
        # checks, and a sampler sees them): setting them after an is_recording() check
        # cost 4 µs more per sampled span than building them costs an unsampled one
        span = self.tracer.start_span(
            self._names.get(event.kind) or f"ctxguard {event.kind}",
            kind=SpanKind.INTERNAL,
            start_time=event.wall_start_ns,
            attributes=self._attributes(event),
        )
        if event.error is not None:
            span.set_attribute("error.type", type(event.error).__name__)
            span.set_status(Status(StatusCode.ERROR, type(event.error).__name__))
        if span.is_recording() and (event.summaries or (self.store_spans and event.store_calls)):
            self._children(span, event)  # an unsampled operation makes no child spans
        span.end(end_time=event.wall_end_ns)

    def _children(self, span: Span, event: OperationEvent) -> None:
        parent = trace.set_span_in_context(span)  # in the caller's current context
        if not event.summaries:  # the usual case: store calls straight under the operation
            for call in event.store_calls:
                self._store(call, event, parent)
            return
        summary_spans = [(s, self._summary(s, event, parent)) for s in event.summaries]
        for call in event.store_calls if self.store_spans else ():
            inside = next(
                (sp for s, sp in summary_spans if s.start_ns <= call.start_ns <= s.end_ns), None
            )
            context = parent if inside is None else trace.set_span_in_context(inside, parent)
            self._store(call, event, context)
        for summary, sspan in summary_spans:
            sspan.end(end_time=event.wall(summary.end_ns))

    def _attributes(self, event: OperationEvent) -> dict[str, Any]:
        attrs: dict[str, Any] = {
            "gen_ai.conversation.id": event.session_id,
            "ctxguard.operation": event.kind,
        }
        if event.cache is not None:
            attrs["ctxguard.window_cache"] = event.cache
        prepared = event.prepared
        if prepared is not None:
            dropped = sum(
                int(d.get("dropped_messages") or 0)
                for d in prepared.decisions
                if d.get("policy") in ("window", "render_trim")
            )
            decisions = prepared.decisions
            compacted = bool(prepared.dropped) or prepared.summary_version > 0
            source = prepared.limit_source
            if "; pressure " in source:
                attrs["ctxguard.pressure"] = "lowered" if "; pressure lowered" in source else "ok"
            attrs.update(
                {
                    "gen_ai.request.max_tokens": prepared.reserved_output,
                    "gen_ai.conversation.compacted": compacted,
                    "ctxguard.turn": prepared.turn,
                    "ctxguard.limit_tokens": prepared.limit,
                    "ctxguard.limit_source": source.split(";", 1)[0].split(":", 1)[0],
                    "ctxguard.budget_tokens": prepared.prompt_budget,
                    "ctxguard.tokens": prepared.tokens,
                    "ctxguard.messages": len(prepared.messages),
                    "ctxguard.dropped_messages": dropped,
                    "ctxguard.summary_version": prepared.summary_version,
                    "ctxguard.policies": tuple(sorted({str(d.get("policy")) for d in decisions})),
                }
            )
            if self.capture_content:
                attrs["gen_ai.input.messages"] = json.dumps(
                    prepared.openai_messages(), ensure_ascii=False
                )
        usage = event.usage
        if usage is not None:
            for key, attr in (
                ("prompt_tokens", "gen_ai.usage.input_tokens"),
                ("completion_tokens", "gen_ai.usage.output_tokens"),
            ):
                value = self._counts.count(usage, key)  # (no bool, nor past 2**63-1)
                if value is not None:
                    attrs[attr] = value
        if event.estimate is not None:
            attrs["ctxguard.estimate_tokens"] = event.estimate
        return attrs

    def _summary(self, summary: SummaryEvent, event: OperationEvent, parent: Any) -> Span:
        attrs: dict[str, Any] = {
            "gen_ai.conversation.id": summary.session_id,
            "ctxguard.summary.outcome": summary.outcome,
            "ctxguard.summary.covers_to": summary.covers_to,
        }
        if summary.version is not None:
            attrs["ctxguard.summary_version"] = summary.version
        span = self.tracer.start_span(
            "ctxguard summary",
            context=parent,
            start_time=event.wall(summary.start_ns),
            attributes=attrs,
        )
        if summary.outcome == "failed":
            span.set_status(Status(StatusCode.ERROR, (summary.error or "failed").split(":")[0]))
        return span

    def _store(self, call: StoreCallEvent, event: OperationEvent, context: Any) -> None:
        name = self._store_names.get(call.method)
        if name is None:
            name = self._store_names[call.method] = f"ctxguard.store {call.method}"
        span = self.tracer.start_span(
            name,
            context=context,
            kind=SpanKind.CLIENT,
            start_time=event.wall(call.start_ns),
            attributes={"db.operation.name": call.method},
        )
        if call.error is not None:
            span.set_attribute("error.type", call.error)
            span.set_status(Status(StatusCode.ERROR, call.error))
        span.end(end_time=event.wall(call.end_ns))
