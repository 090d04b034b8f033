"""``pack_evalsha``: a script call's bytes, the script and keys packed once per session,
the same bytes as packing the whole command each time."""

from __future__ import annotations

import random

import pytest
import redis

from ctxguard.stores import redis_clients
from ctxguard.stores.redis_clients import pack, pack_evalsha

SHA = "0123456789abcdef0123456789abcdef01234567"


def _value(rng: random.Random) -> str | int:
    kind = rng.randrange(4)
    if kind == 0:
        return rng.randrange(-(10**12), 10**12)
    if kind == 1:
        return ""
    alphabet = "ab:{}\r\n é€😀" if kind == 2 else "0123456789"
    return "".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 900)))


def test_the_same_bytes_as_packing_the_whole_command() -> None:
    conn = redis.Connection()
    rng = random.Random(16)
    sessions = [
        [f"ctxg:t:{{s{i}}}:{suffix}" for suffix in ("meta", "msgs", "toks")] for i in range(5)
    ]
    for _ in range(400):
        keys = list(rng.choice(sessions))
        if rng.random() < 0.1:
            keys[1] = f"other-{rng.randrange(3)}"  # the same first key, other keys
        args = [_value(rng) for _ in range(rng.randrange(0, 8))]
        want = pack(conn, "EVALSHA", SHA, len(keys), *keys, *args)
        assert pack_evalsha(conn, SHA, keys, args) == want


def test_a_type_hiredis_refuses_is_packed_as_before() -> None:
    conn = redis.Connection()
    keys, args = ["k1", "k2"], ["a", memoryview(b"xy"), 3]  # redis-py packs a memoryview
    want = pack(conn, "EVALSHA", SHA, 2, *keys, *args)
    assert b"".join(pack_evalsha(conn, SHA, keys, args)) == b"".join(bytes(p) for p in want)
    with pytest.raises(redis.DataError):  # and refuses a bool, as before
        pack_evalsha(conn, SHA, keys, ["a", True])


def test_the_packed_heads_are_bounded() -> None:
    conn = redis.Connection()
    for i in range(5000):
        pack_evalsha(conn, SHA, [f"key-{i}"], ["x"])
    assert len(redis_clients._HEADS) <= 4096
