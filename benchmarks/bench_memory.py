"""Memory: Redis bytes per stored message (MEMORY USAGE) against the message's JSON size.

Two measurements.

**Sessions with their audit trail** (issue 16): a session holds a pinned system
message and T turns (user message, reply) written through ``Guard.prepare`` /
``Guard.complete`` (tiktoken cl100k, audit_mode "sync", so every request leaves an
audit record; the trail keeps the newest 1,000), at a 4,096- and a 32,768-token
prompt window, with long (~650 B of JSON) and short (~108 B) messages. Beside it
the minimal floor of bench_turn (one list element ``tokens|role|content`` per
message, the system message under its own key) stores the same messages. Reported:
MEMORY USAGE (SAMPLES 0) summed over the session's keys (audit included) divided
by the stored messages, and that over the message's JSON size, where the JSON is
what the caller handed in: ``{"role": ..., "content": ...}`` (compact separators).
Target: at most 3x.

**Store only, by size class**: for each size class, K messages are appended to one
session through the store (with token counts, as the guard stores them). Reported per message:

* ``json``: the stored record's size (what ``Message.to_record`` produces);
* ``all keys / K``: MEMORY USAGE (SAMPLES 0, exact) summed over the session's
  keys (records, token counts, id index, meta, pins), divided by K;
* ``marginal``: the growth from K/2 to K messages divided by K/2, i.e. the cost
  of one more message without the session's fixed overhead;
* ``overhead``: marginal / json.

Run: ``python benchmarks/bench_memory.py [--redis-url URL] [--count K] [--turns T]
[--quick]``. Bounded to well under a minute; writes ``benchmarks/results/memory.json``.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import uuid
from pathlib import Path
from typing import Any

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _synthetic import SYSTEM_PROMPT
from _turn.server import bench_url
from _turn.systems import FloorMin
from _turn.workload import Cl100k, SizeData

from ctxguard.guard import Guard
from ctxguard.messages import Message
from ctxguard.stores import NewMessage, WriteOptions, open_store
from ctxguard.stores.keys import KeySpace

RESULTS = Path(__file__).resolve().parent / "results" / "memory.json"
WORDS = "the quick brown fox jumps over the lazy dog while the model keeps counting tokens "


def text(chars: int) -> str:
    return (WORDS * (chars // len(WORDS) + 1))[:chars]


def tool_call(i: int) -> Message:
    args = json.dumps({"query": text(120), "limit": 10, "filters": {"year": 2026}})
    call = {
        "id": f"call_{i}",
        "type": "function",
        "function": {"name": "search", "arguments": args},
    }
    return Message(role="assistant", content=None, tool_calls=[call])


CLASSES: dict[str, Any] = {
    "tiny (20 chars)": lambda i: Message(role="user", content=text(20)),
    "short (200)": lambda i: Message(role="user", content=text(200)),
    "medium (2,000)": lambda i: Message(role="assistant", content=text(2000)),
    "large (20,000)": lambda i: Message(role="tool", content=text(20000), tool_call_id=f"c{i}"),
    "tool call": tool_call,
}


def usage(client: redis.Redis, keys: list[str]) -> int:
    return sum(int(client.memory_usage(k, samples=0) or 0) for k in keys)


def measure(url: str, count: int) -> list[dict[str, Any]]:
    client = redis.Redis.from_url(url)
    rows = []
    for name, make in CLASSES.items():
        namespace = "mem" + uuid.uuid4().hex[:8]
        store = open_store(url, namespace=namespace)
        keys = KeySpace(namespace).session_keys("s")
        messages = [make(i) for i in range(count)]
        half = count // 2
        opts = WriteOptions(counter="tiktoken:cl100k_base")
        for m in messages[:half]:
            store.append("s", [NewMessage(m, 50)], opts)
        at_half = usage(client, keys)
        for m in messages[half:]:
            store.append("s", [NewMessage(m, 50)], opts)
        total = usage(client, keys)
        json_avg = sum(len(m.to_record().encode()) for m in messages) / count
        marginal = (total - at_half) / (count - half)
        rows.append(
            {
                "class": name,
                "messages": count,
                "json_bytes": round(json_avg),
                "redis_bytes_per_message": round(total / count),
                "marginal_bytes_per_message": round(marginal),
                "overhead": round(marginal / json_avg, 2),
            }
        )
        store.delete("s")
        store.close()
    client.close()
    return rows


# -- sessions with their audit trail (issue 16) ------------------------------------

WINDOWS = (4096, 32768)  # prompt tokens per request
LENGTHS = {"long": 620, "short": 80}  # content characters: ~650 B and ~108 B of JSON
RESERVED = 512
TARGET = 3.0


def chat_text(rng: random.Random, chars: int) -> str:
    words = [*WORDS.split(), "order", "refund", "delivery", "invoice", "2026", "#4411"]
    out: list[str] = []
    size = 0
    while size < chars:
        word = rng.choice(words)
        out.append(word)
        size += len(word) + 1
    return " ".join(out)[:chars]


def conversation(turns: int, chars: int, seed: int) -> list[dict[str, str]]:
    rng = random.Random(seed)
    out = []
    for i in range(2 * turns):
        out.append(
            {"role": "user" if i % 2 == 0 else "assistant", "content": chat_text(rng, chars)}
        )
    return out


def json_size(message: dict[str, str]) -> int:
    return len(json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode())


def by_key(client: redis.Redis, keys: list[str]) -> dict[str, int]:
    return {k.rsplit(":", 1)[1]: int(client.memory_usage(k, samples=0) or 0) for k in keys}


def session_rows(url: str, turns: int, tok: Cl100k) -> list[dict[str, Any]]:
    client = redis.Redis.from_url(url)
    rows: list[dict[str, Any]] = []
    system = {"role": "system", "content": SYSTEM_PROMPT}
    for length, chars in LENGTHS.items():
        chat = conversation(turns, chars, seed=len(length))
        messages = [system, *chat]
        avg_json = sum(json_size(m) for m in messages) / len(messages)
        for window in WINDOWS:
            namespace = "mem" + uuid.uuid4().hex[:8]
            guard = Guard(
                url,
                namespace=namespace,
                counter="tiktoken:cl100k_base",
                limit=window + RESERVED,
                max_tokens=RESERVED,
            )
            guard.append("s", [system])
            sent = 0
            for i in range(0, len(chat), 2):
                req = guard.prepare("s", [chat[i]], max_tokens=RESERVED)
                sent += len(req.messages)
                guard.complete("s", chat[i + 1], prepared=req)
            parts = by_key(client, KeySpace(namespace).session_keys("s"))
            audits = int(client.llen(KeySpace(namespace).session_keys("s")[6]))
            rows.append(
                _row("ctxguard", length, window, len(messages), avg_json, parts)
                | {"audit_records": audits, "window_messages_avg": round(sent / turns, 1)}
            )
            guard.store.delete("s")
            guard.close()
        # the minimal floor stores the same messages; no window, no audit
        floor = FloorMin(url, "mem" + uuid.uuid4().hex[:8], tok)
        counts = [tok.message(m["role"], m["content"]) for m in messages]
        floor.load(SizeData(len(messages), messages, counts, []), "s")
        msgs, sys_key = floor.keys("s")
        parts = {"msgs": int(client.memory_usage(msgs, samples=0) or 0)}
        parts["system"] = int(client.memory_usage(sys_key, samples=0) or 0)
        for window in WINDOWS:
            rows.append(_row("floor-min", length, window, len(messages), avg_json, parts))
        floor.cleanup()
    client.close()
    return rows


def _row(
    system: str, length: str, window: int, count: int, avg_json: float, parts: dict[str, int]
) -> dict[str, Any]:
    total = sum(parts.values())
    return {
        "system": system,
        "messages": length,
        "window": window,
        "stored": count,
        "json_bytes": round(avg_json),
        "redis_bytes_per_message": round(total / count),
        "x_json": round(total / count / avg_json, 2),
        "pass": total / count / avg_json <= TARGET,
        "bytes_per_message_by_key": {k: round(v / count) for k, v in parts.items()},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--redis-url",
        default=None,
        help="a Redis to use (default: $CTXGUARD_BENCH_REDIS_URL, else a private one)",
    )
    ap.add_argument("--count", type=int, default=None)
    ap.add_argument("--turns", type=int, default=None, help="turns per session (default 1000)")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    with bench_url(args.redis_url) as args.redis_url:
        run(args)


def run(args: argparse.Namespace) -> None:
    count = args.count or (100 if args.quick else 1000)
    turns = args.turns or (200 if args.quick else 1000)
    sessions = session_rows(args.redis_url, turns, Cl100k())
    rows = measure(args.redis_url, count)
    client = redis.Redis.from_url(args.redis_url)
    info = client.info("server")
    config = client.config_get("list-max-listpack-size")
    client.close()
    report = {
        "redis": info.get("redis_version"),
        "config": config,
        "sessions": sessions,
        "rows": rows,
    }
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=2))
    print(
        f"Redis {report['redis']}: one session of {turns:,} turns (+ the system message), "
        f"per stored message, audit trail included (target <= {TARGET}x JSON)"
    )
    print(
        f"{'system':10} {'msgs':6} {'window':>7} {'json B':>7} {'redis B':>8} {'x json':>7}  "
        "by key (B per message)"
    )
    for r in sessions:
        keys = ", ".join(f"{k} {v}" for k, v in r["bytes_per_message_by_key"].items() if v)
        verdict = "PASS" if r["pass"] else "MISS"
        print(
            f"{r['system']:10} {r['messages']:6} {r['window']:>7,} {r['json_bytes']:>7} "
            f"{r['redis_bytes_per_message']:>8} {r['x_json']:>6}x  [{verdict}] {keys}"
        )
    for r in sessions:
        if "audit_records" in r:
            print(
                f"  ctxguard {r['messages']} @ {r['window']:,}: "
                f"{r['audit_records']} audit records, "
                f"{r['window_messages_avg']} messages sent per request on average"
            )
    print()
    print(f"Store only (no audit): {count} messages per class, one session")
    print(f"{'class':18} {'json B':>8} {'redis B/msg':>12} {'marginal B':>11} {'overhead':>9}")
    for r in rows:
        print(
            f"{r['class']:18} {r['json_bytes']:>8} {r['redis_bytes_per_message']:>12} "
            f"{r['marginal_bytes_per_message']:>11} {r['overhead']:>8}x"
        )
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
