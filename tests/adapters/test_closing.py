"""An adapter opened from a store URL closes the guard it opened; never one passed in.

(Nothing closed it: the Redis connection pool of every ``CtxGuardChatMessageHistory(url,
sid)`` lived until garbage collection, and on a long-lived event loop the AsyncGuard of
every session made there lived as long as the loop.) Each test names its connections
(``client_name``) and counts them in the private Redis' ``CLIENT LIST``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from ctxguard.guard import AsyncGuard, Guard
from tests.conftest import raw_client

pytestmark = pytest.mark.redis


@pytest.fixture
def named(redis_url: str, redis_namespace: str) -> Iterator[tuple[str, Callable[[], int]]]:
    """A store URL whose connections carry a name of their own, and their count."""
    name = f"ctxg-close-{uuid.uuid4().hex[:10]}"
    sep = "&" if "?" in redis_url else "?"
    raw = raw_client(redis_url)

    def connections() -> int:
        return sum(1 for c in raw.client_list() if c.get("name") == name)

    yield f"{redis_url}{sep}client_name={name}", connections
    raw.close()


def _gone(connections: Callable[[], int]) -> int:
    """The count once the server has seen the closed sockets (it drops them on its next
    turn of its event loop, not always before CLIENT LIST answers)."""
    deadline = time.monotonic() + 10
    while connections() and time.monotonic() < deadline:
        time.sleep(0.02)
    return connections()


def _langchain(url: Any, **options: Any) -> Any:
    pytest.importorskip("langchain_core")
    from langchain_core.messages import HumanMessage

    from ctxguard.adapters.langchain import CtxGuardChatMessageHistory

    history = CtxGuardChatMessageHistory(url, "s", **options)
    history.add_messages([HumanMessage("hi")])
    return history


def _chat_store(url: Any, **options: Any) -> Any:
    pytest.importorskip("llama_index.core")
    from llama_index.core.llms import ChatMessage

    from ctxguard.adapters.llamaindex import CtxGuardChatStore

    store = CtxGuardChatStore(url, **options)
    store.add_message("s", ChatMessage(role="user", content="hi"))
    return store


def _memory(url: Any, **options: Any) -> Any:
    pytest.importorskip("llama_index.core")
    from llama_index.core.llms import ChatMessage

    from ctxguard.adapters.llamaindex import CtxGuardMemory

    memory = CtxGuardMemory.from_defaults(url, session_id="s", **options)
    memory.put(ChatMessage(role="user", content="hi"))
    return memory


@pytest.mark.parametrize("make", [_langchain, _chat_store, _memory])
def test_close_releases_the_connections_of_a_url_opened_guard(
    make: Callable[..., Any],
    named: tuple[str, Callable[[], int]],
    redis_namespace: str,
) -> None:
    url, connections = named
    adapter = make(url, namespace=redis_namespace)
    assert connections() > 0
    adapter.close()
    assert _gone(connections) == 0
    adapter.close()  # idempotent
    with make(url, namespace=redis_namespace) as again:  # a context manager too
        assert connections() > 0
    assert again is not adapter and _gone(connections) == 0


@pytest.mark.parametrize("make", [_langchain, _chat_store, _memory])
def test_a_guard_passed_in_stays_open(
    make: Callable[..., Any],
    named: tuple[str, Callable[[], int]],
    redis_namespace: str,
) -> None:
    url, connections = named
    guard = Guard(url, namespace=redis_namespace, limit=400, counter="approx")
    try:
        adapter = make(guard)
        adapter.close()
        assert connections() > 0
        assert [m.message.text for m in guard.store.read("s")] == ["hi"]
    finally:
        guard.close()
    assert _gone(connections) == 0


async def test_aclose_releases_this_loops_async_guard(
    named: tuple[str, Callable[[], int]], redis_namespace: str
) -> None:
    pytest.importorskip("langchain_core")
    from langchain_core.messages import HumanMessage

    from ctxguard.adapters.langchain import CtxGuardChatMessageHistory

    url, connections = named
    async with CtxGuardChatMessageHistory(url, "a", namespace=redis_namespace) as history:
        await history.aadd_messages([HumanMessage("hi")])
        assert [m.content for m in await history.aget_messages()] == ["hi"]
        assert connections() > 0
    assert _gone(connections) == 0


async def test_an_agents_session_closes_its_guards(
    named: tuple[str, Callable[[], int]], redis_namespace: str
) -> None:
    pytest.importorskip("agents")
    from ctxguard.adapters.openai_agents import CtxGuardSession

    url, connections = named
    session = CtxGuardSession("a", url, namespace=redis_namespace)
    await session.add_items([{"role": "user", "content": "hi"}])
    assert connections() > 0
    await session.close()
    assert _gone(connections) == 0
    await session.close()
    aguard = AsyncGuard(url, namespace=redis_namespace, limit=400, counter="approx")
    try:
        async with CtxGuardSession("a", aguard) as passed:
            assert len(await passed.get_items()) == 1
        assert connections() > 0  # the AsyncGuard passed in is left open
        assert len(await aguard.store.read("a")) == 1
    finally:
        await aguard.aclose()
