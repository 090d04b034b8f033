"""SeenIds (Pydantic AI capability, LangChain middleware) after the session was deleted.

The capability and the middleware remember which message ids they stored, so a run
does not count them again. That memory outlived the session: after
``guard.store.delete(sid)``, the next run passing the same history stored only its
new messages, and ``load()`` gave back a history missing everything before. Now the
set keeps the state token our last write left; the next append (made anyway) reports
the token it found, and when they differ the run's messages are laid back in order.
On a turn where nothing changed elsewhere no read is added. A call that brings no
new message (an invoke on the thread's state alone) writes only its reply: that write
lays the run back too (it left the session holding the reply alone).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from ctxguard.guard import AsyncGuard, Guard

from .watched_store import WatchedStore


class Reads:
    """A store wrapper counting ``read_with_token`` calls (the relay's one read)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.reads = 0

    def __getattr__(self, name: str) -> Any:
        if name == "read_with_token":
            self.reads += 1
        return getattr(self.inner, name)


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("which", ["guard", "aguard"])
async def test_pydantic_ai_run_after_the_session_was_deleted_stores_it_all(
    store_url: str, namespace: str, mode: str, which: str
) -> None:
    pytest.importorskip("pydantic_ai")
    if which == "aguard" and mode == "sync":
        pytest.skip("an AsyncGuard belongs to one event loop (run_sync makes its own)")
    from ctxguard.adapters.pydantic_ai import CtxGuardCapability, dump

    from .test_pydantic_ai import weather_agent, weather_model

    kind = AsyncGuard if which == "aguard" else Guard
    guard = kind(store_url, namespace=namespace, limit=4000, counter="approx")
    capability = CtxGuardCapability(guard, session_id="s", max_tokens=64)
    agent = weather_agent(weather_model([]), capability)

    async def run(prompt: str, history: list[Any]) -> list[Any]:
        if mode == "sync":
            result = await asyncio.to_thread(agent.run_sync, prompt, message_history=history)
        else:
            result = await agent.run(prompt, message_history=history)
        return list(result.all_messages())

    first = await run("turn 1: what is the weather like today?", [])
    if isinstance(guard, AsyncGuard):
        await guard.store.delete("s")
    else:
        guard.store.delete("s")
    second = await run("turn 2: and now?", first)
    assert [dump(m) for m in await capability.aload()] == [dump(m) for m in second]
    if isinstance(guard, AsyncGuard):
        audit = await guard.store.read_audit("s")
    else:
        audit = guard.store.read_audit("s")
    replies = len(second) - len(first)  # each of run 2's replies with the usage it reported
    assert len([r for r in audit if r["kind"] == "usage"]) == replies // 2
    third = await run("turn 3: and tomorrow?", second)  # as before, from here on
    assert [dump(m) for m in await capability.aload()] == [dump(m) for m in third]
    if isinstance(guard, AsyncGuard):
        await guard.aclose()
    else:
        guard.close()


def test_pydantic_ai_common_turn_adds_no_read(store_url: str, namespace: str) -> None:
    pytest.importorskip("pydantic_ai")
    from ctxguard.adapters.pydantic_ai import CtxGuardCapability

    from .test_pydantic_ai import weather_agent, weather_model

    plain = Guard(store_url, namespace=namespace, limit=4000, counter="approx")
    store = Reads(plain.store)
    guard = Guard(store, limit=4000, counter="approx")  # type: ignore[arg-type]
    capability = CtxGuardCapability(guard, session_id="s", max_tokens=64)
    agent = weather_agent(weather_model([]), capability)
    history = agent.run_sync("turn 1: what is the weather like today?").all_messages()
    agent.run_sync("turn 2: and now?", message_history=history)
    assert store.reads == 0  # nothing changed elsewhere: the appends' tokens said so
    guard.store.delete("s")
    agent.run_sync("turn 3: and tomorrow?", message_history=history)
    assert store.reads == 1
    plain.close()


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_langchain_middleware_after_the_session_was_deleted_stores_it_all(
    guard: Guard, mode: str
) -> None:
    pytest.importorskip("langchain.agents")
    from langchain_core.messages import HumanMessage

    from ctxguard.adapters.langchain import CtxGuardMiddleware, to_ctxguard

    from .test_langchain_agent import WeatherModel, weather_agent

    agent = weather_agent(WeatherModel(), CtxGuardMiddleware(guard, max_tokens=64))
    config = {"configurable": {"thread_id": "t"}}

    async def invoke(text: str) -> list[Any]:
        state = {"messages": [HumanMessage(text)]}
        if mode == "sync":
            await asyncio.to_thread(agent.invoke, state, config)
        else:
            await agent.ainvoke(state, config)
        messages: list[Any] = (await agent.aget_state(config)).values["messages"]
        return messages

    await invoke("turn 1: what is the weather like today?")
    guard.store.delete("t")
    history = await invoke("turn 2: and now?")
    stored = [s.message.id for s in guard.store.read("t")]
    assert stored == [to_ctxguard(m).id for m in history]


def test_a_rewrite_elsewhere_is_laid_back_in_order(store_url: str, namespace: str) -> None:
    """The session replaced by another writer (one message of its own): the run's
    messages go after it, in the run's order, in one write."""
    from ctxguard.adapters import _served
    from ctxguard.messages import Message

    guard = Guard(store_url, namespace=namespace, limit=4000, counter="approx")
    seen = _served.SeenIds().of("s")
    run = [Message(role="user", content=f"m{i}", id=f"m{i}") for i in range(4)]
    _served.persist(guard, "s", run[:2], seen)
    guard.replace_tail("s", 0, [Message(role="user", content="other", id="o")])
    watched = WatchedStore(guard.store, "s")
    guard.store = watched  # type: ignore[misc]
    _served.persist(guard, "s", run[:3], seen)
    assert [s.message.id for s in watched.inner.read("s")] == ["o", "m0", "m1", "m2"]
    assert watched.writes == ["append", "replace_tail"]
    watched.reset()
    _served.persist(guard, "s", run, seen)  # the set is good again: one append
    assert watched.writes == ["append"]
    assert [s.message.id for s in watched.inner.read("s")] == ["o", "m0", "m1", "m2", "m3"]
    guard.close()


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_langchain_a_call_with_nothing_new_after_a_delete_lays_the_run_back(
    guard: Guard, mode: str
) -> None:
    """A call whose messages were all stored before (an invoke adding no message, on
    the thread's checkpointed state) wrote only its reply: the deleted session held the
    reply alone, missing everything the run holds before it, until some later call
    brought a new message. The reply's write sees the session moved and lays it back."""
    pytest.importorskip("langchain.agents")
    from langchain_core.messages import HumanMessage

    from ctxguard.adapters.langchain import CtxGuardMiddleware, to_ctxguard

    from .test_langchain_agent import WeatherModel, weather_agent

    agent = weather_agent(WeatherModel(), CtxGuardMiddleware(guard, max_tokens=64))
    config = {"configurable": {"thread_id": "t"}}

    async def invoke(state: dict[str, Any]) -> list[Any]:
        if mode == "sync":
            await asyncio.to_thread(agent.invoke, state, config)
        else:
            await agent.ainvoke(state, config)
        messages: list[Any] = (await agent.aget_state(config)).values["messages"]
        return messages

    first = await invoke({"messages": [HumanMessage("turn 1: what is the weather like?")]})
    guard.store.delete("t")
    history = await invoke({"messages": []})
    assert len(history) > len(first)
    stored = [s.message.id for s in guard.store.read("t")]
    assert stored == [to_ctxguard(m).id for m in history]
