"""Load: concurrent asyncio clients doing full turns, AsyncGuard against the async minimal floor.

A turn is what bench_turn times: append the user message, build the request under a
4,096-token prompt budget with the system message pinned, append the reply. The
systems run on one Redis in the same run, in alternating segments (A B C, then C B A,
...), so drift on the machine hits them alike:

* ``ctxguard``: one :class:`ctxguard.AsyncGuard` shared by every client (window
  cache on: a session this guard wrote last plans locally and commits in one script);
* ``ctxguard-one``: the same with ``commit="with_reply"`` (prepare stores nothing;
  ``complete(prepared=)`` stores the user message, the reply and the record in one
  script call: a warm turn is one round trip);
* ``floor-min-async``: bench_turn's minimal floor on ``redis.asyncio`` (one list
  element ``tokens|role|content`` per message; RPUSH + LRANGE 64 + GET pipelined,
  trim on the client, RPUSH the reply).

Client c's t-th turn goes to session (c + t * clients) mod sessions; with as many
sessions as clients (the default, 64 and 64) each client owns one session. Every
session starts with the system message and ``--history`` synthetic messages
(``_synthetic.py``); turns use synthetic messages too (p50 ~79 cl100k tokens).

Per system: turns per second; p50 / p99 turn time; client CPU per turn (this
process's CPU time over the segments / turns); Redis server time per turn from
INFO commandstats deltas (the usec of the commands the client sends: EVALSHA/EVAL
for ctxguard, which sends nothing else (bench_turn counts it), every command for the
floor; a script's inner commands are inside its EVALSHA's usec); and the Redis
process's CPU per turn (INFO cpu deltas: networking and parsing included). Target
(issue 16): each ctxguard row at least 0.8x the floor's turns per second.

With ``--cluster-url`` ctxguard also runs on a Redis Cluster (no floor there), and
``redis-benchmark`` gives RPUSH and LRANGE_100 rates for scale.

Run: ``python benchmarks/bench_load.py [--redis-url URL] [--cluster-url URL]
[--clients 64] [--sessions 64] [--seconds S] [--rounds R] [--quick]``. Writes
``benchmarks/results/load.json``. Keys go under fresh prefixes, deleted after.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import redis
from redis.cluster import ClusterNode, RedisCluster

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _synthetic import HistoryGenerator
from _turn.meters import commandstats
from _turn.server import bench_url
from _turn.systems import CtxGuardAsync, CtxGuardOneAsync, FloorMinAsync, System
from _turn.workload import Cl100k, build_size

from ctxguard.stores.urls import parse_store_url

RESULTS = Path(__file__).resolve().parent / "results" / "load.json"
TARGET_THROUGHPUT = 0.8
GUARDS = ("ctxguard", "ctxguard-one")  # the rows judged against floor-min-async
SCRIPT_COMMANDS = ("evalsha", "eval", "evalsha_ro", "eval_ro")
Turn = Callable[[str, dict[str, str], dict[str, str]], Awaitable[Any]]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def server_cpu(client: Any) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


async def segment(
    turn: Turn,
    pool: list[tuple[dict[str, str], dict[str, str]]],
    clients: int,
    sessions: int,
    seconds: float,
    admin: Any,
) -> dict[str, Any]:
    """Run ``clients`` concurrent clients for ``seconds``; what it cost."""
    latencies: list[float] = []
    stats0, cpu0 = commandstats(admin), server_cpu(admin)
    proc0 = time.process_time()
    stop_at = time.perf_counter() + seconds

    async def client(c: int) -> None:
        t = 0
        while time.perf_counter() < stop_at:
            sid = f"s{(c + t * clients) % sessions}"
            user, reply = pool[(c * 7919 + t) % len(pool)]
            t0 = time.perf_counter()
            await turn(sid, user, reply)
            latencies.append(time.perf_counter() - t0)
            t += 1

    started = time.perf_counter()
    await asyncio.gather(*(client(c) for c in range(clients)))
    elapsed = time.perf_counter() - started
    proc = time.process_time() - proc0
    stats1, cpu1 = commandstats(admin), server_cpu(admin)
    usec = {c: u - stats0.get(c, (0, 0))[1] for c, (_, u) in stats1.items()}
    calls = sum(n - stats0.get(c, (0, 0))[0] for c, (n, _) in stats1.items())
    scripted = any(usec.get(c, 0) > 0 for c in SCRIPT_COMMANDS)
    top = sum(usec.get(c, 0) for c in SCRIPT_COMMANDS) if scripted else sum(usec.values())
    return {
        "turns": len(latencies),
        "seconds": elapsed,
        "latencies": latencies,
        "client_cpu_s": proc,
        "server_us": top,
        "server_cpu_s": cpu1 - cpu0,
        "commands": calls,
    }


def combine(name: str, parts: list[dict[str, Any]]) -> dict[str, Any]:
    turns = sum(p["turns"] for p in parts)
    seconds = sum(p["seconds"] for p in parts)
    lat = [x for p in parts for x in p["latencies"]]
    n = max(1, turns)
    return {
        "system": name,
        "segments": len(parts),
        "turns": turns,
        "seconds": round(seconds, 2),
        "turns_per_s": round(turns / seconds, 1),
        "p50_ms": round(statistics.median(lat) * 1000, 2),
        "p99_ms": round(percentile(lat, 0.99) * 1000, 2),
        "client_cpu_us_per_turn": round(sum(p["client_cpu_s"] for p in parts) / n * 1e6, 1),
        "server_us_per_turn": round(sum(p["server_us"] for p in parts) / n, 1),
        "server_cpu_us_per_turn": round(sum(p["server_cpu_s"] for p in parts) / n * 1e6, 1),
        "commands_per_turn": round(sum(p["commands"] for p in parts) / n, 1),
    }


async def compare(args: argparse.Namespace, seconds: float) -> list[dict[str, Any]]:
    """ctxguard and the async minimal floor on one Redis, alternating segments."""
    prefix = f"ctxguard-load-{uuid.uuid4().hex[:8]}"
    tok = Cl100k()
    data = build_size(args.history + 1, 11, tok)
    sessions = [f"s{i}" for i in range(args.sessions)]
    systems: dict[str, System] = {
        "ctxguard": CtxGuardAsync(args.redis_url, f"{prefix}-guard"),
        "ctxguard-one": CtxGuardOneAsync(args.redis_url, f"{prefix}-one"),
        "floor-min-async": FloorMinAsync(args.redis_url, prefix, tok),
    }
    for system in systems.values():
        for sid in sessions:
            system.load(data, sid)
    pool = HistoryGenerator(20262).turns(2048)
    admin = redis.Redis.from_url(args.redis_url)
    parts: dict[str, list[dict[str, Any]]] = {name: [] for name in systems}
    # one short untimed pass each: connections, scripts, the guard's window cache
    for system in systems.values():
        await segment(system.aturn, pool, args.clients, args.sessions, 1.0, admin)
    names = list(systems)
    for r in range(args.rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            part = await segment(
                systems[name].aturn, pool, args.clients, args.sessions, seconds, admin
            )
            parts[name].append(part)
            print(f"  round {r + 1} {name:16} {part['turns'] / part['seconds']:8.1f} turns/s")
    for system in systems.values():
        await system.aclose()
        system.cleanup()
    admin.close()
    return [combine(name, p) for name, p in parts.items()]


async def cluster_load(url: str, args: argparse.Namespace, seconds: float) -> dict[str, Any]:
    """ctxguard alone on a Redis Cluster."""
    namespace = "bench" + uuid.uuid4().hex[:8]
    system = CtxGuardAsync(url, namespace)
    tok = Cl100k()
    data = build_size(args.history + 1, 11, tok)
    for s in range(args.sessions):
        system.load(data, f"s{s}")
    pool = HistoryGenerator(20262).turns(2048)
    latencies: list[float] = []
    turns = 0
    stop_at = time.perf_counter() + seconds

    async def client(c: int) -> None:
        nonlocal turns
        t = 0
        while time.perf_counter() < stop_at:
            user, reply = pool[(c * 7919 + t) % len(pool)]
            t0 = time.perf_counter()
            await system.aturn(f"s{(c + t * args.clients) % args.sessions}", user, reply)
            latencies.append(time.perf_counter() - t0)
            t += 1

    started = time.perf_counter()
    await asyncio.gather(*(client(c) for c in range(args.clients)))
    elapsed = time.perf_counter() - started
    await system.aclose()
    purge(url, namespace)
    return {
        "system": "ctxguard (cluster)",
        "turns": len(latencies),
        "seconds": round(elapsed, 2),
        "turns_per_s": round(len(latencies) / elapsed, 1),
        "p50_ms": round(statistics.median(latencies) * 1000, 2),
        "p99_ms": round(percentile(latencies, 0.99) * 1000, 2),
    }


def raw(url: str) -> Any:
    parsed = parse_store_url(url)
    if parsed.hosts:
        return RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in parsed.hosts])
    return redis.Redis.from_url(parsed.backend_url)


def purge(url: str, namespace: str) -> None:
    client = raw(url)
    kw = {"target_nodes": RedisCluster.PRIMARIES} if isinstance(client, RedisCluster) else {}
    for key in list(client.scan_iter(match=f"{namespace}:*", count=1000, **kw)):
        client.delete(key)
    client.close()


def redis_benchmark(url: str, clients: int, requests: int) -> dict[str, float]:
    parsed = parse_store_url(url)
    host, port = parsed.hosts[0] if parsed.hosts else (parsed_host(parsed.backend_url))
    cmd = ["redis-benchmark", "-h", host, "-p", str(port), "-n", str(requests)]
    cmd += ["-c", str(clients), "-q", "-t", "rpush,lrange_100"]
    if parsed.hosts:
        cmd.append("--cluster")
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"error": str(exc)}  # type: ignore[dict-item]
    found: dict[str, float] = {}
    for line in out.replace("\r", "\n").splitlines():
        m = re.match(r"^\s*(RPUSH|LRANGE_100)[^:]*:\s*([\d.]+) requests per second", line)
        if m:
            found[m.group(1).lower()] = float(m.group(2))
    return found


def parsed_host(backend_url: str) -> tuple[str, int]:
    client = redis.Redis.from_url(backend_url)
    kw = client.connection_pool.connection_kwargs
    client.close()
    return kw.get("host", "127.0.0.1"), int(kw.get("port", 6379))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--redis-url",
        default=None,
        help="a Redis to use (default: $CTXGUARD_BENCH_REDIS_URL, else a private one)",
    )
    ap.add_argument("--cluster-url", default="")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--sessions", type=int, default=64)
    ap.add_argument("--history", type=int, default=200, help="messages stored per session")
    ap.add_argument("--seconds", type=float, default=None, help="per segment")
    ap.add_argument("--rounds", type=int, default=None, help="segments per system")
    ap.add_argument("--redis-benchmark", action="store_true", help="also run redis-benchmark")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    with bench_url(args.redis_url) as args.redis_url:
        run(args)


def run(args: argparse.Namespace) -> None:
    seconds = args.seconds or (3.0 if args.quick else 8.0)
    args.rounds = args.rounds or (2 if args.quick else 4)
    rows = asyncio.run(compare(args, seconds))
    by = {r["system"]: r for r in rows}
    floor = by["floor-min-async"]["turns_per_s"]
    ratios = {name: by[name]["turns_per_s"] / floor for name in GUARDS}
    report: dict[str, Any] = {
        "clients": args.clients,
        "sessions": args.sessions,
        "history": args.history,
        "seconds_per_segment": seconds,
        "rounds": args.rounds,
        "python": sys.version.split()[0],
        "machine": f"{platform.machine()} x{os.cpu_count()}",
        "redis_url": parse_store_url(args.redis_url).redacted,
        "rows": rows,
        "throughput_ratio": round(ratios["ctxguard"], 3),
        "target": {"bound": TARGET_THROUGHPUT, "pass": ratios["ctxguard"] >= TARGET_THROUGHPUT},
        "throughput_ratios": {n: round(r, 3) for n, r in ratios.items()},
        "targets": {n: r >= TARGET_THROUGHPUT for n, r in ratios.items()},
    }
    if args.cluster_url:
        report["cluster"] = asyncio.run(cluster_load(args.cluster_url, args, seconds))
    if args.redis_benchmark:
        report["redis_benchmark"] = redis_benchmark(args.redis_url, args.clients, 20000)
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=2))
    print()
    print(
        f"{args.clients} asyncio clients, {args.sessions} sessions of {args.history} messages, "
        f"{args.rounds} x {seconds:g}s per system, alternating"
    )
    print(
        f"{'system':16} {'turns':>7} {'turns/s':>8} {'p50 ms':>7} {'p99 ms':>7} "
        f"{'client CPU us':>14} {'server us':>10} {'redis CPU us':>13} {'cmds':>5}  (per turn)"
    )
    for r in rows:
        print(
            f"{r['system']:16} {r['turns']:>7} {r['turns_per_s']:>8} {r['p50_ms']:>7} "
            f"{r['p99_ms']:>7} {r['client_cpu_us_per_turn']:>14} {r['server_us_per_turn']:>10} "
            f"{r['server_cpu_us_per_turn']:>13} {r['commands_per_turn']:>5}"
        )
    for name, ratio in ratios.items():
        verdict = "PASS" if ratio >= TARGET_THROUGHPUT else "MISS"
        print(
            f"  [{verdict}] {name} turns/s / floor-min-async turns/s >= {TARGET_THROUGHPUT}: "
            f"{ratio:.2f}x"
        )
    f = by["floor-min-async"]
    for name in GUARDS:
        for what, key in (
            ("client CPU per turn", "client_cpu_us_per_turn"),
            ("server time per turn", "server_us_per_turn"),
            ("Redis CPU per turn", "server_cpu_us_per_turn"),
        ):
            if f[key]:
                print(f"  [info] {name} {what} / floor-min-async's: {by[name][key] / f[key]:.2f}x")
    if "cluster" in report:
        c = report["cluster"]
        print(f"cluster: ctxguard {c['turns_per_s']} turns/s, p50 {c['p50_ms']} ms")
    if "redis_benchmark" in report:
        print(f"redis-benchmark (-c {args.clients}): {report['redis_benchmark']}")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
