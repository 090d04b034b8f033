"""Where the client's CPU goes under load: cache and branch model, and the event loop.

bench_load finds AsyncGuard at 0.70-0.74x the async minimal floor's turns per second
under 64 clients, with 1.1-1.45x its user CPU a turn although it runs only ~1.04x its
instructions. This takes that gap apart, one system at a time, both in the same run:

* **model** (``valgrind --tool=cachegrind --cache-sim=yes --branch-sim=yes``): 64
  clients on 64 sessions of 200 messages, 3 untimed turns each, then N0 or N0 + N
  turns each in two fresh processes; ``(X(N0 + N) - X(N0)) / (64 N)`` is one turn's
  instructions, L1 instruction and data misses, last-level misses, branches and
  mispredicted branches (cachegrind's model of this host's caches and a simple
  predictor: counts, the same whatever else the machine runs);
* **real** (no valgrind; A B B A): the same turns timed, with user and system CPU and
  minor page faults a turn (``getrusage``) and the event loop's ``select`` calls a turn
  and events per call.

Sessions are loaded by a plain child process first, so the valgrind runs time turns only.

Run: ``python benchmarks/bench_load_cachesim.py [--turns 8] [--base 2] [--real-turns 40]
[--no-model]``
(a private redis-server is started; needs valgrind on PATH; about 6 minutes here).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import resource
import selectors
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

CLIENTS = SESSIONS = 64
HISTORY = 200
SYSTEMS = ("ctxguard", "floor-min-async")
CHILD = [sys.executable, __file__, "--child"]
ENV = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": str(HERE.parent)}
MODEL = {  # cachegrind's summary line -> our column
    "I   refs": "instr",
    "I1  misses": "I1 miss",
    "D1  misses": "D1 miss",
    "LL misses": "LL miss",
    "Branches": "branches",
    "Mispredicts": "mispredicts",
}


def make(system: str, url: str, prefix: str) -> Any:
    from _turn.systems import CtxGuardAsync, FloorMinAsync
    from _turn.workload import Cl100k

    if system == "ctxguard":
        return CtxGuardAsync(url, prefix)
    return FloorMinAsync(url, prefix, Cl100k())


def load(system: str, url: str, prefix: str) -> None:
    from _turn.workload import Cl100k, build_size

    sut = make(system, url, prefix)
    data = build_size(HISTORY + 1, 11, Cl100k())
    for s in range(SESSIONS):
        sut.load(data, f"s{s}")


def turns(system: str, url: str, prefix: str, count: int) -> dict[str, float]:
    """3 untimed turns per client, then ``count``; CPU and loop counts of the timed part."""
    from _synthetic import HistoryGenerator

    sut = make(system, url, prefix)
    pool = HistoryGenerator(20262).turns(2048)
    seen = {"on": 0, "selects": 0, "events": 0}
    select = selectors.EpollSelector.select

    def counted(self: selectors.EpollSelector, timeout: float | None = None) -> Any:
        ready = select(self, timeout)
        if seen["on"]:
            seen["selects"] += 1
            seen["events"] += len(ready)
        return ready

    selectors.EpollSelector.select = counted  # type: ignore[method-assign,assignment]

    async def client(c: int, first: int, n: int) -> None:
        for t in range(first, first + n):
            user, reply = pool[(c * 7919 + t) % len(pool)]
            await sut.aturn(f"s{(c + t * CLIENTS) % SESSIONS}", user, reply)

    async def run() -> dict[str, float]:
        await asyncio.gather(*(client(c, 0, 3) for c in range(CLIENTS)))
        seen["on"] = 1
        r0, w0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        await asyncio.gather(*(client(c, 3, count) for c in range(CLIENTS)))
        r1, w1 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        await sut.aclose()
        n = CLIENTS * count
        return {
            "turns/s": n / (w1 - w0),
            "user us": (r1.ru_utime - r0.ru_utime) / n * 1e6,
            "sys us": (r1.ru_stime - r0.ru_stime) / n * 1e6,
            "minor faults": (r1.ru_minflt - r0.ru_minflt) / n,
            "selects": seen["selects"] / n,
            "events/select": seen["events"] / max(1, seen["selects"]),
        }

    return asyncio.run(run())


def loaded(system: str, url: str, count: int) -> list[str]:
    """Sessions loaded under a fresh prefix (a plain child); the command that runs turns."""
    prefix = f"lcs-{uuid.uuid4().hex[:8]}"
    subprocess.run([*CHILD, "load", system, url, prefix, "0"], env=ENV, check=True)
    return [*CHILD, "turns", system, url, prefix, str(count)]


def model(system: str, url: str, count: int) -> dict[str, float]:
    cmd = loaded(system, url, count)
    valgrind = ["valgrind", "--tool=cachegrind", "--cache-sim=yes", "--branch-sim=yes"]
    valgrind.append(f"--cachegrind-out-file={os.devnull}")
    done = subprocess.run(valgrind + cmd, env=ENV, check=True, capture_output=True, text=True)
    found = {}
    for name, column in MODEL.items():
        hit = re.search(rf"^==\d+== {re.escape(name)}:\s+([\d,]+)", done.stderr, re.M)
        if hit is None:
            raise SystemExit(f"cachegrind printed no {name!r}")
        found[column] = float(hit[1].replace(",", ""))
    return found


def real(system: str, url: str, count: int) -> dict[str, float]:
    out = subprocess.run(
        loaded(system, url, count), env=ENV, check=True, capture_output=True, text=True
    ).stdout
    return dict(json.loads(out.splitlines()[-1]))


def table(title: str, rows: dict[str, dict[str, float]], digits: int) -> None:
    columns = list(next(iter(rows.values())))
    print(f"\n{title}")
    print(f"{'system':18}" + "".join(f"{c:>15}" for c in columns))
    for name, row in rows.items():
        print(f"{name:18}" + "".join(f"{row[c]:15,.{digits}f}" for c in columns))
    a, b = rows[SYSTEMS[0]], rows[SYSTEMS[1]]
    print(f"{'ratio':18}" + "".join(f"{a[c] / b[c] if b[c] else 0:15.2f}" for c in columns))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", nargs=5)
    ap.add_argument("--turns", type=int, default=8, help="N: timed turns per client")
    ap.add_argument("--base", type=int, default=2, help="N0")
    ap.add_argument("--real-turns", type=int, default=40)
    ap.add_argument("--no-model", action="store_true", help="the real runs only")
    args = ap.parse_args()
    if args.child:
        mode, system, url, prefix, count = args.child
        if mode == "load":
            load(system, url, prefix)
        else:
            result = turns(system, url, prefix, int(count))
            print(json.dumps(result))
        return
    from _turn.server import private_redis

    with private_redis() as server:
        # valgrind slows the clients ~50x: connects and replies must not time out
        url = f"{server.url}?socket_connect_timeout=300&socket_timeout=300"
        per_turn: dict[str, dict[str, float]] = {}
        for system in () if args.no_model else SYSTEMS:
            low = model(system, url, args.base)
            high = model(system, url, args.base + args.turns)
            n = CLIENTS * args.turns
            per_turn[system] = {k: (high[k] - low[k]) / n for k in low}
            print(f"  model {system}: {per_turn[system]['instr'] / 1000:,.1f} k instr/turn")
        if per_turn:
            table("model (cachegrind), per turn", per_turn, 0)
        runs: dict[str, list[dict[str, float]]] = {s: [] for s in SYSTEMS}
        for order in (SYSTEMS, SYSTEMS[::-1]):  # A B B A
            for system in order:
                runs[system].append(real(system, url, args.real_turns))
        mean = {s: {k: sum(r[k] for r in rs) / len(rs) for k in rs[0]} for s, rs in runs.items()}
        table(f"real, per turn (mean of {len(runs[SYSTEMS[0]])} runs each, A B B A)", mean, 2)


if __name__ == "__main__":
    main()
