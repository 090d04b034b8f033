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

With ``--instr``: Redis instructions (callgrind, a private server it starts) per script
call that adds one new id to a session holding ``--size`` of them, the one hash against
``--buckets`` B buckets (default 16; the bucket computed inside the script from the id's
bytes, or from its last byte, the bucket key named from the declared ``ids`` key: no
extra keys sent), for ``HSETNX`` and for the ``HEXISTS`` probe, alternated in rounds.

Run: ``python benchmarks/bench_index_layouts.py --redis-url redis://127.0.0.1:PORT/0``
(a private server: it writes and deletes keys under ``bench-layout:``; a few seconds), or
``python benchmarks/bench_index_layouts.py --instr [--size 1000]`` (a minute or two).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import uuid
import zlib
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

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


HASH_LUA = """
local h = 0
local id = ARGV[1]
for i = 1, #id do h = (h * 31 + string.byte(id, i)) % 4294967296 end
local key = KEYS[1] .. ':' .. (h % tonumber(ARGV[3]))
"""
SCRIPTS = {
    "HSETNX, one hash": "return redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2])",
    "HSETNX, B buckets": HASH_LUA + "return redis.call('HSETNX', key, ARGV[1], ARGV[2])",
    "HEXISTS, one hash": "return redis.call('HEXISTS', KEYS[1], ARGV[1])",
    "HEXISTS, B buckets": HASH_LUA + "return redis.call('HEXISTS', key, ARGV[1])",
    "the bucket's hash only": HASH_LUA + "return 1",
    "HSETNX, bucket by tail": "local b = string.byte(ARGV[1], -1) % tonumber(ARGV[3])\n"
    "return redis.call('HSETNX', KEYS[1] .. ':' .. b, ARGV[1], ARGV[2])",
    "empty script": "return 1",
}


def lua_bucket(ident: str, count: int) -> int:
    h = 0
    for byte in ident.encode():
        h = (h * 31 + byte) % 4294967296
    return h % count


def instructions(size: int, count: int, calls: int, rounds: int) -> None:
    from _turn.server import private_redis
    from bench_server_instr import Callgrind

    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not on PATH")
    out_dir = tempfile.mkdtemp(prefix="ctxguard-callgrind-")
    wrapper = ("valgrind", "--tool=callgrind", f"--callgrind-out-file={out_dir}/cg.out")
    with private_redis("--hz", "1", wrapper=wrapper) as server:
        client = redis.Redis.from_url(server.url, decode_responses=True)
        key = f"ctxg:default:{{{uuid.uuid4()}}}:ids"
        ids = [new_message_id() for _ in range(size)]
        client.hset(key, mapping={i: str(n) for n, i in enumerate(ids)})
        for n, i in enumerate(ids):
            client.hsetnx(f"{key}:{lua_bucket(i, count)}", i, str(n))
        encodings = {client.object("encoding", f"{key}:{b}") for b in range(count)}
        scripts = {name: client.register_script(body) for name, body in SCRIPTS.items()}
        for script in scripts.values():
            script(keys=[key], args=["x", "0", str(count)])
        meter = Callgrind(server.pid, out_dir)
        seen: dict[str, list[float]] = {name: [] for name in scripts}
        for _ in range(rounds):
            for name, script in scripts.items():
                fresh = [new_message_id() for _ in range(calls)]
                meter.zero()
                for n, i in enumerate(fresh):
                    script(keys=[key], args=[i, str(size + n), str(count)])
                seen[name].append(meter.dump() / calls)
        kinds = sorted(encodings)
        print(f"{size} ids stored, {count} buckets ({kinds}); k instructions per call:")
        for name, values in seen.items():
            print(f"  {name:<22} {statistics.median(values) / 1000:7.2f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--redis-url")
    ap.add_argument("--instr", action="store_true")
    ap.add_argument("--size", type=int, default=1000)
    ap.add_argument("--buckets", type=int, default=16)
    args = ap.parse_args()
    if args.instr:
        instructions(args.size, args.buckets, 100, 3)
        return
    if not args.redis_url:
        raise SystemExit("--redis-url (a private server) or --instr")
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
