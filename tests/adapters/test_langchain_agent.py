"""LangChain v1: the middleware end to end, the served limit as profile, an exact token_counter."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

pytest.importorskip("langchain.agents")

from langchain.agents import create_agent
from langchain.agents.middleware import (
    ClearToolUsesEdit,
    ContextEditingMiddleware,
    SummarizationMiddleware,
)
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
    trim_messages,
)
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from pydantic import Field

from ctxguard import ContextLimit, ModelLimit
from ctxguard.adapters.langchain import (
    CtxGuardMiddleware,
    model_profile,
    openai_tools,
    to_ctxguard,
    to_langchain,
    token_counter,
)
from ctxguard.errors import ConfigError, CtxGuardError, InvalidIdError, InvalidMessageError
from ctxguard.guard import AsyncGuard, Guard
from tests.conftest import private_memory_url

from .conftest import LIMIT, RESERVE, assert_fits, assert_starts_on_user


@tool
def weather(city: str) -> str:
    """The weather in a city."""
    return f"{city}: 18C, clear skies, light wind from the west. " * 2


SCHEMAS = openai_tools([weather])
SYSTEM = "You answer weather questions."


class WeatherModel(BaseChatModel):
    """Turn i: one tool call (odd i) or two in parallel (even i), then an answer."""

    seen: list[list[BaseMessage]] = Field(default_factory=list)

    @property
    def _llm_type(self) -> str:
        return "fake-weather"

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        self.seen.append(list(messages))
        usage = {"input_tokens": 10 * len(messages), "output_tokens": 7, "total_tokens": 0}
        last = messages[-1]
        if isinstance(last, HumanMessage):
            turn = int(str(last.content).split()[1].rstrip(":"))
            cities = ["Paris", "Oslo"] if turn % 2 == 0 else ["Lima"]
            calls = [{"name": "weather", "args": {"city": c}, "id": f"c{turn}-{c}"} for c in cities]
            reply = AIMessage("", tool_calls=calls, usage_metadata=usage)
        else:
            reply = AIMessage("It is mild. " * 6, usage_metadata=usage)
        return ChatResult(generations=[ChatGeneration(message=reply)])


def weather_agent(model: BaseChatModel, *middleware: Any) -> Any:
    return create_agent(
        model=model,
        tools=[weather],
        system_prompt=SYSTEM,
        middleware=list(middleware),
        checkpointer=InMemorySaver(),
    )


async def run_turns(agent: Any, mode: str, turns: int, thread: str = "chat-1") -> list[Any]:
    config = {"configurable": {"thread_id": thread}}
    for turn in range(turns):
        state = {"messages": [HumanMessage(f"turn {turn}: what is the weather like today?")]}
        if mode == "sync":
            await asyncio.to_thread(agent.invoke, state, config)
        elif mode == "async":
            await agent.ainvoke(state, config)
        else:
            chunks = [c async for c in agent.astream(state, config, stream_mode="messages")]
            assert chunks
    messages: list[Any] = (await agent.aget_state(config)).values["messages"]
    return messages


def check_calls(
    guard: Guard | AsyncGuard,
    model: WeatherModel,
    reserve: int = RESERVE,
    history: list[BaseMessage] | None = None,
) -> None:
    """Each call fits, keeps tool pairs whole and, given the whole ``history``, opens on a
    user turn (after the system prompt) when older messages were left out."""
    whole = None if history is None else [to_ctxguard(m) for m in history]
    for call in model.seen:
        assert isinstance(call[0], SystemMessage)
        assert isinstance(call[-1], HumanMessage | ToolMessage)
        window = [to_ctxguard(m) for m in call]
        assert_fits(guard, window, reserve, SCHEMAS)
        if whole is not None:
            assert_starts_on_user(window, whole)


async def stored(guard: Guard | AsyncGuard, session: str) -> tuple[list[Any], list[Any]]:
    if isinstance(guard, AsyncGuard):
        return await guard.store.read(session), await guard.store.read_audit(session)
    return guard.store.read(session), guard.store.read_audit(session)


@pytest.mark.parametrize("mode", ["sync", "async", "stream"])
@pytest.mark.parametrize("which", ["guard", "aguard"])
async def test_middleware_fits_every_call_and_records_usage(
    store_url: str, namespace: str, mode: str, which: str
) -> None:
    if which == "aguard" and mode == "sync":
        pytest.skip("a sync agent cannot use an AsyncGuard (refused, see test_bad_input)")
    kind = AsyncGuard if which == "aguard" else Guard
    guard = kind(store_url, namespace=namespace, limit=LIMIT, counter="approx")
    model = WeatherModel()
    agent = weather_agent(model, CtxGuardMiddleware(guard, max_tokens=RESERVE))
    state = await run_turns(agent, mode, 12)

    assert len(model.seen) == 24  # a tool call and an answer per turn
    check_calls(guard, model, history=state)
    assert len(model.seen[-1]) < len(state)  # the history outgrew the budget: trimmed
    history, audit = await stored(guard, "chat-1")  # the session is the run's thread
    assert [s.message.id for s in history] == [m.id for m in state]  # whole and ordered
    usage = [r for r in audit if r["kind"] == "usage"]
    assert [r["prompt_tokens"] for r in usage] == [10 * len(c) for c in model.seen]
    assert all(r["estimated"] + RESERVE <= LIMIT for r in usage)
    if isinstance(guard, AsyncGuard):
        await guard.aclose()
    else:
        guard.close()


def test_middleware_with_an_exact_counter() -> None:
    pytest.importorskip("tiktoken")
    guard = Guard(private_memory_url(), limit=LIMIT, counter="tiktoken:cl100k_base")
    assert guard.counter.exact
    model = WeatherModel()
    agent = weather_agent(model, CtxGuardMiddleware(guard, max_tokens=RESERVE))
    state = asyncio.run(run_turns(agent, "sync", 12))
    check_calls(guard, model, history=state)
    assert len(model.seen[-1]) < len(state)


def test_middleware_without_a_session_only_fits(guard: Guard) -> None:
    model = WeatherModel()
    agent = create_agent(
        model=model, tools=[weather], middleware=[CtxGuardMiddleware(guard, max_tokens=RESERVE)]
    )
    agent.invoke({"messages": [HumanMessage("turn 1: weather?")]})
    assert len(model.seen) == 2
    assert list(guard.store.list_sessions()) == []


class CappedWeatherModel(WeatherModel):
    max_tokens: int | None = None  # as ChatOpenAI(max_tokens=...) has


def test_the_models_own_max_tokens_is_reserved(guard: Guard) -> None:
    model = CappedWeatherModel(max_tokens=120)
    agent = weather_agent(model, CtxGuardMiddleware(guard))  # the guard's default: 1024
    asyncio.run(run_turns(agent, "sync", 6))
    check_calls(guard, model, reserve=120)  # (the guard's 1024 would not fit the 400 limit)


def test_an_explicit_session_id_wins(guard: Guard) -> None:
    agent = weather_agent(
        WeatherModel(), CtxGuardMiddleware(guard, session_id="mine", max_tokens=RESERVE)
    )
    asyncio.run(run_turns(agent, "sync", 1, thread="other"))
    assert guard.store.info("mine") is not None and guard.store.info("other") is None


async def invoke_once(agent: Any, mode: str, thread: object) -> list[Any]:
    """One turn of ``agent`` under ``thread_id=thread``; the agent's messages after it."""
    state = {"messages": [HumanMessage("turn 1: weather?")]}
    config = {"configurable": {"thread_id": thread}}
    if mode == "sync":
        done = await asyncio.to_thread(agent.invoke, state, config)
    else:
        done = await agent.ainvoke(state, config)
    messages: list[Any] = done["messages"]
    return messages


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("thread", [7, uuid.UUID(int=7)], ids=["int", "uuid"])
async def test_an_int_or_uuid_thread_id_names_the_session(
    guard: Guard, mode: str, thread: object
) -> None:
    """LangGraph takes any thread_id; an int or a UUID names the session by its text (it
    was taken for no session: nothing stored, no error)."""
    agent = weather_agent(WeatherModel(), CtxGuardMiddleware(guard, max_tokens=RESERVE))
    state = await invoke_once(agent, mode, thread)
    assert list(guard.store.list_sessions()) == [str(thread)]
    assert [s.message.id for s in guard.store.read(str(thread))] == [m.id for m in state]


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("thread", ["a" * 300, "x\ny", 1.5, b"t1"])
async def test_a_thread_id_ctxguard_refuses_is_refused_before_the_model_call(
    guard: Guard, mode: str, thread: object
) -> None:
    """A thread_id that cannot name a session is an InvalidIdError before the model is
    called (it was raised after the call: billed, the reply lost)."""
    model = WeatherModel()
    agent = weather_agent(model, CtxGuardMiddleware(guard, max_tokens=RESERVE))
    with pytest.raises(InvalidIdError) as info:
        await invoke_once(agent, mode, thread)
    assert "\n" not in str(info.value) and "thread_id" in str(info.value)
    assert model.seen == []
    assert list(guard.store.list_sessions()) == []


