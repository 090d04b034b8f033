"""Summaries never lose or corrupt anything, whatever the summarizer does."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Sequence
from typing import Any

import pytest

from ctxguard import Message
from ctxguard.guard import AsyncGuard, ExtractiveSummarizer, Guard
from ctxguard.guard.policies import tool_problems
from tests.conftest import private_memory_url

SYSTEM = {"role": "system", "content": "You are terse."}


def chat(i: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"question number {i} " + "about things " * 8}]


def reply(i: int) -> dict[str, str]:
    return {"role": "assistant", "content": f"answer number {i}. " + "it depends " * 8}


def failing(_: str | None, __: Sequence[Message]) -> str:
    raise RuntimeError("model overloaded")


def hanging(_: str | None, __: Sequence[Message]) -> str:
    time.sleep(3)
    return "too late"


def too_long(_: str | None, __: Sequence[Message]) -> str:
    return "word " * 5000


def not_text(_: str | None, __: Sequence[Message]) -> Any:
    return {"summary": "a dict is not text"}


BAD = [
    pytest.param(failing, "RuntimeError", id="raises"),
    pytest.param(hanging, "timed out", id="hangs"),
    pytest.param(too_long, "over summary_max_tokens", id="too-long"),
    pytest.param(not_text, "not non-empty text", id="not-text"),
]


def guard_kwargs(summarizer: Any) -> dict[str, Any]:
    return dict(
        counter="tiktoken:cl100k_base",
        limit=400,
        max_tokens=50,
        summarizer=summarizer,
        summarize_after=4,
        summary_timeout=0.5,
        summary_max_tokens=200,
    )


def assert_failure_recorded(
    guard_audit: list[dict[str, Any]], reqs: list[Any], needle: str
) -> None:
    for req in reqs:
        assert req.tokens + req.reserved_output <= req.limit
        assert tool_problems(req.messages) == []
        assert req.summary_version == 0  # a failed summary never becomes content
    failures = [r for r in guard_audit if r["kind"] == "summary_failed"]
    assert failures and all(needle in r["error"] for r in failures)
    decided = [d for r in guard_audit if r["kind"] == "request" for d in r.get("decisions", [])]
    assert any(d["policy"] == "summary_failed" for d in decided)


@pytest.mark.parametrize(("summarizer", "needle"), BAD)
def test_bad_summarizer_never_becomes_content_sync(summarizer: Any, needle: str) -> None:
    guard = Guard(f"memory://{uuid.uuid4().hex}", **guard_kwargs(summarizer))
    guard.append("s", [SYSTEM])
    reqs = []
    for i in range(10):
        reqs.append(guard.prepare("s", chat(i)))
        guard.complete("s", reply(i))
    assert_failure_recorded(guard.store.read_audit("s"), reqs, needle)
    assert len(guard.store.read("s")) == 21  # nothing lost
    guard.close()


@pytest.mark.parametrize(("summarizer", "needle"), BAD)
async def test_bad_summarizer_never_becomes_content_async(summarizer: Any, needle: str) -> None:
    guard = AsyncGuard(f"memory://{uuid.uuid4().hex}", **guard_kwargs(summarizer))
    await guard.append("s", [SYSTEM])
    reqs = []
    for i in range(10):
        reqs.append(await guard.prepare("s", chat(i)))
        await guard.complete("s", reply(i))
    assert_failure_recorded(await guard.store.read_audit("s"), reqs, needle)
    await guard.aclose()


async def test_async_summarizer_is_awaited_and_committed() -> None:
    async def summarize(previous: str | None, messages: Sequence[Message]) -> str:
        await asyncio.sleep(0)
        return (previous or "") + f" {len(messages)} folded"

    guard = AsyncGuard(private_memory_url(), **guard_kwargs(summarize))
    await guard.append("s", [SYSTEM])
    for i in range(12):
        req = await guard.prepare("s", chat(i))
        await guard.complete("s", reply(i))
    assert req.summary_version >= 1
    assert req.messages[1].id == f"ctxguard-summary-v{req.summary_version}"
    assert req.tokens + req.reserved_output <= req.limit


def test_extractive_summary_is_inserted_and_counted_within_budget() -> None:
    guard = Guard(private_memory_url(), **guard_kwargs(ExtractiveSummarizer(max_chars=300)))
    guard.append("s", [SYSTEM])
    for i in range(12):
        req = guard.prepare("s", chat(i))
        guard.complete("s", reply(i))
    summary = guard.store.get_summary("s")
    assert summary is not None and req.summary_version == summary.version
    sent = req.messages[1]
    assert sent.role == "system" and summary.text in sent.text
    assert req.summary_version and req.tokens == guard.counter.count_request(list(req.messages))
    first_window_seq = req.sent_seqs[1]
    assert first_window_seq >= summary.covers_to  # no overlap with what it covers


class RecordingSummarizer:
    """Deterministic: the summary lists every folded message id, so coverage is checkable."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.lock = threading.Lock()

    def __call__(self, previous: str | None, messages: Sequence[Message]) -> str:
        time.sleep(0.01)  # let writers race the commit
        ids = [m.id for m in messages]
        with self.lock:
            self.calls.append(ids)
        return " ".join(filter(None, [previous, *ids]))


