"""Writes ctxguard-dashboard.json: ctxguard's metrics beside vLLM's own.

Run ``python examples/grafana/make_dashboard.py`` after changing a panel; the JSON
is what Grafana imports (Dashboards > Import), with a Prometheus data source picked
at import time (``${DS_PROMETHEUS}``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

DS = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
RATE = "$__rate_interval"


def target(expr: str, legend: str, ref: str) -> dict[str, Any]:
    return {"datasource": DS, "expr": expr, "legendFormat": legend, "refId": ref}


def panel(
    pid: int,
    title: str,
    exprs: list[tuple[str, str]],
    x: int,
    y: int,
    unit: str = "short",
    description: str = "",
    max_value: float | None = None,
) -> dict[str, Any]:
    defaults: dict[str, Any] = {"unit": unit}
    if max_value is not None:
        defaults.update(min=0, max=max_value)
    return {
        "id": pid,
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": DS,
        "gridPos": {"h": 8, "w": 12, "x": x, "y": y},
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}},
        "targets": [target(e, legend, chr(65 + i)) for i, (e, legend) in enumerate(exprs)],
    }


def q(quantile: float, metric: str, by: str = "") -> str:
    group = f"le{', ' + by if by else ''}"
    return f"histogram_quantile({quantile}, sum by ({group}) (rate({metric}_bucket[{RATE}])))"


PANELS: list[tuple[str, list[tuple[str, str]], str, str, float | None]] = [
    (
        "Requests by outcome and policy",
        [
            (
                f"sum by (outcome, policy) (rate(ctxguard_requests_total[{RATE}]))",
                "{{outcome}} {{policy}}",
            )
        ],
        "reqps",
        "sent: which policy shaped the window (none = everything fit); refused: the error",
        None,
    ),
    (
        "vLLM KV-cache usage and ctxguard limit utilisation",
        [
            ("max(vllm:kv_cache_usage_perc)", "vLLM KV usage"),
            (q(0.95, "ctxguard_limit_utilisation_ratio"), "ctxguard p95 (prompt+output)/limit"),
        ],
        "percentunit",
        "KV usage from vLLM; utilisation of each request's limit from ctxguard",
        1,
    ),
    (
        "Waiting requests, preemptions (vLLM)",
        [
            ("sum(vllm:num_requests_waiting)", "waiting"),
            (f"sum(rate(vllm:num_preemptions_total[{RATE}]))", "preemptions/s"),
        ],
        "short",
        "",
        None,
    ),
    (
        "Pressure-aware budgets",
        [
            (f"sum by (level) (rate(ctxguard_pressure_requests_total[{RATE}]))", "{{level}}"),
            (
                f'sum(rate(ctxguard_requests_total{{policy="ServerBusyError"}}[{RATE}]))',
                "refused (busy)",
            ),
            (
                f'sum(rate(ctxguard_requests_total{{policy="TenantBudgetError"}}[{RATE}]))',
                "refused (tenant budget)",
            ),
        ],
        "reqps",
        "requests whose limit was lowered or refused because of the server's KV pressure",
        None,
    ),
    (
        "Window tokens",
        [
            (q(0.5, "ctxguard_window_tokens"), "p50"),
            (q(0.95, "ctxguard_window_tokens"), "p95"),
            ("max(ctxguard_limit_tokens)", "limit"),
        ],
        "short",
        "prompt tokens per prepared request (the guard's exact count)",
        None,
    ),
    (
        "Messages dropped, tool groups repaired",
        [
            (f"sum(rate(ctxguard_messages_dropped_total[{RATE}]))", "dropped/s"),
            (f"sum(rate(ctxguard_tool_groups_repaired_total[{RATE}]))", "tool repairs/s"),
        ],
        "short",
        "",
        None,
    ),
    (
        "Summaries",
        [
            (f"sum by (outcome) (rate(ctxguard_summaries_total[{RATE}]))", "{{outcome}}"),
            (q(0.95, "ctxguard_summary_duration_seconds"), "p95 seconds"),
        ],
        "short",
        "",
        None,
    ),
    (
        "Estimate vs server prompt tokens (drift)",
        [
            (q(0.05, "ctxguard_estimate_drift_tokens"), "p5"),
            (q(0.5, "ctxguard_estimate_drift_tokens"), "p50"),
            (q(0.95, "ctxguard_estimate_drift_tokens"), "p95"),
        ],
        "short",
        "server prompt_tokens minus the guard's count; 0 = exact",
        None,
    ),
    (
        "Prefix cache (vLLM) and cached prompt tokens (usage)",
        [
            (
                f"sum(rate(vllm:prefix_cache_hits_total[{RATE}])) / "
                f"sum(rate(vllm:prefix_cache_queries_total[{RATE}]))",
                "vLLM prefix hit ratio",
            ),
            (
                f"sum(rate(ctxguard_prefix_cached_tokens_total[{RATE}])) / "
                f"sum(rate(ctxguard_window_tokens_sum[{RATE}]))",
                "cached share of prompts",
            ),
        ],
        "percentunit",
        "",
        1,
    ),
    (
        "Window cache hit ratio",
        [
            (
                f"sum(rate(ctxguard_window_cache_hits_total[{RATE}])) / (sum(rate("
                f"ctxguard_window_cache_hits_total[{RATE}])) + sum(rate("
                f"ctxguard_window_cache_misses_total[{RATE}])))",
                "hits",
            ),
        ],
        "percentunit",
        "prepares answered in one round trip from the guard's cached window",
        1,
    ),
    (
        "Store operation p99 by operation",
        [(q(0.99, "ctxguard_store_operation_duration_seconds", "operation"), "{{operation}}")],
        "s",
        "",
        None,
    ),
    (
        "Store errors by operation, observer events dropped",
        [
            (
                f"sum by (operation, error) (rate(ctxguard_store_errors_total[{RATE}]))",
                "{{operation}} {{error}}",
            ),
            (
                f"sum(rate(ctxguard_observer_events_dropped_total[{RATE}]))",
                "observer events dropped",
            ),
        ],
        "short",
        "per second; dropped: a background observer's queue was full (metrics undercount)",
        None,
    ),
]


def dashboard() -> dict[str, Any]:
    panels = [
        panel(
            i + 1,
            title,
            exprs,
            x=12 * (i % 2),
            y=8 * (i // 2),
            unit=unit,
            description=desc,
            max_value=top,
        )
        for i, (title, exprs, unit, desc, top) in enumerate(PANELS)
    ]
    return {
        "__inputs": [
            {
                "name": "DS_PROMETHEUS",
                "label": "Prometheus",
                "type": "datasource",
                "pluginId": "prometheus",
                "pluginName": "Prometheus",
            }
        ],
        "title": "ctxguard: context budgets and the vLLM KV cache",
        "uid": "ctxguard-overview",
        "tags": ["ctxguard", "vllm", "llm"],
        "timezone": "browser",
        "schemaVersion": 39,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"},
        "panels": panels,
    }


if __name__ == "__main__":
    out = Path(__file__).with_name("ctxguard-dashboard.json")
    out.write_text(json.dumps(dashboard(), indent=2) + "\n")
    print(f"wrote {out}")