def test_an_async_guard_under_sync_invoke_is_refused_before_the_model_call(
    aguard: AsyncGuard,
) -> None:
    """A sync run with an AsyncGuard is a ConfigError before the model is called (it was
    raised after the call), saying to use ainvoke/astream or a Guard (not a store URL,
    which the middleware refuses)."""
    model = WeatherModel()
    agent = weather_agent(model, CtxGuardMiddleware(aguard, max_tokens=RESERVE))
    with pytest.raises(ConfigError) as info:
        asyncio.run(invoke_once(agent, "sync", "t1"))
    assert str(info.value).endswith("run the agent with ainvoke/astream, or pass a Guard")
    assert model.seen == []


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_message_id_ctxguard_cannot_take_is_stored_once(guard: Guard, mode: str) -> None:
    """A message whose LangChain id is no valid ctxguard id (300 characters) is stored once
    over the run's model calls and turns, and reads back with its own id (it got a fresh
    random id each time, so was stored again on every model call)."""
    agent = weather_agent(WeatherModel(), CtxGuardMiddleware(guard, max_tokens=RESERVE))
    config = {"configurable": {"thread_id": "t"}}
    for turn, message_id in enumerate(["u" * 300, "v" * 300]):
        state = {"messages": [HumanMessage(f"turn {turn}: weather?", id=message_id)]}
        if mode == "sync":
            await asyncio.to_thread(agent.invoke, state, config)
        else:
            await agent.ainvoke(state, config)
    messages = (await agent.aget_state(config)).values["messages"]
    assert [to_langchain(s.message) for s in guard.store.read("t")] == messages


