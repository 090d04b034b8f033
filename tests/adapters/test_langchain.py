"""LangChain adapter: lossless history, LangChain's own semantics, budgeted windows."""

from __future__ import annotations

import asyncio
import warnings
from typing import Any

import pytest

pytest.importorskip("langchain_core")

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    ChatMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.outputs import ChatResult
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
from langchain_core.runnables.history import RunnableWithMessageHistory
from pydantic import Field

from ctxguard.adapters.langchain import (
    CtxGuardChatMessageHistory,
    afit_messages,
    fit_messages,
    to_ctxguard,
    to_langchain,
    window_runnable,
)
from ctxguard.errors import InvalidMessageError
from ctxguard.guard import AsyncGuard, Guard
from ctxguard.messages import Message
from tests.conftest import private_memory_url

from .conftest import LIMIT, RESERVE, assert_fits, assert_prepared_fits


def rich_conversation() -> list[BaseMessage]:
    """Every shape users store: tool calls (parallel), tool results, metadata, blocks."""
    return [
        SystemMessage("You are terse."),
        SystemMessage("Dev rules.", additional_kwargs={"__openai_role__": "developer"}),
        HumanMessage("weather in Paris and Oslo?", name="ann", id="h-1"),
        AIMessage(
            "",
            id="run-1",
            tool_calls=[
                {"name": "weather", "args": {"city": "Paris", "days": [1, 2]}, "id": "call_a"},
                {"name": "weather", "args": {"city": "Oslo"}, "id": "call_b"},
            ],
            response_metadata={"model_name": "fake", "finish_reason": "tool_calls"},
            usage_metadata={"input_tokens": 10, "output_tokens": 5, "total_tokens": 15},
        ),
        ToolMessage("18C", tool_call_id="call_a", name="weather", artifact={"raw": [1]}),
        ToolMessage([{"type": "text", "text": "-2C"}], tool_call_id="call_b", status="error"),
        AIMessage([{"type": "text", "text": "Paris 18C"}, {"type": "reasoning", "reasoning": "x"}]),
        HumanMessage([{"type": "text", "text": "and"}, {"type": "text", "text": " this?"}]),
        ChatMessage("custom role message", role="user"),
        AIMessage("done", additional_kwargs={"refusal": None}),
    ]


IMAGE = HumanMessage(
    [
        {"type": "text", "text": "and this?"},
        {"type": "image_url", "image_url": {"url": "https://x.test/a.png"}},
    ]
)


def test_conversion_round_trips_every_shape() -> None:
    for message in [*rich_conversation(), IMAGE]:
        assert to_langchain(to_ctxguard(message)) == message
    assert to_ctxguard(IMAGE).metadata == {"langchain": {"id": None}}  # image is an OpenAI part


def test_tool_calls_become_openai_tool_calls() -> None:
    ai = to_ctxguard(rich_conversation()[3])
    assert ai.to_openai()["tool_calls"][0] == {
        "id": "call_a",
        "type": "function",
        "function": {"name": "weather", "arguments": '{"city": "Paris", "days": [1, 2]}'},
    }
    tool = to_ctxguard(rich_conversation()[4])
    assert tool.to_openai() == {"role": "tool", "content": "18C", "tool_call_id": "call_a"}
    assert to_ctxguard(rich_conversation()[1]).role == "developer"


def test_chunks_are_stored_as_messages() -> None:
    assert to_langchain(to_ctxguard(AIMessageChunk("hi", id="c1"))) == AIMessage("hi", id="c1")


def test_plain_openai_messages_read_as_langchain() -> None:
    stored = Message.from_openai(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ],
        }
    )
    back = to_langchain(stored)
    assert isinstance(back, AIMessage)
    assert back.tool_calls == [{"name": "f", "args": {}, "id": "c", "type": "tool_call"}]


def test_history_round_trip_sync(guard: Guard) -> None:
    history = CtxGuardChatMessageHistory(guard, "s1")
    conversation = rich_conversation()
    history.add_messages(conversation[:4])
    history.add_messages(conversation[4:])
    assert history.messages == conversation


