"""The Grafana dashboard is what its generator writes, and queries metrics that exist."""

from __future__ import annotations

import html
import importlib.util
import json
import math
import re
import sys
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from ctxguard.guard import Guard
from ctxguard.observe.metrics import PrometheusObserver
from tests.conftest import private_memory_url

GRAFANA = Path(__file__).resolve().parents[2] / "examples" / "grafana"
VLLM = {
    "vllm:kv_cache_usage_perc",
    "vllm:num_requests_waiting",
    "vllm:num_preemptions_total",
    "vllm:prefix_cache_hits_total",
    "vllm:prefix_cache_queries_total",
}


def generated() -> dict[str, object]:
    spec = importlib.util.spec_from_file_location("make_dashboard", GRAFANA / "make_dashboard.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.dashboard()  # type: ignore[no-any-return]


def test_json_is_the_generators_output() -> None:
    stored = json.loads((GRAFANA / "ctxguard-dashboard.json").read_text())
    assert stored == json.loads(json.dumps(generated()))


def test_every_queried_metric_exists() -> None:
    registry = CollectorRegistry()
    guard = Guard(
        private_memory_url(), limit=400, max_tokens=64, observer=PrometheusObserver(registry)
    )
    guard.prepare("d1", [{"role": "user", "content": "hi"}])
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
    names = {m.name + end for m in registry.collect() for end in suffixes[m.type]}
    stored = json.loads((GRAFANA / "ctxguard-dashboard.json").read_text())
    exprs = [t["expr"] for p in stored["panels"] for t in p["targets"]]
    used = {m for e in exprs for m in re.findall(r"\b((?:ctxguard|vllm)[:_][a-z_:]+)", e)}
    assert {m for m in used if m.startswith("vllm")} == VLLM
    missing = sorted(m for m in used if m.startswith("ctxguard") and m not in names)
    assert not missing, missing


def load_example(name: str) -> Any:
    sys.path.insert(0, str(GRAFANA))
    try:
        spec = importlib.util.spec_from_file_location(f"grafana_{name}", GRAFANA / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up while it runs
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(GRAFANA))


def test_the_picture_draws_every_panel_of_the_dashboard() -> None:
    """render.py (the README's dashboard.png) evaluates and draws every target of every panel."""
    render = load_example("render")
    stored = json.loads((GRAFANA / "ctxguard-dashboard.json").read_text())
    targets = render.parsed_targets()  # raises on any expression it cannot evaluate
    assert [len(t) for t in targets] == [len(p["targets"]) for p in stored["panels"]]
    # samples of a real registry after real turns, plus vLLM-shaped ones, at 4 times
    registry = CollectorRegistry()
    guard = Guard(
        private_memory_url(), limit=400, max_tokens=64, observer=PrometheusObserver(registry)
    )
    series: dict[Any, list[tuple[float, float]]] = {}
    one = frozenset({("engine", "0")})
    for step in range(8):
        prepared = guard.prepare("d2", [{"role": "user", "content": f"question {step}"}])
        guard.complete(
            "d2",
            {"role": "assistant", "content": "an answer"},
            prepared=prepared,
            usage={"prompt_tokens": prepared.tokens + 1, "completion_tokens": 3},
        )
        render.collect(registry, step * render.STEP, series)
        for name in sorted(VLLM):
            series.setdefault((name, one), []).append((step * render.STEP, 0.5 * step))
    drawn = render.evaluate(series, 8)
    assert len(drawn) == len(stored["panels"])
    lines = {
        p["title"]: {name for name, _ in d} for p, d in zip(stored["panels"], drawn, strict=True)
    }
    assert lines["Window tokens"] == {"p50", "p95", "limit"}
    assert lines["Waiting requests, preemptions (vLLM)"] == {"waiting", "preemptions/s"}
    assert lines["Window cache hit ratio"] == {"hits"}
    assert lines["Store operation p99 by operation"] >= {"append_with_audit"}
    page = render.page(drawn)
    for panel in stored["panels"]:
        assert html.escape(panel["title"]) in page


def test_promql_forms_as_prometheus_computes_them() -> None:
    promql = load_example("promql")
    a = frozenset({("op", "a")})
    b = frozenset({("op", "b")})
    series = {
        ("c_total", a): [(0.0, 0.0), (60.0, 120.0)],
        ("c_total", b): [(0.0, 10.0), (60.0, 70.0)],
        ("g", a): [(0.0, 0.25), (60.0, 0.75)],
    }
    ev = promql.Evaluator(series, 60.0)
    at = lambda expr: ev.at(promql.parse(expr), 60.0)  # noqa: E731
    assert at("sum(rate(c_total[$__rate_interval]))") == {frozenset(): 3.0}
    assert at("sum by (op) (rate(c_total[$__rate_interval]))") == {a: 2.0, b: 1.0}
    assert at('sum(rate(c_total{op="b"}[$__rate_interval])) / 2') == {frozenset(): 0.5}
    assert at("max(g)") == {frozenset(): 0.75}
    # Prometheus: rank 0.5*100 = 50 falls in (1, 2] holding 40 of 100 -> 1 + (50-30)/40
    assert promql.bucket_quantile(0.5, [(1.0, 30.0), (2.0, 70.0), (math.inf, 100.0)]) == 1.5
    assert promql.bucket_quantile(0.99, [(1.0, 30.0), (2.0, 70.0), (math.inf, 100.0)]) == 2.0
    with pytest.raises(promql.PromQLError):
        promql.parse("increase(c_total[5m])")
