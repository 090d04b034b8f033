"""Memory: Redis bytes per stored message (MEMORY USAGE) against the message's JSON size.

For each size class, K messages are appended to one session through the store
(with token counts, as the guard stores them). Reported per message:

* ``json``: the stored record's size (what ``Message.to_record`` produces);
* ``all keys / K``: MEMORY USAGE (SAMPLES 0, exact) summed over the session's
  keys (records, token counts, id index, meta, pins), divided by K;
* ``marginal``: the growth from K/2 to K messages divided by K/2, i.e. the cost
  of one more message without the session's fixed overhead;
* ``overhead``: marginal / json.

Run: ``python benchmarks/bench_memory.py [--redis-url URL] [--count K] [--quick]``.
Bounded to a few seconds; writes ``benchmarks/results/memory.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import uuid
from pathlib import Path
from typing import Any

import redis

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = os.environ.get("CTXGUARD_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
    ap.add_argument("--redis-url", default=default)
    ap.add_argument("--count", type=int, default=None)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    count = args.count or (100 if args.quick else 1000)
    rows = measure(args.redis_url, count)
    client = redis.Redis.from_url(args.redis_url)
    info = client.info("server")
    config = client.config_get("list-max-listpack-size")
    client.close()
    report = {"redis": info.get("redis_version"), "config": config, "rows": rows}
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=2))
    print(f"Redis {report['redis']}, {count} messages per class, one session")
    print(f"{'class':18} {'json B':>8} {'redis B/msg':>12} {'marginal B':>11} {'overhead':>9}")
    for r in rows:
        print(
            f"{r['class']:18} {r['json_bytes']:>8} {r['redis_bytes_per_message']:>12} "
            f"{r['marginal_bytes_per_message']:>11} {r['overhead']:>8}x"
        )
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
