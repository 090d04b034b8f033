"""LlamaIndex end to end: a FunctionAgent (async and streamed) over 12 turns with single
and parallel tool calls, and the chat engine (sync, async, streamed), on CtxGuardMemory.

Every LLM call gets a window that fits the limit by the guard's own count (tool schemas
included), opens on a user turn once older messages are left out and keeps tool pairs
whole; the session holds every message of every turn, in order. FunctionAgent has no
sync run. It sends ``memory.aget()`` plus its ``system_prompt`` and this run's tool steps
(its scratchpad), which the memory never sees: the memory's ``max_tokens`` reserves room
for them beside the reply (``agent_reserve``; the README keeps the system prompt in the
memory instead, pinned and counted there).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

pytest.importorskip("llama_index.core")

from llama_index.core.agent.workflow import FunctionAgent
from llama_index.core.base.llms.types import ToolCallBlock
from llama_index.core.chat_engine import SimpleChatEngine
from llama_index.core.llms import ChatMessage, ChatResponse, MockLLM
from llama_index.core.llms.mock import MockFunctionCallingLLM
from llama_index.core.tools import FunctionTool
from llama_index.core.workflow import Context
from pydantic import Field

from ctxguard.adapters.llamaindex import CtxGuardMemory, to_ctxguard
from ctxguard.guard import AsyncGuard, Guard
from ctxguard.messages import Message

from .conftest import LIMIT, RESERVE, assert_fits, assert_starts_on_user

TURNS = 12
AGENT_LIMIT = 2 * LIMIT  # the reserve for what the agent adds takes ~320 tokens
SYSTEM = "You answer weather questions."


def weather(city: str) -> str:
    """The weather in a city."""
    return f"{city}: 18C, clear skies, light wind from the west. " * 2


TOOL = FunctionTool.from_defaults(weather)
SCHEMAS: list[dict[str, Any]] = [TOOL.metadata.to_openai_tool()]


def cities(turn: int) -> list[str]:
    """One tool call on odd turns, two in parallel on even ones."""
    return ["Paris", "Oslo"] if turn % 2 == 0 else ["Lima"]


def tool_calls(turn: int) -> ChatMessage:
    return ChatMessage(
        role="assistant",
        blocks=[
            ToolCallBlock(tool_call_id=f"c{turn}-{c}", tool_name="weather", tool_kwargs={"city": c})
            for c in cities(turn)
        ],
    )


def answer(turn: int) -> ChatMessage:
    return ChatMessage(role="assistant", content=f"It is mild ({turn}). " * 6)


def weather_llm(seen: list[list[ChatMessage]]) -> MockFunctionCallingLLM:
    """Turn i: its tool calls, then (tool results back) an answer; records every call."""

    def respond(messages: Sequence[ChatMessage], **kwargs: Any) -> ChatMessage:
        seen.append(list(messages))
        last = messages[-1]
        if last.role.value == "tool":
            users = [m for m in messages if m.role.value == "user"]
            return answer(int(str(users[-1].content).split()[1].rstrip(":")))
        return tool_calls(int(str(last.content).split()[1].rstrip(":")))

    return MockFunctionCallingLLM(response_generator=respond)


def agent_reserve(counter: Guard | AsyncGuard, with_system: bool) -> int:
    """The reply, tool schemas, the largest turn's tool steps (and the agent's system prompt
    when the agent, not the memory, holds it)."""
    turn = 0  # a parallel turn: two calls and two results
    steps = [to_ctxguard(tool_calls(turn))] + [
        Message(role="tool", content=weather(c), tool_call_id=f"c{turn}-{c}") for c in cities(turn)
    ]
    system = [Message(role="system", content=SYSTEM)] if with_system else []
    return RESERVE + counter.counter.count_request([*system, *steps], tools=SCHEMAS)


def expected_roles(turns: int) -> list[tuple[str, int]]:
    """(role, tool calls) of every stored message, in order."""
    out: list[tuple[str, int]] = []
    for turn in range(turns):
        n = len(cities(turn))
        out += [("user", 0), ("assistant", n)] + [("tool", 0)] * n + [("assistant", 0)]
    return out


def roles(history: Sequence[Message]) -> list[tuple[str, int]]:
    return [(m.role, len(m.tool_calls or ())) for m in history]


def check_calls(
    guard: Guard | AsyncGuard,
    seen: list[list[ChatMessage]],
    history: Sequence[Message],
    reserve: int,
    tools: list[dict[str, Any]] | None,
) -> None:
    for call in seen:
        window = [to_ctxguard(m) for m in call]
        assert window[0].role == "system"
        assert_fits(guard, window, reserve, tools)  # includes: tool pairs whole
        assert_starts_on_user(window, history)
    assert len(seen[-1]) < len(history)  # the history outgrew the budget: trimmed


@pytest.mark.parametrize("streaming", [False, True], ids=["async", "stream"])
@pytest.mark.parametrize(
    "which", ["url-agent-prompt", "aguard-memory-prompt"], ids=["url", "aguard"]
)
async def test_function_agent_fits_every_call_and_keeps_the_session(
    store_url: str, namespace: str, streaming: bool, which: str
) -> None:
    aguard = AsyncGuard(store_url, namespace=namespace, limit=AGENT_LIMIT, counter="approx")
    seen: list[list[ChatMessage]] = []
    in_memory = which.endswith("memory-prompt")  # the README's way: pinned in the session
    agent = FunctionAgent(
        llm=weather_llm(seen),
        tools=[TOOL],
        system_prompt=None if in_memory else SYSTEM,
        streaming=streaming,
    )
    reserve = agent_reserve(aguard, with_system=not in_memory)
    system = [ChatMessage(role="system", content=SYSTEM)] if in_memory else None
    if which.startswith("url"):
        memory = CtxGuardMemory.from_defaults(
            store_url,
            session_id="agent",
            namespace=namespace,
            limit=AGENT_LIMIT,
            max_tokens=reserve,
            chat_history=system,
        )
    else:
        memory = CtxGuardMemory.from_defaults(aguard, session_id="agent", max_tokens=reserve)
        if system:  # from_defaults(chat_history=...) writes with the sync API
            await memory.aset(system)
    ctx = Context(agent)
    for turn in range(TURNS):
        handler = agent.run(f"turn {turn}: what is the weather like today?", ctx=ctx, memory=memory)
        if streaming:
            events = [event async for event in handler.stream_events()]
            assert events
        result: Any = await handler
        assert str(result.response.content).startswith(f"It is mild ({turn})")

    history = [to_ctxguard(m) for m in await memory.aget_all()]
    pinned = [("system", 0)] if in_memory else []
    assert roles(history) == pinned + expected_roles(TURNS)  # whole and ordered
    users = [m.text for m in history if m.role == "user"]
    assert users == [f"turn {t}: what is the weather like today?" for t in range(TURNS)]
    assert len(seen) == 2 * TURNS
    check_calls(aguard, seen, history, RESERVE, SCHEMAS)
    await aguard.aclose()


class RecordingLLM(MockLLM):
    seen: list[list[ChatMessage]] = Field(default_factory=list)

    def _reply(self, messages: Any) -> ChatMessage:
        self.seen.append(list(messages))
        return ChatMessage(role="assistant", content="a fine reply " * 8)

    def chat(self, messages: Any, **kwargs: Any) -> ChatResponse:
        return ChatResponse(message=self._reply(messages))

    async def achat(self, messages: Any, **kwargs: Any) -> ChatResponse:
        return self.chat(messages, **kwargs)

    def stream_chat(self, messages: Any, **kwargs: Any) -> Any:
        reply = self._reply(messages)

        def gen() -> Any:
            text = ""
            for word in str(reply.content).split(" "):
                text += word + " "
                yield ChatResponse(
                    message=ChatMessage(role="assistant", content=text), delta=word + " "
                )

        return gen()

    async def astream_chat(self, messages: Any, **kwargs: Any) -> Any:
        chunks = list(self.stream_chat(messages, **kwargs))

        async def gen() -> Any:
            for chunk in chunks:
                yield chunk

        return gen()


@pytest.mark.parametrize("mode", ["sync", "async", "stream", "astream"])
async def test_chat_engine_with_a_system_prompt_over_many_turns(
    store_url: str, namespace: str, guard: Guard, mode: str
) -> None:
    llm = RecordingLLM()
    memory = CtxGuardMemory.from_defaults(
        store_url, session_id="chat", namespace=namespace, limit=LIMIT, max_tokens=RESERVE
    )
    engine = SimpleChatEngine.from_defaults(llm=llm, memory=memory, system_prompt=SYSTEM)
    for turn in range(TURNS + 2):
        question = f"question {turn}: what should I pack for a trip to city number {turn}?"
        if mode == "sync":
            text = engine.chat(question).response
        elif mode == "async":
            text = (await engine.achat(question)).response
        elif mode == "stream":
            streamed = engine.stream_chat(question)
            text = "".join(streamed.response_gen)
        else:
            astreamed = await engine.astream_chat(question)
            text = "".join([t async for t in astreamed.async_response_gen()])
        assert text.startswith("a fine reply")
    history = [to_ctxguard(m) for m in memory.get_all()]
    assert [m.role for m in history] == ["user", "assistant"] * (TURNS + 2)
    assert [m.text for m in history if m.role == "user"] == [
        f"question {t}: what should I pack for a trip to city number {t}?" for t in range(TURNS + 2)
    ]
    assert len(llm.seen) == TURNS + 2
    check_calls(guard, llm.seen, history, RESERVE, None)
