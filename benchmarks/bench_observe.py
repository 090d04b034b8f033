"""Per-turn cost with the observer off vs Prometheus metrics and OpenTelemetry spans on.

Same process, same Redis, same workload, interleaved rounds: each system runs a
block of turns in turn, repeated, so drift of the machine hits every system alike.
A turn = ``prepare`` one user message (a 2,048-token limit, so windows are trimmed)
+ ``complete`` with the server's usage, on sessions holding a few dozen messages,
window cache on. Ratios are against ``off`` (no observer) in the same run.

* ``off``: ``Guard("redis://…")``, no observer (the cost of the hook: one attribute
  check per operation);
* ``noop``: an observer that does nothing (the hook's own cost in situ);
* ``metrics``: ``observer=PrometheusObserver(CollectorRegistry())``;
* ``tracing``: ``observer=TracingObserver(provider)``, an SDK ``TracerProvider``
  with a ``BatchSpanProcessor`` (what production uses) into an in-memory exporter
  (cleared between rounds): a span per operation and per store call, 4 per turn;
* ``tracing-ops``: ``TracingObserver(provider, store_spans=False)``, 2 spans per turn;
* ``tracing-1%``: ``tracing`` on a provider that samples 1% of traces
  (``ParentBased(TraceIdRatioBased(0.01))``, how tracing usually runs in production):
  an unsampled operation makes one non-recording span and no children;
* ``both-1%``: ``fan_out(metrics, tracing-1%)``;
* ``both`` / ``both-ops``: ``fan_out(metrics, tracing)`` / with ``tracing-ops``;
* ``metrics-bg`` / ``both-1%-bg`` / ``both-bg``: ``metrics``, ``both-1%`` and ``both``
  delivered by ``background(...)`` (the turn only enqueues; its thread delivers every
  10 ms). Turns back to back, no idle time, the flush at the end of each block timed:
  the bound where the deliverer's work can only hide in the turns' own Redis waits;
* ``span-floor``: the SDK's floor for ``tracing``: an observer that makes the same
  spans (one per operation, a child per store call, same times, same provider)
  with no attributes and nothing else;
* ``span-floor+attrs``: the same spans carrying constant attribute dicts with the
  keys and value types ``tracing`` sets (what storing the attributes costs the SDK).

``tracing`` minus ``span-floor+attrs`` is what ctxguard's own code adds; the
floors minus ``off`` is the SDK's price for the spans the issue asks for. The last
column replays one recorded cached turn's events (prepare + complete) through each
observer alone, interleaved rounds, same provider: the observer's cost without the
Redis round trips' noise (for the ``-bg`` rows: what the enqueue costs the caller).

Run: ``python benchmarks/bench_observe.py [--redis-url URL] [--turns 200] [--rounds 7]``
(needs ``.[metrics,otel]`` and ``opentelemetry-sdk``). Without ``--redis-url`` a
private redis-server is started on a free port and stopped at the end.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _turn.server import private_redis
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import SpanKind
from prometheus_client import CollectorRegistry

from ctxguard import Guard
from ctxguard.guard.events import Observer, OperationEvent
from ctxguard.observe import BackgroundObserver, background, fan_out
from ctxguard.observe.metrics import PrometheusObserver
from ctxguard.observe.tracing import TracingObserver

SESSIONS = 8


# the attributes TracingObserver sets on a cached turn's spans (keys and value types)
PREPARE_ATTRS: dict[str, Any] = {
    "gen_ai.conversation.id": "obs-3",
    "ctxguard.operation": "prepare",
    "ctxguard.window_cache": "hit",
    "gen_ai.request.max_tokens": 256,
    "gen_ai.conversation.compacted": True,
    "ctxguard.turn": 40,
    "ctxguard.limit_tokens": 2048,
    "ctxguard.limit_source": "static",
    "ctxguard.budget_tokens": 1792,
    "ctxguard.tokens": 1750,
    "ctxguard.messages": 14,
    "ctxguard.dropped_messages": 66,
    "ctxguard.summary_version": 0,
    "ctxguard.policies": ("admission", "window"),
}
COMPLETE_ATTRS: dict[str, Any] = {
    "gen_ai.conversation.id": "obs-3",
    "ctxguard.operation": "complete",
    "gen_ai.usage.input_tokens": 1750,
    "gen_ai.usage.output_tokens": 60,
    "ctxguard.estimate_tokens": 1750,
}


def span_floor(provider: TracerProvider, with_attributes: bool) -> Observer:
    """The same spans as TracingObserver (parentage, kinds, times), nothing of ours."""
    tracer = trace.get_tracer("floor", tracer_provider=provider)

    def observe(event: OperationEvent) -> None:
        attrs = None
        if with_attributes:
            attrs = PREPARE_ATTRS if event.kind == "prepare" else COMPLETE_ATTRS
        span = tracer.start_span("op", start_time=event.wall_start_ns, attributes=attrs)
        parent = trace.set_span_in_context(span)
        for call in event.store_calls:
            tracer.start_span(
                "store",
                context=parent,
                kind=SpanKind.CLIENT,
                start_time=event.wall(call.start_ns),
                attributes={"db.operation.name": call.method} if with_attributes else None,
            ).end(end_time=event.wall(call.end_ns))
        span.end(end_time=event.wall_end_ns)

    return observe


def noop(event: OperationEvent) -> None:
    pass


def make_observers(exporter: InMemorySpanExporter) -> dict[str, Observer | None]:
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(exporter))
    metrics = PrometheusObserver(CollectorRegistry())
    tracing = TracingObserver(provider)
    ops_only = TracingObserver(provider, store_spans=False)
    sampled_provider = TracerProvider(sampler=ParentBased(TraceIdRatioBased(0.01)))
    sampled_provider.add_span_processor(BatchSpanProcessor(exporter))
    sampled = TracingObserver(sampled_provider)
    return {
        "off": None,
        "noop": noop,
        "metrics": metrics,
        "span-floor": span_floor(provider, with_attributes=False),
        "span-floor+attrs": span_floor(provider, with_attributes=True),
        "tracing": tracing,
        "tracing-ops": ops_only,
        "both": fan_out(metrics, tracing),
        "both-ops": fan_out(metrics, ops_only),
        "tracing-1%": sampled,
        "both-1%": fan_out(metrics, sampled),
        "metrics-bg": background(PrometheusObserver(CollectorRegistry())),
        "both-1%-bg": background(PrometheusObserver(CollectorRegistry()), sampled),
        "both-bg": background(PrometheusObserver(CollectorRegistry()), tracing),
    }


def settle(observer: Observer | None) -> None:
    """A background observer's pending events delivered (between timed blocks)."""
    if isinstance(observer, BackgroundObserver):
        observer.flush(30)


