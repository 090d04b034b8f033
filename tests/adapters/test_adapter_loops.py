"""An adapter session used from many event loops and threads: one guard per loop, shared
safely by threads, closed by its loop's shutdown, nothing kept for loops that closed.

Frameworks call one session from a new loop per call (``asyncio.run``, the Agents SDK's
``Runner.run_sync``). Each loop needs its own async guard (an async Redis connection
belongs to its loop) and its own ``asyncio.Lock``; once the loop has closed, both must be
let go. Kept in a WeakKeyDictionary they never were: the guard's connections and the lock
refer to their loop, so every call left a guard and an open socket behind.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import gc
import logging
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

import pytest

from ctxguard.adapters._loops import PerLoop
from ctxguard.adapters.openai_agents import CtxGuardSession
from tests.conftest import private_memory_url

CALLS = 60


def open_sockets() -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own descriptor, closed by now
            count += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
    return count


def started(session_id: str, redis_url: str, namespace: str) -> CtxGuardSession:
    """An Agents session over the test Redis that has run once (its first connection)."""
    session = CtxGuardSession(session_id, f"{redis_url}?namespace={namespace}", limit=4096)
    asyncio.run(session.add_items([{"role": "user", "content": "first"}]))
    gc.collect()
    return session


@pytest.mark.redis
def test_a_session_called_from_a_new_loop_each_time_keeps_one_guard(
    redis_url: str, namespace: str
) -> None:
    session = started("loops", redis_url, namespace)
    before = open_sockets()
    for i in range(CALLS):
        asyncio.run(session.add_items([{"role": "user", "content": f"turn {i}"}]))
    gc.collect()
    assert len(session.ref.per_loop) == 0 and len(session._locks) == 1  # guards: closed
    assert open_sockets() <= before + 2  # not one more per call
    items = asyncio.run(session.get_items())
    assert [i["content"] for i in items][-2:] == [f"turn {CALLS - 2}", f"turn {CALLS - 1}"]
    assert len(items) == CALLS + 1


# -- threads: the map of loops is shared by every thread's loop -------------------------


class _ClosedLoop:
    """A closed loop whose ``is_closed`` waits until two threads ask at once (or 0.5 s):
    two threads looking through the map together both find it."""

    def __init__(self, meet: threading.Barrier) -> None:
        self._meet = meet

    def is_closed(self) -> bool:
        with contextlib.suppress(threading.BrokenBarrierError):
            self._meet.wait(timeout=0.5)
        return True


class _OpenLoop:
    def is_closed(self) -> bool:
        return False


def test_two_threads_that_find_the_same_closed_loop_both_go_on() -> None:
    """CI saw ``KeyError`` out of ``add_items``: two threads' loops dropped the same
    closed loop, and the second ``del`` found it gone."""
    per_loop: PerLoop[object] = PerLoop(object)
    per_loop.get_for(_ClosedLoop(threading.Barrier(2)))  # type: ignore[arg-type]
    loops = [_OpenLoop(), _OpenLoop()]
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        made = list(pool.map(per_loop.get_for, loops))  # type: ignore[arg-type]
    assert len(per_loop) == 2 and made[0] is not made[1]
    assert [per_loop.get_for(loop) for loop in loops] == made  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "server",
    [
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("cluster", marks=pytest.mark.cluster),
    ],
)
def test_threads_that_each_run_loops_share_one_session(
    server: str,
    request: pytest.FixtureRequest,
    namespace: str,
    purge_after: Callable[[str], None],
    caplog: pytest.LogCaptureFixture,
) -> None:
    url: str = request.getfixturevalue(f"{server}_url")
    purge_after(url)
    session = CtxGuardSession("threads", url, namespace=namespace, limit=4096)

    def add(n: int) -> None:
        asyncio.run(session.add_items([{"role": "user", "content": f"message {n}"}]))

    with caplog.at_level(logging.WARNING, logger="asyncio"):
        for _ in range(3):  # rounds: each finds the closed loops of the one before
            with concurrent.futures.ThreadPoolExecutor(max_workers=6) as pool:
                list(pool.map(add, range(12)))
        gc.collect()
    items = asyncio.run(session.get_items())
    assert sorted(i["content"] for i in items) == sorted(f"message {n % 12}" for n in range(36))
    # each loop's guard was closed by its loop: no client left open to complain
    assert [r.getMessage() for r in caplog.records] == []


# -- shutdown: a loop's guard is closed by that loop -------------------------------------


def _open_sockets_after(work: Callable[[], Any]) -> int:
    before = open_sockets()
    gc.disable()  # what closes the sockets is the loop's shutdown, not a collection
    try:
        work()
        return open_sockets() - before
    finally:
        gc.enable()


@pytest.mark.redis
def test_asyncio_run_closes_its_loops_guard_before_it_returns(
    redis_url: str, namespace: str
) -> None:
    session = started("closed", redis_url, namespace)
    for i in range(3):
        added = _open_sockets_after(
            lambda i=i: asyncio.run(session.add_items([{"role": "user", "content": f"{i}"}]))
        )
        assert added == 0  # this call's connection closed, not waiting for the next call
    assert len(session.ref.per_loop) == 0  # and nothing kept for the loops that ended


@pytest.mark.redis
def test_a_loop_that_lives_on_after_shutdown_asyncgens_keeps_working(
    redis_url: str, namespace: str, recwarn: pytest.WarningsRecorder
) -> None:
    """The Agents SDK's ``run_sync`` keeps one loop per thread and runs
    ``shutdown_asyncgens()`` after every run."""
    session = CtxGuardSession("lives", f"{redis_url}?namespace={namespace}", limit=4096)
    loop = asyncio.new_event_loop()
    try:
        for i in range(4):
            loop.run_until_complete(session.add_items([{"role": "user", "content": f"{i}"}]))
            loop.run_until_complete(loop.shutdown_asyncgens())
        items = loop.run_until_complete(session.get_items())
    finally:
        loop.close()
    assert [i["content"] for i in items] == ["0", "1", "2", "3"]
    assert len(session.ref.per_loop) <= 1
    assert not [w for w in recwarn if issubclass(w.category, ResourceWarning)]


@pytest.mark.redis
def test_a_loop_closed_without_its_shutdown_is_dropped_quietly(
    redis_url: str, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    unraisable: list[Any] = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    session = CtxGuardSession("bare", f"{redis_url}?namespace={namespace}", limit=4096)
    loop = asyncio.new_event_loop()
    loop.run_until_complete(session.add_items([{"role": "user", "content": "bare loop"}]))
    loop.close()  # no shutdown_asyncgens: the guard cannot be closed on it any more
    asyncio.run(session.add_items([{"role": "user", "content": "next"}]))
    del loop
    gc.collect()
    assert [u.exc_value for u in unraisable] == []
    assert len(session.ref.per_loop) == 0


@pytest.mark.redis
def test_the_llamaindex_store_serves_one_loop_after_another(redis_url: str, namespace: str) -> None:
    """Its async lock used to be one ``asyncio.Lock``: bound to the first loop that waited
    on it, it raised RuntimeError in the next."""
    from llama_index.core.llms import ChatMessage

    from ctxguard.adapters.llamaindex import CtxGuardChatStore

    store = CtxGuardChatStore(f"{redis_url}?namespace={namespace}")
    store.set_messages("k", [ChatMessage(role="user", content=str(i)) for i in range(8)])

    async def two_at_once() -> None:  # the second waits for the first: the lock is used
        await asyncio.gather(store.adelete_last_message("k"), store.adelete_last_message("k"))

    for _ in range(3):
        asyncio.run(two_at_once())
    assert [m.content for m in store.get_messages("k")] == ["0", "1"]


def test_threads_that_first_ask_for_the_sync_guard_at_once_share_one() -> None:
    from ctxguard.adapters._shared import GuardRef

    for _ in range(5):
        ref = GuardRef(private_memory_url(), limit=4096)
        start = threading.Barrier(8)

        def first_call(_: int, ref: GuardRef = ref, start: threading.Barrier = start) -> int:
            start.wait(timeout=5)
            return id(ref.sync())

        with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
            assert len(set(pool.map(first_call, range(8)))) == 1
