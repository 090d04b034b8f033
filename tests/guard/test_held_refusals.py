"""With ``audit_mode="with_reply"`` the previous turn's request record is held for its
``complete``; a prepare refused late (a ``ConflictError`` after its commits, a request
refused on the re-plan after a stale fast commit) wrote it (completed: false) before
giving up. It stays held now: the refused prepare changes nothing stored but its
``refused`` record (tests/store_diff.py), and the record is written by the turn's
``complete`` (with the usage) or by the next prepare that is not refused. On memory://,
Redis and Redis Cluster, Guard and AsyncGuard.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from ctxguard import AsyncGuard, Guard
from ctxguard.errors import BudgetError, ConflictError
from ctxguard.guard import flows, ops
from ctxguard.stores import open_async_store, open_store
from tests import store_diff

SID = "s"
SEEDED = [
    {"role": "system", "content": "be brief", "id": "m-sys"},
    {"role": "user", "content": "hello", "id": "m-u1"},
    {"role": "assistant", "content": "hi", "id": "m-a1"},
]
SETTINGS: dict[str, Any] = {"counter": "approx", "limit": 400, "max_tokens": 60}
# pinned by another writer: it fits with a short question, not with LONG
BIG_SYSTEM = {"role": "system", "content": "word " * 120, "id": "m-big"}
LONG = [{"role": "user", "content": "word " * 80, "id": "m-long"}]
USAGE_OUT = 2


def user(message_id: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"question {message_id}", "id": message_id}]


@pytest.fixture
def no_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    """The waits between a prepare's commits at zero (64 of them otherwise take seconds)."""

    class Zero:
        @staticmethod
        def uniform(low: float, high: float) -> float:
            return 0.0

    monkeypatch.setattr(ops, "random", Zero)


