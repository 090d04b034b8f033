"""The common case of ``append`` and ``window`` (``lua/_fast.lua``) answers and writes
exactly as the general script, and writes nothing when it declines.

Each example builds one session by raw commands (any mix of the states the scripts
meet: counts and counters, TTLs, a trail at its cap, request contexts, rids seen, a
damaged key or meta field), copies it to three key spaces, and makes one call on each:
the script Redis runs (fast path, then the general one), the general script alone, and
the fast path alone (``general()`` replaced by a marker). The first two must give the
same reply (or the same error) and leave the same keys, values and TTLs; the third
either declines having changed nothing, or does what the general script did.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ctxguard.stores.keys import SUFFIXES, KeySpace
from ctxguard.stores.redis_protocol import general_script, load_script
from tests.conftest import raw_client

pytestmark = pytest.mark.redis

DECLINED = "fast path declined"
# the three scripts called on three copies of a session; a fourth copy is left alone
CALLED = ("run", "general", "fast")
SID = "s"
NOW = "1796400000123456"  # the caller's clock (us)


def fast_only(name: str) -> str:
    text = load_script(name)
    cut = text.rindex("local function general()")
    return text[:cut] + f"return '{DECLINED}'\n"


@pytest.fixture(scope="module")
def client(redis_url: str) -> Iterator[Any]:
    c = raw_client(redis_url)
    yield c
    c.close()


@pytest.fixture(scope="module")
def scripts(client: Any) -> dict[str, dict[str, Any]]:
    return {
        name: {
            "run": client.register_script(load_script(name)),
            "general": client.register_script(general_script(name)),
            "fast": client.register_script(fast_only(name)),
        }
        for name in ("window", "append")
    }


@pytest.fixture
def spaces(
    namespace: str, redis_url: str, purge_after: Callable[[str], None]
) -> dict[str, list[str]]:
    purge_after(redis_url)
    return {
        role: KeySpace(f"{namespace}{role}", "default").session_keys(SID)
        for role in (*CALLED, "control")
    }


# -- a session, by raw commands -------------------------------------------------

COUNTER = "c" * 32
OTHER = "d" * 32
DIGEST = "0123456789abcdef"


def rid(i: int) -> str:
    return f"01J{i:023d}"


SESSION = {
    "exists": st.booleans(),
    "messages": st.integers(0, 5),
    "counts_off": st.sampled_from([0, 0, 0, 1, -1]),  # toks holds one count more/less
    "counter": st.sampled_from([COUNTER, OTHER, None]),
    "epoch": st.booleans(),
    "stamp": st.booleans(),
    # 15 digits and a sign: the fast path declines, the general script takes it
    "turns": st.sampled_from([None, "0", "7", "-100000000000000"]),
    "ctx": st.sampled_from([None, DIGEST, "fedcba9876543210"]),
    "trail": st.sampled_from([0, 0, 1, 3, 4]),
    "trail_rids": st.booleans(),
    "ttl": st.sampled_from([None, 3_600_000, 3_599_500, 3_000_000, 9_000, 9_600]),
    "bad_field": st.sampled_from([None, "count", "tokens", "turns", "ver", "created", "updated"]),
    "bad_value": st.sampled_from(["x1", "1234567890123456", "1.5", ""]),  # 16 digits: no integer
    "bad_key": st.sampled_from([None, "msgs", "toks", "ids", "audit", "rids", "meta"]),
}


def build(c: Any, keys: list[str], s: dict[str, Any]) -> None:
    k = dict(zip(SUFFIXES, keys, strict=True))
    n = s["messages"]
    if s["exists"]:
        meta: dict[str, str] = {
            "created": "1796400000000",
            "updated": "1796400000001",
            "count": str(n),
            "tokens": str(10 * n),
            "sumver": "0",
            "ver": str(3 + n),
        }
        if s["epoch"]:
            meta["epoch"] = "1796400000000000"
        if s["stamp"]:
            meta["stamp"] = "1796400000000999"
        if s["counter"]:
            meta["counter"] = s["counter"]
        if s["turns"] is not None:
            meta["turns"] = s["turns"]
        if s["ctx"]:
            meta["ctx"] = s["ctx"]
        if s["bad_field"]:
            meta[s["bad_field"]] = s["bad_value"]
        c.hset(k["meta"], mapping=meta)
    for i in range(n):
        c.rpush(k["msgs"], json.dumps(["u", f"m{i}", f"id{i}", i]))
        c.hset(k["ids"], f"id{i}", i)
    counts = n + s["counts_off"] if n else 0
    if counts > 0:
        c.rpush(k["toks"], *[10] * counts)
    for i in range(s["trail"]):
        record = {"rid": rid(i), "kind": "usage"} if s["trail_rids"] else {"kind": "old"}
        c.rpush(k["audit"], json.dumps(record, separators=(",", ":")))
        if s["trail_rids"]:
            c.hset(k["rids"], rid(i), "0")
    if s["bad_key"]:
        c.delete(k[s["bad_key"]])
        c.set(k[s["bad_key"]], "damaged")


def expire_together(c: Any, spaces: dict[str, list[str]], ttl: int | None) -> None:
    """The copies' TTLs set in one transaction: the same instant for every copy."""
    if ttl:
        pipe = c.pipeline(transaction=True)
        for keys in spaces.values():
            for key in keys:
                pipe.pexpire(key, ttl)
        pipe.execute()


