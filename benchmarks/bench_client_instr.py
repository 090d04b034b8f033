"""Client CPU per turn as instructions (callgrind over the Python client), noise-free.

Each (system, code) pair runs twice under ``valgrind --tool=callgrind``: N0 turns and
N0 + N turns, in fresh processes with ``PYTHONHASHSEED=0``; ``(Ir(N0 + N) - Ir(N0)) / N``
is the instructions one turn costs the client, start-up and imports cancelled out (the
method of benchmarks/README.md, "Client round 2": N0 = 20, N = 200, H = 100). The same
count whatever else the machine runs. ``--code`` names the trees to compare (each put
first on ``PYTHONPATH``; e.g. ``/work/main`` and this worktree), run alternately.

Rows: ``floor-min``, ``floor-min-async`` (issue 16's minimal client, sync and async),
``ctxguard`` (Guard, window cache warm), ``ctxguard-async`` (AsyncGuard, warm),
``ctxguard-one`` / ``ctxguard-one-async`` (the same with ``commit="with_reply"``: one
script call per warm turn), ``ctxguard-cold`` / ``ctxguard-one-cold`` (the window cache
off: every prepare fetches).

Run: ``python benchmarks/bench_client_instr.py [--size 100] [--turns 200] [--code DIR ...]``
(a private redis-server is started; needs valgrind on PATH; a few minutes).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

SYSTEMS = (
    "floor-min",
    "floor-min-async",
    "ctxguard",
    "ctxguard-one",
    "ctxguard-async",
    "ctxguard-one-async",
    "ctxguard-cold",
    "ctxguard-one-cold",
)


def child(system: str, url: str, size: int, turns: int, made: int) -> None:
    """Run ``turns`` turns of ``system`` on one session of ``size`` messages (``made``
    turns' messages generated either way, so that only the turns differ between runs)."""
    from _synthetic import HistoryGenerator
    from _turn.systems import (
        CtxGuardAsync,
        CtxGuardCold,
        CtxGuardOne,
        CtxGuardOneAsync,
        CtxGuardOneCold,
        CtxGuardSync,
        FloorMin,
        FloorMinAsync,
    )
    from _turn.workload import Cl100k, build_size

    tok = Cl100k()
    data = build_size(size, 7, tok)
    prefix = f"ci-{uuid.uuid4().hex[:8]}"
    classes = {
        "floor-min": FloorMin,
        "floor-min-async": FloorMinAsync,
        "ctxguard": CtxGuardSync,
        "ctxguard-async": CtxGuardAsync,
        "ctxguard-one": CtxGuardOne,
        "ctxguard-one-async": CtxGuardOneAsync,
        "ctxguard-cold": CtxGuardCold,
        "ctxguard-one-cold": CtxGuardOneCold,
    }
    cls = classes[system]
    sut = cls(url, prefix, tok) if system.startswith("floor") else cls(url, prefix)
    session = "s1"
    sut.load(data, session)
    gen = HistoryGenerator(11)
    pairs = gen.turns(made)[:turns]
    if sut.is_async:

        async def run() -> None:
            for user, reply in pairs:
                await sut.aturn(session, user, reply)
            await sut.aclose()

        asyncio.run(run())
    else:
        for user, reply in pairs:
            sut.turn(session, user, reply)
    sut.cleanup()


def instructions(code: str, system: str, url: str, size: int, turns: int, made: int) -> int:
    out = tempfile.mkdtemp(prefix="ctxguard-ci-")
    env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": code}
    cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}/cg.out"]
    cmd += [sys.executable, __file__, "--child", system, "--url", url]
    cmd += ["--size", str(size), "--turns", str(turns), "--made", str(made)]
    subprocess.run(cmd, env=env, check=True, capture_output=True)
    text = Path(f"{out}/cg.out").read_text()
    found = re.search(r"^(?:summary|totals): (\d+)", text, re.M)
    if not found:
        raise SystemExit("callgrind wrote no total")
    return int(found[1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--child")
    ap.add_argument("--url")
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--turns", type=int, default=200)
    ap.add_argument("--base", type=int, default=20)
    ap.add_argument("--made", type=int, default=0)
    ap.add_argument("--code", nargs="*", default=[str(HERE.parent)])
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    args = ap.parse_args()
    if args.child:
        child(args.child, args.url, args.size, args.turns, args.made)
        return
    from _turn.server import private_redis

    with private_redis() as server:
        for system in args.systems.split(","):
            for code in args.code:
                if system.startswith("floor") and code != args.code[0]:
                    continue  # the floors run no ctxguard code
                made = args.base + args.turns
                low = instructions(code, system, server.url, args.size, args.base, made)
                high = instructions(code, system, server.url, args.size, made, made)
                per = (high - low) / args.turns
                print(f"{system:16s} {code:24s} {per / 1000:9.1f} k instructions/turn", flush=True)


if __name__ == "__main__":
    main()
