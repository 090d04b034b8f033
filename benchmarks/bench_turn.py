"""Cost of one chat turn on a real Redis: ctxguard against minimal floors and two peers.

One turn = append the user message, build the request under a 4,096-token prompt
budget with the system message pinned, append the assistant's reply. H messages
are already stored (synthetic, see ``_synthetic.py``). Systems, all on the same
Redis with the same tokenizer (tiktoken cl100k_base, the OpenAI cookbook rule:
3 + role + content tokens per message, 3 to prime the reply):

* ``floor-min`` (issue 16): each message one list element ``tokens|role|content``;
  one pipelined round trip (RPUSH user + LRANGE the newest 64 + GET system), trim
  on the client by the stored counts (a second LRANGE only if 64 do not fill the
  budget), then RPUSH the reply. Every ratio is taken against it;
* ``floor-min-async``: the same on ``redis.asyncio``; the base of the async rows;
* ``floor`` / ``floor-async``: the earlier floor (JSON records decoded on the client);
* ``ctxguard``: :class:`ctxguard.Guard` on ``redis://``, window cache on (default);
* ``ctxguard-prefix``: the same with ``prefix_block_size=16`` (each record carries
  the prefix-cache estimate: one more encode of the window per turn);
* ``ctxguard-cold``: the same with ``window_cache_size=0`` (every prepare fetches);
* ``ctxguard-with-reply``: ``audit_mode="with_reply"``;
* ``ctxguard-async`` / ``ctxguard-async-cold``: :class:`ctxguard.AsyncGuard`, one
  client, sequential turns, cache on / off;
* ``ctxguard-one`` / ``ctxguard-one-cold`` / ``ctxguard-one-async``: ``ctxguard`` /
  ``ctxguard-cold`` / ``ctxguard-async`` with ``commit="with_reply"`` (prepare stores
  nothing; ``complete(prepared=)`` stores the user message, the reply and the record in
  one script call: a warm turn is one round trip), judged as their twins;
* ``langchain`` and ``llamaindex``: the peers (``_turn/peers.py``).

Around every turn the run counts the packets sent (round trips), the commands in
them, and INFO commandstats deltas (server time, every command Redis ran), outside
the timed region; see ``_turn/meters.py``. After the timed phase, each floor-min and
ctxguard row's server time is measured again over blocks of turns with no INFO between
them (``--blocks``, ``--block-turns``; ``_turn/blocks.py``), and judged as well.

Run: ``python benchmarks/bench_turn.py [--redis-url URL] [--sizes 100,1000,10000]
[--turns N] [--quick] [--systems a,b]``. Prints the tables and writes
``benchmarks/results/turn.json``. Keys go under a fresh prefix, deleted at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import platform
import random
import statistics
import sys
import time
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _synthetic import HistoryGenerator, length_summary
from _turn.blocks import server_in_blocks
from _turn.meters import RoundTrips, TurnCost, commandstats
from _turn.peers import LangChain, LlamaIndex
from _turn.report import BLOCK_SYSTEMS, OBSERVED, SYSTEMS, evaluate, render
from _turn.server import bench_url
from _turn.systems import (
    CtxGuardAsync,
    CtxGuardAsyncCold,
    CtxGuardCold,
    CtxGuardObserved,
    CtxGuardObservedAll,
    CtxGuardObservedInline,
    CtxGuardOne,
    CtxGuardOneAsync,
    CtxGuardOneCold,
    CtxGuardPrefix,
    CtxGuardSync,
    CtxGuardWithReply,
    Floor,
    FloorAsync,
    FloorMin,
    FloorMinAsync,
    System,
)
from _turn.workload import (
    LLAMAINDEX_SIZES,
    LLAMAINDEX_WHY,
    PROMPT_BUDGET,
    RESERVED_OUTPUT,
    Check,
    Cl100k,
    SizeData,
    build_size,
    make_plan,
    quantile,
    sessions_needed,
    turns_for,
    warmup_for,
)

RESULTS = Path(__file__).resolve().parent / "results" / "turn.json"


def make_systems(
    wanted: list[str], url: str, prefix: str, tok: Cl100k
) -> tuple[dict[str, System], dict[str, str]]:
    makers: dict[str, Any] = {
        "floor-min": lambda: FloorMin(url, prefix, tok),
        "floor-min-async": lambda: FloorMinAsync(url, prefix, tok),
        "floor": lambda: Floor(url, prefix, tok),
        "floor-async": lambda: FloorAsync(url, prefix, tok),
        "ctxguard": lambda: CtxGuardSync(url, f"{prefix}-sync"),
        "ctxguard-cold": lambda: CtxGuardCold(url, f"{prefix}-cold"),
        "ctxguard-one": lambda: CtxGuardOne(url, f"{prefix}-one"),
        "ctxguard-one-cold": lambda: CtxGuardOneCold(url, f"{prefix}-onecold"),
        "ctxguard-one-async": lambda: CtxGuardOneAsync(url, f"{prefix}-oneasync"),
        "ctxguard-prefix": lambda: CtxGuardPrefix(url, f"{prefix}-prefix"),
        "ctxguard-observed": lambda: CtxGuardObserved(url, f"{prefix}-obs"),
        "ctxguard-observed-all": lambda: CtxGuardObservedAll(url, f"{prefix}-obsall"),
        "ctxguard-observed-inline": lambda: CtxGuardObservedInline(url, f"{prefix}-obsin"),
        "ctxguard-with-reply": lambda: CtxGuardWithReply(url, f"{prefix}-reply"),
        "ctxguard-async": lambda: CtxGuardAsync(url, f"{prefix}-async"),
        "ctxguard-async-cold": lambda: CtxGuardAsyncCold(url, f"{prefix}-acold"),
        "langchain": lambda: LangChain(url, prefix, tok),
        "llamaindex": lambda: LlamaIndex(url, prefix, tok),
    }
    systems: dict[str, System] = {}
    skipped: dict[str, str] = {}
    for name in SYSTEMS:
        if name not in wanted:
            continue
        try:
            systems[name] = makers[name]()
        except ImportError as exc:
            skipped[name] = f"not installed ({exc.name}); pip install the bench extra"
    unknown = set(wanted) - set(SYSTEMS)
    if unknown:
        raise SystemExit(f"unknown systems {sorted(unknown)}; known: {', '.join(SYSTEMS)}")
    return systems, skipped


async def run(args: argparse.Namespace) -> dict[str, Any]:
    sizes = tuple(int(s) for s in args.sizes.split(","))
    plan = make_plan(sizes, args.turns, args.quick)
    prefix = f"ctxguard-bench-{uuid.uuid4().hex[:8]}"
    admin = redis.Redis.from_url(args.redis_url)
    server = admin.info("server")
    tok = Cl100k()
    rng = random.Random(args.seed)
    started = time.perf_counter()
    systems, skipped = make_systems(
        [s for s in args.systems.split(",") if s], args.redis_url, prefix, tok
    )

    # data and pre-load (not timed)
    print(f"redis {server.get('redis_version')} at {_redact(args.redis_url)}; prefix {prefix}")
    datas: dict[int, SizeData] = {}
    pairs_needed = max(plan.turns + plan.warmup, 64)
    turn_pool = HistoryGenerator(args.seed * 7 + 1).turns(min(pairs_needed, 4096))
    dist = length_summary([m for pair in turn_pool for m in pair], tok.text)
    for size in sizes:
        t0 = time.perf_counter()
        data = datas[size] = build_size(size, args.seed, tok)
        for name, system in systems.items():
            if name == "llamaindex" and size not in LLAMAINDEX_SIZES:
                continue
            n = turns_for(plan, name, size) + warmup_for(plan, name, size)
            data.sessions[name] = [f"s{size}-{i}" for i in range(sessions_needed(size, n))]
            for session in data.sessions[name]:
                system.load(data, session)
        print(
            f"  loaded H={size:>6,} for {len(systems)} systems in {time.perf_counter() - t0:.1f}s"
        )

    # the schedule: every (system, size) spread evenly over one timeline, shuffled ties
    tasks: list[tuple[float, str, int, bool]] = []
    for size in sizes:
        for name in systems:
            if name not in datas[size].sessions:
                continue
            warm, timed = warmup_for(plan, name, size), turns_for(plan, name, size)
            for i in range(warm):
                tasks.append((-1 + i / max(1, warm) + rng.random() * 1e-3, name, size, False))
            for i in range(timed):
                tasks.append(((i + rng.random()) / timed, name, size, True))
    tasks.sort()

    samples: dict[tuple[str, int], list[int]] = {}
    cpus: dict[tuple[str, int], list[int]] = {}  # this thread's CPU time (ns) per turn
    checks: dict[tuple[str, int], Check] = {}
    costs: dict[tuple[str, int], TurnCost] = {}
    cursor: dict[tuple[str, int], int] = {}
    pool_at = 0
    meter = RoundTrips()
    meter.install()
    stats = commandstats(admin)
    gc.collect()
    gc.disable()  # collected between turns instead, so pauses do not land in one system
    t_timed = time.perf_counter()
    try:
        for index, (_, name, size, timed) in enumerate(tasks):
            system = systems[name]
            sessions = datas[size].sessions[name]
            key = (name, size)
            k = cursor.get(key, 0)
            cursor[key] = k + 1
            session = sessions[k % len(sessions)]
            user, reply = turn_pool[pool_at % len(turn_pool)]
            pool_at += 1
            meter.active = True
            c0 = time.thread_time_ns()  # (read outside the timed region)
            if system.is_async:
                t0 = time.perf_counter_ns()
                out = await system.aturn(session, user, reply)
                elapsed = time.perf_counter_ns() - t0
            else:
                t0 = time.perf_counter_ns()
                out = system.turn(session, user, reply)
                elapsed = time.perf_counter_ns() - t0
            cpu = time.thread_time_ns() - c0
            meter.active = False
            packets = meter.take()
            out = system.outcome(out)
            after = commandstats(admin)  # between turns, not timed; INFO itself left out
            checks.setdefault(key, Check()).add(out, user)
            if timed:
                samples.setdefault(key, []).append(elapsed)
                cpus.setdefault(key, []).append(cpu)
                costs.setdefault(key, TurnCost()).add(packets, stats, after)
            stats = after
            if index % 50 == 49:
                gc.collect()
    finally:
        gc.enable()
        meter.uninstall()
    timed_seconds = time.perf_counter() - t_timed

    def block_turn(name: str, size: int) -> Any:
        nonlocal pool_at
        sessions = datas[size].sessions[name]
        k = cursor.get((name, size), 0)
        cursor[(name, size)] = k + 1
        user, reply = turn_pool[pool_at % len(turn_pool)]
        pool_at += 1
        system = systems[name]
        session = sessions[k % len(sessions)]
        return (
            system.aturn(session, user, reply)
            if system.is_async
            else system.turn(session, user, reply)
        )

    blocks: dict[tuple[str, int], dict[str, float]] = {}
    if args.blocks > 0:
        rows = [key for key in samples if key[0] in BLOCK_SYSTEMS]
        meter.install()
        try:
            blocks = await server_in_blocks(
                rows, block_turn, admin, meter, rng, args.blocks, args.block_turns
            )
        finally:
            meter.uninstall()

    for system in systems.values():
        if system.is_async:
            await system.aclose()
        system.cleanup()
    admin.close()

    results = []
    for (name, size), values in sorted(
        samples.items(), key=lambda kv: (SYSTEMS.index(kv[0][0]), kv[0][1])
    ):
        ms = [v / 1e6 for v in values]
        results.append(
            {
                "system": name,
                "size": size,
                "turns": len(ms),
                "p50_ms": statistics.median(ms),
                "p99_ms": quantile(ms, 0.99),
                "mean_ms": statistics.fmean(ms),
                "min_ms": min(ms),
                "cpu_p50_us": statistics.median(cpus[(name, size)]) / 1e3,
                "cpu_mean_us": statistics.fmean(cpus[(name, size)]) / 1e3,
            }
        )
    return {
        "meta": {
            "at": datetime.now(UTC).isoformat(timespec="seconds"),
            "python": platform.python_version(),
            "machine": f"{platform.machine()}, {os.cpu_count()} cpus",
            "redis": server.get("redis_version"),
            "redis_url": _redact(args.redis_url),
            "prompt_budget": PROMPT_BUDGET,
            "reserved_output": RESERVED_OUTPUT,
            "ctxguard_limit": PROMPT_BUDGET + RESERVED_OUTPUT,
            "tokenizer": "tiktoken cl100k_base, cookbook rule (3 + role + content per message)",
            "plan": {
                "turns": plan.turns,
                "warmup": plan.warmup,
                "langchain": plan.langchain,
                "llamaindex": plan.llamaindex,
            },
            "quick": args.quick,
            "seed": args.seed,
            "timed_phase_seconds": round(timed_seconds, 1),
            "total_seconds": round(time.perf_counter() - started, 1),
            "skipped": skipped,
            "llamaindex_sizes_note": LLAMAINDEX_WHY,
            "turn_message_lengths": dist.__dict__,
        },
        "results": results,
        "checks": {f"{n}@{s}": {**c.__dict__, "ok": c.ok} for (n, s), c in sorted(checks.items())},
        "server_blocks": {f"{n}@{s}": v for (n, s), v in blocks.items()},
        "costs": {
            f"{n}@{s}": c.summary()
            for (n, s), c in sorted(
                costs.items(), key=lambda kv: (SYSTEMS.index(kv[0][0]), kv[0][1])
            )
        },
    }


def _redact(url: str) -> str:
    if "@" not in url:
        return url
    scheme, rest = url.split("://", 1)
    return f"{scheme}://***@{rest.rsplit('@', 1)[1]}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--redis-url",
        default=None,
        help="a Redis to use (default: $CTXGUARD_BENCH_REDIS_URL, else a private one)",
    )
    parser.add_argument("--sizes", default="100,1000,10000")
    parser.add_argument(
        "--turns", type=int, default=None, help="timed turns per size (ctxguard*, floor*)"
    )
    parser.add_argument("--quick", action="store_true", help="about 2 minutes")
    parser.add_argument("--systems", default=",".join(s for s in SYSTEMS if s not in OBSERVED))
    parser.add_argument("--seed", type=int, default=20261)
    parser.add_argument(
        "--blocks", type=int, default=8, help="rounds of server time in blocks (0: none)"
    )
    parser.add_argument("--block-turns", type=int, default=50, help="turns per block")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    with bench_url(args.redis_url) as args.redis_url:
        report = evaluate(asyncio.run(run(args)))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    render(report, args.output)
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
