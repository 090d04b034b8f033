"""A guard used after close() refuses the call with GuardClosedError, stores nothing,
and does not open its connections again.

Before, every method of a closed guard still worked: redis-py reconnected the pool
close() had released (connections nobody would close again), and the sync guard's
summarizer pool, shut down by close(), answered a summary with a bare RuntimeError
("cannot schedule new futures after shutdown").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from ctxguard import AsyncGuard, CtxGuardError, Guard, GuardClosedError
from ctxguard.guard.plan import SummaryRequest
from ctxguard.stores import open_async_store, open_store
from tests.conftest import private_memory_url
from tests.guard.test_close import connected

pytestmark = pytest.mark.redis

HI = [{"role": "user", "content": "hi"}]
REPLY = {"role": "assistant", "content": "hello"}
SETTINGS: dict[str, Any] = {"counter": "approx", "limit": 400, "max_tokens": 50}


def _calls(guard: Any, prepared: Any) -> dict[str, Any]:
    request = SummaryRequest(previous_text=None, previous_version=0, covers_from=0, covers_to=1)
    return {
        "prepare": lambda: guard.prepare("s", HI),
        "append": lambda: guard.append("s", HI),
        "replace_tail": lambda: guard.replace_tail("s", 0, HI),
        "complete": lambda: guard.complete("s", REPLY, prepared=prepared),
        "summarize": lambda: guard.summarize("s", request),
    }


def test_every_call_on_a_closed_guard_is_refused(redis_url: str, namespace: str) -> None:
    guard = Guard(redis_url, namespace=namespace, **SETTINGS)
    prepared = guard.prepare("s", HI)
    guard.close()
    for name, call in _calls(guard, prepared).items():
        with pytest.raises(GuardClosedError, match="was closed") as caught:
            call()
        assert isinstance(caught.value, CtxGuardError), name
    assert connected(guard.store) == 0  # not reconnected
    guard.close()  # a second close does nothing
    reader = open_store(redis_url, namespace=namespace)
    try:
        assert [m.message.text for m in reader.read("s")] == ["hi"]  # nothing more stored
    finally:
        reader.close()


async def test_every_call_on_a_closed_async_guard_is_refused(
    redis_url: str, namespace: str
) -> None:
    guard = AsyncGuard(redis_url, namespace=namespace, **SETTINGS)
    prepared = await guard.prepare("s", HI)
    await guard.aclose()
    for call in _calls(guard, prepared).values():
        with pytest.raises(GuardClosedError, match="was closed"):
            await call()
    assert connected(guard.store) == 0
    await guard.aclose()
    reader = open_async_store(redis_url, namespace=namespace)
    try:
        assert [m.message.text for m in await reader.read("s")] == ["hi"]
    finally:
        await reader.close()


def test_a_guard_closed_over_a_store_passed_in_is_refused_and_the_store_still_works() -> None:
    store = open_store(private_memory_url())
    guard = Guard(store, **SETTINGS)
    guard.close()
    with pytest.raises(GuardClosedError):
        guard.append("s", HI)
    assert store.read("s") == []
    Guard(store, **SETTINGS).append("s", HI)  # the store is the caller's, still open
    assert len(store.read("s")) == 1


def _summarizer(previous: str | None, messages: Sequence[Any]) -> str:
    return "a summary"


def test_a_summary_that_starts_after_close_is_typed() -> None:
    """A prepare already running when another thread closed the guard reaches the
    summarizer pool close() shut down: a GuardClosedError, not a RuntimeError."""
    guard = Guard(private_memory_url(), summarizer=_summarizer, **SETTINGS)
    assert guard._call_summarizer(None, []) == "a summary"  # (its pool made)
    guard.close()
    # the call that began before close() reaches the summarizer now:
    with pytest.raises(GuardClosedError):
        guard._call_summarizer(None, [])
