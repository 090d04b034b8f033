"""Where one turn's cost goes: the commands a turn sends, their server time, the client's profile.

Needs a **private** Redis (it reads MONITOR and, for the duration of the run, sets
``slowlog-log-slower-than 0``, restored after). Sessions hold H messages (bench_turn's
synthetic data, its 4,096-token prompt budget, tiktoken cl100k). Prints:

1. every command of one warm turn (ctxguard, window cache hit), one cold turn
   (``window_cache_size=0``) and one minimal-floor turn, in order, from MONITOR
   (commands run by a script show as ``lua``), arguments shortened;
2. per script call, its server time from SLOWLOG (each EVALSHA of a turn apart);
3. INFO commandstats deltas over ``--turns`` warm and cold turns: calls and usec per
   turn of every command (a script's inner commands are also inside its EVALSHA);
4. cProfile of ``--turns`` warm turns on the client, top 25 by tottime.

Run: ``python benchmarks/profile_turn.py --redis-url redis://127.0.0.1:PORT/0
[--size 1000] [--turns 2000]``.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import re
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _synthetic import HistoryGenerator
from _turn.meters import commandstats
from _turn.server import bench_url
from _turn.systems import CtxGuardCold, CtxGuardSync, FloorMin, System
from _turn.workload import Cl100k, build_size

from ctxguard.stores.redis_protocol import load_script

SESSIONS = 8


ARG = re.compile(r'"((?:[^"\\]|\\.)*)"')


def shorten(arg: str, keep: int = 24) -> str:
    """A session key as its suffix (``…:meta``), long values cut, with their length."""
    if arg.startswith("ctxguard-profile-") and ":" in arg:
        return "…:" + arg.rsplit(":", 1)[1]
    return arg if len(arg) <= keep else f"{arg[:keep]}…({len(arg)} chars)"


def monitor_turns(url: str, turns: list[tuple[str, Any]]) -> dict[str, list[str]]:
    """MONITOR lines of each labelled turn (a callable), split by ECHO markers."""
    client = redis.Redis.from_url(url)
    lines: list[str] = []
    ready = threading.Event()

    def listen() -> None:
        with client.monitor() as m:
            ready.set()
            while True:
                raw = m.connection.read_response()
                text = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
                lines.append(text)
                if '"profile-stop"' in text:
                    return

    thread = threading.Thread(target=listen, daemon=True)
    thread.start()
    ready.wait(5)
    time.sleep(0.2)
    for label, fn in turns:
        client.echo(f"profile-mark {label}")
        fn()
    client.echo("profile-stop")
    thread.join(10)
    client.close()
    out: dict[str, list[str]] = {}
    current = None
    for text in lines:
        if '"profile-mark' in text:
            current = text.split('"profile-mark ', 1)[1].rstrip('"')
            out[current] = []
            continue
        if current is None or '"profile-stop"' in text:
            continue
        _, rest = text.split(" ", 1)
        source = "lua" if rest.startswith("[0 lua]") else "client"
        args = ARG.findall(rest)
        if args and args[0].upper() in ("EVALSHA", "EVAL"):
            args = [args[0], args[1][:8], *args[2:]]
        out[current].append(f"{source:6} " + " ".join(shorten(a) for a in args[:9]))
    return out


def slowlog_turns(admin: Any, fn: Any, count: int) -> list[list[tuple[str, int]]]:
    """(command, usec) of each top-level call of ``count`` turns (SLOWLOG)."""
    old = admin.config_get("slowlog-log-slower-than")["slowlog-log-slower-than"]
    old_len = admin.config_get("slowlog-max-len")["slowlog-max-len"]
    admin.config_set("slowlog-max-len", 10000)
    admin.config_set("slowlog-log-slower-than", 0)
    admin.slowlog_reset()
    per_turn = []
    try:
        for _ in range(count):
            admin.slowlog_reset()
            fn()
            entries = admin.slowlog_get(100)
            calls = []
            for e in reversed(entries):
                cmd = e["command"]
                if isinstance(cmd, bytes):
                    cmd = cmd.decode(errors="replace")
                name = cmd.split(" ", 1)[0].lower()
                if name in ("slowlog", "config"):
                    continue
                if name == "evalsha":
                    name = f"evalsha {cmd.split(' ')[1][:8]}"
                calls.append((name, int(e["duration"])))
            per_turn.append(calls)
    finally:
        admin.config_set("slowlog-log-slower-than", old)
        admin.config_set("slowlog-max-len", old_len)
        admin.slowlog_reset()
    return per_turn


def stats_turns(admin: Any, fn: Any, count: int) -> dict[str, tuple[float, float]]:
    before = commandstats(admin)
    for _ in range(count):
        fn()
    after = commandstats(admin)
    out = {}
    for c, (calls, usec) in after.items():
        c0, u0 = before.get(c, (0, 0))
        if calls > c0:
            out[c] = ((calls - c0) / count, (usec - u0) / count)
    return out


def script_floor(admin: Any, keys: list[str], args: list[str], calls: int) -> list[str]:
    """Server usec per call of near-empty scripts: what a script costs before its work."""
    lib = load_script("add_audit").split("-- add_audit:", 1)[0]
    bodies = {
        "RPUSH of a 300-byte element (plain command)": None,
        "EVALSHA 'return 1', no keys, no args": ("return 1", 0),
        "EVALSHA 'return 1', 7 keys + a warm turn's args": ("return 1", 1),
        "EVALSHA _lib.lua + 'return 1', same keys and args": (lib + "\nreturn 1", 1),
    }
    out = []
    scratch = keys[0] + ":scratch"
    for label, body in bodies.items():
        before = commandstats(admin)
        if body is None:
            for _ in range(calls):
                admin.rpush(scratch, "x" * 300)
            name = "rpush"
        else:
            sha = admin.script_load(body[0])
            for _ in range(calls):
                if body[1]:
                    admin.evalsha(sha, len(keys), *keys, *args)
                else:
                    admin.evalsha(sha, 0)
            name = "evalsha"
        after = commandstats(admin)
        usec = (after[name][1] - before.get(name, (0, 0))[1]) / calls
        out.append(f"  {usec:6.1f} us  {label}")
    admin.delete(scratch)
    return out


def step_times(guard: Any, one: Any, turns: int) -> list[str]:
    """Wall time inside the guard's steps over ``turns`` warm turns (timers, no profiler)."""
    core, store = guard.core, guard.store
    spent: dict[str, float] = {}
    patched: list[tuple[Any, str, Any]] = []

    def wrap(obj: Any, attr: str, label: str) -> None:
        orig = getattr(obj, attr)

        def timed(*a: Any, **k: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return orig(*a, **k)
            finally:
                spent[label] = spent.get(label, 0.0) + time.perf_counter() - t0

        setattr(obj, attr, timed)
        patched.append((obj, attr, orig))

    wrap(core.counter, "count_message", "  of which counting (tiktoken, cookbook rule)")
    wrap(core, "encode_new", "encode_new: validate, id, count the 2 new messages")
    wrap(core, "plan", "  of which plan (pinning, admission, window)")
    wrap(core, "finalize", "  of which finalize (exact count, post-checks)")
    wrap(core, "audit_record", "  of which the audit record")
    wrap(core, "speculate", "speculate: plan on the cached window + audit record")
    wrap(store, "commit_if_unchanged", "store: window script (round trip 1)")
    wrap(store, "append_with_audit", "store: append script (round trip 2)")
    t0 = time.perf_counter()
    for _ in range(turns):
        one()
    total = time.perf_counter() - t0
    for obj, attr, orig in patched:
        if attr in vars(obj):
            delattr(obj, attr)
        if getattr(obj, attr) is not orig:
            setattr(obj, attr, orig)
    out = [f"  {total / turns * 1e6:6.0f} us  whole turn (wall)"]
    for label, value in spent.items():
        out.append(f"  {value / turns * 1e6:6.0f} us  {label}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--redis-url",
        default=None,
        help="a Redis to use (default: $CTXGUARD_BENCH_REDIS_URL, else a private one)",
    )
    ap.add_argument("--size", type=int, default=1000)
    ap.add_argument("--turns", type=int, default=2000)
    args = ap.parse_args()
    with bench_url(args.redis_url) as url:
        profile(args, url)


def profile(args: argparse.Namespace, url: str) -> None:
    tok = Cl100k()
    prefix = f"ctxguard-profile-{uuid.uuid4().hex[:8]}"
    data = build_size(args.size, 20261, tok)
    systems: dict[str, System] = {
        "warm": CtxGuardSync(url, f"{prefix}-warm"),
        "cold": CtxGuardCold(url, f"{prefix}-cold"),
        "floor-min": FloorMin(url, prefix, tok),
    }
    sessions = [f"p{i}" for i in range(SESSIONS)]
    for system in systems.values():
        for sid in sessions:
            system.load(data, sid)
    pool = HistoryGenerator(7).turns(512)
    at = {"n": 0}

    def turner(name: str) -> Any:
        system = systems[name]

        def one() -> None:
            n = at["n"]
            at["n"] += 1
            user, reply = pool[n % len(pool)]
            system.turn(sessions[n % SESSIONS], user, reply)

        return one

    for name in systems:  # warm: every session once (fills the guard's window cache)
        for _ in range(2 * SESSIONS):
            turner(name)()
    admin = redis.Redis.from_url(url)

    print(f"H={args.size:,}, {SESSIONS} sessions, 4,096-token prompt budget, tiktoken cl100k\n")
    print("1. Commands of one turn, in order (MONITOR; 'lua' = run inside a script)")
    # one turn per system on the same session index so the warm one is a cache hit
    seen = monitor_turns(url, [(name, turner(name)) for name in systems])
    for name, cmds in seen.items():
        print(f"\n  {name} turn: {len(cmds)} commands")
        for line in cmds:
            print(f"    {line}")

    print("\n2. Server time per top-level call (SLOWLOG, usec; median of 50 turns)")
    for name in systems:
        per_turn = slowlog_turns(admin, turner(name), 50)
        width = max(len(t) for t in per_turn)
        cols = []
        for i in range(width):
            vals = sorted(t[i][1] for t in per_turn if len(t) > i)
            label = next(t[i][0] for t in per_turn if len(t) > i)
            cols.append(f"{label} {vals[len(vals) // 2]}")
        total = sorted(sum(u for _, u in t) for t in per_turn)
        print(f"  {name:10} total {total[len(total) // 2]:>4} us: " + "; ".join(cols))

    print("\n2b. What a script call costs before it does anything (commandstats, 2,000 calls)")
    warm_guard = systems["warm"].guard  # type: ignore[attr-defined]
    call = warm_guard.store.protocol.window_call(
        sessions[0], 4000, warm_guard.core.write_options, []
    )
    user = pool[0][0]["content"]
    args_like = [str(a) for a in call.args[:6]] + ["x" * 1400, "1000", "1", "id", user, "60", "0"]
    print("\n".join(script_floor(admin, call.keys, args_like, 2000)))

    print("\n2c. Client CPU per turn without the profiler (process_time over 300 turns)")
    for name in systems:
        one = turner(name)
        c0 = time.process_time()
        w0 = time.perf_counter()
        for _ in range(300):
            one()
        cpu = (time.process_time() - c0) / 300 * 1e6
        wall = (time.perf_counter() - w0) / 300 * 1e6
        print(f"  {name:10} {cpu:6.0f} us CPU, {wall:6.0f} us wall")

    n_stats = min(args.turns, 500)
    print(f"\n3. INFO commandstats per turn ({n_stats} turns each): calls / usec")
    for name in systems:
        stats = stats_turns(admin, turner(name), n_stats)
        top = ", ".join(
            f"{c} {calls:.2f} / {usec:.1f}" for c, (calls, usec) in sorted(stats.items())
        )
        print(f"  {name:10} {top}")

    print("\n4a. Wall time inside the guard's steps, 2,000 warm turns (timers, no profiler)")
    print("\n".join(step_times(systems["warm"].guard, turner("warm"), 2000)))  # type: ignore[attr-defined]

    print(f"\n4. cProfile of {args.turns:,} warm turns (client), top 25 by tottime")
    warm = turner("warm")
    profiler = cProfile.Profile()
    t0 = time.perf_counter()
    profiler.enable()
    for _ in range(args.turns):
        warm()
    profiler.disable()
    wall = time.perf_counter() - t0
    buf = io.StringIO()
    pstats.Stats(profiler, stream=buf).sort_stats("tottime").print_stats(25)
    print(f"  {wall / args.turns * 1e6:.0f} us per turn under the profiler")
    print("\n".join(buf.getvalue().splitlines()[4:]))
    buf = io.StringIO()
    pstats.Stats(profiler, stream=buf).sort_stats("cumulative").print_stats(30)
    print("  top 30 by cumulative time")
    print("\n".join(buf.getvalue().splitlines()[4:]))

    for system in systems.values():
        system.cleanup()
    admin.close()


if __name__ == "__main__":
    main()
