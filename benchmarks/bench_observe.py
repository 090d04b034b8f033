"""Per-turn cost with the observer off vs Prometheus metrics and OpenTelemetry spans on.

Same process, same Redis, same workload, interleaved rounds: each system runs a
block of turns in turn, repeated, so drift of the machine hits every system alike.
A turn = ``prepare`` one user message (a 2,048-token limit, so windows are trimmed)
+ ``complete`` with the server's usage, on sessions holding a few dozen messages,
window cache on. Ratios are against ``off`` (no observer) in the same run.

* ``off``: ``Guard("redis://…")``, no observer (the cost of the hook: one attribute
  check per operation);
* ``metrics``: ``observer=PrometheusObserver(CollectorRegistry())``;
* ``tracing``: ``observer=TracingObserver(provider)``, an SDK ``TracerProvider``
  with a ``BatchSpanProcessor`` (what production uses) into an in-memory exporter
  (cleared between rounds): a span per operation and per store call, 4 per turn;
* ``tracing-ops``: ``TracingObserver(provider, store_spans=False)``, 2 spans per turn;
* ``both`` / ``both-ops``: ``fan_out(metrics, tracing)`` / with ``tracing-ops``.

Run: ``python benchmarks/bench_observe.py [--redis-url URL] [--turns 200] [--rounds 5]``
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
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from ctxguard import Guard
from ctxguard.guard.events import Observer
from ctxguard.observe import fan_out
from ctxguard.observe.metrics import PrometheusObserver
from ctxguard.observe.tracing import TracingObserver

SESSIONS = 8


def make_observers(exporter: InMemorySpanExporter) -> dict[str, Observer | None]:
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(exporter))
    metrics = PrometheusObserver(CollectorRegistry())
    tracing = TracingObserver(provider)
    ops_only = TracingObserver(provider, store_spans=False)
    return {
        "off": None,
        "metrics": metrics,
        "tracing": tracing,
        "tracing-ops": ops_only,
        "both": fan_out(metrics, tracing),
        "both-ops": fan_out(metrics, ops_only),
    }


def user(i: int) -> dict[str, str]:
    return {"role": "user", "content": f"question {i}: " + "tell me more about that " * 12}


def reply(i: int) -> dict[str, str]:
    return {"role": "assistant", "content": f"answer {i}: " + "it depends on the case " * 20}


def turns(guard: Guard, prefix: str, start: int, count: int) -> float:
    began = time.perf_counter()
    for i in range(start, start + count):
        session = f"{prefix}-{i % SESSIONS}"
        prepared = guard.prepare(session, [user(i)], max_tokens=256)
        usage = {"prompt_tokens": prepared.tokens, "completion_tokens": 60}
        guard.complete(session, reply(i), prepared=prepared, usage=usage)
    return (time.perf_counter() - began) / count


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
    for guard in guards.values():
        guard.close()
    base = statistics.median(per_turn["off"])
    return {
        name: {"median_us": statistics.median(v) * 1e6, "ratio": statistics.median(v) / base}
        for name, v in per_turn.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url")
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    if args.redis_url:
        results = run(args.redis_url, args.turns, args.rounds)
    else:
        with private_redis() as server:
            results = run(server.url, args.turns, args.rounds)
    print(f"{'system':<10} {'per turn (us)':>14} {'ratio vs off':>13}")
    for name, row in results.items():
        print(f"{name:<10} {row['median_us']:>14.1f} {row['ratio']:>13.3f}")


if __name__ == "__main__":
    main()