# -- LangChain's own context tools with ctxguard's exact count ---------------------------


def call(i: int) -> Any:
    return {"name": "weather", "args": {"city": "Lima"}, "id": f"t{i}"}


def long_history(turns: int) -> list[BaseMessage]:
    out: list[BaseMessage] = [SystemMessage(SYSTEM)]
    for i in range(turns):
        out += [
            HumanMessage(f"turn {i}: weather in Lima?"),
            AIMessage(
                "", tool_calls=[{"name": "weather", "args": {"city": "Lima"}, "id": f"t{i}"}]
            ),
            ToolMessage("Lima: 18C and clear " * 3, tool_call_id=f"t{i}"),
            AIMessage(f"Lima is 18C ({i})."),
        ]
    return out


def test_token_counter_is_the_guards_exact_count(guard: Guard) -> None:
    count = token_counter(guard)
    history = long_history(3)
    assert count(history) == guard.counter.count_request([to_ctxguard(m) for m in history])
    with_tools = token_counter(guard, tools=[weather])
    assert with_tools(history) == guard.counter.count_request(
        [to_ctxguard(m) for m in history], tools=SCHEMAS
    )
    assert count([("user", "hi")]) == count([HumanMessage("hi")])  # message-likes too


def test_trim_messages_with_the_token_counter(guard: Guard) -> None:
    count = token_counter(guard)
    history = long_history(20)
    trimmed = trim_messages(
        history,
        max_tokens=250,
        token_counter=count,
        strategy="last",
        start_on="human",
        include_system=True,
    )
    assert 0 < count(trimmed) <= 250
    assert isinstance(trimmed[0], SystemMessage) and isinstance(trimmed[1], HumanMessage)
    assert trimmed[-1] is history[-1]
    assert count(history) > 250


def test_summarization_middleware_uses_the_profile_and_the_counter(guard: Guard) -> None:
    profile = model_profile(guard, max_tokens=RESERVE)
    summarizer = GenericFakeChatModel(
        messages=iter([AIMessage(f"summary {i}") for i in range(50)]), profile=profile
    )
    summarize = SummarizationMiddleware(
        summarizer,
        trigger=("fraction", 0.7),
        keep=("messages", 6),
        token_counter=token_counter(guard, tools=[weather]),
    )
    model = WeatherModel(profile=profile)
    agent = weather_agent(model, summarize, CtxGuardMiddleware(guard, max_tokens=RESERVE))
    state = asyncio.run(run_turns(agent, "sync", 12))
    check_calls(guard, model)
    assert any("summary" in str(m.content) for m in state)  # LangChain summarised the state
    history, _ = asyncio.run(stored(guard, "chat-1"))
    assert len(history) > len(state)  # ctxguard's session kept every message


