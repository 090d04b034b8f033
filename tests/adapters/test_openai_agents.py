"""OpenAI Agents SDK adapter: the Session protocol, its semantics, budgeted windows."""

from __future__ import annotations

import contextlib
import copy
from typing import Any

import pytest

pytest.importorskip("agents")

from agents import Agent, RunConfig, Runner, SQLiteSession, function_tool
from agents.memory import Session
from agents.testing.model import ModelStep, ScriptedModel, assistant_message, function_call

from ctxguard.adapters.openai_agents import CtxGuardSession, items_to_messages
from ctxguard.guard import AsyncGuard, Guard

from .conftest import RESERVE, assert_fits


def items() -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "weather in Paris and Oslo?"},
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "two"}]},
        {
            "type": "function_call",
            "call_id": "a",
            "name": "weather",
            "arguments": '{"c":"P"}',
            "id": "fc_1",
            "status": "completed",
        },
        {"type": "function_call", "call_id": "b", "name": "weather", "arguments": '{"c":"O"}'},
        {"type": "function_call_output", "call_id": "a", "output": "18C"},
        {
            "type": "function_call_output",
            "call_id": "b",
            "output": [{"type": "input_text", "text": "-2C"}],
        },
        {
            "type": "message",
            "role": "assistant",
            "id": "msg_1",
            "status": "completed",
            "content": [{"type": "output_text", "text": "Paris 18C, Oslo -2C", "annotations": []}],
        },
        {"role": "user", "content": [{"type": "input_text", "text": "thanks"}]},
        {"type": "web_search_call", "id": "ws_1", "status": "completed"},
    ]


def test_session_protocol() -> None:
    assert isinstance(CtxGuardSession("s"), Session)


def test_parallel_calls_share_one_assistant_message() -> None:
    messages = items_to_messages(items())
    calls = [m for m in messages if m.tool_calls]
    assert len(calls) == 1 and [c.id for c in calls[0].tool_calls or ()] == ["a", "b"]


@pytest.fixture
def session(aguard: AsyncGuard) -> CtxGuardSession:
    return CtxGuardSession("s1", aguard)


async def test_items_round_trip(session: CtxGuardSession) -> None:
    await session.add_items(items()[:4])
    await session.add_items(items()[4:])
    assert await session.get_items() == items()


async def test_get_items_limit_is_latest_n_in_order(session: CtxGuardSession) -> None:
    await session.add_items(items())
    for n in range(1, len(items()) + 3):
        assert await session.get_items(limit=n) == items()[-n:]
    assert await session.get_items(limit=0) == []


async def test_pop_item_returns_the_newest(session: CtxGuardSession) -> None:
    await session.add_items(items())
    expected = items()
    while expected:
        assert await session.pop_item() == expected.pop()
        assert await session.get_items() == expected
    assert await session.pop_item() is None


async def test_clear_session(session: CtxGuardSession) -> None:
    await session.add_items(items())
    await session.clear_session()
    assert await session.get_items() == []
    await session.add_items(items()[:2])
    assert await session.get_items() == items()[:2]


async def test_same_answers_as_sqlite_session(session: CtxGuardSession) -> None:
    reference = SQLiteSession("ref")

    async def both(method: str, *args: Any) -> Any:
        ours = await getattr(session, method)(*copy.deepcopy(args))
        theirs = await getattr(reference, method)(*copy.deepcopy(args))
        assert ours == theirs, method

    await both("add_items", items()[:5])
    await both("pop_item")
    await both("add_items", items()[4:])
    for limit in (None, 1, 3, 50):
        await both("get_items", limit)
    await both("pop_item")
    await both("clear_session")
    await both("pop_item")
    await both("get_items")


async def test_sync_guard_works_from_async(guard: Guard) -> None:
    session = CtxGuardSession("s1", guard)
    await session.add_items(items())
    assert await session.pop_item() == items()[-1]
    assert await session.get_items(limit=2) == items()[-3:-1]