async def test_history_round_trip_async(aguard: AsyncGuard) -> None:
    history = CtxGuardChatMessageHistory(aguard, "s1")
    conversation = rich_conversation()
    await history.aadd_messages(conversation[:5])
    await history.aadd_messages(conversation[5:])
    assert await history.aget_messages() == conversation


async def test_url_history_shares_session_between_sync_and_async(
    store_url: str, namespace: str
) -> None:
    history = CtxGuardChatMessageHistory(store_url, "s1", namespace=namespace)
    history.add_user_message("sync")
    await history.aadd_messages([AIMessage("async")])
    assert [m.content for m in await history.aget_messages()] == ["sync", "async"]
    assert [m.content for m in history.messages] == ["sync", "async"]


def test_clear_matches_langchain(guard: Guard) -> None:
    history = CtxGuardChatMessageHistory(guard, "s1")
    history.add_messages([HumanMessage("a"), AIMessage("b")])
    history.clear()
    assert history.messages == []
    history.add_messages([HumanMessage("again")])
    assert [m.content for m in history.messages] == ["again"]
    assert str(history) == "Human: again"


async def test_aclear(aguard: AsyncGuard) -> None:
    history = CtxGuardChatMessageHistory(aguard, "s1")
    await history.aadd_messages([HumanMessage("a")])
    await history.aclear()
    assert await history.aget_messages() == []


def test_a_retried_message_id_is_stored_once(guard: Guard) -> None:
    history = CtxGuardChatMessageHistory(guard, "s1")
    reply = AIMessage("hi", id="run-7")
    history.add_messages([HumanMessage("q"), reply])
    history.add_messages([reply])
    assert [m.content for m in history.messages] == ["q", "hi"]


@pytest.mark.parametrize("message_id", ["i" * 300, "x\ny"], ids=["300-chars", "newline"])
async def test_a_message_id_ctxguard_cannot_take_is_stored_once(
    guard: Guard, message_id: str
) -> None:
    """A LangChain id that is no valid ctxguard id gives the same derived id every time,
    so the message is stored once and reads back with its own id (it got a fresh random
    id, and was stored again, on every add)."""
    history = CtxGuardChatMessageHistory(guard, "s1")
    message = HumanMessage("q", id=message_id)
    history.add_messages([message])
    history.add_messages([message])
    await history.aadd_messages([message])
    assert history.messages == [message]
    assert to_ctxguard(message).id == to_ctxguard(message).id != message_id


def test_async_guard_refuses_sync_calls(aguard: AsyncGuard) -> None:
    history = CtxGuardChatMessageHistory(aguard, "s1")
    with pytest.raises(Exception, match="AsyncGuard"):
        _ = history.messages


def long_history(turns: int) -> list[BaseMessage]:
    out: list[BaseMessage] = [SystemMessage("You answer weather questions.")]
    for i in range(turns):
        out += [
            HumanMessage(f"question {i}: what is the weather in city number {i}?"),
            AIMessage(
                "",
                tool_calls=[{"name": "weather", "args": {"city": f"c{i}"}, "id": f"call_{i}"}],
            ),
            ToolMessage(f"sunny, {i} degrees, light wind from the west", tool_call_id=f"call_{i}"),
            AIMessage(f"It is sunny with {i} degrees in city {i}."),
        ]
    return out


def check_window(guard: Guard | AsyncGuard, window: list[BaseMessage], newest: str) -> None:
    assert isinstance(window[0], SystemMessage)
    assert window[-1].content == newest
    assert_fits(guard, [to_ctxguard(m) for m in window], RESERVE)


def test_budgeted_messages_sync(guard: Guard) -> None:
    history = CtxGuardChatMessageHistory(guard, "s1", max_tokens=RESERVE)
    history.add_messages(long_history(20))
    window = history.budgeted_messages([HumanMessage("newest question?")])
    assert len(window) < len(history.messages)
    check_window(guard, window, "newest question?")
    assert history.last_prepared is not None
    assert_prepared_fits(history.last_prepared)
    assert history.messages[-1].content == "newest question?"  # it was appended


