"""audit finds damaged keys; repair rebuilds them from the message list, audited and atomic."""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from typing import Any

import pytest
import redis

from ctxguard.guard import Guard
from ctxguard.stores import open_store
from ctxguard.stores.base import SessionStore, Summary
from ctxguard.stores.keys import SUFFIXES, KeySpace

from .conftest import Cli

Damage = Callable[[Any], None]  # gets a redis client + keys, or the memory session


def _keys(namespace: str) -> dict[str, str]:
    return dict(zip(SUFFIXES, KeySpace(namespace).session_keys("s"), strict=True))


# name -> (damage on Redis, damage on the memory store (None: Redis only), key named)
DAMAGE: dict[str, tuple[Callable[[redis.Redis, dict[str, str]], Any], Damage | None, str]] = {
    "pins holds a non-number": (
        lambda r, k: r.rpush(k["pins"], "x"),
        lambda s: s.pins.append("x"),
        "pins",
    ),
    "pins beyond the history": (
        lambda r, k: r.rpush(k["pins"], 999),
        lambda s: s.pins.append(999),
        "pins",
    ),
    "toks shorter than msgs": (
        lambda r, k: r.rpop(k["toks"]),
        None,  # the in-process store keeps one count per message
        "toks",
    ),
    "toks holds a word": (
        lambda r, k: r.lset(k["toks"], 0, "abc"),
        None,  # the in-process store holds ints
        "toks",
    ),
    "meta tokens wrong": (
        lambda r, k: r.hset(k["meta"], "tokens", 12345),
        lambda s: setattr(s.tokens, "total", 12345),
        "meta",
    ),
    "meta count not a number": (lambda r, k: r.hset(k["meta"], "count", "many"), None, "meta"),
    # the state token's epoch gone: every write refused (it had stored, then failed)
    "meta epoch missing": (lambda r, k: r.hdel(k["meta"], "epoch"), None, "meta"),
    "ids names a ghost": (
        lambda r, k: r.hset(k["ids"], "ghost", 0),
        lambda s: s.ids.__setitem__("ghost", 0),
        "ids",
    ),
    "summary does not decode": (
        lambda r, k: r.set(k["sum"], "{bad"),
        lambda s: setattr(s, "summary", "{bad"),
        "sum",
    ),
    "summary beyond the history": (
        lambda r, k: r.set(k["sum"], Summary(version=1, text="x", covers_to=99).model_dump_json()),
        lambda s: setattr(
            s, "summary", Summary(version=1, text="x", covers_to=99).model_dump_json()
        ),
        "sum",
    ),
    "toks is a string": (lambda r, k: (r.delete(k["toks"]), r.set(k["toks"], "x")), None, "toks"),
}


def _session(run: Cli, namespace: str) -> None:
    guard = Guard(run.url, counter="approx", limit=400, namespace=namespace, max_tokens=50)
    guard.prepare("s", [{"role": "system", "content": "Be terse."}])
    for turn in range(3):
        req = guard.prepare("s", [{"role": "user", "content": f"question {turn}"}])
        guard.complete("s", {"role": "assistant", "content": f"answer {turn}"}, prepared=req)
    guard.close()


def _damage(case: str, run: Cli, store: SessionStore, namespace: str) -> bool:
    on_redis, on_memory, _ = DAMAGE[case]
    if run.url.startswith("memory"):
        if on_memory is None:
            return False
        on_memory(store._sessions["s"])  # type: ignore[attr-defined]
        return True
    client = redis.Redis.from_url(run.url)
    try:
        on_redis(client, _keys(namespace))
    finally:
        client.close()
    return True


@pytest.mark.parametrize("case", sorted(DAMAGE))
def test_audit_names_the_damaged_key_and_repair_rebuilds_it(
    case: str, target: tuple[Cli, SessionStore], namespace: str
) -> None:
    run, store = target
    _session(run, namespace)
    messages = store.read("s")
    assert run("audit", "s").exit_code == 0
    if not _damage(case, run, store, namespace):
        pytest.skip("the in-process store cannot hold this damage")
    key = DAMAGE[case][2]
    data = run.json("audit", "s")
    assert ("damaged_key", f"key {key}") in {(v["check"], v["where"]) for v in data["violations"]}
    # --dry-run says what would change and writes nothing
    before = store.inspect("s")  # type: ignore[attr-defined]
    dry = run("repair", "s", "--dry-run")
    assert dry.exit_code == 0 and "would change" in dry.stderr and key in dry.stderr
    assert store.inspect("s") == before  # type: ignore[attr-defined]
    fixed = run.json("repair", "s")
    assert fixed["applied"] is True and any(c.startswith(key) for c in fixed["changes"])
    assert run("audit", "s").exit_code == 0, run("audit", "s").stdout
    assert [m.message for m in store.read("s")] == [m.message for m in messages]
    records = store.read_audit("s")
    assert records[-1]["kind"] == "repair" and records[-1]["changes"] == fixed["changes"]
    assert "repaired" in run("show", "s").stdout
    # the session works again, and a second repair finds nothing to do
    guard = Guard(run.url, counter="approx", limit=400, namespace=namespace, max_tokens=50)
    request = guard.prepare("s", [{"role": "user", "content": "still there?"}])
    guard.close()
    assert request.messages[-1].text == "still there?"
    assert run.json("repair", "s") == {"session": "s", "changes": [], "applied": False}


