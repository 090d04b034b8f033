"""Client cost of the audit record compaction (issue 16): ``compact_json`` against plain
``encode_audit`` per record, this tree and a baseline tree in the same process.

The records are real: a guard on the in-process store (approx counter) runs a
conversation of ~650 B messages at a 4,096-token window (the window drops: ``dropped``
and ``decisions`` in every request record) and at 32,768 (nothing dropped), and its
trail gives a request record of each, a usage record and a refused record. A request
record is timed as the Redis store writes it: its context split out
(``audit_context.split``). Each timing is the best of ``--repeat`` runs of ``--number``
calls, the trees interleaved record by record, so both see the same load.

Run: ``python benchmarks/bench_audit_compact.py [--baseline /work/main] [--number N]
[--repeat R]`` (``--baseline``: a checkout whose ``ctxguard/stores/audit_compact.py``
is loaded beside this tree's; without it only this tree is timed).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import sys
import timeit
from pathlib import Path
from types import ModuleType
from typing import Any

from ctxguard.errors import CtxGuardError
from ctxguard.guard import Guard
from ctxguard.stores import audit_compact
from ctxguard.stores.audit_context import split
from ctxguard.stores.records import encode_audit, with_rid

RESERVED = 512
WORDS = "the quick brown fox jumps over the lazy dog while the model keeps counting tokens "


def text(chars: int) -> str:
    return (WORDS * (chars // len(WORDS) + 1))[:chars]


def trail(window: int, turns: int) -> list[dict[str, Any]]:
    guard = Guard("memory://", counter="approx", limit=window + RESERVED, max_tokens=RESERVED)
    guard.prepare("s", [{"role": "system", "content": "You are a helpful assistant."}])
    for i in range(turns):
        prepared = guard.prepare("s", [{"role": "user", "content": f"{i} " + text(620)}])
        guard.complete(
            "s",
            {"role": "assistant", "content": text(620)},
            prepared=prepared,
            usage={"prompt_tokens": prepared.tokens, "completion_tokens": 150},
        )
    with contextlib.suppress(CtxGuardError):  # the refused record
        guard.prepare("s", [{"role": "user", "content": text(4 * (window + 4 * RESERVED))}])
    records = guard.store.read_audit("s")
    guard.close()
    return records


def last(records: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    return next(r for r in reversed(records) if r.get("kind") == kind)


def as_written(record: dict[str, Any]) -> dict[str, Any]:
    """The record ``compact_json`` gets from the Redis store (rid placed, context out)."""
    record = dict(with_rid(record))
    record["turn"] = 0 if "turn" in record else record.get("turn")
    if record["turn"] is None:
        del record["turn"]
    parts = split(record)
    return dict(record if parts is None else parts[0])


def load_baseline(root: Path) -> ModuleType:
    path = root / "ctxguard" / "stores" / "audit_compact.py"
    spec = importlib.util.spec_from_file_location("baseline_audit_compact", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def best(func: Any, number: int, repeat: int) -> float:
    return min(timeit.repeat(func, number=number, repeat=repeat)) / number * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, help="a checkout to time beside this tree")
    parser.add_argument("--number", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    small, large = trail(4096, 40), trail(32768, 12)
    records = {
        "request 4k (dropping)": as_written(last(small, "request")),
        "request 32k": as_written(last(large, "request")),
        "refused": as_written(last(small, "refused")),
        "usage": as_written(last(small, "usage")),
    }
    assert "dropped" in records["request 4k (dropping)"]
    assert "dropped" not in records["request 32k"]
    trees: dict[str, ModuleType] = {"branch": audit_compact}
    if args.baseline is not None:
        trees = {"baseline": load_baseline(args.baseline), **trees}
    names = " ".join(f"{t + ' us':>12} {'x plain':>8}" for t in trees)
    print(f"{'record':<24} {'bytes':>6} {'plain us':>9} {names} {'stored B':>8}")
    for name, record in records.items():
        texts = {t: m.compact_json(record) for t, m in trees.items()}
        assert len(set(texts.values())) == 1, f"{name}: the trees store different bytes"
        plain = best(lambda r=record: encode_audit(r), args.number, args.repeat)
        cells = []
        for module in trees.values():
            took = best(lambda r=record, m=module: m.compact_json(r), args.number, args.repeat)
            cells.append(f"{took:>12.2f} {took / plain:>8.2f}")
        stored = len(texts["branch"].encode())
        size = len(encode_audit(record).encode())
        print(f"{name:<24} {size:>6} {plain:>9.2f} {' '.join(cells)} {stored:>8}")
    print("expand (the read path), per record:")
    for name, record in records.items():
        stored = audit_compact.json.loads(audit_compact.compact_json(record))
        cells = []
        for tree, module in trees.items():
            took = best(lambda s=stored, m=module: m.expand(s), args.number, args.repeat)
            cells.append(f"{tree} {took:.2f} us")
        print(f"  {name:<22} {', '.join(cells)}")


if __name__ == "__main__":
    sys.exit(main())