def audit_arg(kind: str, i: int) -> str:
    if kind == "none":
        return ""
    if kind == "request":
        return '{"turn":0,"rid":"' + rid(100 + i) + '","kind":"request","sent":[[0,3]]}'
    if kind == "request-ctx":
        head = '{"turn":0,"rid":"' + rid(100 + i) + '","kind":"request","ctx":"' + DIGEST + '"}'
        return head + "\n" + DIGEST + '{"kind":"request","limit":4096}'
    if kind == "usage":
        return '{"rid":"' + rid(100 + i) + '","kind":"usage","usage":{"prompt_tokens":5}}'
    if kind == "seen":
        return '{"rid":"' + rid(0) + '","kind":"usage"}'
    return '{"kind":"no rid"}'


CALL = {
    "script": st.sampled_from(["window", "append"]),
    "counter": st.sampled_from([COUNTER, COUNTER, OTHER, ""]),
    "ttl": st.sampled_from([0, 0, 3600, 10, 50]),
    "cap": st.sampled_from([0, 0, 3, 5, 6, 100]),
    "audit": st.sampled_from(
        ["none", "request", "request", "request-ctx", "usage", "seen", "no-rid"]
    ),
    "keep": st.sampled_from([0, 1000, 3, 2, 1]),
    "ids": st.sampled_from(
        [
            ["new"],
            ["id0"],
            ["new", "new2"],
            ["new", "new2", "new3"],
            ["new", "new"],
            ["new", "id0"],
            ["id0", "new"],
            ["new", "new2", "new"],
        ]
    ),
    "tokens": st.sampled_from(["12", "-1", "0", "x"]),
    # each message's flag in turn (the last repeats)
    "pinned": st.sampled_from(["1", "01", "001", "10"]),
    "token": st.sampled_from(["right", "right", "right", "wrong", "none", "fetch"]),
    "recount": st.booleans(),
    "retry": st.sampled_from([False, False, False, True]),
}
# a session and a call as a chat turn meets them: what the fast path takes
NORMAL_SESSION = {
    "exists": True,
    "messages": 4,
    "counts_off": 0,
    "counter": COUNTER,
    "epoch": True,
    "stamp": True,
    "turns": "7",
    "ctx": DIGEST,
    "trail": 3,
    "trail_rids": True,
    "ttl": 3_600_000,
    "bad_field": None,
    "bad_value": "x1",
    "bad_key": None,
}
NORMAL_CALL = {
    "script": "window",
    "counter": COUNTER,
    "ttl": 3600,
    "cap": 0,
    "audit": "request-ctx",
    "keep": 1000,
    "ids": ["new"],
    "tokens": "12",
    "pinned": "0",
    "token": "right",
    "recount": False,
    "retry": False,
}


@st.composite
def cases(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, Any]]:
    """Mostly a normal turn with up to three things changed (each edge of the fast
    path's conditions, alone and together), sometimes everything drawn at random."""
    s, p = dict(NORMAL_SESSION), dict(NORMAL_CALL)
    p["script"] = draw(CALL["script"])
    # normal turns differ too: a batch (tool results), the first record of a trail, one at
    # its cap, no TTL on the
    # call (the session's own kept) or a short one (no slack), no record or a usage record
    s["trail"] = draw(st.sampled_from([3, 0]))
    p["ids"] = draw(st.sampled_from([["new"], ["new"], ["new", "new2"], ["new", "new2", "new3"]]))
    p["keep"] = draw(st.sampled_from([1000, 3]))
    p["ttl"] = draw(st.sampled_from([3600, 0, 50, 10]))
    s["ttl"] = draw(st.sampled_from([3_600_000, 9_600]))
    p["audit"] = draw(st.sampled_from(["request-ctx", "request", "none", "usage"]))
    if draw(st.integers(0, 4)) == 0:
        changed = [*SESSION, *(f"call.{name}" for name in CALL)]
    else:
        changed = draw(
            st.lists(
                st.sampled_from([*SESSION, *(f"call.{n}" for n in CALL)]), max_size=3, unique=True
            )
        )
    for name in changed:
        if name.startswith("call."):
            p[name[5:]] = draw(CALL[name[5:]])
        else:
            s[name] = draw(SESSION[name])
    return s, p