def test_context_editing_middleware_with_the_counter(guard: Guard) -> None:
    edit = ContextEditingMiddleware(
        edits=[ClearToolUsesEdit(trigger=150, keep=1)],
        token_counter=token_counter(guard, tools=[weather]),
    )
    model = WeatherModel()
    agent = weather_agent(model, edit, CtxGuardMiddleware(guard, max_tokens=RESERVE))
    asyncio.run(run_turns(agent, "sync", 6))
    check_calls(guard, model)
    sent_tools = [m for call in model.seen for m in call if isinstance(m, ToolMessage)]
    assert any(m.content == "[cleared]" for m in sent_tools)
    history, _ = asyncio.run(stored(guard, "chat-1"))
    kept = [s.message for s in history if s.message.role == "tool"]
    assert kept and all(m.text.startswith(("Lima", "Paris", "Oslo")) for m in kept)


# -- the served limit as the model's profile ------------------------------------------


def test_model_profile_is_the_served_limit_less_the_reserve(store_url: str) -> None:
    guard = Guard(store_url, limit=LIMIT, max_tokens=RESERVE, safety_margin=8)
    assert model_profile(guard) == {"max_input_tokens": LIMIT - RESERVE - 8}
    assert model_profile(guard, max_tokens=100) == {"max_input_tokens": LIMIT - 100}
    assert model_profile(ContextLimit(1000, "test")) == {"max_input_tokens": 1000}
    served = ModelLimit("meta-llama/Llama-3.1-8B-Instruct", max_model_len=8192)
    assert model_profile(served, max_tokens=512) == {"max_input_tokens": 8192 - 512}
    model = GenericFakeChatModel(messages=iter([]), profile=model_profile(guard))
    assert model.profile == {"max_input_tokens": LIMIT - RESERVE - 8}
    guard.close()


def test_chat_openai_pointed_at_vllm_takes_the_profile() -> None:
    openai = pytest.importorskip("langchain_openai")
    model = openai.ChatOpenAI(
        model="Qwen/Qwen3-8B",
        base_url="http://127.0.0.1:9/v1",
        api_key="unused",
        profile=model_profile(8192, max_tokens=1024),
    )
    assert model.profile["max_input_tokens"] == 7168


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda g: model_profile(g), ConfigError),  # 1024 reserved in a 400 limit
        (lambda g: model_profile("8192"), ConfigError),
        (lambda g: model_profile(g, max_tokens=-1), CtxGuardError),
        (lambda g: token_counter("approx"), ConfigError),
        (lambda g: token_counter(g, tools=[object()]), CtxGuardError),
        (lambda g: CtxGuardMiddleware(private_memory_url()), ConfigError),
        (lambda g: CtxGuardMiddleware(g, session_id=""), CtxGuardError),
        (lambda g: CtxGuardMiddleware(g, max_tokens=-1), CtxGuardError),
    ],
)
def test_bad_arguments_are_one_line_typed_errors(guard: Guard, call: Any, error: type) -> None:
    with pytest.raises(error) as info:
        call(guard)
    assert "\n" not in str(info.value)


def test_token_counter_counts_a_bare_string_as_one_human_message(guard: Guard) -> None:
    """As a chat model takes it (``model.invoke("hi")``); before, LangChain's
    convert_to_messages read it as one human message per character (5.3x the count
    here)."""
    count = token_counter(guard)
    text = "what is the weather in Lima today?"
    assert count(text) == count([HumanMessage(text)]) == count([("human", text)])
    assert count(HumanMessage(text)) == count([HumanMessage(text)])
    assert count(m for m in [HumanMessage(text)]) == count([HumanMessage(text)])


@pytest.mark.parametrize("bad", [[object()], [HumanMessage("ok"), 5], {"role": "user"}, None])
def test_token_counter_refuses_what_is_not_messages_in_one_line(guard: Guard, bad: Any) -> None:
    """(before: LangChain's multi-line NotImplementedError, or a dict's keys counted)"""
    with pytest.raises(InvalidMessageError) as exc:
        token_counter(guard)(bad)
    assert "\n" not in str(exc.value) and "messages" in str(exc.value)
