"""Server time per turn measured over blocks of turns, with no INFO between them.

The timed phase reads ``INFO commandstats`` around every turn, which runs between any
two turns a command that walks Redis's whole command table: Redis's caches are colder
for the next turn than under real traffic, and that costs the two systems differently
(a script call more in absolute time, the floor's four plain commands more in ratio).
Here each (system, size) runs ``per_block`` turns back to back between two INFO reads,
the blocks of every row interleaved in a shuffled order, ``blocks`` rounds; a block's
server time is the usec of the commands the client sent (as ``TurnCost``), over its
turns. Reported as the median block per row, beside the per-turn figure.
"""

from __future__ import annotations

import gc
import random
import statistics
from collections.abc import Callable, Sequence
from typing import Any

from _turn.meters import RoundTrips, command_names, commandstats


def block_server_us(
    packets: Sequence[Any],
    before: dict[str, tuple[int, int]],
    after: dict[str, tuple[int, int]],
    turns: int,
) -> float:
    """Usec per turn of the commands these packets sent, between two INFO reads."""
    top = {name for p in packets for name in command_names(p)}
    return sum(usec - before.get(c, (0, 0))[1] for c, (_, usec) in after.items() if c in top) / max(
        1, turns
    )


async def server_in_blocks(
    rows: Sequence[tuple[str, int]],
    run_turn: Callable[[str, int], Any],
    admin: Any,
    meter: RoundTrips,
    rng: random.Random,
    blocks: int,
    per_block: int,
) -> dict[tuple[str, int], dict[str, float]]:
    """Median and spread of the per-turn server time over ``blocks`` blocks per row.

    ``run_turn(name, size)`` runs one turn of that row (an awaitable for async ones).
    """
    found: dict[tuple[str, int], list[float]] = {row: [] for row in rows}
    gc.collect()
    gc.disable()
    try:
        for _ in range(blocks):
            order = list(rows)
            rng.shuffle(order)
            for name, size in order:
                before = commandstats(admin)
                meter.active = True
                for _ in range(per_block):
                    out = run_turn(name, size)
                    if hasattr(out, "__await__"):
                        await out
                meter.active = False
                after = commandstats(admin)
                found[(name, size)].append(block_server_us(meter.take(), before, after, per_block))
                gc.collect()
    finally:
        gc.enable()
        meter.active = False
    return {
        row: {"median": statistics.median(v), "min": min(v), "max": max(v), "blocks": len(v)}
        for row, v in found.items()
        if v
    }