def token_of(c: Any, keys: list[str]) -> str:
    try:
        epoch, ver, stamp = c.hmget(keys[0], "epoch", "ver", "stamp")
    except redis.ResponseError:
        return "x"
    if not epoch:
        return ""
    return f"{epoch.decode()}:{(ver or b'0').decode()}:{(stamp or b'').decode()}"


def args_of(p: dict[str, Any], token: str) -> list[str]:
    messages: list[str] = [str(len(p["ids"]))]
    flags = p["pinned"]
    for j, mid in enumerate(p["ids"]):
        record = json.dumps(["u", f"new message {j}", mid, 5])
        messages += [mid, record, p["tokens"], flags[min(j, len(flags) - 1)]]
    audit = audit_arg(p["audit"], 0)
    if p["script"] == "append":
        head = [p["counter"], str(p["ttl"]), str(p["cap"]), audit, str(p["keep"]), NOW]
        return head + messages + (["1"] if p["retry"] else [])
    expect = {"right": "=" + token, "wrong": "=1:2:3", "none": "=", "fetch": ""}[p["token"]]
    head = [
        p["counter"],
        str(p["ttl"]),
        str(p["cap"]),
        "4096",
        "1",
        expect,
        audit,
        str(p["keep"]),
        NOW,
    ]
    counts = ["1", "0", "7"] if p["recount"] else ["0"]
    return head + messages + counts + (["1"] if p["retry"] else [])


# -- what a call did --------------------------------------------------------------


def outcome(script: Any, keys: list[str], args: list[str], names: list[str]) -> Any:
    try:
        return settled(script(keys=keys, args=args), names)
    except redis.ResponseError as exc:
        return settled(exc, names)


def as_general(reply: Any, n: int) -> Any:
    """The fast path's one-string answer (``count turn before after``, ``hit `` in front
    for window) in the general script's shape: {count, {1, ...}, before, after}, and for
    window {'hit', that, turn, after}. Any other reply as it is."""
    if not isinstance(reply, bytes) or reply == DECLINED.encode():
        return reply
    text = reply.decode()
    count, turn, before, after = text.removeprefix("hit ").split(" ")
    appended = [int(count), [1] * n, before, after]
    return ["hit", appended, int(turn), after] if text.startswith("hit ") else appended


def settled(reply: Any, names: list[str]) -> Any:
    """A script's reply, or its error's text (key names, script and line numbered)."""
    if isinstance(reply, redis.ResponseError):
        text = str(reply).rsplit("caused error: ", 1)[-1].split(" script:")[0]
        text = re.sub(r"f_[0-9a-f]{40}", "f_<sha>", text)
        text = re.sub(r"user_script:\d+:", "user_script:<line>:", text)
        return ("error", normalize(text, names))
    return normalize(reply, names)


def normalize(value: Any, names: list[str]) -> Any:
    if isinstance(value, list):
        return [normalize(v, names) for v in value]
    if isinstance(value, bytes):
        value = value.decode()
    if isinstance(value, str):
        for i, name in enumerate(names):
            value = value.replace(name, f"<key {i}>")
        # a stamp from the server's TIME (a counter switch, recounts): differs per call
        value = SERVER_TIME.sub("<server time>", value)
    return value


FETCH_REPLY_LENGTH = 13  # window.lua's reply to a fetch; its TTL in seconds at index 9
FETCH_TTL = 9


def same_reply(a: Any, b: Any) -> bool:
    """Two scripts' replies are equal, except that a fetch's TTL in seconds (``TTL``
    rounds the milliseconds left: 3,599,500 ms reads 3600, a millisecond later 3599) may
    differ by one second: the two scripts ran at two instants of the same transaction."""
    if not (
        isinstance(a, list)
        and isinstance(b, list)
        and len(a) == len(b) == FETCH_REPLY_LENGTH
        and isinstance(a[FETCH_TTL], int)
        and isinstance(b[FETCH_TTL], int)
        and min(a[FETCH_TTL], b[FETCH_TTL]) >= 0
    ):
        return bool(a == b)
    rest_a = a[:FETCH_TTL] + a[FETCH_TTL + 1 :]
    rest_b = b[:FETCH_TTL] + b[FETCH_TTL + 1 :]
    return rest_a == rest_b and abs(a[FETCH_TTL] - b[FETCH_TTL]) <= 1


