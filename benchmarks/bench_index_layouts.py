"""Memory of the two id indexes (``ids``: message id -> seq, ``rids``: audit record id ->
turn) as one hash per session, as today, against the same entries spread over small
bucket hashes (bucket chosen from the id: crc32 mod B), which Redis keeps in listpack
encoding while each holds at most ``hash-max-listpack-entries`` (128) entries.

A measurement of a layout not built (issue 16, task mem3): what the lever would buy
per stored message before anyone writes it into the scripts. The entries are what the
store writes (26-character ULIDs; seq / turn as decimal text), the key names as long
as a real session's (``ctxg:default:{<uuid>}:ids:<b>``), so MEMORY USAGE (SAMPLES 0)
counts what a session's keys would. Not counted (either layout): the expires entry of
each key with a TTL, about 24-32 B a key, i.e. B x that per session.

Run: ``python benchmarks/bench_index_layouts.py --redis-url redis://127.0.0.1:PORT/0``
(a private server: it writes and deletes keys under ``bench-layout:``; a few seconds).
"""

from __future__ import annotations

import argparse
import sys
import uuid
import zlib
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ctxguard.ids import new_message_id


def usage(client: redis.Redis, keys: list[str]) -> int:
    return sum(int(client.memory_usage(k, samples=0) or 0) for k in keys)


def one_hash(client: redis.Redis, base: str, ids: list[str]) -> int:
    key = f"{base}:ids"
    for start in range(0, len(ids), 500):
        chunk = ids[start : start + 500]
        client.hset(key, mapping={i: str(start + n) for n, i in enumerate(chunk)})
    return usage(client, [key])


def buckets(client: redis.Redis, base: str, ids: list[str], count: int) -> tuple[int, int]:
    keys = [f"{base}:ids:{b}" for b in range(count)]
    pipe = client.pipeline(transaction=False)
    for seq, i in enumerate(ids):
        pipe.hsetnx(keys[zlib.crc32(i.encode()) % count], i, str(seq))
    pipe.execute()
    made = [k for k in keys if client.exists(k)]
    listpack = sum(1 for k in made if client.object("encoding", k) == "listpack")
    return usage(client, made), len(made) - listpack


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--redis-url", required=True)
    args = ap.parse_args()
    client = redis.Redis.from_url(args.redis_url, decode_responses=True)
    print(f"Redis {client.info('server')['redis_version']}: B per entry (MEMORY USAGE)")
    print(f"{'entries':>8} {'one hash':>9} " + " ".join(f"{f'B={b}':>12}" for b in (8, 16, 32, 64)))
    for n in (100, 200, 500, 1000, 2000, 5000):
        ids = [new_message_id() for _ in range(n)]
        base = f"bench-layout:{{{uuid.uuid4()}}}"
        row = [f"{n:>8}", f"{one_hash(client, base, ids) / n:>9.1f}"]
        for count in (8, 16, 32, 64):
            total, converted = buckets(client, f"{base}{count}", ids, count)
            row.append(f"{total / n:>8.1f} ({converted})")
        print(" ".join(row))
        for key in client.scan_iter(f"{base}*"):
            client.delete(key)
    print("(n) = buckets past 128 entries, kept as a hashtable")


if __name__ == "__main__":
    main()
