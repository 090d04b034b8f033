"""The guard's full turn on a real Redis Cluster: prepare, complete, summaries, audit.

Sessions are chosen so their hash tags land on different primaries, so the
same scripts are shown to run wherever a session lives.
"""

from __future__ import annotations

from typing import Any

import pytest
import redis
from redis.crc import key_slot

from ctxguard.guard import AsyncGuard, ExtractiveSummarizer, Guard
from ctxguard.guard.policies import tool_problems
from ctxguard.stores.keys import KeySpace
from ctxguard.stores.urls import parse_store_url

pytestmark = [pytest.mark.cluster]
SYSTEM = {"role": "system", "content": "You are terse."}
TURNS = 10


def chat(i: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"question number {i} " + "about things " * 8}]


def reply(i: int) -> dict[str, str]:
    return {"role": "assistant", "content": f"answer number {i}. " + "it depends " * 8}


def primaries_by_slot(url: str) -> list[tuple[int, int, int]]:
    host, port = parse_store_url(url).hosts[0]
    client = redis.Redis(host=host, port=port)
    try:
        return [(int(s), int(e), int(p[1])) for s, e, p, *_ in client.cluster("slots")]
    finally:
        client.close()


def sessions_on_every_primary(url: str, namespace: str) -> list[str]:
    """One session id per primary, found by hashing candidate ids."""
    ranges = primaries_by_slot(url)
    found: dict[int, str] = {}
    space = KeySpace(namespace)
    for n in range(10_000):
        sid = f"chat-{n}"
        slot = key_slot(space.session_keys(sid)[0].encode())
        owner = next(p for s, e, p in ranges if s <= slot <= e)
        found.setdefault(owner, sid)
        if len(found) == len(ranges):
            break
    assert len(found) == len(ranges) >= 3
    return list(found.values())


def settings() -> dict[str, Any]:
    return dict(
        counter="tiktoken:cl100k_base",
        limit=400,
        max_tokens=50,
        summarizer=ExtractiveSummarizer(max_chars=300),
        summarize_after=4,
        summary_max_tokens=200,
    )


def check_session(req: Any, audit: list[dict[str, Any]], stored: int, summary: Any) -> None:
    assert req.tokens + req.reserved_output <= req.limit
    assert tool_problems(req.messages) == []
    assert stored == 1 + 2 * TURNS  # nothing lost by trimming or summarising
    assert summary is not None and summary.version >= 1 and req.summary_version >= 1
    kinds = [r["kind"] for r in audit]
    assert kinds.count("request") == TURNS and kinds.count("usage") == TURNS
    assert "summary" in kinds
    turns = [r["turn"] for r in audit if r["kind"] == "request"]
    assert turns == list(range(1, TURNS + 1))  # numbered by the store, in order


def test_guard_turns_on_cluster(cluster_url: str, namespace: str, purge_after: Any) -> None:
    purge_after(cluster_url)
    guard = Guard(cluster_url, namespace=namespace, **settings())
    sessions = sessions_on_every_primary(cluster_url, namespace)
    for sid in sessions:
        guard.append(sid, [SYSTEM])
    for i in range(TURNS):
        for sid in sessions:
            req = guard.prepare(sid, chat(i))
            guard.complete(sid, reply(i), prepared=req, usage={"prompt_tokens": req.tokens})
    for sid in sessions:
        req = guard.prepare(sid)
        audit = guard.store.read_audit(sid)[:-1]  # the last prepare is not a full turn
        check_session(req, audit, len(guard.store.read(sid)), guard.store.get_summary(sid))
    assert sorted(guard.store.list_sessions()) == sorted(sessions)
    guard.close()


async def test_async_guard_turns_on_cluster(
    cluster_url: str, namespace: str, purge_after: Any
) -> None:
    purge_after(cluster_url)
    guard = AsyncGuard(cluster_url, namespace=namespace, **settings())
    sessions = sessions_on_every_primary(cluster_url, namespace)
    for sid in sessions:
        await guard.append(sid, [SYSTEM])
    for i in range(TURNS):
        for sid in sessions:
            req = await guard.prepare(sid, chat(i))
            await guard.complete(sid, reply(i), prepared=req, usage={"prompt_tokens": req.tokens})
    for sid in sessions:
        req = await guard.prepare(sid)
        audit = (await guard.store.read_audit(sid))[:-1]
        stored = len(await guard.store.read(sid))
        check_session(req, audit, stored, await guard.store.get_summary(sid))
    assert sorted([s async for s in guard.store.list_sessions()]) == sorted(sessions)
    await guard.aclose()
