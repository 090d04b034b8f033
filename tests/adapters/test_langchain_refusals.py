"""What the LangChain agent middleware refuses stores nothing (tests/store_diff.py compares
every key of the session store before and after), with a one-line ``CtxGuardError``, and
the model is not called; a model call that raises stores nothing of its turn."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

pytest.importorskip("langchain.agents")

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult

from ctxguard.adapters.langchain import CtxGuardMiddleware
from ctxguard.errors import CtxGuardError
from ctxguard.guard import Guard
from tests import store_diff
from tests.guard.test_refusal_matrix import MidBatchCounter

from .conftest import LIMIT, RESERVE
from .test_langchain_agent import WeatherModel, weather_agent

THREAD = "t1"


class BrokenFrom(MidBatchCounter):
    """Fails on the ``fail_at``-th message it counts and every one after."""

    def count_message(self, message: Any) -> int:
        if self.armed and self.seen + 1 >= self.fail_at:
            self.seen += 1
            raise RuntimeError("counter broke on this message")
        return super().count_message(message)


class FailingModel(WeatherModel):
    """The weather model, raising on its ``fail_on``-th call (1-based) once armed."""

    fail_on: int = 0
    calls: int = 0

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        self.calls += 1
        if self.fail_on and self.calls == self.fail_on:
            raise ConnectionError("model server went away")
        return super()._generate(messages, *args, **kwargs)


def humans(n: int, first: int = 0) -> list[BaseMessage]:
    return [HumanMessage(f"turn {i}: weather?") for i in range(first, first + n)]


def bad_third(bad: BaseMessage) -> list[BaseMessage]:
    batch = humans(5)
    batch[2] = bad
    return batch


AUDIO = HumanMessage(content=[{"type": "input_audio", "input_audio": {"data": "AA"}}])
CASES: dict[str, list[BaseMessage]] = {
    "audio-3rd-of-5": bad_third(AUDIO),
    "over-budget": [HumanMessage("turn 9: " + "word " * 6000)],
    "orphan-tool-result": [ToolMessage("42", tool_call_id="nope"), *humans(1)],
}


async def invoke(agent: Any, mode: str, messages: list[BaseMessage]) -> Any:
    state = {"messages": messages}
    config = {"configurable": {"thread_id": THREAD}}
    if mode == "sync":
        return await asyncio.to_thread(agent.invoke, state, config)
    return await agent.ainvoke(state, config)


def snap(guard: Guard, store_url: str) -> store_diff.Snapshot:
    return store_diff.take(guard.store, None if store_url.startswith("memory") else store_url)


async def seeded(guard: Guard, model: WeatherModel, mode: str) -> Any:
    agent = weather_agent(model, CtxGuardMiddleware(guard, max_tokens=RESERVE))
    await invoke(agent, mode, humans(1))
    return agent


def assert_one_line(exc: BaseException) -> None:
    assert isinstance(exc, CtxGuardError), repr(exc)
    assert str(exc) and "\n" not in str(exc)


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("case", list(CASES))
async def test_a_refused_call_stores_nothing_and_calls_no_model(
    guard: Guard, store_url: str, mode: str, case: str
) -> None:
    model = WeatherModel()
    agent = await seeded(guard, model, mode)
    calls = len(model.seen)
    before = snap(guard, store_url)
    with pytest.raises(CtxGuardError) as info:
        await invoke(agent, mode, CASES[case])
    assert_one_line(info.value)
    assert len(model.seen) == calls
    store_diff.assert_refused_only(before, snap(guard, store_url))


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("fail_at", [1, 3, 5])
async def test_a_counter_failing_mid_batch_stores_nothing(
    store_url: str, namespace: str, mode: str, fail_at: int
) -> None:
    counter = BrokenFrom(fail_at)
    guard = Guard(store_url, namespace=namespace, limit=LIMIT, counter=counter)
    try:
        model = WeatherModel()
        agent = await seeded(guard, model, mode)
        calls = len(model.seen)
        before = snap(guard, store_url)
        counter.armed = True
        with pytest.raises(CtxGuardError) as info:
            await invoke(agent, mode, humans(5))
        assert_one_line(info.value)
        assert len(model.seen) == calls
        store_diff.assert_refused_only(before, snap(guard, store_url))
    finally:
        guard.close()


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_closed_guard_is_refused_before_the_model_call(
    guard: Guard, store_url: str, mode: str
) -> None:
    model = WeatherModel()
    agent = await seeded(guard, model, mode)
    calls = len(model.seen)
    before = snap(guard, store_url)
    guard.close()
    with pytest.raises(CtxGuardError) as info:
        await invoke(agent, mode, humans(1))
    assert_one_line(info.value)
    assert len(model.seen) == calls
    store_diff.assert_refused_only(before, snap(guard, store_url))


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("fail_on", [1, 2])
async def test_a_model_call_that_raises_stores_nothing_of_it(
    guard: Guard, store_url: str, mode: str, fail_on: int
) -> None:
    """The 1st call of a turn (the user's message) or the 2nd (after the tool result)
    raises: what that call would have stored is not there; the earlier call's is."""
    model = FailingModel()
    agent = await seeded(guard, model, mode)
    model.calls, model.fail_on = 0, fail_on
    before = snap(guard, store_url)
    stored_before = [s.message.id for s in guard.store.read(THREAD)]
    with pytest.raises(ConnectionError):
        await invoke(agent, mode, humans(1, 1))
    if fail_on == 1:
        store_diff.assert_refused_only(before, snap(guard, store_url))
    else:  # the 1st call stored the user's message and the reply with its tool calls
        stored = guard.store.read(THREAD)
        assert [s.message.id for s in stored[: len(stored_before)]] == stored_before
        new = [s.message for s in stored[len(stored_before) :]]
        assert [m.role for m in new] == ["user", "assistant"]
        assert new[-1].tool_calls
    # the same thread runs again: every message of the agent's state is stored once
    model.fail_on = 0
    done = await invoke(agent, mode, humans(1, 3))
    ids = [s.message.id for s in guard.store.read(THREAD)]
    assert len(ids) == len(set(ids))
    assert ids == [m.id for m in done["messages"]]


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_new_middleware_on_the_same_thread_stores_each_message_once(
    guard: Guard, mode: str
) -> None:
    """A re-run (a new process: a fresh middleware, the checkpointer's state) of the same
    thread stores no message twice and keeps tool calls with their results."""
    from langgraph.checkpoint.memory import InMemorySaver

    saver = InMemorySaver()
    for turn in range(3):
        agent = weather_agent(WeatherModel(), CtxGuardMiddleware(guard, max_tokens=RESERVE))
        agent.checkpointer = saver
        done = await invoke(agent, mode, humans(1, turn))
    state: list[BaseMessage] = done["messages"]
    stored = [s.message for s in guard.store.read(THREAD)]
    assert [m.id for m in stored] == [m.id for m in state]
    assert sum(isinstance(m, HumanMessage) for m in state) == 3  # (one thread, 3 runs)
    calls = [c["id"] for m in state if isinstance(m, AIMessage) for c in m.tool_calls]
    results = [m.tool_call_id for m in state if isinstance(m, ToolMessage)]
    assert sorted(calls) == sorted(results) and len(calls) == len(set(calls))


class MarkedReplyModel(WeatherModel):
    """The weather model, answering a user turn's message at once with ``text``."""

    text: str = "BOOM"

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        if isinstance(messages[-1], HumanMessage) and "turn 1:" in str(messages[-1].content):
            self.seen.append(list(messages))
            usage = {"input_tokens": 10 * len(messages), "output_tokens": 7, "total_tokens": 0}
            reply = AIMessage(self.text, usage_metadata=usage)
            return ChatResult(generations=[ChatGeneration(message=reply)])
        return super()._generate(messages, *args, **kwargs)


class FailsOnMarked(MidBatchCounter):
    """The approx counter, raising on a message that says BOOM."""

    def count_message(self, message: Any) -> int:
        if "BOOM" in (message.text or ""):
            raise RuntimeError("counter broke on the reply")
        return super().count_message(message)


REPLY_REFUSALS: dict[str, tuple[dict[str, Any], str]] = {
    "counter-fails-on-the-reply": ({"counter": FailsOnMarked(0)}, "BOOM"),
    "reply-too-long": ({"counter": "approx", "max_message_tokens": 100}, "word " * 300),
}


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("case", list(REPLY_REFUSALS))
async def test_a_reply_the_guard_refuses_stores_nothing_of_the_turn(
    store_url: str, namespace: str, mode: str, case: str
) -> None:
    """The user's message was stored, then the reply's count failed: the turn stood in
    the session without its reply, under an error saying nothing was stored. Now the
    messages and the reply go in one append: the refusal stores neither."""
    settings, text = REPLY_REFUSALS[case]
    guard = Guard(store_url, namespace=namespace, limit=LIMIT, **settings)
    try:
        model = MarkedReplyModel(text=text)
        agent = await seeded(guard, model, mode)
        before = snap(guard, store_url)
        with pytest.raises(CtxGuardError) as info:
            await invoke(agent, mode, humans(1, 1))
        assert_one_line(info.value)
        assert model.seen[-1][-1].content == "turn 1: weather?"  # the model was called
        store_diff.assert_refused_only(before, snap(guard, store_url))
    finally:
        guard.close()
