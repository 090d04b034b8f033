"""CtxGuardLLM end to end: a FunctionAgent's FINAL model input fits, with no hand-set reserve.

The agent adds its ``system_prompt``, the tool schemas and the run's tool calls and
results to what ``memory.aget()`` returns; the memory here reserves only the reply
(``max_tokens=RESERVE``), so without the wrapper the calls overflow (the planted
bypass below shows it). With ``CtxGuardLLM`` every call the fake model receives, counted
with the guard's own counter and the tool schemas the model was given, fits the limit
minus the reply, opens (after the system prompt) on a user turn and keeps tool pairs
whole; the session holds every message of every turn, in order. 12 turns, single and
parallel tool calls; ``asyncio.run`` per turn (the sync way to run a workflow), async,
streamed events; and the sync tool-calling entry points driven by hand.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

pytest.importorskip("llama_index.core")

from llama_index.core.agent.workflow import AgentWorkflow, FunctionAgent
from llama_index.core.llms import ChatMessage
from llama_index.core.llms.mock import MockFunctionCallingLLM
from llama_index.core.workflow import Context

from ctxguard.adapters import _shared
from ctxguard.adapters.llamaindex import CtxGuardLLM, CtxGuardMemory, to_ctxguard
from ctxguard.errors import BudgetError, ConfigError, InvalidInputError
from ctxguard.guard import AsyncGuard, Guard
from ctxguard.messages import Message

from .conftest import LIMIT, RESERVE, assert_fits, assert_starts_on_user
from .test_llamaindex_agent import (
    SYSTEM,
    TOOL,
    TURNS,
    answer,
    expected_roles,
    roles,
    tool_calls,
    weather,
)

AGENT_LIMIT = 2 * LIMIT
Call = tuple[list[ChatMessage], list[dict[str, Any]] | None]


def recording_llm(seen: list[Call]) -> MockFunctionCallingLLM:
    """Turn i: its tool calls (one, or two in parallel), then an answer; records every
    input it receives with the tools it was given, as OpenAI schemas."""

    def respond(messages: Sequence[ChatMessage], **kwargs: Any) -> ChatMessage:
        tools = kwargs.get("tools")
        seen.append((list(messages), [t.metadata.to_openai_tool() for t in tools or ()] or None))
        users = [m for m in messages if m.role.value == "user"]
        turn = int(str(users[-1].content).split()[1].rstrip(":"))
        return answer(turn) if messages[-1].role.value == "tool" else tool_calls(turn)

    return MockFunctionCallingLLM(response_generator=respond)


def check_inputs(
    guard: Guard | AsyncGuard, seen: list[Call], history: Sequence[Message], pinned: int
) -> None:
    """Every recorded model input fits by the guard's exact count (tools included) with the
    reply reserved, opens after the pinned messages on a user turn, keeps tool pairs whole."""
    for messages, tools in seen:
        window = [to_ctxguard(m) for m in messages]
        assert [m.role for m in window[:pinned]] == ["system"] * pinned
        assert window[pinned].role == "user", [m.role for m in window]
        assert_fits(guard, window, RESERVE, tools)  # includes: tool pairs whole
        assert_starts_on_user(window, history)
    assert any(len(m) < len(history) for m, _ in seen)  # the history outgrew the limit


def question(turn: int) -> str:
    return f"turn {turn}: what is the weather like today, and should I take a coat?"


async def run_turn(agent: FunctionAgent, ctx: Context, memory: CtxGuardMemory, turn: int) -> str:
    handler = agent.run(question(turn), ctx=ctx, memory=memory)
    if agent.streaming:
        assert [event async for event in handler.stream_events()]
    result: Any = await handler
    return str(result.response.content)


def check_session(memory: CtxGuardMemory, pinned: list[tuple[str, int]]) -> list[Message]:
    history = [to_ctxguard(m) for m in memory.get_all()]
    assert roles(history) == pinned + expected_roles(TURNS)  # whole and ordered
    assert [m.text for m in history if m.role == "user"] == [question(t) for t in range(TURNS)]
    return history


@pytest.mark.parametrize("mode", ["run", "async", "stream"])
@pytest.mark.parametrize("prompt", ["agent", "memory"])
def test_function_agent_every_final_input_fits(
    store_url: str, namespace: str, mode: str, prompt: str
) -> None:
    seen: list[Call] = []
    memory = CtxGuardMemory.from_defaults(
        store_url,
        session_id="agent",
        namespace=namespace,
        limit=AGENT_LIMIT,
        max_tokens=RESERVE,  # the reply only: no hand-set reserve for what the agent adds
        chat_history=[ChatMessage(role="system", content=SYSTEM)] if prompt == "memory" else None,
    )
    # the reply reserved: given here, or (unset) the memory's max_tokens
    reserve = {"max_tokens": RESERVE} if prompt == "agent" else {}
    llm = CtxGuardLLM(recording_llm(seen), memory, **reserve)
    agent = FunctionAgent(
        llm=llm,
        tools=[TOOL],
        system_prompt=SYSTEM if prompt == "agent" else None,
        streaming=mode == "stream",
    )
    ctx = Context(agent)

    async def turns(first: int, last: int) -> None:
        for turn in range(first, last):
            assert (await run_turn(agent, ctx, memory, turn)).startswith(f"It is mild ({turn})")

    if mode == "run":  # a fresh event loop per turn, as a sync caller runs a workflow
        for turn in range(TURNS):
            asyncio.run(turns(turn, turn + 1))
    else:
        asyncio.run(turns(0, TURNS))

    history = check_session(memory, [("system", 0)] if prompt == "memory" else [])
    assert len(seen) == 2 * TURNS
    check_inputs(memory.ref.any_guard(), seen, history, pinned=1)
    assert llm.last_prepared is not None
    assert llm.last_prepared.reserved_output == RESERVE


@pytest.mark.parametrize("streaming", [False, True], ids=["async", "stream"])
async def test_agent_workflow_with_a_handoff_tool_fits(
    store_url: str, namespace: str, streaming: bool
) -> None:
    """An ``AgentWorkflow`` of two agents (so a ``handoff`` tool beside the weather tool) on
    an ``AsyncGuard``: every call fits with both tools' schemas counted."""
    aguard = AsyncGuard(store_url, namespace=namespace, limit=AGENT_LIMIT, counter="approx")
    seen: list[Call] = []
    memory = CtxGuardMemory.from_defaults(aguard, session_id="flow", max_tokens=RESERVE)
    llm = CtxGuardLLM(recording_llm(seen), aguard, max_tokens=RESERVE)
    weather_agent = FunctionAgent(
        name="weather",
        description="Answers weather questions.",
        llm=llm,
        tools=[TOOL],
        system_prompt=SYSTEM,
        can_handoff_to=["clerk"],
        streaming=streaming,
    )
    clerk = FunctionAgent(name="clerk", description="Files requests.", llm=llm, tools=[TOOL])
    flow = AgentWorkflow(agents=[weather_agent, clerk], root_agent="weather")
    ctx = Context(flow)
    for turn in range(TURNS):
        handler = flow.run(question(turn), ctx=ctx, memory=memory)
        if streaming:
            assert [event async for event in handler.stream_events()]
        result: Any = await handler
        assert str(result.response.content).startswith(f"It is mild ({turn})")
    history = [to_ctxguard(m) for m in await memory.aget_all()]
    assert roles(history) == expected_roles(TURNS)
    assert all(tools is not None and len(tools) == 2 for _, tools in seen)  # weather + handoff
    check_inputs(aguard, seen, history, pinned=1)
    await aguard.aclose()