class MovedEveryTime:
    """A store on which, once armed, every commit finds the session moved by another
    writer: its ``commit_if_unchanged`` is given a token the session no longer has,
    so the real store answers as a fetch and writes nothing."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.armed = False
        self.commits = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def commit_if_unchanged(self, session_id: str, token: str, *rest: Any) -> Any:
        if self.armed:
            self.commits += 1
            token = "9" + token  # (another writer's state)
        return self.inner.commit_if_unchanged(session_id, token, *rest)


def _requests(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if r["kind"] == "request"]


def _check_completed(records: list[dict[str, Any]], prepared: Any) -> None:
    """The held record went out once, with the reply, completed with its usage."""
    requests = _requests(records)
    assert len(requests) == 1, requests
    assert requests[0]["completed"] is True
    assert requests[0]["prompt_tokens"] == prepared.tokens
    assert requests[0]["completion_tokens"] == USAGE_OUT


def _usage(prepared: Any) -> dict[str, int]:
    return {"prompt_tokens": prepared.tokens, "completion_tokens": USAGE_OUT}


# -- ConflictError after MAX_COMMITS commits -----------------------------------------


@pytest.mark.usefixtures("no_backoff")
def test_a_conflict_leaves_the_held_record_held(backend: str, namespace: str) -> None:
    inner = open_store(backend, namespace=namespace)
    store = MovedEveryTime(inner)
    guard = Guard(store, **SETTINGS, audit_mode="with_reply")
    try:
        guard.append(SID, SEEDED)
        prepared = guard.prepare(SID, user("q1"))  # its record held
        store.armed = True
        before = store_diff.take(inner, backend)
        with pytest.raises(ConflictError):
            guard.prepare(SID, user("q2"))
        assert store.commits == flows.MAX_COMMITS + 1  # the fast commit, then every plan's
        store_diff.assert_refused_only(before, store_diff.take(inner, backend))
        store.armed = False
        guard.complete(
            SID, {"role": "assistant", "content": "ok"}, prepared=prepared, usage=_usage(prepared)
        )
        _check_completed(inner.read_audit(SID), prepared)
    finally:
        guard.close()
        inner.close()


@pytest.mark.usefixtures("no_backoff")
def test_async_a_conflict_leaves_the_held_record_held(backend: str, namespace: str) -> None:
    async def run() -> None:
        inner = open_async_store(backend, namespace=namespace)
        store = MovedEveryTime(inner)
        guard = AsyncGuard(store, **SETTINGS, audit_mode="with_reply")
        try:
            await guard.append(SID, SEEDED)
            prepared = await guard.prepare(SID, user("q1"))
            store.armed = True
            before = await asyncio.to_thread(store_diff.take, inner, backend)
            with pytest.raises(ConflictError):
                await guard.prepare(SID, user("q2"))
            assert store.commits == flows.MAX_COMMITS + 1
            after = await asyncio.to_thread(store_diff.take, inner, backend)
            store_diff.assert_refused_only(before, after)
            store.armed = False
            reply = {"role": "assistant", "content": "ok"}
            await guard.complete(SID, reply, prepared=prepared, usage=_usage(prepared))
            _check_completed(await inner.read_audit(SID), prepared)
        finally:
            await guard.aclose()
            await store.close()

    asyncio.run(run())


# -- a stale fast commit, then the re-planned request refused ---------------------------


def test_a_request_refused_after_a_stale_fast_commit_leaves_the_held_record_held(
    backend: str, namespace: str
) -> None:
    store = open_store(backend, namespace=namespace)
    guard = Guard(store, **SETTINGS, audit_mode="with_reply")
    other = Guard(store, **SETTINGS)  # another process: our cached window goes stale
    try:
        guard.append(SID, SEEDED)
        prepared = guard.prepare(SID, user("q1"))  # held; the window is cached
        other.append(SID, [BIG_SYSTEM])
        before = store_diff.take(store, backend)
        with pytest.raises(BudgetError):
            guard.prepare(SID, LONG)  # fits the cached window; the fetched one does not
        store_diff.assert_refused_only(before, store_diff.take(store, backend), refused=True)
        # the next prepare that is not refused writes it (no reply came for it)
        nxt = guard.prepare(SID, user("q2"))
        requests = _requests(store.read_audit(SID))
        assert [(r["rid"], r["completed"]) for r in requests] == [
            (prepared.pending_audit["rid"], False)  # type: ignore[index]
        ]
        guard.complete(SID, {"role": "assistant", "content": "ok"}, prepared=nxt, usage=_usage(nxt))
        assert [r["completed"] for r in _requests(store.read_audit(SID))] == [False, True]
    finally:
        other.close()
        guard.close()
        store.close()


def test_async_a_request_refused_after_a_stale_fast_commit_leaves_the_held_record_held(
    backend: str, namespace: str
) -> None:
    async def run() -> None:
        store = open_async_store(backend, namespace=namespace)
        guard = AsyncGuard(store, **SETTINGS, audit_mode="with_reply")
        other = AsyncGuard(store, **SETTINGS)
        try:
            await guard.append(SID, SEEDED)
            prepared = await guard.prepare(SID, user("q1"))
            await other.append(SID, [BIG_SYSTEM])
            before = await asyncio.to_thread(store_diff.take, store, backend)
            with pytest.raises(BudgetError):
                await guard.prepare(SID, LONG)
            after = await asyncio.to_thread(store_diff.take, store, backend)
            store_diff.assert_refused_only(before, after, refused=True)
            reply = {"role": "assistant", "content": "ok"}
            await guard.complete(SID, reply, prepared=prepared, usage=_usage(prepared))
            _check_completed(await store.read_audit(SID), prepared)
        finally:
            await other.aclose()
            await guard.aclose()
            await store.close()

    asyncio.run(run())


# -- the held record's write failing after the request is stored -------------------------


class FailingRecord:
    """A store whose ``record`` (the held records' write) fails while armed."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.armed = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def record(self, *args: Any) -> Any:
        if self.armed:
            from ctxguard.errors import StoreConnectionError

            raise StoreConnectionError("lost the connection before record")
        return self.inner.record(*args)


def test_a_held_record_that_cannot_be_written_stays_held(backend: str, namespace: str) -> None:
    """Held records are written once the request is stored; if that write fails, the
    prepare still answers (its request is stored) and the records stay held."""
    inner = open_store(backend, namespace=namespace)
    store = FailingRecord(inner)
    guard = Guard(store, **SETTINGS, audit_mode="with_reply")
    try:
        guard.append(SID, SEEDED)
        first = guard.prepare(SID, user("q1"))
        store.armed = True
        second = guard.prepare(SID, user("q2"))  # stored; the held record not written
        assert [m.id for m in second.messages][-1] == "q2"
        assert [m.message.id for m in inner.read(SID)][-1] == "q2"
        assert _requests(inner.read_audit(SID)) == []
        store.armed = False
        guard.complete(SID, {"role": "assistant", "content": "a1"}, prepared=first)
        guard.complete(SID, {"role": "assistant", "content": "a2"}, prepared=second)
        rids = [r["rid"] for r in _requests(inner.read_audit(SID))]
        assert rids == [first.pending_audit["rid"], second.pending_audit["rid"]]  # type: ignore[index]
    finally:
        guard.close()
        inner.close()
