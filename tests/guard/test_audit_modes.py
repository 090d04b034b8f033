"""Audit records: written before prepare returns, or together with the reply."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from ctxguard import AsyncGuard, Guard
from ctxguard.guard.replay import ReplayOverrides, core_for_record, replay_records
from tests.conftest import recorded_ids

SYSTEM = {"role": "system", "content": "Be brief."}


def user(i: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"question {i} " + "and more words " * 6}]


def requests(audit: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in audit if r["kind"] == "request"]


def test_sync_mode_numbers_each_request_before_it_is_sent() -> None:
    guard = Guard(f"memory://{uuid.uuid4().hex}", counter="approx", limit=300, max_tokens=40)
    guard.append("s", [SYSTEM])
    for i in range(4):
        req = guard.prepare("s", user(i))
        assert req.turn == i + 1
        assert requests(guard.store.read_audit("s"))[-1]["turn"] == req.turn
        guard.complete(
            "s",
            {"role": "assistant", "content": "ok"},
            prepared=req,
            usage={"prompt_tokens": req.tokens + 2},
        )
    usage = [r for r in guard.store.read_audit("s") if r["kind"] == "usage"]
    assert [(u["of_turn"], u["drift"]) for u in usage] == [(t, 2) for t in range(1, 5)]


def test_with_reply_mode_writes_one_record_per_turn_with_the_usage() -> None:
    guard = Guard(
        f"memory://{uuid.uuid4().hex}",
        counter="approx",
        limit=300,
        max_tokens=40,
        audit_mode="with_reply",
    )
    guard.append("s", [SYSTEM])
    for i in range(6):
        req = guard.prepare("s", user(i))
        assert (
            req.turn == 0
            and requests(guard.store.read_audit("s")) == requests(guard.store.read_audit("s"))[:i]
        )
        guard.complete(
            "s",
            {"role": "assistant", "content": "ok"},
            prepared=req,
            usage={"prompt_tokens": req.tokens - 1},
        )
    records = requests(guard.store.read_audit("s"))
    assert [r["turn"] for r in records] == list(range(1, 7))
    assert all(r["completed"] and r["drift"] == -1 for r in records)
    assert not [r for r in guard.store.read_audit("s") if r["kind"] == "usage"]
    history = guard.store.read("s")
    core = core_for_record(guard.counter, records[0], ReplayOverrides())
    assert all(t.same for t in replay_records(core, history, guard.store.read_audit("s")))


def test_with_reply_mode_keeps_requests_whose_reply_never_came() -> None:
    guard = Guard(
        f"memory://{uuid.uuid4().hex}",
        counter="approx",
        limit=300,
        max_tokens=40,
        audit_mode="with_reply",
    )
    first = guard.prepare("s", user(1))  # the model call failed: no complete()
    second = guard.prepare("s", user(2))  # the held record is written first
    records = requests(guard.store.read_audit("s"))
    assert [(recorded_ids(guard.store, "s", r), r["completed"]) for r in records] == [
        (list(m.id for m in first.messages), False)
    ]
    guard.prepare("t", user(3))
    guard.close()  # close writes what is still held, for every session
    assert [recorded_ids(guard.store, "s", r) for r in requests(guard.store.read_audit("s"))][
        -1
    ] == [m.id for m in second.messages]
    assert len(requests(guard.store.read_audit("t"))) == 1


@pytest.mark.redis
async def test_with_reply_mode_on_redis_async(redis_url: str, redis_namespace: str) -> None:
    guard = AsyncGuard(
        redis_url,
        namespace=redis_namespace,
        counter="tiktoken:cl100k_base",
        limit=300,
        max_tokens=40,
        audit_mode="with_reply",
    )
    await guard.append("s", [SYSTEM])
    for i in range(5):
        req = await guard.prepare("s", user(i))
        await guard.complete(
            "s",
            {"role": "assistant", "content": "ok"},
            prepared=req,
            usage={"prompt_tokens": req.tokens},
        )
    records = requests(await guard.store.read_audit("s"))
    assert [r["turn"] for r in records] == [1, 2, 3, 4, 5] and all(r["drift"] == 0 for r in records)
    await guard.aclose()


def test_with_reply_mode_holds_every_record_of_concurrent_prepares() -> None:
    """Two prepares of one session in flight at once (threads of one guard): each held
    record is kept; complete() takes its own, the next prepare writes the other."""
    guard = Guard(
        f"memory://{uuid.uuid4().hex}",
        counter="approx",
        limit=300,
        max_tokens=40,
        audit_mode="with_reply",
    )
    first = guard.prepare("s", user(1))
    held = guard.core.take("s", None)  # as if a second prepare ran between flush and hold:
    assert held is not None
    second = guard.prepare("s", user(2))  # ... both records are held at once
    guard.core.put_back([held])
    guard.complete("s", {"role": "assistant", "content": "ok"}, prepared=first, usage={})
    guard.prepare("s", user(3))  # writes the other held record, not completed
    records = requests(guard.store.read_audit("s"))
    assert [(r["rid"], r["completed"]) for r in records] == [
        (first.pending_audit["rid"], True),  # type: ignore[index]
        (second.pending_audit["rid"], False),  # type: ignore[index]
    ]
    guard.close()
    assert len(requests(guard.store.read_audit("s"))) == 3


def test_with_reply_complete_never_takes_another_prepares_record() -> None:
    guard = Guard(
        f"memory://{uuid.uuid4().hex}",
        counter="approx",
        limit=300,
        max_tokens=40,
        audit_mode="with_reply",
    )
    first = guard.prepare("s", user(1))
    second = guard.prepare("s", user(2))  # writes the first record (no reply yet)
    guard.complete("s", {"role": "assistant", "content": "late"}, prepared=first, usage={})
    guard.complete("s", {"role": "assistant", "content": "ok"}, prepared=second, usage={})
    audit = guard.store.read_audit("s")
    assert [(r["kind"], r.get("completed")) for r in audit] == [
        ("request", False),
        ("usage", None),  # the late reply to the first request
        ("request", True),  # the second request, completed by its own reply
    ]
    assert audit[2]["rid"] == second.pending_audit["rid"]  # type: ignore[index]
