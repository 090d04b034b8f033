"""bench_turn's report: targets (issue 16) and the printed tables."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

TARGET_WARM = 1.5  # p50 / minimal floor p50, window cache warm
TARGET_COLD = 2.0  # p50 / minimal floor p50, window cache cold
TARGET_SERVER = 3.0  # Redis server time per turn / the minimal floor's
TARGET_SCALING = 1.2  # p50 at the largest H / p50 at the smallest

# ctxguard-one*: commit="with_reply" (one script call per warm turn), judged as their twins
WARM = ("ctxguard", "ctxguard-one", "ctxguard-with-reply", "ctxguard-async", "ctxguard-one-async")
COLD = ("ctxguard-cold", "ctxguard-one-cold", "ctxguard-async-cold")
CTXGUARD_SYSTEMS = (
    "ctxguard",
    "ctxguard-one",
    "ctxguard-cold",
    "ctxguard-one-cold",
    "ctxguard-with-reply",
    "ctxguard-async",
    "ctxguard-one-async",
    "ctxguard-async-cold",
)
ASYNC_SYSTEMS = (
    "floor-min-async",
    "floor-async",
    "ctxguard-async",
    "ctxguard-one-async",
    "ctxguard-async-cold",
)
FLOORS = ("floor-min", "floor-min-async", "floor", "floor-async")
# issue 15: not run by default
OBSERVED = ("ctxguard-observed", "ctxguard-observed-all", "ctxguard-observed-inline")
SYSTEMS = (*FLOORS, *CTXGUARD_SYSTEMS, "ctxguard-prefix", *OBSERVED, "langchain", "llamaindex")
# the rows whose server time is also measured in blocks of turns (_turn/blocks.py)
BLOCK_SYSTEMS = (*FLOORS[:2], *CTXGUARD_SYSTEMS)
# what each row is divided by, first one that ran
BASES_SYNC = ("floor-min", "floor")
BASES_ASYNC = ("floor-min-async", "floor-min", "floor-async", "floor")


def baseline(name: str, size: int, ran: set[tuple[str, int]]) -> str | None:
    """The floor a row is divided by: the minimal floor of its I/O model when it ran."""
    for base in BASES_ASYNC if name in ASYNC_SYSTEMS else BASES_SYNC:
        if (base, size) in ran:
            return base
    return None


def evaluate(report: dict[str, Any]) -> dict[str, Any]:
    """Targets (PASS/MISS) for the ctxguard rows; other ratios as information."""
    p50 = {(r["system"], r["size"]): r["p50_ms"] for r in report["results"]}
    cost = {tuple(k.split("@")): v for k, v in report["costs"].items()}
    server = {(n, int(s)): c["server_us_per_turn"] for (n, s), c in cost.items()}
    blocks: dict[tuple[str, int], float] = {}
    for key, block in report.get("server_blocks", {}).items():
        name, size = key.split("@")
        blocks[(name, int(size))] = block["median"]
    sizes = sorted({r["size"] for r in report["results"]})
    ran = set(p50)
    targets: list[dict[str, Any]] = []
    info: list[dict[str, Any]] = []

    def line(what: str, value: float, bound: float | None) -> None:
        if bound is None:
            info.append({"what": what, "value": value})
        else:
            targets.append({"target": f"{what} <= {bound}", "value": value, "pass": value <= bound})

    for name in CTXGUARD_SYSTEMS:
        bound = TARGET_WARM if name in WARM else TARGET_COLD
        for size in sizes:
            base = baseline(name, size, ran)
            if base is None or (name, size) not in p50:
                continue
            judged = base.startswith("floor-min")
            line(
                f"{name} p50 / {base} p50 at {size:,}",
                p50[(name, size)] / p50[(base, size)],
                bound if judged else None,
            )
            if (name, size) in server and server.get((base, size)):
                line(
                    f"{name} server time / {base}'s at {size:,}",
                    server[(name, size)] / server[(base, size)],
                    TARGET_SERVER if judged else None,
                )
            if (name, size) in blocks and blocks.get((base, size)):
                line(
                    f"{name} server time in blocks / {base}'s at {size:,}",
                    blocks[(name, size)] / blocks[(base, size)],
                    TARGET_SERVER if judged else None,
                )
        lo, hi = min(sizes), max(sizes)
        if lo != hi and (name, lo) in p50 and (name, hi) in p50:
            scaling = p50[(name, hi)] / p50[(name, lo)]
            line(
                f"{name} p50 {hi:,} / p50 {lo:,}", scaling, TARGET_SCALING if name in WARM else None
            )
    for size in sizes:  # the floors against each other
        for a, b in (
            ("floor", "floor-min"),
            ("floor-async", "floor-min-async"),
            ("floor-min-async", "floor-min"),
        ):
            if (a, size) in p50 and (b, size) in p50:
                line(f"{a} p50 / {b} p50 at {size:,}", p50[(a, size)] / p50[(b, size)], None)
    report["targets"] = targets
    report["info"] = info
    return report


def _against_base(
    table: dict[str, dict[str, Any]], sizes: list[int], ran: set[tuple[str, int]], value: str
) -> Iterator[tuple[str, int, dict[str, Any], float]]:
    """Each row of ``table`` (keyed ``name@size``) in SYSTEMS order, with its ``value``
    over its base's (nan without one)."""
    for name in SYSTEMS:
        for s in sizes:
            row = table.get(f"{name}@{s}")
            if row is None:
                continue
            base = baseline(name, s, ran)
            b = table.get(f"{base}@{s}") if base else None
            yield name, s, row, row[value] / b[value] if b and b[value] else float("nan")


