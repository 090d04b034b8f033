"""What decoding a window's stored records costs a process that has not seen them.

A guard that has the session's window cached decodes nothing; one that has not (a
gateway's other worker, a cache that evicted the session, ``window_cache_size=0``)
decodes every record the fetch returns that its record cache does not hold. Arm
``full`` is ``Message.from_record`` (the ISO expansion, then pydantic's validation: the
decode before session 30); arm ``quick`` is the decode as shipped (``decode_record``
without its cache: a plain message's positional record by ``plain_from_record``,
anything else the full way). Both decode the same fresh ``bytes`` (as hiredis hands
them over, so nothing is hashed or cached between rounds) of windows made by the
turn benchmark's generator: plain turns, and one window with every seventh message a
tool call or result (those are not positional: both arms take the full way).
The arms alternate in shuffled rounds; each figure is the best of its rounds.

Run: ``python benchmarks/bench_decode.py [--rounds 15] [--window 32]`` (seconds).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _synthetic import HistoryGenerator

from ctxguard.messages import Message
from ctxguard.stores.records import decode_record

ARMS: dict[str, Callable[[bytes], Message]] = {
    "full": Message.from_record,
    "quick": decode_record.__wrapped__,  # type: ignore[attr-defined]
}


def windows(size: int, seed: int) -> dict[str, list[bytes]]:
    gen = HistoryGenerator(seed)
    plain = [Message(**m) for pair in gen.turns(size) for m in pair][:size]  # type: ignore[arg-type]
    mixed: list[Message] = []
    for i, m in enumerate(plain):
        if i % 7 == 3:
            call = {"id": f"call_{i}", "type": "function"}
            call["function"] = {"name": "lookup", "arguments": '{"q": "x"}'}  # type: ignore[assignment]
            m = Message(role="assistant", content=None, tool_calls=[call])  # type: ignore[list-item]
        elif i % 7 == 4:
            m = Message(role="tool", content=m.text, tool_call_id=f"call_{i - 1}")
        mixed.append(m)
    return {
        "plain turns": [m.to_record().encode() for m in plain],
        "1 in 7 tool messages": [m.to_record().encode() for m in mixed],
    }


def best_us(decode: Callable[[bytes], Message], records: list[bytes], repeat: int) -> float:
    fresh = [[bytes(bytearray(r)) for r in records] for _ in range(repeat)]
    start = time.perf_counter()
    for batch in fresh:
        for raw in batch:
            decode(raw)
    return (time.perf_counter() - start) / repeat * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--window", type=int, default=32, help="records a cold fetch decodes")
    ap.add_argument("--seed", type=int, default=20261)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    for label, records in windows(args.window, args.seed).items():
        for raw in records:  # the arms agree, record for record
            assert ARMS["quick"](raw) == ARMS["full"](raw)
        best = {arm: float("inf") for arm in ARMS}
        for _ in range(args.rounds):
            order = list(ARMS)
            rng.shuffle(order)
            for arm in order:
                best[arm] = min(best[arm], best_us(ARMS[arm], records, 50))
        full, quick = best["full"], best["quick"]
        print(
            f"{label:22s} {args.window} records: full {full:7.1f} us, quick {quick:7.1f} us "
            f"({quick / full:.2f}x the full decode; {full / args.window:.2f} -> "
            f"{quick / args.window:.2f} us a record)"
        )


if __name__ == "__main__":
    main()
