"""One AsyncGuard met by several event loops, on Redis and Redis Cluster.

Async Redis connections belong to the loop that opened them. Before: loops running at
the same time in two threads took each other's connections (a hang in ``select()``,
or "lost its connection (RuntimeError inside redis-py)"), and ``aclose()`` from a later
``asyncio.run`` raised a bare ``RuntimeError: Event loop is closed``. Now the first
loop owns the store; another loop running at the same time gets a one-line ConfigError
before any connection is touched; once the owning loop has closed or stopped, the next
loop takes the store over with a new client, so ``asyncio.run`` after ``asyncio.run``
keeps working, and so does a framework's ``run_sync`` loop kept per thread.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from ctxguard import AsyncGuard
from ctxguard.errors import ConfigError

pytestmark = pytest.mark.filterwarnings("ignore::ResourceWarning")  # dropped dead-loop sockets


@pytest.fixture(
    params=[
        pytest.param("redis_url", marks=pytest.mark.redis),
        pytest.param("cluster_url", marks=pytest.mark.cluster),
    ]
)
def url(request: pytest.FixtureRequest, namespace: str) -> str:
    value: str = request.getfixturevalue(request.param)
    return value


def guard(url: str, namespace: str) -> AsyncGuard:
    return AsyncGuard(url, counter="approx", limit=4096, namespace=namespace)


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


async def turns(g: AsyncGuard, tag: str, sessions: int = 4) -> None:
    """A prepare in each of ``sessions`` sessions at once (the pool opens several
    connections, and a cluster client meets its first-use lock)."""
    await asyncio.gather(*(g.prepare(f"{tag}-{n}", [user(tag)]) for n in range(sessions)))


class LoopThread:
    """An event loop running in a thread of its own until stopped and closed."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    def close(self) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)
        self.loop.close()


@pytest.fixture
def other_loop() -> Iterator[LoopThread]:
    running = LoopThread()
    yield running
    running.close()


def refused(exc: pytest.ExceptionInfo[ConfigError]) -> None:
    text = str(exc.value)
    assert "another event loop running in another thread" in text
    assert "one AsyncGuard or async store per event loop" in text and "PerLoop" in text
    assert "\n" not in text and len(text) <= 300


def test_asyncio_run_after_asyncio_run_keeps_working_and_closes(url: str, namespace: str) -> None:
    g = guard(url, namespace)
    for run in range(3):
        asyncio.run(turns(g, f"run{run}"))
    asyncio.run(g.aclose())  # from a loop of its own, after the others closed: no error

    async def counts() -> list[int]:
        again = guard(url, namespace)
        try:
            infos = [await again.store.info(f"run{r}-{n}") for r in range(3) for n in range(4)]
            return [0 if i is None else i.message_count for i in infos]
        finally:
            await again.aclose()

    assert asyncio.run(counts()) == [1] * 12


def test_a_second_running_loop_is_refused_before_any_connection(
    url: str, namespace: str, other_loop: LoopThread
) -> None:
    g = guard(url, namespace)
    other_loop.run(turns(g, "first"))  # the loop in the other thread owns the store now

    with pytest.raises(ConfigError) as exc:
        asyncio.run(g.prepare("second", [user("x")]))
    refused(exc)
    with pytest.raises(ConfigError) as exc:  # nor closed from here: close it on its loop
        asyncio.run(g.aclose())
    refused(exc)

    assert other_loop.run(g.store.info("second")) is None  # nothing was stored
    other_loop.run(turns(g, "first"))  # its own loop still works on it
    other_loop.close()
    asyncio.run(turns(g, "after"))  # that loop closed: this one takes the store over
    asyncio.run(g.aclose())


def test_a_stopped_loop_hands_the_store_on_and_takes_it_back(url: str, namespace: str) -> None:
    """A loop kept open between runs (a thread's loop for a framework's ``run_sync``)
    runs no code while stopped, so another loop may take the store over, and it back."""
    g = guard(url, namespace)
    kept = asyncio.new_event_loop()
    try:
        kept.run_until_complete(turns(g, "kept"))
        asyncio.run(turns(g, "other"))  # `kept` is stopped, not closed
        kept.run_until_complete(turns(g, "kept"))  # and takes it back
        kept.run_until_complete(g.aclose())

        async def counts() -> list[int]:
            again = guard(url, namespace)
            try:
                names = [f"{tag}-{n}" for tag in ("kept", "other") for n in range(4)]
                infos = [await again.store.info(name) for name in names]
                return [0 if i is None else i.message_count for i in infos]
            finally:
                await again.aclose()

        assert asyncio.run(counts()) == [2] * 4 + [1] * 4
    finally:
        kept.close()


def test_two_threads_with_loops_running_at_once(url: str, namespace: str) -> None:
    """Each thread's loop runs turns while the other's runs: one owns the store, the
    other's every call is the ConfigError (before: hangs, RuntimeErrors)."""
    g = guard(url, namespace)
    started, done = threading.Barrier(2), threading.Barrier(2)  # both loops run throughout
    outcomes: dict[str, list[str]] = {"a": [], "b": []}

    async def worker(tag: str) -> None:
        for n in range(20):
            try:
                await turns(g, f"{tag}{n}")
                outcomes[tag].append("ok")
            except ConfigError as exc:
                refused_text = str(exc)
                assert "another event loop running in another thread" in refused_text
                outcomes[tag].append("refused")
            if n == 0:
                await asyncio.to_thread(started.wait, 30)
        await asyncio.to_thread(done.wait, 30)

    threads = [threading.Thread(target=asyncio.run, args=(worker(t),)) for t in outcomes]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not any(thread.is_alive() for thread in threads)
    assert {frozenset(o) for o in outcomes.values()} == {
        frozenset({"ok"}),
        frozenset({"refused"}),
    }
    asyncio.run(g.aclose())  # both loops have closed: dropped without them


def test_a_closed_loops_sockets_are_closed_when_the_next_loop_takes_over(
    url: str, namespace: str
) -> None:
    """(they stayed open until the garbage collector found their transports: a file
    descriptor per connection per ``asyncio.run`` meanwhile, and under ``python -X dev``
    "unclosed transport", "unclosed socket" and "loop is closed" ResourceWarnings)"""
    import gc
    import warnings

    from ctxguard.stores.redis_loops import _connections

    g = guard(url, namespace)
    asyncio.run(turns(g, "first"))
    old = [c._writer.transport for c in _connections(g.store.client) if c._writer is not None]
    assert old
    gc.collect()  # (what earlier tests left)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        asyncio.run(turns(g, "second"))  # takes the store over from the closed loop
        assert all(t.is_closing() and t.get_extra_info("socket").fileno() == -1 for t in old)
        del old
        gc.collect()
    said = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
    assert said == []
    asyncio.run(g.aclose())
