"""Load: N concurrent asyncio clients over M sessions doing full turns.

A turn is ``AsyncGuard.prepare`` followed by ``AsyncGuard.complete`` (one
script: append the reply). With the session's window cached, prepare is one
script (append the user message + the audit record, if the session is
unchanged); otherwise one script appends and fetches the window, and one more
writes the audit record. Client c's t-th turn goes to session (c + t * clients)
mod sessions; clients drift apart, so two of them sometimes meet on one
session, and the one that commits second re-plans on a fetch.
Targets: a single Redis and a Redis Cluster (when a URL is given), in the same
run, each next to ``redis-benchmark``'s figure for the closest stock mix.

Why RPUSH + LRANGE_100: on the server a turn costs about three list appends
(user message and its token count, reply; the audit push) and one range read of
the recent window (up to ~100 records at these sizes). ``redis-benchmark -t
rpush,lrange_100`` with the same client count measures both commands; the
"server ceiling" column is 1 / (3/RPUSH + 1/LRANGE_100), the turns per second
Redis itself could serve if a turn cost exactly that mix and the clients were free.
It is an upper bound: the scripts do more (HSETNX for idempotency, meta
updates) and the guard counts tokens in Python.

Run: ``python benchmarks/bench_load.py [--redis-url URL] [--cluster-url URL]
[--clients 32] [--sessions 64] [--approx] [--quick]``. Each target runs at most
``--seconds`` (default 45 s; 8 s with --quick). Prints a table and writes
``benchmarks/results/load.json``. Keys go under a fresh namespace, deleted after.
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
from pathlib import Path
from typing import Any

import redis
from redis.cluster import ClusterNode, RedisCluster

from ctxguard.guard import AsyncGuard
from ctxguard.stores.urls import parse_store_url

RESULTS = Path(__file__).resolve().parent / "results" / "load.json"
USER = "Could you look at the numbers from yesterday's run and tell me what changed? " * 2
REPLY = "The p99 moved because the window grew; the median stayed flat. " * 3


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def load(
    url: str, counter: str, clients: int, sessions: int, seconds: float
) -> dict[str, Any]:
    namespace = "bench" + uuid.uuid4().hex[:8]
    guard = AsyncGuard(url, namespace=namespace, counter=counter, limit=8192, max_tokens=256)
    for s in range(sessions):
        await guard.append(f"s{s}", [{"role": "system", "content": "You are a careful analyst."}])
    latencies: list[float] = []
    stop_at = time.perf_counter() + seconds

    async def client(c: int) -> None:
        turn = 0
        while time.perf_counter() < stop_at:
            sid = f"s{(c + turn * clients) % sessions}"
            t0 = time.perf_counter()
            req = await guard.prepare(sid, [{"role": "user", "content": f"{turn}: {USER}"}])
            await guard.complete(sid, {"role": "assistant", "content": REPLY}, prepared=req)
            latencies.append(time.perf_counter() - t0)
            turn += 1

    started = time.perf_counter()
    await asyncio.gather(*(client(c) for c in range(clients)))
    elapsed = time.perf_counter() - started
    await guard.aclose()
    purge(url, namespace)
    return {
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
    if "rpush" in found and "lrange_100" in found:
        found["ceiling_turns_per_s"] = round(1 / (3 / found["rpush"] + 1 / found["lrange_100"]), 1)
    return found


def parsed_host(backend_url: str) -> tuple[str, int]:
    client = redis.Redis.from_url(backend_url)
    kw = client.connection_pool.connection_kwargs
    client.close()
    return kw.get("host", "127.0.0.1"), int(kw.get("port", 6379))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--redis-url", default=os.environ.get("CTXGUARD_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
    )
    ap.add_argument("--cluster-url", default=os.environ.get("CTXGUARD_TEST_CLUSTER_URL", ""))
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--sessions", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=None)
    ap.add_argument("--approx", action="store_true", help='counter "approx" instead of tiktoken')
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    seconds = args.seconds or (8.0 if args.quick else 45.0)
    counter = "approx" if args.approx else "tiktoken:cl100k_base"
    requests = 5000 if args.quick else 20000
    targets = [("redis", args.redis_url)] + (
        [("cluster", args.cluster_url)] if args.cluster_url else []
    )
    rows = []
    for name, url in targets:
        result = asyncio.run(load(url, counter, args.clients, args.sessions, seconds))
        result |= {"target": name, "url": parse_store_url(url).redacted}
        result["redis_benchmark"] = redis_benchmark(url, args.clients, requests)
        rows.append(result)
    report = {
        "clients": args.clients,
        "sessions": args.sessions,
        "counter": counter,
        "python": sys.version.split()[0],
        "machine": f"{platform.machine()} x{os.cpu_count()}",
        "rows": rows,
    }
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=2))
    print(f"{args.clients} asyncio clients, {args.sessions} sessions, counter {counter}")
    head = f"{'target':8} {'turns':>7} {'turns/s':>8} {'p50 ms':>7} {'p99 ms':>7} | "
    print(head + f"{'RPUSH/s':>9} {'LRANGE_100/s':>12} {'ceiling turns/s':>15}")
    for r in rows:
        b = r["redis_benchmark"]
        left = f"{r['target']:8} {r['turns']:>7} {r['turns_per_s']:>8} {r['p50_ms']:>7} "
        right = f"{b.get('rpush', 0):>9.0f} {b.get('lrange_100', 0):>12.0f} "
        print(left + f"{r['p99_ms']:>7} | " + right + f"{b.get('ceiling_turns_per_s', 0):>15}")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