def long_items(turns: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"role": "system", "content": "You answer weather questions."}]
    for i in range(turns):
        out += [
            {"role": "user", "content": f"question {i}: weather in city number {i}?"},
            {"type": "function_call", "call_id": f"c{i}", "name": "weather", "arguments": "{}"},
            {"type": "function_call_output", "call_id": f"c{i}", "output": f"sunny, {i} deg"},
            {"role": "assistant", "content": f"It is sunny with {i} degrees in city {i}."},
        ]
    return out


async def test_window_mode_get_items_is_budgeted(aguard: AsyncGuard) -> None:
    session = CtxGuardSession("s1", aguard, window=True, max_tokens=RESERVE)
    await session.add_items(long_items(20))
    window = await session.get_items()
    assert window[0] == {"role": "system", "content": "You answer weather questions."}
    assert window[-1] == long_items(20)[-1]
    assert len(window) < len(long_items(20))
    assert_fits(aguard, items_to_messages(window), RESERVE)
    assert await session.get_items(limit=3) == long_items(20)[-3:]  # limit stays raw


@function_tool
def weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}, 20 degrees and a light breeze from the west"


def scripted_turn(i: int) -> list[ModelStep]:
    call = function_call("weather", {"city": f"c{i}"}, call_id=f"call_{i}", item_id=f"fc_{i}")
    done = assistant_message(f"It is sunny in c{i}. " * 3, item_id=f"msg_{i}")
    return [ModelStep(output=[call]), ModelStep(output=[done])]


async def test_runner_end_to_end(store_url: str, namespace: str, aguard: AsyncGuard) -> None:
    model = ScriptedModel([step for i in range(8) for step in scripted_turn(i)])
    agent = Agent(
        name="w", instructions="You answer weather questions.", model=model, tools=[weather]
    )
    limit = aguard.limit_source.resolve().tokens
    session = CtxGuardSession("chat", store_url, namespace=namespace, limit=limit)
    config = RunConfig(
        call_model_input_filter=session.model_input_filter(max_tokens=RESERVE),
        tracing_disabled=True,
    )
    for i in range(8):
        result = await Runner.run(agent, f"weather in c{i}?", session=session, run_config=config)
        assert str(result.final_output).startswith(f"It is sunny in c{i}")
    stored = await session.get_items()
    assert len(stored) == 8 * 4  # user, function_call, function_call_output, message
    assert stored[0] == {"role": "user", "content": "weather in c0?"}
    for recorded in model.calls:
        window = [{"role": "system", "content": recorded.system_instructions}, *recorded.input]
        assert_fits(aguard, items_to_messages(window), RESERVE)
    assert len(model.calls[-1].input) < len(stored)


@pytest.mark.parametrize("crash", [False, True])
async def test_pop_item_of_parallel_calls_is_one_write(
    store_url: str, namespace: str, crash: bool
) -> None:
    """The newest message holds two parallel calls; popping the second leaves the first
    in its place, with its id, in one store write: a reader never sees both gone, and a
    crash after the first write loses neither (it was a retract, then an append)."""
    from ctxguard import AsyncGuard
    from ctxguard.stores import open_async_store

    from .watched_store import Crash, WatchedStore

    store = WatchedStore(open_async_store(store_url, namespace=namespace), "s1")
    guard = AsyncGuard(store, limit=400, counter="approx")  # type: ignore[arg-type]
    session = CtxGuardSession("s1", guard)
    try:
        await session.add_items(items()[:5])  # ... reasoning, call a, call b: one message
        newest = (await store.inner.read_last("s1", 1))[0].message.id
        store.reset(crash_after=1 if crash else None)
        with contextlib.suppress(Crash):
            assert await session.pop_item() == items()[4]
        assert store.writes == ["replace_tail"]
        kept = await session.get_items()
        assert kept in (items()[:4], items()[:5])
        if not crash:
            assert kept == items()[:4]
            assert store.seen == [[m.message.id for m in await store.inner.read("s1")]]
            assert (await store.inner.read_last("s1", 1))[0].message.id == newest
            audit = await store.inner.read_audit("s1")
            assert audit[-1]["kind"] == "replace" and audit[-1]["ids"] == [newest]
        store.reset()
        assert await session.pop_item() == items()[3]  # the last call: a plain retract
        assert store.writes == ["retract"]
    finally:
        await store.inner.close()