async def test_budgeted_messages_async(aguard: AsyncGuard) -> None:
    history = CtxGuardChatMessageHistory(aguard, "s1", max_tokens=RESERVE)
    await history.aadd_messages(long_history(20))
    window = await history.abudgeted_messages([HumanMessage("newest question?")])
    assert len(window) < len(await history.aget_messages())
    check_window(aguard, window, "newest question?")


def test_budgeted_window_needs_a_limit(store_url: str, namespace: str) -> None:
    history = CtxGuardChatMessageHistory(store_url, "s1", namespace=namespace)
    history.add_user_message("hi")  # storage works without a limit
    with pytest.raises(Exception, match="limit"):
        history.budgeted_messages()


def test_fit_keeps_the_callers_objects_and_tool_pairs(guard: Guard) -> None:
    prompt = long_history(20)
    window = fit_messages(guard, prompt, max_tokens=RESERVE)
    assert all(any(m is p for p in prompt) for m in window)
    check_window(guard, window, prompt[-1].content)  # type: ignore[arg-type]


async def fit_all_ways(guard: Guard, value: Any) -> list[list[BaseMessage]]:
    """``value`` fitted by fit_messages, afit_messages and window_runnable (invoke, ainvoke)."""
    runnable = window_runnable(guard, max_tokens=RESERVE)
    return [
        fit_messages(guard, value, max_tokens=RESERVE),
        await afit_messages(guard, value, max_tokens=RESERVE),
        runnable.invoke(value),
        await runnable.ainvoke(value),
    ]


async def test_fit_takes_what_a_chat_model_takes() -> None:
    """(role, content) tuples, role/content dicts, strings, a prompt value, mixed with
    messages, are fitted as a chat model reads them, the messages given returned as
    themselves (tuples and dicts raised a bare AttributeError)."""
    guard = Guard(private_memory_url(), limit=LIMIT, counter="approx")
    system, answer = SystemMessage("be terse"), AIMessage("hello")
    mixed: list[Any] = [system, ("user", "hi"), answer, {"role": "user", "content": "and?"}]
    expected = [system, HumanMessage("hi"), answer, HumanMessage("and?")]
    for window in await fit_all_ways(guard, mixed):
        assert window == expected
        assert window[0] is system and window[2] is answer
    for value in ["hi", ["hi"], [("human", "hi")], ChatPromptTemplate([("user", "hi")]).invoke({})]:
        assert await fit_all_ways(guard, value) == [[HumanMessage("hi")]] * 4


@pytest.mark.parametrize(
    "value",
    [None, 5, {"messages": [HumanMessage("hi")]}, b"hi", [5], [("user",)], [{"content": "x"}]],
    ids=["none", "int", "state-dict", "bytes", "int-item", "one-tuple", "no-role"],
)
async def test_fit_refuses_what_a_chat_model_refuses(value: Any) -> None:
    """Input a chat model cannot read is a one-line InvalidMessageError (it was a bare
    TypeError, AttributeError or NotImplementedError)."""
    guard = Guard(private_memory_url(), limit=LIMIT, counter="approx")
    runnable = window_runnable(guard, max_tokens=RESERVE)
    calls = [
        lambda: fit_messages(guard, value, max_tokens=RESERVE),
        lambda: asyncio.run(afit_messages(guard, value, max_tokens=RESERVE)),
        lambda: runnable.invoke(value),
        lambda: asyncio.run(runnable.ainvoke(value)),
    ]
    for call in calls:
        with pytest.raises(InvalidMessageError) as info:
            await asyncio.to_thread(call)
        assert "\n" not in str(info.value) and "messages" in str(info.value)


