"""A simulation (a model, not a measurement of vLLM): many long sessions on one server's
KV cache, with and without pressure-aware budgets.

The server: the KV capacity the calculator gives for Llama-3.1-8B-Instruct on an 80 GiB
GPU (``ModelLimit(...).resolve().details["capacity_tokens"]``), 16-token blocks. Each
tick is one engine step: every running request decodes one token (a new block every
16), a request that needs a block when none is free preempts the newest running
request (recompute: its blocks are freed, it goes back to the front of the queue and
starts over), and waiting requests are admitted first-come-first-served while their
prompt's blocks are free and the tick's prefill budget (16,384 tokens; one longer prompt
may take a whole tick) lasts.

The sessions: N of them, each with a long history (uniform 2k-24k tokens at the
start), alternating a turn (a 150-token user message; a 150-450-token reply) and a
think time (uniform 20-200 ticks). The prompt is the history up to the limit
(32,768 - 512 reserved for output), as the guard's window policy would send it.

``pressure`` runs the same sessions with the real :class:`PressureLimit` level logic
(``update`` with the server's KV usage and queue length at each prepare; defaults:
lower at 0.85 KV or 8 waiting, refuse at 64 waiting or at 0.97 KV with 8 waiting,
margins 0.1 / 4): lowered halves the limit, refused makes the session back off
``BACKOFF`` (50) ticks and try again. ``lower-only`` is the same with refusals off.

Reported: preemptions, delay (ticks from a turn's first attempt, refused tries and
back-off included, to its first admission), prompt tokens sent, turns done, turns sent
with a lowered limit, refusals (each refused try). Run: ``python benchmarks/bench_pressure_sim.py
[--sessions 64,128,256] [--ticks 20000]``.
"""

from __future__ import annotations

import argparse
import bisect
import random
import statistics
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ctxguard import ModelLimit
from ctxguard.observe.pressure import Pressure, PressureLimit

BLOCK = 16
MAX_MODEL_LEN = 32768
RESERVED = 512
PREFILL_BUDGET = 16384
MAX_RUNNING = 256
BACKOFF = 50  # ticks a refused session waits before it tries again


@dataclass
class Request:
    session: int
    prompt: int
    output: int
    arrival: int
    generated: int = 0
    blocks: int = 0
    admitted: bool = False


@dataclass
class Stats:
    preemptions: int = 0
    refusals: int = 0
    lowered: int = 0
    turns: int = 0
    tokens_sent: int = 0
    delays: list[int] = field(default_factory=list)


def capacity_tokens() -> int:
    limit = ModelLimit(
        "meta-llama/Llama-3.1-8B-Instruct", max_model_len=MAX_MODEL_LEN, gpu_memory_gib=80
    ).resolve()
    return int(limit.details["capacity_tokens"])


# the budgets compared: static, the PressureLimit defaults, and lowering without refusals
SYSTEMS: dict[str, dict[str, float] | None] = {
    "static": None,
    "pressure": {},
    "lower-only": {"refuse_at": 2.0, "waiting_refuse": 1e9},
}


def simulate(
    sessions: int, ticks: int, pressure: dict[str, float] | None, capacity: int, seed: int = 7
) -> Stats:
    rng = random.Random(seed)
    total_blocks = capacity // BLOCK
    free = total_blocks
    history = [rng.randint(2000, 24000) for _ in range(sessions)]
    wake = sorted((rng.randint(0, 200), s) for s in range(sessions))
    waiting: deque[Request] = deque()
    running: list[Request] = []
    stats = Stats()
    first_try: list[int | None] = [None] * sessions  # a refused turn's wait counts too
    level = (
        None
        if pressure is None
        else PressureLimit(MAX_MODEL_LEN, "http://127.0.0.1:9/metrics", interval=3600, **pressure)
    )
    for tick in range(ticks):
        # sessions whose think time is over prepare a turn
        while wake and wake[0][0] <= tick:
            _, s = wake.pop(0)
            if first_try[s] is None:
                first_try[s] = tick
            limit = MAX_MODEL_LEN
            if level is not None:
                usage = 1 - free / total_blocks
                state = level.update(Pressure(usage, float(len(waiting)), time.monotonic()))
                if state == "refused":
                    stats.refusals += 1
                    bisect.insort(wake, (tick + BACKOFF, s))
                    continue
                if state == "lowered":
                    stats.lowered += 1
                    limit = int(MAX_MODEL_LEN * level.lowered_fraction)
            history[s] += 150
            prompt = min(history[s], limit - RESERVED)
            stats.tokens_sent += prompt
            arrival, first_try[s] = first_try[s] or tick, None
            waiting.append(Request(s, prompt, rng.randint(150, 450), arrival))
        # decode one token per running request; preempt the newest when out of blocks
        index = 0
        while index < len(running):
            req = running[index]
            if (req.prompt + req.generated) % BLOCK == 0:
                while free == 0 and running[-1] is not req:
                    victim = running.pop()
                    free += victim.blocks
                    victim.blocks, victim.generated = 0, 0
                    waiting.appendleft(victim)
                    stats.preemptions += 1
                if free == 0:  # it is the newest itself: it waits for blocks
                    running.pop(index)
                    free += req.blocks
                    req.blocks, req.generated = 0, 0
                    waiting.appendleft(req)
                    stats.preemptions += 1
                    continue
                free -= 1
                req.blocks += 1
            req.generated += 1
            if req.generated >= req.output:
                running.pop(index)
                free += req.blocks
                history[req.session] += req.output
                stats.turns += 1
                bisect.insort(wake, (tick + rng.randint(20, 200), req.session))
                continue
            index += 1
        # admit waiting requests first-come-first-served
        budget = PREFILL_BUDGET
        while waiting and len(running) < MAX_RUNNING:
            req = waiting[0]
            need = -(-(req.prompt + 1) // BLOCK)
            if need > free or (req.prompt > budget and budget < PREFILL_BUDGET):
                break
            waiting.popleft()
            free -= need
            budget -= req.prompt
            req.blocks = need
            if not req.admitted:
                req.admitted = True
                stats.delays.append(tick - req.arrival)
            running.append(req)
    return stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", default="64,128,256")
    parser.add_argument("--ticks", type=int, default=20000)
    args = parser.parse_args()
    capacity = capacity_tokens()
    print(f"KV capacity: {capacity:,} tokens ({capacity // BLOCK:,} blocks of {BLOCK})")
    header = (
        f"{'sessions':>8} {'budgets':>10} {'preempt':>8} {'delay p50':>9} {'delay p95':>9} "
        f"{'delay p99':>9} "
        f"{'tokens sent':>12} {'turns':>6} {'lowered':>8} {'refused':>8}"
    )
    print(header)
    for n in (int(x) for x in args.sessions.split(",")):
        for name, pressure in SYSTEMS.items():
            st = simulate(n, args.ticks, pressure, capacity)
            delays = sorted(st.delays) or [0]
            p95 = delays[int(0.95 * (len(delays) - 1))]
            p99 = delays[int(0.99 * (len(delays) - 1))]
            print(
                f"{n:>8} {name:>10} {st.preemptions:>8} "
                f"{statistics.median(delays):>9.0f} {p95:>9} {p99:>9} {st.tokens_sent:>12,} "
                f"{st.turns:>6} {st.lowered:>8} {st.refusals:>8}"
            )


if __name__ == "__main__":
    main()
