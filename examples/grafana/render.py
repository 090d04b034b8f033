"""Draws ctxguard-dashboard.json's panels from a test run (not Grafana: no Grafana here).

Runs real guard turns on a private Redis (or ``--redis-url``) with a
``PrometheusObserver``, in front of a fake vLLM whose ``/metrics`` (served over HTTP,
read by a real ``PressureLimit``) follows a load curve: KV usage rising to the
refusal threshold and falling back, a waiting queue, preemptions, prefix-cache hits.
One step of the run stands for 15 s; after each step both registries are sampled.
Then every target of every panel of the dashboard JSON is evaluated over those
samples with ``promql.py`` (the few PromQL forms the dashboard uses, Prometheus's
arithmetic) and drawn in the dashboard's grid as SVG, screenshotted to PNG by
headless Chromium (``scripts/install-chromium.sh``; ``--html-only`` skips it).

Run: ``python examples/grafana/render.py [--out examples/grafana/dashboard.png]``
(needs ``.[metrics]``: prometheus_client; a redis-server on PATH without ``--redis-url``).
"""

from __future__ import annotations

import argparse
import html
import json
import math
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1]))

from promql import Evaluator, Labels, Series, parse  # noqa: E402

DASHBOARD = HERE / "ctxguard-dashboard.json"
STEP = 15.0  # simulated seconds per step
RATE_INTERVAL = 60.0  # what $__rate_interval stands for (4 steps)
COLOURS = ("#73bf69", "#f2cc0c", "#5794f2", "#ff9830", "#f2495c", "#b877d9", "#8ab8ff")


def panels() -> list[dict[str, Any]]:
    return list(json.loads(DASHBOARD.read_text())["panels"])


def parsed_targets() -> list[list[tuple[Any, str]]]:
    """Every panel's targets as (parsed expression, legend format): fails on any unsupported."""
    return [[(parse(t["expr"]), t["legendFormat"]) for t in p["targets"]] for p in panels()]


# -- the run --------------------------------------------------------------------------


def load(step: int, steps: int) -> float:
    """0..1..0: the fake server's load over the run (a peak in the middle)."""
    return math.sin(math.pi * step / max(1, steps - 1)) ** 2


def collect(
    registry: Any, t: float, series: dict[tuple[str, Labels], list[tuple[float, float]]]
) -> None:
    for family in registry.collect():
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue
            key = (sample.name, frozenset(sample.labels.items()))
            series.setdefault(key, []).append((t, float(sample.value)))


def run(redis_url: str, steps: int, seed: int) -> Series:
    from prometheus_client import CollectorRegistry, Counter, Gauge

    from ctxguard import Guard, ServerBusyError, TenantBudgetError
    from ctxguard.errors import BudgetError
    from ctxguard.observe import fan_out
    from ctxguard.observe.metrics import PrometheusObserver, start_http_server
    from ctxguard.observe.pressure import PressureLimit
    from ctxguard.observe.tenant_budget import TenantBudget

    rnd = random.Random(seed)
    ours, vllm = CollectorRegistry(), CollectorRegistry()
    labels = {"engine": "0", "model_name": "llama-3.1-8b"}
    kv = Gauge("vllm:kv_cache_usage_perc", "KV usage", list(labels), registry=vllm)
    waiting = Gauge("vllm:num_requests_waiting", "waiting", list(labels), registry=vllm)
    preempt = Counter("vllm:num_preemptions", "preemptions", list(labels), registry=vllm)
    hits = Counter("vllm:prefix_cache_hits", "prefix hits", list(labels), registry=vllm)
    queries = Counter("vllm:prefix_cache_queries", "prefix queries", list(labels), registry=vllm)
    server, thread = start_http_server(0, registry=vllm)
    metrics_url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
    observer = PrometheusObserver(ours)
    namespace = f"dash{rnd.randrange(16**6):06x}"

    def summarizer(previous: str | None, messages: Sequence[Any]) -> str:
        return f"{len(messages)} earlier messages about the deployment"

    pressure = PressureLimit(8192, metrics_url, interval=0.0, timeout=2.0)
    guard = Guard(
        redis_url,
        limit=pressure,
        max_tokens=512,
        namespace=namespace,
        observer=observer,
        summarizer=summarizer,
        summarize_after=6,
    )
    budget = TenantBudget(
        redis_url,
        tokens=6_000,
        window_seconds=2.0,
        namespace=namespace,
        tenant="trial",
        min_tokens=2048,
    )
    trial = Guard(
        redis_url,
        limit=budget.limit(4096),
        max_tokens=256,
        namespace=namespace,
        tenant="trial",
        observer=fan_out(observer, budget),
    )
    series: dict[tuple[str, Labels], list[tuple[float, float]]] = {}
    words = [
        "the",
        "cluster",
        "rolls",
        "out",
        "a",
        "new",
        "model",
        "and",
        "we",
        "watch",
        "the",
        "queue",
        "and",
        "the",
        "cache",
    ]
    try:
        for step in range(steps):
            level = load(step, steps)
            kv.labels(**labels).set(round(0.3 + 0.69 * level, 3))
            waiting.labels(**labels).set(int(40 * level**4))
            if level > 0.85:
                preempt.labels(**labels).inc(rnd.randint(1, 6))
            queries.labels(**labels).inc(4000)  # other clients of the server: 30 % hits
            hits.labels(**labels).inc(1200)
            for i in range(int(10 + 30 * level)):
                guest = trial if i % 7 == 0 else guard
                session = f"s{rnd.randrange(24)}"
                text = " ".join(rnd.choice(words) for _ in range(rnd.randint(20, 400)))
                if rnd.random() < 0.01:
                    text = "long " * 9000  # refused: over the budget whatever is dropped
                try:
                    prepared = guest.prepare(session, [{"role": "user", "content": text}])
                except (ServerBusyError, TenantBudgetError, BudgetError):
                    continue
                cached = int(prepared.tokens * rnd.uniform(0.4, 0.9))
                queries.labels(**labels).inc(prepared.tokens)
                hits.labels(**labels).inc(cached)
                usage = {
                    "prompt_tokens": prepared.tokens + rnd.choice((0, 0, 0, 1, 2, 3, -1, 7)),
                    "completion_tokens": 120,
                    "prompt_tokens_details": {"cached_tokens": cached},
                }
                answer = " ".join(rnd.choice(words) for _ in range(rnd.randint(30, 200)))
                guest.complete(
                    session,
                    {"role": "assistant", "content": answer},
                    prepared=prepared,
                    usage=usage,
                )
            t = step * STEP
            collect(ours, t, series)
            collect(vllm, t, series)
            time.sleep(0.05)
    finally:
        guard.close()
        trial.close()
        budget.close()
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
    return series