def test_the_agent_overflows_without_the_wrapper(store_url: str, namespace: str) -> None:
    """The same run with the fitting bypassed: the agent's additions push calls over."""
    seen: list[Call] = []
    memory = CtxGuardMemory.from_defaults(
        store_url, session_id="agent", namespace=namespace, limit=AGENT_LIMIT, max_tokens=RESERVE
    )
    agent = FunctionAgent(llm=recording_llm(seen), tools=[TOOL], system_prompt=SYSTEM)
    ctx = Context(agent)
    for turn in range(TURNS):
        asyncio.run(run_turn(agent, ctx, memory, turn))
    history = check_session(memory, [])
    with pytest.raises(AssertionError):
        check_inputs(memory.ref.any_guard(), seen, history, pinned=1)


@pytest.mark.parametrize("streamed", [False, True], ids=["chat", "stream"])
def test_sync_tool_calling_entry_points_fit(guard: Guard, streamed: bool) -> None:
    """``chat_with_tools`` / ``stream_chat_with_tools`` driven by hand (user_msg apart from
    the history): every input fits, and the caller's history stays whole."""
    seen: list[Call] = []
    inner = recording_llm(seen)
    llm = CtxGuardLLM(inner, guard, max_tokens=RESERVE)
    history = [ChatMessage(role="system", content=SYSTEM)]
    for turn in range(TURNS):
        user = ChatMessage(role="user", content=question(turn))
        call = llm.stream_chat_with_tools if streamed else llm.chat_with_tools
        response: Any = call([TOOL], user_msg=user, chat_history=history)
        if streamed:
            response = list(response)[-1]
        history.append(user)
        history.append(response.message)
        for selection in llm.get_tool_calls_from_response(response, error_on_no_tool_call=True):
            result = weather(selection.tool_kwargs["city"])
            history.append(
                ChatMessage(
                    role="tool",
                    content=result,
                    additional_kwargs={"tool_call_id": selection.tool_id},
                )
            )
        final: Any = llm.chat_with_tools([TOOL], chat_history=history)
        history.append(final.message)
        assert str(final.message.content).startswith(f"It is mild ({turn})")
    whole = [to_ctxguard(m) for m in history]
    assert roles(whole) == [("system", 0), *expected_roles(TURNS)]
    sent = seen[-1][0]  # the caller's own message objects, not copies
    assert all(any(m is h for h in history) for m in sent)
    check_inputs(guard, seen, whole, pinned=1)


