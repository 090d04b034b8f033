"""What the observer hook costs per turn: ``events.observed()`` with a no-op observer
against the same flows driven bare, no I/O (issue 15).

A turn's two flows as the guard runs them on a cached session: ``prepare`` (resolve the
limit, one ``commit_if_unchanged``, the window cache noted) and ``complete`` (one
``append_with_audit``), answered at once by a driver loop like ``Guard._run``. The
operations' own work is left out, so the difference is the hook alone: the event built,
every store call timed, the operation made current, the observer called. Interleaved
rounds; medians.

Run: ``python benchmarks/bench_hook.py [--turns 20000] [--rounds 9]``; to measure another
checkout's hook the same way, run a copy of this file from outside any checkout with
``PYTHONPATH=<that checkout>`` (the script puts its own checkout first on the path).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ctxguard.guard import events
from ctxguard.guard.flows import ResolveLimit, StoreCall


class Core:
    observer: object = object()  # what the flows check before noting anything


CORE = Core()


def prepare_flow() -> Generator[Any, Any, Any]:
    yield ResolveLimit()
    outcome = yield StoreCall("commit_if_unchanged", ())
    if CORE.observer is not None:
        events.note_cache("hit")
    return outcome


def complete_flow() -> Generator[Any, Any, Any]:
    return (yield StoreCall("append_with_audit", ()))


def drive(flow: Generator[Any, Any, Any]) -> Any:
    """``Guard._run`` without the I/O: every op answered at once."""
    reply: Any = None
    while True:
        try:
            flow.send(reply)
        except StopIteration as stop:
            return stop.value
        reply = 1


def noop(event: events.OperationEvent) -> None:
    pass


def bare_turn() -> None:
    drive(prepare_flow())
    drive(complete_flow())


def observed_turn() -> None:
    drive(events.observed(prepare_flow(), noop, "prepare", "s"))
    drive(events.observed(complete_flow(), noop, "complete", "s", usage=None, estimate=3))


def per_turn_us(turn: Callable[[], None], turns: int) -> float:
    began = time.perf_counter_ns()
    for _ in range(turns):
        turn()
    return (time.perf_counter_ns() - began) / turns / 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    bare: list[float] = []
    observed: list[float] = []
    for _ in range(args.rounds):
        bare.append(per_turn_us(bare_turn, args.turns))
        observed.append(per_turn_us(observed_turn, args.turns))
    hook = [o - b for o, b in zip(observed, bare, strict=True)]
    print(
        f"bare turn {statistics.median(bare):.2f} us, observed {statistics.median(observed):.2f}"
        f" us: the hook {statistics.median(hook):.2f} us per turn"
        f" (rounds {min(hook):.2f}-{max(hook):.2f})"
    )


if __name__ == "__main__":
    main()
