"""Redis CPU per turn as instructions (callgrind): ctxguard against the minimal floor, noise-free.

Server time from INFO commandstats is wall time inside Redis: on a shared 2-core
machine another process can stretch it. This run counts the instructions the
Redis process executes instead (valgrind's callgrind; the same count for the same
work, whatever else the machine does). A private ``redis-server`` is started under
callgrind (``hz 1``, so its timers add little), and for each system, alternating
in rounds, the counters are zeroed, N turns run, and the count is dumped.

Rows (sync, H stored messages, bench_turn's data and 4,096-token budget):
``floor-min`` (issue 16's minimal client), ``ctxguard`` (window cache warm: two
script calls a turn), ``ctxguard-cold`` (three), ``ctxguard-one`` / ``ctxguard-one-cold``
(``commit="with_reply"``: one script call a warm turn; a fetch and one call cold), and
what a script call costs before it does anything: ``EVALSHA 'return 1'`` with a warm
turn's keys and arguments, and the same with the helpers a window script carries (both
also with a one-call turn's keys and arguments: two messages and the record). With
``--ttl S``: ``ctxguard-ttl`` and ``ctxguard-ttl-cold``, the same turns with
``ttl_seconds=S`` (every script call ends with the sliding TTL's touch). ``cmds`` is the
commands Redis ran per turn (INFO commandstats: the script calls and every ``redis.call``
inside them).

Run: ``python benchmarks/bench_server_instr.py [--size 1000] [--turns 60] [--rounds 3]
[--ttl 3600] [--port P]`` (about 2-4 minutes; needs valgrind and redis-server on PATH).
"""

from __future__ import annotations

import argparse
import glob
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _synthetic import HistoryGenerator
from _turn.server import private_redis
from _turn.systems import CtxGuardCold, CtxGuardOne, CtxGuardOneCold, CtxGuardSync, FloorMin, System
from _turn.workload import Cl100k, build_size

from ctxguard.stores import redis as redis_store
from ctxguard.stores.redis_protocol import general_script

RESULTS = Path(__file__).resolve().parent / "results" / "server_instr.json"


class Callgrind:
    """Zero and dump the counters of a process running under callgrind."""

    def __init__(self, pid: int, out_dir: str) -> None:
        self.pid, self.out_dir = pid, out_dir

    def zero(self) -> None:
        subprocess.run(["callgrind_control", "-z", str(self.pid)], check=True, capture_output=True)

    def dump(self) -> int:
        before = set(glob.glob(f"{self.out_dir}/cg.out.*"))
        subprocess.run(["callgrind_control", "-d", str(self.pid)], check=True, capture_output=True)
        for _ in range(100):
            new = set(glob.glob(f"{self.out_dir}/cg.out.*")) - before
            if new:
                time.sleep(0.2)  # let callgrind finish writing
                text = Path(new.pop()).read_text()
                found = re.search(r"^(?:summary|totals): (\d+)", text, re.M)
                if found:
                    return int(found[1])
            time.sleep(0.1)
        raise SystemExit("callgrind wrote no dump")


def command_calls(client: redis.Redis) -> int:
    """Commands the server has run (INFO commandstats), INFO itself left out."""
    stats = client.info("commandstats")
    return sum(int(v["calls"]) for k, v in stats.items() if k != "cmdstat_info")


def turner(system: System, pool: list[tuple[str, str]]) -> Callable[[int], None]:
    at = [0]

    def run(n: int) -> None:
        for _ in range(n):
            user, reply = pool[at[0] % len(pool)]
            at[0] += 1
            system.turn(
                "s", {"role": "user", "content": user}, {"role": "assistant", "content": reply}
            )

    return run


def script_calls(
    url: str, system: CtxGuardSync, pool: list[tuple[str, str]], label: str = ""
) -> dict[str, Any]:
    """Two script-call rows: a warm turn's window call (its first script call) with
    'return 1' as its body, and with the helpers of window.lua before 'return 1';
    ``label`` follows each row's name."""
    captured: list[tuple[list[str], list[Any]]] = []
    original = redis_store.RedisStore._evalsha

    def spy(self: Any, script: Any, call: Any) -> Any:
        captured.append((list(call.keys), list(call.args)))
        return original(self, script, call)

    redis_store.RedisStore._evalsha = spy  # type: ignore[method-assign]
    try:
        turner(system, pool)(1)
    finally:
        redis_store.RedisStore._evalsha = original  # type: ignore[method-assign]
    keys, args = captured[0]
    client = redis.Redis.from_url(url)
    window = general_script("window")  # (the common case in front of it left out)
    helpers = window[: window.index("local n = tonumber(ARGV[10])")]
    rows = {}
    for name, body in (
        (f"EVALSHA 'return 1'{label}", "return 1"),
        (f"+ window.lua's helpers{label}", helpers + "return 1"),
    ):
        script = client.register_script(body)
        rows[name] = lambda n, s=script: [s(keys=keys, args=args) for _ in range(n)]
    if label:  # a one-call commit's keys and arguments: what its writes alone cost
        rows[f"the turn's writes alone{label}"] = bare_writes(client, keys, args)
    return rows


