"""Audit trail exact under retries: commands that never reach Redis, replies that are lost.

A :class:`FaultProxy` between the store and a private server either drops one
chosen command before the server sees it ("refuse") or lets the server run it
and closes the connection before the reply gets back ("drop_reply"). Whatever
is retried, by the store or by the caller, every audit record lands exactly
once, a request keeps the turn it was given, a committed summary is recorded
as committed, and a message stored by a lost attempt is reported as stored.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from ctxguard import AsyncGuard, Guard
from ctxguard.errors import StoreConnectionError
from ctxguard.guard.plan import SummaryRequest
from ctxguard.messages import Message
from ctxguard.stores import Summary, WriteOptions, open_async_store, open_store
from ctxguard.stores.base import RecordWrite
from ctxguard.stores.redis import RetryPolicy
from ctxguard.stores.redis_protocol import SCRIPT_NAMES, load_script
from tests.conftest import recorded_ids

from .helpers import RecordingPolicy, new
from .servers import FaultProxy, RedisServer

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]
OPTS = WriteOptions(counter="c1")
ONE_ATTEMPT = RetryPolicy(attempts=1)  # what reaches the caller after the store's retries
SID = "s1"


@pytest.fixture
def proxy(private_redis: RedisServer) -> Iterator[FaultProxy]:
    admin = private_redis.client()
    for name in SCRIPT_NAMES:  # cached: an EVALSHA then runs at once, no NOSCRIPT round
        admin.script_load(load_script(name))
    admin.close()
    proxy = FaultProxy(private_redis.port).start()
    yield proxy
    proxy.stop()


def sha(store: Any, script: str) -> str:
    return str(store._scripts[script].sha)


def summarizer(previous: str | None, messages: Sequence[Message]) -> str:
    return f"{len(messages)} messages"


def guard(store: Any, cls: type = Guard, **kw: Any) -> Any:
    kw.setdefault("summarizer", summarizer)
    return cls(store, counter="approx", limit=4000, max_tokens=100, **kw)


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def reply(text: str = "ok") -> Message:
    return Message(role="assistant", content=text)


def kinds(audit: list[dict[str, Any]]) -> list[str]:
    return [r["kind"] for r in audit]


def assert_rids_unique(audit: list[dict[str, Any]]) -> None:
    rids = [r["rid"] for r in audit]
    assert len(rids) == len(set(rids)), rids


# -- (a) a complete() that never reached Redis, retried by the caller ----------------


@pytest.mark.parametrize("mode", ["with_reply", "sync"])
def test_complete_that_never_reached_redis_then_retried_audits_once(
    proxy: FaultProxy, mode: str
) -> None:
    store = open_store(proxy.url, namespace="lost", retry=ONE_ATTEMPT)
    g = guard(store, audit_mode=mode)
    prepared = g.prepare(SID, [user("question")])
    answer = reply()
    proxy.arm(sha(store, "append"), "refuse")
    with pytest.raises(StoreConnectionError):
        g.complete(SID, answer, prepared=prepared, usage={"prompt_tokens": 9})
    assert proxy.fired == ["refuse"]
    assert kinds(store.read_audit(SID)) == ([] if mode == "with_reply" else ["request"])

    g.complete(SID, answer, prepared=prepared, usage={"prompt_tokens": 9})
    g.close()

    audit = open_store(proxy.url, namespace="lost").read_audit(SID)
    if mode == "with_reply":  # the held request record, completed with the usage
        assert kinds(audit) == ["request"]
        assert audit[0]["completed"] is True and audit[0]["prompt_tokens"] == 9
    else:
        assert kinds(audit) == ["request", "usage"]
        assert audit[1]["of_turn"] == audit[0]["turn"] == prepared.turn == 1
    assert [m.message.role for m in store.read(SID)] == ["user", "assistant"]


def test_complete_whose_reply_was_lost_then_retried_by_the_caller_audits_once(
    proxy: FaultProxy,
) -> None:
    """Every attempt of the store lost its reply; the caller sends the same reply again."""
    store = open_store(proxy.url, namespace="lost", retry=ONE_ATTEMPT)
    g = guard(store)
    prepared = g.prepare(SID, [user("question")])
    answer = reply()
    proxy.arm(sha(store, "append"), "drop_reply")
    with pytest.raises(StoreConnectionError):
        g.complete(SID, answer, prepared=prepared, usage={"prompt_tokens": 9})
    again = g.complete(SID, answer, prepared=prepared, usage={"prompt_tokens": 9})
    assert again.duplicates == (answer.id,)  # a new call: the reply was stored before it
    audit = store.read_audit(SID)
    assert kinds(audit) == ["request", "usage"]
    assert len(store.read(SID)) == 2
    g.close()


@pytest.mark.parametrize("fault", ["refuse", "drop_reply"])
def test_held_records_survive_a_flush_that_failed(proxy: FaultProxy, fault: str) -> None:
    """with_reply: the next prepare writes the held record once its own request is
    stored; if that write fails (or its reply is lost), the prepare still answers and
    the record stays held: a later prepare writes it, once."""
    store = open_store(proxy.url, namespace="lost", retry=ONE_ATTEMPT)
    g = guard(store, audit_mode="with_reply")
    first = g.prepare(SID, [user("one")])  # no complete: the model call failed
    proxy.arm(sha(store, "add_audit"), fault)
    second = g.prepare(SID, [user("two")])  # no complete either
    assert proxy.fired == [fault]
    assert [m.message.content for m in store.read(SID)] == ["one", "two"]
    third = g.prepare(SID, [user("three")])
    g.complete(SID, reply(), prepared=third, usage={"prompt_tokens": 5})
    audit = store.read_audit(SID)
    assert [(r["kind"], r["completed"]) for r in audit] == [
        ("request", False),
        ("request", False),
        ("request", True),
    ]
    assert recorded_ids(store, SID, audit[0]) == [m.id for m in first.messages]
    assert recorded_ids(store, SID, audit[1]) == [m.id for m in second.messages]
    assert_rids_unique(audit)
    g.close()


# -- (b) the server ran the command, the reply was lost: the store retries ------------


def _prime_cache(g: Any) -> None:
    g.prepare(SID, [user("first")])
    g.complete(SID, reply("first answer"))
    assert g.core.cache.get(SID) is not None  # the next prepare takes the cached path


@pytest.mark.parametrize("audit_mode", ["sync", "with_reply"])
def test_cached_prepare_whose_reply_was_lost(proxy: FaultProxy, audit_mode: str) -> None:
    policy = RecordingPolicy()
    store = open_store(proxy.url, namespace="lost", retry=policy)
    g = guard(store, audit_mode=audit_mode)
    _prime_cache(g)
    proxy.arm(sha(store, "window"), "drop_reply")
    question = Message(role="user", content="second")
    prepared = g.prepare(SID, [question])
    assert proxy.fired == ["drop_reply"] and policy.used
    assert prepared.messages[-1].id == question.id
    g.complete(SID, reply("second answer"), prepared=prepared, usage={"prompt_tokens": 3})
    audit = store.read_audit(SID)
    requests = [r for r in audit if r["kind"] == "request"]
    assert [r["turn"] for r in requests] == [1, 2]
    if audit_mode == "sync":
        assert prepared.turn == 2  # the turn the lost attempt was given
        assert kinds(audit) == ["request", "request", "usage"]
    else:
        assert kinds(audit) == ["request", "request"]
    assert_rids_unique(audit)
    assert [m.message.id for m in store.read(SID)].count(question.id) == 1
    assert len(store.read(SID)) == 4
    g.close()


def test_complete_with_usage_whose_reply_was_lost(proxy: FaultProxy) -> None:
    policy = RecordingPolicy()
    store = open_store(proxy.url, namespace="lost", retry=policy)
    g = guard(store)
    prepared = g.prepare(SID, [user("question")])
    answer = reply()
    proxy.arm(sha(store, "append"), "drop_reply")
    result = g.complete(SID, answer, prepared=prepared, usage={"prompt_tokens": 9})
    assert proxy.fired == ["drop_reply"] and policy.used
    assert result.stored == (answer.id,) and result.duplicates == ()  # stored by this call
    assert kinds(store.read_audit(SID)) == ["request", "usage"]
    assert len(store.read(SID)) == 2
    g.close()


STORE_OPS = ["append", "add_audit", "record", "record_with_counts", "append_with_audit"]
STORE_OPS += ["append_with_counts"]


@pytest.mark.parametrize("op", STORE_OPS)
def test_store_writes_whose_reply_was_lost(proxy: FaultProxy, op: str) -> None:
    policy = RecordingPolicy()
    store = open_store(proxy.url, namespace="lost", retry=policy)
    store.append(SID, [new("first", id="m-first")], OPTS)
    message = new("late", id="m-late")
    request = {"turn": 0, "rid": uuid.uuid4().hex, "kind": "request"}
    # counts with a record: one script, record.lua (it checks for both before writing)
    script = {"record": "add_audit", "record_with_counts": "record"}.get(op, op)
    # an append with a record and recounts: one script too, append.lua
    script = {"append_with_audit": "append", "append_with_counts": "append"}.get(script, script)
    proxy.arm(sha(store, script), "drop_reply")

    if op == "append":
        result: Any = store.append(SID, [message], OPTS)
        assert result.stored == ("m-late",) and result.duplicates == ()
    elif op == "add_audit":
        assert store.add_audit(SID, request, retention=10) == 1
    elif op == "record":
        assert store.record(SID, RecordWrite(audit=request, retention=10)) == 1
    elif op == "record_with_counts":
        write = RecordWrite(counter="c1", counts={0: 4}, audit=request, retention=10)
        assert store.record(SID, write) == 1
        assert store.read(SID)[0].tokens == 4
    elif op == "append_with_counts":
        write = RecordWrite(counter="c1", counts={0: 4}, audit={"kind": "usage"}, retention=10)
        result = store.append_with_audit(SID, [message], OPTS, write)
        assert result.stored == ("m-late",) and result.duplicates == ()
        assert store.read(SID)[0].tokens == 4
    else:
        usage = RecordWrite(audit={"kind": "usage"}, retention=10)
        result = store.append_with_audit(SID, [message], OPTS, usage)
        assert result.stored == ("m-late",)

    assert proxy.fired == ["drop_reply"] and policy.used  # lost, then retried
    ids = [m.message.id for m in store.read(SID)]
    appends = op in ("append", "append_with_audit", "append_with_counts")
    assert ids == (["m-first", "m-late"] if appends else ["m-first"])
    audit = store.read_audit(SID)
    assert len(audit) == (0 if op == "append" else 1)
    if audit and audit[0]["kind"] == "request":
        assert audit[0]["turn"] == 1
    store.close()


@pytest.mark.parametrize("attempts", [4, 1])
def test_summary_commit_whose_reply_was_lost_is_recorded_as_committed(
    proxy: FaultProxy, attempts: int
) -> None:
    """Retried by the store (4 attempts), or read back by the guard (1 attempt)."""
    store = open_store(proxy.url, namespace="lost", retry=RetryPolicy(attempts=attempts))
    g = guard(store)
    for i in range(3):
        g.prepare(SID, [user(f"q{i}")])
        g.complete(SID, reply(f"a{i}"))
    proxy.arm(sha(store, "commit_summary"), "drop_reply")
    summary, error = g.summarize(SID, SummaryRequest(None, 0, 0, 4))
    assert proxy.fired == ["drop_reply"]
    assert error is None and summary is not None and summary.version == 1
    stored = store.get_summary(SID)
    assert stored is not None and stored.version == 1 and stored.text == summary.text
    [record] = [r for r in store.read_audit(SID) if r["kind"].startswith("summary")]
    assert record["kind"] == "summary" and record["committed"] is True
    g.close()


def test_summary_commit_lost_before_redis_is_recorded_as_failed(proxy: FaultProxy) -> None:
    store = open_store(proxy.url, namespace="lost", retry=ONE_ATTEMPT)
    g = guard(store)
    for i in range(3):
        g.prepare(SID, [user(f"q{i}")])
        g.complete(SID, reply(f"a{i}"))
    proxy.arm(sha(store, "commit_summary"), "refuse")
    summary, error = g.summarize(SID, SummaryRequest(None, 0, 0, 4))
    assert summary is None and error is not None and "StoreConnectionError" in error
    assert store.get_summary(SID) is None
    [record] = [r for r in store.read_audit(SID) if r["kind"].startswith("summary")]
    assert record["kind"] == "summary_failed" and record["committed"] is False
    g.close()


def test_direct_summary_commit_whose_reply_was_lost(proxy: FaultProxy) -> None:
    store = open_store(proxy.url, namespace="lost", retry=RecordingPolicy())
    store.append(SID, [new("a", id="m-a"), new("b", id="m-b")], OPTS)
    proxy.arm(sha(store, "commit_summary"), "drop_reply")
    assert store.commit_summary(SID, Summary(version=1, text="t", covers_to=1), 0) is True
    assert proxy.fired == ["drop_reply"]
    summary = store.get_summary(SID)
    assert summary is not None and summary.version == 1
    store.close()


# -- the same on the async store ---------------------------------------------------


async def test_async_cached_prepare_and_complete_whose_replies_were_lost(
    proxy: FaultProxy,
) -> None:
    policy = RecordingPolicy()
    store = open_async_store(proxy.url, namespace="lost", retry=policy)
    g = guard(store, cls=AsyncGuard)
    await g.prepare(SID, [user("first")])
    await g.complete(SID, reply("first answer"))
    assert g.core.cache.get(SID) is not None
    proxy.arm(sha(store, "window"), "drop_reply")
    prepared = await g.prepare(SID, [user("second")])
    assert prepared.turn == 2
    answer = reply("second answer")
    proxy.arm(sha(store, "append"), "drop_reply")
    result = await g.complete(SID, answer, prepared=prepared, usage={"prompt_tokens": 3})
    assert result.stored == (answer.id,)
    assert proxy.fired == ["drop_reply", "drop_reply"] and len(policy.used) >= 2
    audit = await store.read_audit(SID)
    assert kinds(audit) == ["request", "request", "usage"]
    assert [r.get("turn") for r in audit] == [1, 2, None]
    assert_rids_unique(audit)
    assert len(await store.read(SID)) == 4
    await g.aclose()


async def test_async_with_reply_complete_that_never_reached_redis(proxy: FaultProxy) -> None:
    store = open_async_store(proxy.url, namespace="lost", retry=ONE_ATTEMPT)
    g = guard(store, cls=AsyncGuard, audit_mode="with_reply")
    prepared = await g.prepare(SID, [user("question")])
    answer = reply()
    proxy.arm(sha(store, "append"), "refuse")
    with pytest.raises(StoreConnectionError):
        await g.complete(SID, answer, prepared=prepared, usage={"prompt_tokens": 9})
    await g.complete(SID, answer, prepared=prepared, usage={"prompt_tokens": 9})
    audit = await store.read_audit(SID)
    assert kinds(audit) == ["request"] and audit[0]["completed"] is True
    await g.aclose()
