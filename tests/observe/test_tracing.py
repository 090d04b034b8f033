"""OpenTelemetry spans from the SDK's in-memory exporter after real guard turns."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence

import pytest
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult
from opentelemetry.trace import Link, SpanKind, StatusCode, TraceState
from opentelemetry.util.types import Attributes

from ctxguard import Message
from ctxguard.errors import BudgetError, ConfigError
from ctxguard.guard import AsyncGuard, Guard
from ctxguard.observe.tracing import CAPTURE_ENV, TracingObserver
from tests.conftest import private_memory_url

SECRET = "the-sentence-that-must-not-leak"


def user(i: int) -> dict[str, str]:
    return {"role": "user", "content": f"{SECRET} {i} " + "about things " * 8}


def reply(i: int) -> dict[str, str]:
    return {"role": "assistant", "content": f"answer number {i}. " + "it depends " * 8}


def summarizer(previous: str | None, messages: Sequence[Message]) -> str:
    return f"{len(messages)} messages about things"


@pytest.fixture
def exporter() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    provider = TracerProvider()
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    yield provider, memory  # (nothing to shut down: a synchronous in-memory exporter)


def named(spans: Sequence[ReadableSpan], name: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name]


def children(spans: Sequence[ReadableSpan], parent: ReadableSpan) -> list[ReadableSpan]:
    assert parent.context is not None
    return [s for s in spans if s.parent is not None and s.parent.span_id == parent.context.span_id]


def test_spans_of_real_turns_on_redis(
    redis_url: str,
    namespace: str,
    exporter: tuple[TracerProvider, InMemorySpanExporter],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(CAPTURE_ENV, raising=False)
    provider, memory = exporter
    guard = Guard(
        redis_url,
        limit=400,
        max_tokens=64,
        namespace=namespace,
        observer=TracingObserver(provider),
        summarizer=summarizer,
        summarize_after=2,
    )
    try:
        for i in range(8):
            prepared = guard.prepare("c1", [user(i)])
            guard.complete(
                "c1",
                reply(i),
                prepared=prepared,
                usage={"prompt_tokens": prepared.tokens + 2, "completion_tokens": 30},
            )
        with pytest.raises(BudgetError):
            guard.prepare("c1", [{"role": "user", "content": "word " * 2000}])
    finally:
        guard.close()
    spans = memory.get_finished_spans()
    prepares = named(spans, "ctxguard prepare")
    completes = named(spans, "ctxguard complete")
    assert len(prepares) == 9 and len(completes) == 8
    first = prepares[0].attributes or {}
    assert first["gen_ai.conversation.id"] == "c1"
    assert first["gen_ai.request.max_tokens"] == 64
    assert first["ctxguard.limit_tokens"] == 400
    assert first["ctxguard.budget_tokens"] == 400 - 64
    assert first["gen_ai.conversation.compacted"] is False
    assert isinstance(first["ctxguard.tokens"], int) and first["ctxguard.tokens"] > 0
    compacted = [p for p in prepares if (p.attributes or {}).get("gen_ai.conversation.compacted")]
    assert compacted, "a 400-token limit must have compacted some window"
    assert any((p.attributes or {}).get("ctxguard.summary_version", 0) > 0 for p in compacted)
    done = completes[0].attributes or {}
    assert done["gen_ai.usage.input_tokens"] == done["ctxguard.estimate_tokens"] + 2
    assert done["gen_ai.usage.output_tokens"] == 30
    # each store call is a child span of its operation, inside its time
    for op in prepares[:8] + completes:
        kids = [s for s in children(spans, op) if s.name.startswith("ctxguard.store ")]
        assert kids, op.name
        for kid in kids:
            assert op.start_time is not None and op.end_time is not None
            assert op.start_time <= (kid.start_time or 0) <= (kid.end_time or 0) <= op.end_time
    assert {s.name for s in children(spans, completes[0])} == {"ctxguard.store append_with_audit"}
    # an inline summary is a child of its prepare, its store calls children of it
    summaries = named(spans, "ctxguard summary")
    assert summaries
    assert (summaries[0].attributes or {})["ctxguard.summary.outcome"] == "committed"
    parent_ids = {p.context.span_id for p in prepares if p.context is not None}
    assert summaries[0].parent is not None and summaries[0].parent.span_id in parent_ids
    assert {s.name for s in children(spans, summaries[0])} >= {
        "ctxguard.store read",
        "ctxguard.store commit_summary",
    }
    refused = prepares[-1]
    assert refused.status.status_code is StatusCode.ERROR
    assert (refused.attributes or {})["error.type"] == "BudgetError"
    # no content by default
    for span in spans:
        assert SECRET not in json.dumps(dict(span.attributes or {}))


def test_content_only_with_the_capture_switch(
    exporter: tuple[TracerProvider, InMemorySpanExporter], monkeypatch: pytest.MonkeyPatch
) -> None:
    provider, memory = exporter
    monkeypatch.setenv(CAPTURE_ENV, "true")
    guard = Guard(
        private_memory_url(), limit=400, max_tokens=64, observer=TracingObserver(provider)
    )
    guard.prepare("c2", [user(0)])
    (span,) = memory.get_finished_spans()[-1:]
    assert SECRET in str((span.attributes or {})["gen_ai.input.messages"])
    monkeypatch.setenv(CAPTURE_ENV, "false")
    guard = Guard(
        private_memory_url(), limit=400, max_tokens=64, observer=TracingObserver(provider)
    )
    guard.prepare("c2b", [user(0)])
    assert "gen_ai.input.messages" not in (memory.get_finished_spans()[-1].attributes or {})


async def test_async_guard_spans(
    redis_url: str, namespace: str, exporter: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, memory = exporter
    guard = AsyncGuard(
        redis_url,
        limit=400,
        max_tokens=64,
        namespace=namespace,
        observer=TracingObserver(provider),
    )
    try:
        prepared = await guard.prepare("c3", [user(0)])
        await guard.complete("c3", reply(0), prepared=prepared)
    finally:
        await guard.aclose()
    spans = memory.get_finished_spans()
    (prepare,) = named(spans, "ctxguard prepare")
    assert (prepare.attributes or {})["ctxguard.window_cache"] == "miss"
    assert [s.name for s in children(spans, prepare)] == [
        "ctxguard.store fetch_window",
        "ctxguard.store commit_if_unchanged",
    ]


def test_operation_span_joins_the_callers_trace(
    exporter: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, memory = exporter
    guard = Guard(
        private_memory_url(), limit=400, max_tokens=64, observer=TracingObserver(provider)
    )
    with provider.get_tracer("app").start_as_current_span("handler") as handler:
        guard.prepare("c4", [user(0)])
    (prepare,) = named(memory.get_finished_spans(), "ctxguard prepare")
    assert prepare.parent is not None
    assert prepare.parent.span_id == handler.get_span_context().span_id


def test_store_spans_can_be_left_out(
    exporter: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, memory = exporter
    observer = TracingObserver(provider, store_spans=False)
    guard = Guard(private_memory_url(), limit=400, max_tokens=64, observer=observer)
    guard.prepare("c5", [user(0)])
    assert [s.name for s in memory.get_finished_spans()] == ["ctxguard prepare"]


class DropAll(Sampler):
    """Samples nothing and remembers every span it was asked about."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def should_sample(
        self,
        parent_context: Context | None,
        trace_id: int,
        name: str,
        kind: SpanKind | None = None,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        trace_state: TraceState | None = None,
    ) -> SamplingResult:
        self.asked.append(name)
        return SamplingResult(Decision.DROP)

    def get_description(self) -> str:
        return "DropAll"


def test_an_unsampled_operation_makes_no_child_spans(redis_url: str, namespace: str) -> None:
    sampler = DropAll()
    provider = TracerProvider(sampler=sampler)
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    guard = Guard(
        redis_url, limit=400, max_tokens=64, namespace=namespace, observer=TracingObserver(provider)
    )
    try:
        for i in range(3):
            prepared = guard.prepare("c6", [user(i)])
            guard.complete("c6", reply(i), prepared=prepared)
    finally:
        guard.close()
    assert memory.get_finished_spans() == ()
    # the sampler saw the operation spans only: no store span was started under them
    assert sampler.asked == ["ctxguard prepare", "ctxguard complete"] * 3


@pytest.mark.parametrize(
    "kwargs",
    [
        {"capture_content": "false"},  # (before: truthy, so every message went into spans)
        {"capture_content": 0},
        {"store_spans": "no"},
        {"tracer_provider": "otel"},  # (before: AttributeError)
    ],
)
def test_bad_arguments_are_config_errors(kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        TracingObserver(**kwargs)  # type: ignore[arg-type]