def test_plain_chat_and_complete_fit(guard: Guard) -> None:
    """``chat``/``achat``/``stream_chat``/``astream_chat`` (no tools) fit the same way."""
    seen: list[Call] = []
    llm = CtxGuardLLM(recording_llm(seen), guard, max_tokens=RESERVE)
    history = [ChatMessage(role="system", content=SYSTEM)]
    for turn in range(TURNS):
        history.append(ChatMessage(role="user", content=question(turn)))
        history.append(tool_calls(turn))
        for city in ["Paris", "Oslo"] if turn % 2 == 0 else ["Lima"]:
            history.append(
                ChatMessage(
                    role="tool",
                    content=weather(city),
                    additional_kwargs={"tool_call_id": f"c{turn}-{city}"},
                )
            )
        mode = turn % 4
        if mode == 0:
            reply = llm.chat(history).message
        elif mode == 1:
            reply = asyncio.run(llm.achat(history)).message
        elif mode == 2:
            reply = list(llm.stream_chat(history))[-1].message
        else:

            async def astream() -> Any:
                return [c async for c in await llm.astream_chat(history)][-1].message

            reply = asyncio.run(astream())
        history.append(reply)
    check_inputs(guard, seen, [to_ctxguard(m) for m in history], pinned=1)
    assert llm.complete("short question").text == "short question"


def test_a_call_that_cannot_fit_raises_budget_error(guard: Guard) -> None:
    seen: list[Call] = []
    llm = CtxGuardLLM(recording_llm(seen), guard, max_tokens=LIMIT - 10)
    with pytest.raises(BudgetError):
        llm.chat_with_tools([TOOL], user_msg=question(0), chat_history=[])
    assert seen == []  # nothing reached the model


def test_bad_arguments_are_typed_errors(guard: Guard) -> None:
    with pytest.raises(ConfigError):
        CtxGuardLLM("gpt", guard)  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        CtxGuardLLM(recording_llm([]), "redis://x")  # type: ignore[arg-type]
    llm = CtxGuardLLM(recording_llm([]), guard)
    with pytest.raises(InvalidInputError):
        llm.chat_with_tools(["weather"], user_msg="hi")  # type: ignore[list-item]
    with pytest.raises(InvalidInputError):
        llm.chat([ChatMessage(role="user", content="hi")], max_tokens=-1)


def test_fit_uses_the_guards_own_policy_path(monkeypatch: pytest.MonkeyPatch, guard: Guard) -> None:
    """The wrapper fits through ``_shared.fit`` (the path the Pydantic AI adapter uses)."""
    calls: list[int] = []
    real = _shared.fit

    def spy(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(_shared, "fit", spy)
    llm = CtxGuardLLM(recording_llm([]), guard, max_tokens=RESERVE)
    llm.chat_with_tools([TOOL], user_msg=question(0))
    assert calls == [1]
