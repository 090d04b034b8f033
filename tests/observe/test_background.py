"""``background(...)``: observers delivered off the request path, exact when read."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from ctxguard.errors import ConfigError, InvalidInputError
from ctxguard.guard import AsyncGuard, Guard
from ctxguard.guard.events import OperationEvent
from ctxguard.observe import BackgroundObserver, background, fan_out
from ctxguard.observe.metrics import PrometheusObserver
from ctxguard.observe.tracing import TracingObserver
from tests.conftest import private_memory_url

SYSTEM = {"role": "system", "content": "You are terse."}


def user(i: int) -> dict[str, str]:
    return {"role": "user", "content": f"question number {i} " + "about things " * 8}


def reply(i: int) -> dict[str, str]:
    return {"role": "assistant", "content": f"answer number {i}. " + "it depends " * 8}


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    got = registry.get_sample_value(name, labels)
    return 0.0 if got is None else got


def event(i: int = 0) -> OperationEvent:
    return OperationEvent("prepare", f"s{i}", i, i)


class Slow:
    """An observer that takes ``seconds`` per event (what a busy one does)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.seen: list[OperationEvent] = []

    def __call__(self, event: OperationEvent) -> None:
        time.sleep(self.seconds)
        self.seen.append(event)


@pytest.fixture
def tracing() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    provider = TracerProvider()
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    yield provider, memory


def named(spans: tuple[ReadableSpan, ...], name: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name]


def test_metrics_of_real_turns_are_exact_without_a_flush(redis_url: str, namespace: str) -> None:
    registry = CollectorRegistry()
    # the first observer is slow: what a collect reads is delivered only by its flush
    slow = Slow(0.02)
    deliverer = background(slow, PrometheusObserver(registry))
    guard = Guard(redis_url, limit=400, max_tokens=64, namespace=namespace, observer=deliverer)
    try:
        guard.prepare("b1", [SYSTEM])
        for i in range(6):
            prepared = guard.prepare("b1", [user(i)])
            guard.complete(
                "b1", reply(i), prepared=prepared, usage={"prompt_tokens": prepared.tokens + 2}
            )
        # read at once, no flush: the registry's collect flushes the deliverer first
        assert (
            value(registry, "ctxguard_operation_duration_seconds_count", operation="prepare") == 7
        )
        sent = value(registry, "ctxguard_requests_total", outcome="sent", policy="none")
        windowed = value(registry, "ctxguard_requests_total", outcome="sent", policy="window")
        assert sent + windowed == 7
        assert (
            value(registry, "ctxguard_operation_duration_seconds_count", operation="complete") == 6
        )
        assert value(registry, "ctxguard_window_tokens_count") == 7
        assert value(registry, "ctxguard_limit_tokens") == 400
        assert value(registry, "ctxguard_estimate_drift_tokens_bucket", le="4.0") == 6
        assert value(registry, "ctxguard_estimate_drift_tokens_bucket", le="1.0") == 0
        assert value(registry, "ctxguard_window_cache_hits_total") >= 5
        labels = {"operation": "append_with_audit"}
        assert value(registry, "ctxguard_store_operation_duration_seconds_count", **labels) == 6
        assert value(registry, "ctxguard_observer_events_dropped_total") == 0
        assert len(slow.seen) == 13
        # delivered on the deliverer's thread, not the caller's
        assert deliverer._thread is not None and deliverer._thread is not threading.current_thread()
    finally:
        guard.close()
        deliverer.close()