def render(report: dict[str, Any], output: Path) -> None:
    rows = report["results"]
    sizes = sorted({r["size"] for r in rows})
    by = {(r["system"], r["size"]): r for r in rows}
    ran = set(by)
    p50 = {k: r["p50_ms"] for k, r in by.items()}
    meta = report["meta"]
    lengths = meta["turn_message_lengths"]
    print()
    print(
        f"One turn (append user, prepare under {meta['prompt_budget']:,} prompt tokens with the "
        f"system pinned, append reply) on Redis {meta['redis']}, {meta['machine']}, "
        f"Python {meta['python']}"
    )
    print(
        f"Synthetic messages: p50 {lengths['p50']:.0f} cl100k tokens, "
        f"{lengths['share_chinese']:.0%} Chinese, {lengths['share_code']:.0%} code"
    )
    header = f"{'system':<20}" + "".join(f"{f'H={s:,}':>34}" for s in sizes)
    print()
    print(header)
    sub = f"{'p50 ms':>9}{'p99 ms':>9}{'x base':>11}{'n':>5}"
    print(f"{'':<20}" + sub * len(sizes))
    print("-" * len(header))
    for name in SYSTEMS:
        cells = []
        for s in sizes:
            r = by.get((name, s))
            if r is None:
                cells.append(f"{'not run':>34}")
                continue
            base = baseline(name, s, ran)
            ratio = r["p50_ms"] / p50[(base, s)] if base else float("nan")
            cells.append(
                f"{_ms(r['p50_ms']):>9}{_ms(r['p99_ms']):>9}{ratio:>10.2f}x{r['turns']:>5}"
            )
        if any(c.strip() != "not run" for c in cells):
            print(f"{name:<20}" + "".join(cells))
    print(
        "x base: p50 / the p50 of the minimal floor of the same I/O model at the same H "
        "(sync rows / floor-min, async rows / floor-min-async)"
    )
    print()
    if any(n == "llamaindex" for n, _ in ran):
        print(f"note: {meta['llamaindex_sizes_note']}")
    for name, why in meta["skipped"].items():
        print(f"note: {name} skipped: {why}")
    print()
    print("Redis cost per timed turn (INFO commandstats deltas around every turn; round trips")
    print("= packets sent; commands = every call Redis counted, scripts' included; server us =")
    print("usec of the commands the client sent, scripts' work inside them):")
    print(
        f"  {'system@H':<26}{'rt':>5}{'cmds':>7}{'sent':>6}{'server us':>11}{'p50 us':>8}"
        f"{'x base':>8}{'in Lua us':>11}"
    )
    costs = report["costs"]
    for name, s, c, ratio in _against_base(costs, sizes, ran, "server_us_per_turn"):
        print(
            f"  {f'{name}@{s}':<26}{c['round_trips_per_turn']:>5.2f}"
            f"{c['commands_per_turn']:>7.1f}{c['sent_per_turn']:>6.2f}"
            f"{c['server_us_per_turn']:>11.1f}{c['server_us_p50']:>8}{ratio:>7.2f}x"
            f"{c['script_inner_us_per_turn']:>11.1f}"
        )
    blocks = report.get("server_blocks", {})
    if blocks:
        print()
        first = next(iter(blocks.values()))
        print(
            f"Server time per turn in blocks ({first['blocks']} blocks per row, interleaved; "
            "INFO only around each block, not between turns; _turn/blocks.py):"
        )
        print(f"  {'system@H':<26}{'median us':>10}{'min':>8}{'max':>8}{'x base':>8}")
        for name, s, block, ratio in _against_base(blocks, sizes, ran, "median"):
            print(
                f"  {f'{name}@{s}':<26}{block['median']:>10.1f}{block['min']:>8.1f}"
                f"{block['max']:>8.1f}{ratio:>7.2f}x"
            )
    print()
    print("Where the p50 turn goes: client CPU (this thread's user + system time around each")
    print("turn; an observer's background thread not counted), Redis server time (above), and")
    print("the rest (waiting on the other side: scheduling, the loopback stack, the reply):")
    print(
        f"  {'system@H':<26}{'wall p50':>9}{'cpu p50':>9}{'x base':>8}{'server':>8}{'rest':>8}"
        "   (us)"
    )
    for name in SYSTEMS:
        for s in sizes:
            r, c = by.get((name, s)), costs.get(f"{name}@{s}")
            if r is None or c is None or "cpu_p50_us" not in r:
                continue
            base = baseline(name, s, ran)
            b = by.get((base, s)) if base else None
            ratio = r["cpu_p50_us"] / b["cpu_p50_us"] if b and b.get("cpu_p50_us") else float("nan")
            wall, cpu, server = r["p50_ms"] * 1e3, r["cpu_p50_us"], c["server_us_per_turn"]
            print(
                f"  {f'{name}@{s}':<26}{wall:>9.0f}{cpu:>9.0f}{ratio:>7.2f}x{server:>8.0f}"
                f"{wall - cpu - server:>8.0f}"
            )
    print()
    print(f"Commands per turn at H={max(sizes):,} (as Redis counts them):")
    for name in SYSTEMS:
        c = costs.get(f"{name}@{max(sizes)}")
        if c is None:
            continue
        cmds = ", ".join(f"{k} {v:.2f}" for k, v in c["calls_per_turn"].items())
        print(f"  {name:<20} {cmds}")
    print()
    for t in report["targets"]:
        verdict = "PASS" if t["pass"] else "MISS"
        print(f"  [{verdict}] {t['target']}: {t['value']:.2f}x")
    for i in report.get("info", []):
        print(f"  [info] {i['what']}: {i['value']:.2f}x")
    print()
    checks = report["checks"]
    bad = {k: v for k, v in checks.items() if k.startswith("ctxguard") and not v["ok"]}
    total = sum(v["turns"] for k, v in checks.items() if k.startswith("ctxguard"))
    if bad:
        print(f"  [FAIL] ctxguard correctness: {bad}")
    elif total:
        print(
            f"  [OK] correctness: all {total:,} ctxguard requests (incl. warm-up) had "
            "tokens + reserved <= limit, the pinned system message first and the newest user "
            "message last"
        )
    for k, v in checks.items():
        if not k.startswith("ctxguard") and not v["ok"]:
            print(f"  note: {k}: {v}")
    print()
    print(
        f"timed phase {meta['timed_phase_seconds']}s, total {meta['total_seconds']}s; "
        f"JSON: {output}"
    )


def _ms(value: float) -> str:
    if value >= 1000:
        return f"{value / 1000:.2f}s"
    if value >= 100:
        return f"{value:.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"