def test_fit_counts_tools(guard: Guard) -> None:
    def weather(city: str) -> str:
        """Weather for a city, with a long description that costs tokens to send."""
        return city

    prompt = long_history(20)
    without = fit_messages(guard, prompt, max_tokens=RESERVE)
    with_tools = fit_messages(guard, prompt, max_tokens=RESERVE, tools=[weather])
    assert len(with_tools) < len(without)


# -- RunnableWithMessageHistory end to end ---------------------------------------------


class RecordingChatModel(GenericFakeChatModel):
    """GenericFakeChatModel that remembers the messages of each call."""

    seen: list[list[BaseMessage]] = Field(default_factory=list)

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        self.seen.append(list(messages))
        return super()._generate(messages, *args, **kwargs)


def make_chain(guard: Guard | AsyncGuard, namespace: str, url: str) -> tuple[Any, Any]:
    model = RecordingChatModel(messages=iter([AIMessage(f"answer {i} " * 8) for i in range(40)]))
    prompt = ChatPromptTemplate.from_messages(
        [
            ("system", "You are a helpful assistant."),
            MessagesPlaceholder("history"),
            ("human", "{question}"),
        ]
    )
    chain = prompt | window_runnable(guard, max_tokens=RESERVE) | model
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # RunnableWithMessageHistory is deprecated upstream
        with_history = RunnableWithMessageHistory(
            chain,
            lambda session_id: CtxGuardChatMessageHistory(url, session_id, namespace=namespace),
            input_messages_key="question",
            history_messages_key="history",
        )
    return with_history, model


def check_run(guard: Guard | AsyncGuard, model: RecordingChatModel, stored: list[Any]) -> None:
    assert len(stored) == 2 * len(model.seen)
    assert [type(m) for m in stored[:2]] == [HumanMessage, AIMessage]
    for call in model.seen:
        assert isinstance(call[0], SystemMessage)
        assert isinstance(call[-1], HumanMessage)
        assert_fits(guard, [to_ctxguard(m) for m in call], RESERVE)
    assert len(model.seen[-1]) < len(stored)  # the history outgrew the budget: it was trimmed


def test_runnable_with_message_history_sync(guard: Guard, store_url: str, namespace: str) -> None:
    chain, model = make_chain(guard, namespace, store_url)
    config = {"configurable": {"session_id": "chat-1"}}
    for i in range(12):
        reply = chain.invoke({"question": f"question number {i} about the weather"}, config)
        assert reply.content.startswith(f"answer {i}")
    stored = CtxGuardChatMessageHistory(guard, "chat-1").messages
    check_run(guard, model, stored)


async def test_runnable_with_message_history_async(
    aguard: AsyncGuard, store_url: str, namespace: str
) -> None:
    chain, model = make_chain(aguard, namespace, store_url)
    config = {"configurable": {"session_id": "chat-1"}}
    for i in range(12):
        await chain.ainvoke({"question": f"question number {i} about the weather"}, config)
    stored = await CtxGuardChatMessageHistory(aguard, "chat-1").aget_messages()
    check_run(aguard, model, stored)


def test_window_budget_is_the_guards_limit() -> None:
    assert LIMIT > RESERVE


# -- LangChain v1 agent middleware ------------------------------------------------------


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_agent_middleware_fits_each_model_call(guard: Guard, mode: str) -> None:
    agents = pytest.importorskip("langchain.agents")
    from ctxguard.adapters.langchain import CtxGuardMiddleware

    model = RecordingChatModel(messages=iter([AIMessage("final answer")]))
    agent = agents.create_agent(
        model=model,
        tools=[],
        system_prompt="You answer weather questions.",
        middleware=[CtxGuardMiddleware(guard, max_tokens=RESERVE)],
    )
    history = [*long_history(20)[1:], HumanMessage("newest question?")]
    state = {"messages": history}
    result = agent.invoke(state) if mode == "sync" else await agent.ainvoke(state)
    sent = model.seen[-1]
    check_window(guard, sent, "newest question?")
    assert len(sent) < len(history)
    assert len(result["messages"]) == len(history) + 1  # the agent's state keeps everything
    assert result["messages"][-1].content == "final answer"