def user(i: int) -> dict[str, str]:
    return {"role": "user", "content": f"question {i}: " + "tell me more about that " * 12}


def reply(i: int) -> dict[str, str]:
    return {"role": "assistant", "content": f"answer {i}: " + "it depends on the case " * 20}


def turns(guard: Guard, prefix: str, start: int, count: int) -> float:
    """Per turn (s) of ``count`` back-to-back turns, a background observer's flush at the
    end included (all its work for these turns is in the time)."""
    began = time.perf_counter()
    for i in range(start, start + count):
        session = f"{prefix}-{i % SESSIONS}"
        prepared = guard.prepare(session, [user(i)], max_tokens=256)
        usage = {"prompt_tokens": prepared.tokens, "completion_tokens": 60}
        guard.complete(session, reply(i), prepared=prepared, usage=usage)
    settle(guard.observer)
    return (time.perf_counter() - began) / count


def replay(
    observers: dict[str, Observer | None],
    events: list[OperationEvent],
    exporter: InMemorySpanExporter,
    rounds: int,
    calls: int = 2000,
) -> dict[str, float]:
    """Per turn (µs): each observer alone, called on one recorded turn's events, interleaved."""
    per_turn: dict[str, list[float]] = {n: [] for n, o in observers.items() if o is not None}
    for _ in range(rounds):
        for name in per_turn:
            observer = observers[name]
            assert observer is not None
            began = time.perf_counter()
            for _ in range(calls):
                for event in events:
                    observer(event)
            per_turn[name].append((time.perf_counter() - began) / calls * 1e6)
            settle(observer)
            exporter.clear()
    return {name: statistics.median(v) for name, v in per_turn.items()}


def run(url: str, turns_per_round: int, rounds: int) -> dict[str, Any]:
    exporter = InMemorySpanExporter()
    observers = make_observers(exporter)
    namespace = "bench" + uuid.uuid4().hex[:8]
    guards = {
        name: Guard(url, limit=2048, namespace=namespace, observer=obs)
        for name, obs in observers.items()
    }
    for name, guard in guards.items():  # warm up: sessions exist, windows cached
        guard.prepare(f"{name}-0", [{"role": "system", "content": "You are terse."}])
        turns(guard, name, 0, 4 * SESSIONS)
    per_turn: dict[str, list[float]] = {name: [] for name in guards}
    for r in range(rounds):
        for name, guard in guards.items():
            start = 4 * SESSIONS + r * turns_per_round
            per_turn[name].append(turns(guard, name, start, turns_per_round))
            exporter.clear()
    recorded: list[OperationEvent] = []  # one cached turn's events, for the replay table
    recorder = Guard(url, limit=2048, namespace=namespace, observer=recorded.append)
    turns(recorder, "off", 0, SESSIONS + 1)  # the last turn: a cached session's, as above
    del recorded[:-2]
    for guard in [*guards.values(), recorder]:
        guard.close()
    alone = replay(observers, recorded, exporter, rounds)

    # ratios per round (each round's systems ran back to back), then their median
    def ratio(name: str, against: str) -> float:
        return statistics.median(
            a / b for a, b in zip(per_turn[name], per_turn[against], strict=True)
        )

    def added(name: str, against: str) -> float:
        return (
            statistics.median(a - b for a, b in zip(per_turn[name], per_turn[against], strict=True))
            * 1e6
        )

    return {
        name: {
            "median_us": statistics.median(v) * 1e6,
            "ratio": ratio(name, "off"),
            "over_off_us": added(name, "off"),
            "over_floor_us": added(name, "span-floor+attrs") if "tracing" in name else None,
            "vs_floor": ratio(name, "span-floor+attrs") if "tracing" in name else None,
            "alone_us": alone.get(name),
        }
        for name, v in per_turn.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url")
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    if args.redis_url:
        results = run(args.redis_url, args.turns, args.rounds)
    else:
        with private_redis() as server:
            results = run(server.url, args.turns, args.rounds)
    print(
        f"{'system':<17} {'per turn (us)':>14} {'ratio vs off':>13} {'us over off':>12}"
        f" {'ratio vs floor+attrs':>21} {'us over floor+attrs':>20} {'observer alone (us)':>20}"
    )
    for name, row in results.items():
        floor = "" if row["vs_floor"] is None else f"{row['vs_floor']:.3f}"
        over = "" if row["over_floor_us"] is None else f"{row['over_floor_us']:.1f}"
        alone = "" if row["alone_us"] is None else f"{row['alone_us']:.1f}"
        print(
            f"{name:<17} {row['median_us']:>14.1f} {row['ratio']:>13.3f}"
            f" {row['over_off_us']:>12.1f} {floor:>21} {over:>20} {alone:>20}"
        )


if __name__ == "__main__":
    main()