def test_spans_of_real_turns_keep_the_callers_parent(
    redis_url: str, namespace: str, tracing: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, memory = tracing
    deliverer = background(TracingObserver(provider))
    guard = Guard(redis_url, limit=400, max_tokens=64, namespace=namespace, observer=deliverer)
    tracer = provider.get_tracer("app")
    handlers = []
    try:
        for i in range(3):
            with tracer.start_as_current_span(f"handler {i}") as handler:
                prepared = guard.prepare("b2", [user(i)])
                guard.complete("b2", reply(i), prepared=prepared, usage={"prompt_tokens": 5})
            handlers.append(handler.get_span_context().span_id)
        guard.prepare("b2", [user(9)])  # outside any span: a root
        assert deliverer.flush(5)
    finally:
        guard.close()
        deliverer.close()
    spans = memory.get_finished_spans()
    prepares = named(spans, "ctxguard prepare")
    completes = named(spans, "ctxguard complete")
    assert len(prepares) == 4 and len(completes) == 3
    for i, span_id in enumerate(handlers):
        for op in (prepares[i], completes[i]):
            assert op.parent is not None and op.parent.span_id == span_id, op.name
    assert prepares[3].parent is None
    assert (prepares[0].attributes or {})["gen_ai.conversation.id"] == "b2"
    assert (prepares[1].attributes or {})["ctxguard.window_cache"] == "hit"
    assert (completes[0].attributes or {})["gen_ai.usage.input_tokens"] == 5
    stores = [s for s in spans if s.name == "ctxguard.store commit_if_unchanged"]
    assert stores and all(
        s.parent is not None and s.parent.span_id in {p.context.span_id for p in prepares}
        for s in stores
    )


async def test_async_guard_keeps_the_callers_parent(
    redis_url: str, namespace: str, tracing: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, memory = tracing
    deliverer = background(TracingObserver(provider, store_spans=False))
    guard = AsyncGuard(redis_url, limit=400, max_tokens=64, namespace=namespace, observer=deliverer)
    try:
        with provider.get_tracer("app").start_as_current_span("async handler") as handler:
            prepared = await guard.prepare("b3", [user(0)])
            await guard.complete("b3", reply(0), prepared=prepared)
    finally:
        await guard.aclose()
    deliverer.close()  # flushes
    ops = [s for s in memory.get_finished_spans() if s.name.startswith("ctxguard ")]
    assert [s.name for s in ops] == ["ctxguard prepare", "ctxguard complete"]
    span_id = handler.get_span_context().span_id
    assert all(s.parent is not None and s.parent.span_id == span_id for s in ops)


def test_flush_waits_and_times_out() -> None:
    slow = Slow(0.05)
    deliverer = background(slow)
    try:
        assert deliverer.flush(1)  # nothing enqueued yet: done
        for i in range(4):
            deliverer(event(i))
        assert not deliverer.flush(0.001)  # four slow events are not delivered by then
        assert deliverer.flush(10)
        assert [e.session_id for e in slow.seen] == ["s0", "s1", "s2", "s3"]  # in order
        assert deliverer.pending == 0
    finally:
        deliverer.close()


def test_close_delivers_what_is_pending_then_inline() -> None:
    seen: list[tuple[str, str]] = []

    def where(event: OperationEvent) -> None:
        seen.append((event.session_id, threading.current_thread().name))

    deliverer = background(where)
    deliverer(event(1))
    deliverer.close()
    deliverer.close()  # idempotent
    assert seen == [("s1", "ctxguard-observer")]
    deliverer(event(2))  # after close: on the caller's thread
    assert seen[-1] == ("s2", threading.current_thread().name)
    assert deliverer._thread is not None and not deliverer._thread.is_alive()


def test_a_raising_observer_stops_no_later_delivery() -> None:
    calls = {"n": 0}
    seen: list[OperationEvent] = []

    def broken(event: OperationEvent) -> None:
        calls["n"] += 1
        raise RuntimeError("observer bug")

    deliverer = background(broken, seen.append)
    try:
        for i in range(5):
            deliverer(event(i))
        assert deliverer.flush(5)
    finally:
        deliverer.close()
    assert calls["n"] == 5
    assert [e.session_id for e in seen] == [f"s{i}" for i in range(5)]


def test_a_guard_answers_whatever_the_observer_does() -> None:
    def broken(event: OperationEvent) -> None:
        raise RuntimeError("observer bug")

    seen: list[OperationEvent] = []
    deliverer = background(fan_out(broken, seen.append))  # fan_out's observers, flattened
    assert len(deliverer.observers) == 2
    guard = Guard(private_memory_url(), limit=400, max_tokens=64, observer=deliverer)
    assert guard.prepare("b4", [user(0)]).tokens > 0
    deliverer.close()
    assert [e.kind for e in seen] == ["prepare"]


def test_a_full_queue_drops_and_counts_instead_of_blocking() -> None:
    registry = CollectorRegistry()
    gate = threading.Event()
    entered = threading.Event()

    def stuck(event: OperationEvent) -> None:
        entered.set()
        gate.wait(30)

    deliverer = background(stuck, PrometheusObserver(registry), max_pending=3)

    def enqueue_ten() -> None:
        for i in range(1, 11):
            deliverer(event(i))

    calls = threading.Thread(target=enqueue_ten)
    try:
        deliverer(event(0))
        assert entered.wait(10)  # the thread took event 0 and sticks there
        calls.start()
        calls.join(20)
        assert not calls.is_alive(), "enqueueing blocked on a full queue"
        assert deliverer.dropped == 7  # 3 waited, 7 were refused
        assert "dropped=7" in repr(deliverer)
    finally:
        gate.set()
        calls.join(5)
    assert deliverer.flush(10)
    deliverer.close()
    assert value(registry, "ctxguard_observer_events_dropped_total") == 7
    assert value(registry, "ctxguard_operation_duration_seconds_count", operation="prepare") == 4


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_delivers_on_its_own_thread() -> None:
    seen: list[tuple[int, str, int | None]] = []

    def record(event: OperationEvent) -> None:
        seen.append((os.getpid(), event.session_id, threading.get_ident()))

    deliverer = background(record)
    deliverer(event(1))
    assert deliverer.flush(5)
    parent_thread = deliverer._thread
    deliverer(event(2))  # pending in the parent at the fork: the parent's to deliver
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report what it delivered, then leave at once
        try:
            before = len(seen)
            deliverer(event(3))
            flushed = deliverer.flush(5)
            child = deliverer._thread
            report = {
                "flushed": flushed,
                "new_thread": child is not None and child is not parent_thread,
                "alive": child is not None and child.is_alive(),
                "delivered": [s for _, s, _ in seen[before:]],
            }
            os.write(write, json.dumps(report).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        report = json.loads(pipe.read() or "{}")
    os.waitpid(pid, 0)
    assert deliverer.flush(5)
    deliverer.close()
    assert report == {"flushed": True, "new_thread": True, "alive": True, "delivered": ["s3"]}
    assert [s for _, s, _ in seen] == ["s1", "s2"]  # the parent delivered its own


def test_fork_and_exit_hooks_are_registered_once_per_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``os.register_at_fork`` callbacks cannot be removed: one set per deliverer would
    pile up in a process that makes many. One set visits every live deliverer."""
    import gc
    import importlib
    import weakref

    module = importlib.import_module("ctxguard.observe.background")
    forks: list[object] = []
    exits: list[object] = []
    monkeypatch.setattr(module, "_hooks_registered", False)
    monkeypatch.setattr(module.os, "register_at_fork", lambda **hooks: forks.append(hooks))
    monkeypatch.setattr(module.atexit, "register", lambda fn, *a: exits.append(fn))
    made = [background(Slow(0)) for _ in range(50)]
    try:
        assert len(forks) == 1 and len(exits) == 1
        assert all(d in module._LIVE for d in made)
        module._before_fork()  # what a fork runs: every live deliverer's step is held
        try:
            assert all(d._step._is_owned() for d in made)  # type: ignore[attr-defined]
        finally:
            module._after_fork_parent()
        assert not any(d._step._is_owned() for d in made)  # type: ignore[attr-defined]
    finally:
        for d in made:
            d.close()
    refs = [weakref.ref(d) for d in made]
    del made, d
    gc.collect()
    assert all(ref() is None for ref in refs)  # the set holds them weakly


def test_bad_arguments_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="at least one observer"):
        background()
    with pytest.raises(ConfigError, match="callables"):
        background(42)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="max_pending"):
        background(print, max_pending=0)
    with pytest.raises(ConfigError, match="interval"):
        background(print, interval=0)
    with pytest.raises(ConfigError, match="interval"):  # (before: taken as 1 s)
        background(print, interval=True)
    with pytest.raises(ConfigError, match="callables"):  # (before: skipped at every event)
        fan_out(print, 42)  # type: ignore[arg-type]


def test_a_wait_past_a_million_seconds_is_refused() -> None:
    """(before: OverflowError out of Event.wait / Thread.join)"""
    deliverer = background(lambda event: None)
    deliverer(event())  # the thread runs
    with pytest.raises(InvalidInputError, match="1,000,000"):
        deliverer.flush(1e300)
    with pytest.raises(InvalidInputError, match="1,000,000"):
        deliverer.close(1e300)
    deliverer.close()
    with pytest.raises(InvalidInputError, match="1,000,000"):
        Guard(private_memory_url(), limit=400).wait_for_summaries(1e300)
    assert isinstance(background(print), BackgroundObserver)


async def test_concurrent_async_operations_note_their_own_event(
    redis_url: str, namespace: str
) -> None:
    import asyncio

    seen: list[OperationEvent] = []
    guard = AsyncGuard(
        redis_url, limit=400, max_tokens=64, namespace=namespace, observer=seen.append
    )
    sessions = [f"c{i}" for i in range(4)]
    try:
        for s in sessions:
            await guard.prepare(s, [user(0)])  # cached from now on
        seen.clear()
        # interleaved on one loop: each operation made current in its own task's context
        await asyncio.gather(*(guard.prepare(s, [user(1)]) for s in sessions))
    finally:
        await guard.aclose()
    assert sorted(e.session_id for e in seen) == sessions
    assert [e.cache for e in seen] == ["hit"] * 4
    assert all(len(e.store_calls) == 1 for e in seen)


def test_a_scrape_restricted_to_some_names_flushes_first() -> None:
    """``?name[]=`` scrapes collect only the collectors naming those metrics: the flush
    must run in them, not in a collector of its own that the restriction leaves out."""
    from prometheus_client import generate_latest

    registry = CollectorRegistry()
    slow = Slow(0.01)
    deliverer = background(slow, PrometheusObserver(registry))
    try:
        for i in range(5):
            deliverer(event(i))
        restricted = registry.restricted_registry(["ctxguard_operation_duration_seconds_count"])
        text = generate_latest(restricted).decode()
        assert 'ctxguard_operation_duration_seconds_count{operation="prepare"} 5.0' in text
        assert "ctxguard_requests_total" not in text  # the restriction still holds
        assert len(slow.seen) == 5
    finally:
        deliverer.close()


def test_a_second_observer_on_one_registry_is_a_config_error() -> None:
    registry = CollectorRegistry()
    PrometheusObserver(registry)
    with pytest.raises(ConfigError, match="already registered on this registry"):
        PrometheusObserver(registry)
    PrometheusObserver(registry, prefix="other")  # another prefix is fine