# The writes of a one-call turn in this key layout and nothing else: no check of any
# key's type or integer, no idempotency (ids and rids written, never read), no state
# token, no cap, no TTL. (Arguments as fast_window.lua takes them: the audit record at
# 7, the clock at 9, n at 10, then id, record, count, pinned per message; each call's
# ids made new with the list's length.) What a script call costs in this design
# before any check: the floor the checks sit on.
BARE_WRITES = """
local n = tonumber(ARGV[10])
local m = redis.call('HMGET', KEYS[1], 'count', 'tokens', 'ver')
local len = redis.call('LLEN', KEYS[2])
local ids, msgs, toks, added = {}, {}, {}, 0
for i = 0, n - 1 do
  local at = 11 + 4 * i
  ids[2 * i + 1] = ARGV[at] .. ':' .. len
  ids[2 * i + 2] = string.format('%d', len + i)
  msgs[i + 1] = ARGV[at + 1]
  toks[i + 1] = ARGV[at + 2]
  added = added + tonumber(ARGV[at + 2])
end
redis.call('HSET', KEYS[4], unpack(ids))
redis.call('RPUSH', KEYS[2], unpack(msgs))
redis.call('RPUSH', KEYS[3], unpack(toks))
redis.call('RPUSH', KEYS[7], ARGV[7])
redis.call('HSET', KEYS[1], 'count', string.format('%d', len + n),
  'tokens', string.format('%d', tonumber(m[2] or '0') + added),
  'ver', string.format('%d', tonumber(m[3] or '0') + 1), 'stamp', ARGV[9])
redis.call('HSET', KEYS[8], 'r' .. len, '0')
return len + n
"""


def bare_writes(client: redis.Redis, keys: list[str], args: list[Any]) -> Callable[[int], Any]:
    """A row running :data:`BARE_WRITES` on a copy of the session's keys (COPY), so
    that its lists and hashes have the session's sizes and encodings."""
    copies = [f"{key}:bare" for key in keys]
    for key, copy in zip(keys, copies, strict=True):
        client.copy(key, copy, replace=True)
    script = client.register_script(BARE_WRITES)
    return lambda n: [script(keys=copies, args=args) for _ in range(n)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=1000)
    ap.add_argument("--turns", type=int, default=60, help="turns per system per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ttl", type=int, default=0, help="add rows with ttl_seconds=TTL")
    ap.add_argument("--port", type=int, default=None, help="the private server's port")
    args = ap.parse_args()
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("valgrind (with callgrind_control) is not on PATH")
    out_dir = tempfile.mkdtemp(prefix="ctxguard-callgrind-")
    wrapper = ("valgrind", "--tool=callgrind", f"--callgrind-out-file={out_dir}/cg.out")
    tok = Cl100k()
    data = build_size(args.size, 20261, tok)
    pool = [(t[0]["content"], t[1]["content"]) for t in HistoryGenerator(7).turns(256)]
    with private_redis("--hz", "1", wrapper=wrapper, port=args.port) as server:
        prefix = f"ctxguard-instr-{uuid.uuid4().hex[:8]}"
        systems: dict[str, System] = {
            "floor-min": FloorMin(server.url, prefix, tok),
            "ctxguard": CtxGuardSync(server.url, f"{prefix}-warm"),
            "ctxguard-cold": CtxGuardCold(server.url, f"{prefix}-cold"),
            "ctxguard-one": CtxGuardOne(server.url, f"{prefix}-one"),
            "ctxguard-one-cold": CtxGuardOneCold(server.url, f"{prefix}-onecold"),
        }
        if args.ttl:
            systems["ctxguard-ttl"] = CtxGuardSync(
                server.url, f"{prefix}-ttl", ttl_seconds=args.ttl
            )
            systems["ctxguard-ttl-cold"] = CtxGuardSync(
                server.url, f"{prefix}-ttl-cold", window_cache_size=0, ttl_seconds=args.ttl
            )
        runs: dict[str, Callable[[int], Any]] = {}
        for name, system in systems.items():
            system.load(data, "s")
            runs[name] = turner(system, pool)
            runs[name](3)  # warm-up: scripts loaded, the window cached
        warm, one = systems["ctxguard"], systems["ctxguard-one"]
        assert isinstance(warm, CtxGuardSync) and isinstance(one, CtxGuardSync)
        runs.update(script_calls(server.url, warm, pool))
        runs.update(script_calls(server.url, one, pool, " (one-call args)"))
        meter = Callgrind(server.pid, out_dir)
        stats = redis.Redis.from_url(server.url)
        counts: dict[str, list[float]] = {name: [] for name in runs}
        commands: dict[str, list[float]] = {name: [] for name in runs}
        for _ in range(args.rounds):
            for name, run in runs.items():
                before = command_calls(stats)
                meter.zero()
                run(args.turns)
                counts[name].append(meter.dump() / args.turns)
                commands[name].append((command_calls(stats) - before) / args.turns)
        for system in systems.values():
            system.cleanup()
    shutil.rmtree(out_dir, ignore_errors=True)
    base = statistics.median(counts["floor-min"])
    rows = [
        {
            "row": name,
            "instructions_per_call": round(statistics.median(v)),
            "spread": round(max(v) - min(v)),
            "x_floor_min_turn": round(statistics.median(v) / base, 2),
            "commands_per_call": round(statistics.median(commands[name]), 1),
        }
        for name, v in counts.items()
    ]
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps({"size": args.size, "turns": args.turns, "rows": rows}, indent=2))
    print(
        f"Redis instructions per turn (callgrind), H={args.size:,}, median of {args.rounds} rounds"
    )
    print(f"{'row':40s} {'k instr':>9s} {'spread':>8s} {'x floor-min turn':>17s} {'cmds':>6s}")
    for r in rows:
        print(
            f"{r['row']:40s} {r['instructions_per_call'] / 1000:9.1f} {r['spread'] / 1000:8.1f} "
            f"{r['x_floor_min_turn']:17.2f} {r['commands_per_call']:6.1f}"
        )


if __name__ == "__main__":
    main()