SERVER_TIME = re.compile(r"\b\d{10}\.\d{1,6}\b")


def snapshot(c: Any, spaces: dict[str, list[str]]) -> dict[str, dict[str, Any]]:
    """Every copy's keys: types and TTLs read in one transaction (one instant for all),
    then the values."""
    pipe = c.pipeline(transaction=True)
    for keys in spaces.values():
        for key in keys:
            pipe.type(key)
            pipe.pttl(key)
    flat = iter(pipe.execute())
    seen = {
        role: [(next(flat).decode(), next(flat)) for _ in keys] for role, keys in spaces.items()
    }
    return {role: contents(c, spaces[role], seen[role]) for role in spaces}


def contents(c: Any, keys: list[str], seen: list[tuple[str, int]] | None = None) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for i, (suffix, key) in enumerate(zip(SUFFIXES, keys, strict=True)):
        kind, pttl = seen[i] if seen is not None else (c.type(key).decode(), c.pttl(key))
        if kind == "hash":
            value: Any = sorted(normalize(list(i), []) for i in c.hgetall(key).items())
        elif kind == "list":
            value = c.lrange(key, 0, -1)
        elif kind == "string":
            value = c.get(key)
        else:
            value = None
        found[suffix] = (kind, value, pttl)
    return found


def same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """The same keys and values, and TTLs within 250 ms (the three calls run in one
    transaction and the TTLs are read in another: milliseconds apart)."""
    if a.keys() != b.keys():
        return False
    for name in a:
        (kind_a, value_a, ttl_a), (kind_b, value_b, ttl_b) = a[name], b[name]
        if (kind_a, value_a) != (kind_b, value_b):
            return False
        if ttl_a < 0 or ttl_b < 0:  # -1 no TTL, -2 no key: exactly
            if ttl_a != ttl_b:
                return False
        elif abs(ttl_a - ttl_b) > 250:
            return False
    return True