def test_repair_refuses_a_message_list_that_does_not_decode(
    target: tuple[Cli, SessionStore], namespace: str
) -> None:
    run, store = target
    _session(run, namespace)
    if run.url.startswith("memory"):
        store._sessions["s"].records.append("{not a message")  # type: ignore[attr-defined]
    else:
        client = redis.Redis.from_url(run.url)
        client.rpush(_keys(namespace)["msgs"], b"\xff{not json")
        client.close()
    before = store.inspect("s")  # type: ignore[attr-defined]
    result = run("repair", "s")
    assert result.exit_code == 2 and result.stderr.count("\n") == 1
    assert "record 7 does not decode" in result.stderr
    assert "ctxguard delete" in result.stderr and "nothing changed" in result.stderr
    assert store.inspect("s") == before  # type: ignore[attr-defined]


def test_repair_of_an_unknown_session_exits_7(target: tuple[Cli, SessionStore]) -> None:
    run, _ = target
    assert run("repair", "nobody").exit_code == 7


def test_repair_writes_nothing_when_the_session_changed_since_it_was_read(
    target: tuple[Cli, SessionStore], namespace: str
) -> None:
    from ctxguard.stores.integrity import plan_repair

    run, store = target
    _session(run, namespace)
    raw = store.inspect("s")  # type: ignore[attr-defined]
    plan = plan_repair("s", raw, 0, 0)
    store.add_audit("s", {"kind": "usage"}, retention=0)  # audit does not count
    from ctxguard.messages import Message
    from ctxguard.stores.base import NewMessage

    store.append("s", [NewMessage(Message(role="user", content="late"))])
    assert store.repair("s", plan, {"kind": "repair"}) is False  # type: ignore[attr-defined]
    last = {k: v for k, v in store.read_audit("s")[-1].items() if k != "rid"}
    assert json.dumps(last) == json.dumps({"kind": "usage"})


@pytest.mark.cluster
def test_repair_runs_on_the_cluster(cluster_url: str, namespace: str, purge_after: Any) -> None:
    from ctxguard.stores import open_store
    from ctxguard.stores.integrity import find_problems, plan_repair

    purge_after(cluster_url)
    _session(Cli(cluster_url, namespace), namespace)
    store = open_store(cluster_url, namespace=namespace)
    client = store.client  # type: ignore[attr-defined]
    client.rpush(_keys(namespace)["pins"], "x")
    raw = store.inspect("s")  # type: ignore[attr-defined]
    assert [p.key for p in find_problems("s", raw)] == ["pins"]
    assert store.repair("s", plan_repair("s", raw, 0, 0), {"kind": "repair"})  # type: ignore[attr-defined]
    assert find_problems("s", store.inspect("s")) == []  # type: ignore[attr-defined]
    store.close()


async def test_async_stores_inspect_and_repair_the_same_way(namespace: str) -> None:
    from ctxguard.stores import open_async_store
    from ctxguard.stores.integrity import find_problems, plan_repair

    store = open_async_store(f"memory://{namespace}")
    guard = Guard(f"memory://{namespace}", counter="approx", limit=400, max_tokens=50)
    guard.prepare("s", [{"role": "system", "content": "Be terse."}])
    guard.close()
    store.sync._sessions["s"].pins.append(5)  # type: ignore[attr-defined]
    raw = await store.inspect("s")  # type: ignore[attr-defined]
    assert [p.key for p in find_problems("s", raw)] == ["pins"]
    assert await store.repair("s", plan_repair("s", raw, 0, 0), {"kind": "repair"})  # type: ignore[attr-defined]
    assert find_problems("s", await store.inspect("s")) == []  # type: ignore[attr-defined]


@pytest.mark.parametrize("session", ["-x; touch pwned", "a b $(id)", "it's [red]"])
def test_the_commands_a_refused_repair_suggests_name_the_session_as_a_shell_reads_them(
    session: str, namespace: str
) -> None:
    """The session id (any text a client chose) was pasted into the suggested commands
    as is: a copied line ran ``; touch pwned`` or read ``-x`` as an option. Each
    suggested line, split as a shell splits it, now reads back the session."""
    run = Cli(f"memory://{namespace}", namespace)
    store = open_store(run.url, namespace=namespace)
    guard = Guard(store, counter="approx", limit=400, max_tokens=50)
    guard.prepare(session, [{"role": "user", "content": "question"}])
    store._sessions[session].records.append("{not a message")  # type: ignore[attr-defined]
    result = run("repair", "--", session)
    assert result.exit_code == 2 and result.stderr.count("\n") == 1, result.stderr
    commands = result.stderr.split("`")[1::2]
    assert [c.split()[:2] for c in commands] == [["ctxguard", "show"], ["ctxguard", "delete"]]
    shown = run(*shlex.split(commands[0])[1:])
    assert shown.exit_code == 0, shown.stderr
    assert json.loads(shown.stdout)["info"]["session_id"] == session
    assert shlex.split(commands[1])[-1] == session
    guard.close()
