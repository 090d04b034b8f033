"""The Grafana dashboard is what its generator writes, and queries metrics that exist."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

from prometheus_client import CollectorRegistry

from ctxguard.guard import Guard
from ctxguard.observe.metrics import PrometheusObserver

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
    guard = Guard("memory://", limit=400, max_tokens=64, observer=PrometheusObserver(registry))
    guard.prepare("d1", [{"role": "user", "content": "hi"}])
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
    names = {m.name + end for m in registry.collect() for end in suffixes[m.type]}
    stored = json.loads((GRAFANA / "ctxguard-dashboard.json").read_text())
    exprs = [t["expr"] for p in stored["panels"] for t in p["targets"]]
    used = {m for e in exprs for m in re.findall(r"\b((?:ctxguard|vllm)[:_][a-z_:]+)", e)}
    assert {m for m in used if m.startswith("vllm")} == VLLM
    missing = sorted(m for m in used if m.startswith("ctxguard") and m not in names)
    assert not missing, missing