@settings(
    max_examples=800, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(case=cases())
# an integer field of 16 digits, on a turn the fast path would take otherwise: each one
# (drawn above too, but rarely on an otherwise normal turn)
@example(case=(dict(NORMAL_SESSION, bad_field="turns", bad_value="1234567890123456"), NORMAL_CALL))
@example(case=(dict(NORMAL_SESSION, bad_field="tokens", bad_value="1234567890123456"), NORMAL_CALL))
@example(case=(dict(NORMAL_SESSION, bad_field="ver", bad_value="1234567890123456"), NORMAL_CALL))
@example(case=(dict(NORMAL_SESSION, bad_field="count", bad_value="1234567890123456"), NORMAL_CALL))
@example(
    case=(dict(NORMAL_SESSION, bad_field="created", bad_value="1234567890123456"), NORMAL_CALL)
)
@example(
    case=(
        dict(NORMAL_SESSION, bad_field="turns", bad_value="1234567890123456"),
        dict(NORMAL_CALL, script="append"),
    )
)
# the checks that come after the first write (an id's HSETNX), each taken back: a trail
# or rids of another type, a rid written already, an id stored or repeated
@example(case=(dict(NORMAL_SESSION, bad_key="audit"), dict(NORMAL_CALL, ids=["new", "new2"])))
@example(case=(dict(NORMAL_SESSION, bad_key="rids"), dict(NORMAL_CALL, ids=["new", "new2"])))
@example(case=(NORMAL_SESSION, dict(NORMAL_CALL, ids=["new", "new2"], audit="seen")))
@example(case=(NORMAL_SESSION, dict(NORMAL_CALL, ids=["new", "new2", "id0"])))
@example(case=(NORMAL_SESSION, dict(NORMAL_CALL, ids=["new", "new2", "new"])))
@example(case=(dict(NORMAL_SESSION, bad_key="rids"), NORMAL_CALL))
@example(case=(dict(NORMAL_SESSION, bad_key="audit"), NORMAL_CALL))
@example(case=(dict(NORMAL_SESSION, bad_key="audit"), dict(NORMAL_CALL, script="append")))
# a batch of two (the with_reply turn: its own straight-line writes) and of three, with
# the session's counter and with none (every count written as unknown)
@example(case=(NORMAL_SESSION, dict(NORMAL_CALL, counter="", ids=["new", "new2"])))
@example(case=(NORMAL_SESSION, dict(NORMAL_CALL, counter="", ids=["new", "new2", "new3"])))
@example(case=(NORMAL_SESSION, dict(NORMAL_CALL, ids=["new", "new2", "new3"])))
@example(case=(NORMAL_SESSION, dict(NORMAL_CALL, audit="seen")))
def test_the_fast_path_answers_and_writes_as_the_general_script(
    client: Any,
    scripts: dict[str, dict[str, Any]],
    spaces: dict[str, list[str]],
    case: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    s, p = case
    for keys in spaces.values():
        client.delete(*keys)
        build(client, keys, s)
    expire_together(client, spaces, s["ttl"])
    args = args_of(p, token_of(client, spaces["run"]))
    # the three calls in one transaction: nothing else runs between them, but the clock
    # does (Redis 7.0 freezes it per script, not per MULTI): see same_reply
    pipe = client.pipeline(transaction=True)
    for role in CALLED:
        scripts[p["script"]][role](keys=spaces[role], args=args, client=pipe)
    replies = pipe.execute(raise_on_error=False)
    done = {
        role: settled(as_general(r, len(p["ids"])), spaces[role])
        for role, r in zip(CALLED, replies, strict=True)
    }
    after = snapshot(client, spaces)
    assert same_reply(done["run"], done["general"]), (done["run"], done["general"])
    assert same(after["run"], after["general"]), (after["run"], after["general"])
    if isinstance(done["general"], tuple) and done["general"][0] == "error":
        # a refused call stores nothing (a meta without its epoch, or a count that is no
        # integer, once wrote and then failed)
        assert same(after["general"], after["control"]), (done["general"], after["general"])
    if done["fast"] == DECLINED:
        # nothing written: as the copy no call touched
        assert same(after["fast"], after["control"]), (after["fast"], after["control"])
    else:
        assert same_reply(done["fast"], done["general"]), (done["fast"], done["general"])
        assert same(after["fast"], after["general"]), (after["fast"], after["general"])


def test_the_common_turn_takes_the_fast_path(
    client: Any, scripts: dict[str, dict[str, Any]], spaces: dict[str, list[str]]
) -> None:
    """A turn as a chat makes it (one message, the session's counter, a request record
    with its context stored, a trail at its cap, a TTL) is answered by the fast path:
    else the property above would pass with a fast path that always declines."""
    s = NORMAL_SESSION
    for script, audit in [
        ("window", "request-ctx"),
        ("window", "none"),
        ("append", "none"),
        ("append", "usage"),
        ("window-batch", "request-ctx"),
        ("append-batch", "usage"),
    ]:
        keys = spaces["fast"]
        client.delete(*keys)
        build(client, keys, s)
        expire_together(client, {"fast": keys}, s["ttl"])
        name, batch = script.removesuffix("-batch"), script.endswith("-batch")
        ids = ["new", "new2", "new3"] if batch else ["new"]
        p = {**NORMAL_CALL, "script": name, "audit": audit, "keep": 3, "ids": ids}
        done = outcome(scripts[name]["fast"], keys, args_of(p, token_of(client, keys)), keys)
        assert done != DECLINED, (script, audit)
    # a bulk append (an import: thousands of messages) is the general script's: the fast
    # path writes each id with its own HSETNX, and takes at most 16
    for script, size, taken in [("append", 16, True), ("append", 17, False), ("window", 17, False)]:
        keys = spaces["fast"]
        client.delete(*keys)
        build(client, keys, s)
        ids = [f"new{i}" for i in range(size)]
        p = {**NORMAL_CALL, "script": script, "audit": "none", "ids": ids}
        done = outcome(scripts[script]["fast"], keys, args_of(p, token_of(client, keys)), keys)
        assert (done != DECLINED) is taken, (script, size)


def test_replies_are_compared_exactly_but_for_a_fetchs_ttl_rounding() -> None:
    """The flake this helper closed: a session TTL of 3,599,500 ms read 3600 in the first
    script and 3599 in the second, a millisecond later. Anything else must still differ."""
    fetch = [[1], ["count", "4"], False, 0, [], [], [], [], [], 3600, "1:2:3", -1, 4]
    assert same_reply(fetch, [*fetch[:9], 3599, *fetch[10:]])
    assert not same_reply(fetch, [*fetch[:9], 3598, *fetch[10:]])  # two seconds apart
    assert not same_reply(fetch, [*fetch[:9], -1, *fetch[10:]])  # no TTL at all
    assert not same_reply(fetch, [*fetch[:10], "1:2:4", *fetch[11:]])
    assert not same_reply(fetch, [*fetch[:3], 1, *fetch[4:]])
    assert not same_reply([1, 3600], [1, 3599])  # not a fetch: exactly