@pytest.mark.redis
def test_background_summaries_race_four_writers_without_loss(
    redis_url: str, redis_namespace: str
) -> None:
    summarizer = RecordingSummarizer()
    guard = Guard(
        redis_url,
        namespace=redis_namespace,
        counter="tiktoken:cl100k_base",
        limit=600,
        max_tokens=50,
        summarizer=summarizer,
        summarize_after=6,
        summary_mode="background",
        summary_max_tokens=100_000,
    )
    session = "race"
    guard.append(session, [SYSTEM])
    per_writer = 150

    def writer(w: int) -> None:
        for k in range(per_writer):
            guard.append(
                session, [{"role": "user", "content": f"w{w} m{k}", "id": f"w{w}-{k:04d}"}]
            )

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    prepared = 0
    while any(t.is_alive() for t in threads):
        req = guard.prepare(session)
        assert req.tokens + req.reserved_output <= req.limit
        prepared += 1
    for t in threads:
        t.join()
    guard.prepare(session)
    guard.wait_for_summaries(timeout=30)

    stored = guard.store.read(session)
    ids = [s.message.id for s in stored]
    assert len(ids) == len(set(ids)) == 1 + 4 * per_writer  # nothing lost, nothing doubled
    for w in range(4):
        mine = [i for i in ids if i.startswith(f"w{w}-")]
        assert mine == sorted(mine)  # each writer's order kept
    summary = guard.store.get_summary(session)
    assert summary is not None and summary.version >= 1 and prepared > 0
    covered = [s.message.id for s in stored[: summary.covers_to] if s.message.role != "system"]
    assert summary.text.split() == covered  # the chain of summaries covers exactly its range
    guard.close()


@pytest.mark.timeout(120)
def test_four_background_summaries_at_once_each_get_their_summarizer_call() -> None:
    # background summaries and their summarizer calls shared one pool of 4 threads: four
    # summaries at once held all four, their calls queued behind them, and each failed
    # ("summarizer timed out") after summary_timeout with its summarizer never run
    together = threading.Barrier(4, timeout=30)  # the first four calls must run at once
    calls: list[str] = []
    lock = threading.Lock()

    def summarizer(previous: str | None, messages: Sequence[Message]) -> str:
        with lock:
            calls.append(messages[0].text)
            first_four = len(calls) <= 4
        if first_four:
            together.wait()
        return "SUMMARY"

    guard = Guard(
        private_memory_url(),
        counter="approx",
        limit=300,
        max_tokens=40,
        summarizer=summarizer,
        summarize_after=3,
        summary_mode="background",
        summary_timeout=20,
    )
    sessions = [f"s{n}" for n in range(4)]
    for i in range(6):
        for session in sessions:
            guard.prepare(session, chat(i))
            guard.complete(session, reply(i))
    guard.wait_for_summaries(timeout=60)
    failed = [
        r for s in sessions for r in guard.store.read_audit(s) if r["kind"] == "summary_failed"
    ]
    assert failed == [] and len(calls) >= 4 and not together.broken
    for session in sessions:
        summary = guard.store.get_summary(session)
        assert summary is not None and summary.text == "SUMMARY"
    guard.close()