# -- the picture -------------------------------------------------------------------------


def legend(fmt: str, labels: Labels) -> str:
    """Grafana's legend format: ``{{label}}`` replaced by the series' value of that label."""
    values = dict(labels)
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: values.get(m.group(1), ""), fmt).strip()


def show(value: float, unit: str) -> str:
    if unit == "percentunit":
        return f"{100 * value:.0f}%"
    if unit == "reqps":
        return f"{value:.2g} req/s"
    if unit == "s":
        return f"{value * 1000:.3g} ms" if value < 1 else f"{value:.3g} s"
    if abs(value) >= 1000:
        return f"{value / 1000:.3g}k"
    return f"{value:.3g}"


def draw_panel(
    panel: dict[str, Any],
    lines: list[tuple[str, list[tuple[float, float]]]],
    span: tuple[float, float],
) -> str:
    width, height, left, top, bottom = 760, 300, 64, 34, 66
    plot_w, plot_h = width - left - 16, height - top - bottom
    unit = panel["fieldConfig"]["defaults"].get("unit", "short")
    values = [v for _, pts in lines for _, v in pts if math.isfinite(v)]
    t0, t1 = span
    top_value = panel["fieldConfig"]["defaults"].get("max")
    lo = min([0.0, *values]) if values else 0.0
    hi = top_value if top_value is not None else (max(values) if values else 1.0)
    if hi <= lo:
        hi = lo + 1
    hi = hi if top_value is not None else hi * 1.1

    def x(t: float) -> float:
        return left + (t - t0) / (t1 - t0) * plot_w

    def y(v: float) -> float:
        return top + plot_h - (v - lo) / (hi - lo) * plot_h

    out = [
        f'<svg width="{width}" height="{height}" xmlns="http://www.w3.org/2000/svg">',
        f'<rect width="{width}" height="{height}" rx="3" fill="#181b1f" stroke="#2c3235"/>',
        f'<text x="12" y="22" class="title">{html.escape(panel["title"])}</text>',
    ]
    for i in range(5):
        v = lo + (hi - lo) * i / 4
        out.append(
            f'<line x1="{left}" x2="{left + plot_w}" y1="{y(v):.1f}" y2="{y(v):.1f}" class="grid"/>'
        )
        label = show(v, unit)
        out.append(f'<text x="{left - 6}" y="{y(v) + 4:.1f}" class="axis end">{label}</text>')
    for minute in range(0, int((t1 - t0) // 60) + 1, 3):
        tx = x(t0 + 60 * minute)
        out.append(f'<text x="{tx:.1f}" y="{top + plot_h + 16}" class="axis mid">{minute}m</text>')
    if not values:
        out.append(
            f'<text x="{width / 2}" y="{top + plot_h / 2}" class="nodata mid">No data</text>'
        )
    legend_x, ly = 12.0, height - 30
    for i, (name, pts) in enumerate(lines):
        colour = COLOURS[i % len(COLOURS)]
        path, pen = [], "M"
        for t, v in pts:
            if not math.isfinite(v):
                pen = "M"
                continue
            path.append(f"{pen}{x(t):.1f},{y(v):.1f}")
            pen = "L"
        if path:
            out.append(
                f'<path d="{" ".join(path)}" stroke="{colour}" fill="none" stroke-width="1.6"/>'
            )
        if legend_x + 26 + 6.5 * len(name) > width - 8:  # the next legend row
            legend_x, ly = 12.0, ly + 16
        out.append(f'<rect x="{legend_x}" y="{ly - 8}" width="14" height="4" fill="{colour}"/>')
        out.append(
            f'<text x="{legend_x + 18}" y="{ly - 2}" class="legend">{html.escape(name)}</text>'
        )
        legend_x += 26 + 6.5 * len(name)
    out.append("</svg>")
    return "\n".join(out)


def evaluate(series: Series, steps: int) -> list[list[tuple[str, list[tuple[float, float]]]]]:
    """Each panel's lines: one per target and result series, evaluated at every step."""
    evaluator = Evaluator(series, RATE_INTERVAL)
    times = [s * STEP for s in range(steps) if s * STEP >= RATE_INTERVAL]
    drawn = []
    for targets in parsed_targets():
        lines: dict[str, list[tuple[float, float]]] = {}
        for node, fmt in targets:
            for t in times:
                for labels, value in evaluator.at(node, t).items():
                    lines.setdefault(legend(fmt, labels), []).append((t - RATE_INTERVAL, value))
        drawn.append(sorted(lines.items()))
    return drawn


def page(drawn: list[list[tuple[str, list[tuple[float, float]]]]]) -> str:
    times = [t for lines in drawn for _, pts in lines for t, _ in pts] or [0.0]
    span = (min(times), max(max(times), min(times) + 1))  # one time axis for every panel
    cells = []
    for panel, lines in zip(panels(), drawn, strict=True):
        grid = panel["gridPos"]
        cells.append(
            f'<div style="grid-column:{grid["x"] // 12 + 1};grid-row:{grid["y"] // 8 + 1}">'
            f"{draw_panel(panel, lines, span)}</div>"
        )
    title = json.loads(DASHBOARD.read_text())["title"]
    return f"""<!doctype html><html><head><meta charset="utf-8"><style>
body {{ background:#111217; margin:0; padding:12px; font-family:Inter,Helvetica,Arial,sans-serif; }}
h1 {{ color:#ccccdc; font-size:18px; font-weight:500; margin:4px 4px 10px; }}
.note {{ color:#8e8e8e; font-size:12px; margin:0 4px 10px; }}
.grid-wrap {{ display:grid; grid-template-columns:repeat(2, 760px); gap:8px; }}
.title {{ fill:#ccccdc; font-size:14px; font-weight:500; }}
.axis {{ fill:#8e8e8e; font-size:11px; }} .legend {{ fill:#ccccdc; font-size:11px; }}
.grid {{ stroke:#2c3235; stroke-width:1; }} .nodata {{ fill:#8e8e8e; font-size:14px; }}
.end {{ text-anchor:end; }} .mid {{ text-anchor:middle; }}
</style></head><body><h1>{html.escape(title)}</h1>
<div class="note">Drawn by examples/grafana/render.py from this dashboard's queries over
metrics of a test run (real guard turns on Redis, a fake vLLM /metrics on a load curve);
not a Grafana screenshot.</div>
<div class="grid-wrap">{"".join(cells)}</div></body></html>"""


def screenshot(page_html: str, out: Path, rows: int) -> None:
    # what scripts/install-chromium.sh installs first, then the full browsers
    names = ("chromium-headless-shell", "chromium", "chromium-browser")
    chromium = next((found for name in names if (found := shutil.which(name))), None)
    if chromium is None:
        raise SystemExit("chromium not found: run scripts/install-chromium.sh or use --html-only")
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "dashboard.html"
        source.write_text(page_html)
        size = f"{2 * 760 + 8 + 24},{rows * 308 + 80}"
        subprocess.run(
            [
                chromium,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--hide-scrollbars",
                f"--user-data-dir={tmp}/profile",
                f"--screenshot={out}",
                f"--window-size={size}",
                source.as_uri(),
            ],
            check=True,
            capture_output=True,
            timeout=120,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url")
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--seed", type=int, default=15)
    parser.add_argument("--out", type=Path, default=HERE / "dashboard.png")
    parser.add_argument("--html-only", action="store_true")
    args = parser.parse_args()
    parsed_targets()  # fail before the run if a panel cannot be drawn
    if args.redis_url:
        series = run(args.redis_url, args.steps, args.seed)
    else:
        sys.path.insert(0, str(HERE.parents[1] / "benchmarks"))
        from _turn.server import private_redis

        with private_redis() as redis_server:
            series = run(redis_server.url, args.steps, args.seed)
    page_html = page(evaluate(series, args.steps))
    if args.html_only:
        out = args.out.with_suffix(".html")
        out.write_text(page_html)
    else:
        rows = max(p["gridPos"]["y"] // 8 + 1 for p in panels())
        screenshot(page_html, args.out, rows)
        out = args.out
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
