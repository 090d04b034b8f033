"""A request the guard refuses stores nothing, through LlamaIndex's real FunctionAgent
workflow and chat engine on CtxGuardMemory.

Both store the user's message (``memory.aput`` / ``put``) before they ask the memory
for the window (``aget`` / ``get``), which the guard fits; when it refuses (BudgetError:
the message cannot fit), the memory takes back what it stored of the request (one
``store.retract``): the store is as before but for the guard's ``refused`` audit record
and that ``retract`` record (tests/store_diff.py), and the turns before are kept whole.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

pytest.importorskip("llama_index.core")

from llama_index.core.agent.workflow import FunctionAgent
from llama_index.core.base.llms.types import ToolCallBlock
from llama_index.core.chat_engine import SimpleChatEngine
from llama_index.core.llms import ChatMessage
from llama_index.core.llms.mock import MockFunctionCallingLLM
from llama_index.core.workflow import Context

from ctxguard.adapters.llamaindex import CtxGuardLLM, CtxGuardMemory
from ctxguard.errors import BudgetError
from tests import store_diff

from .conftest import LIMIT, RESERVE
from .test_llamaindex_agent import TOOL, RecordingLLM, weather_llm

BIG = "every word here counts " * 200  # far past LIMIT on its own
AGENT_LIMIT = 4 * LIMIT


def raised(exc: BaseException, kind: type[BaseException]) -> bool:
    """Whether ``exc`` or an exception it was raised from is a ``kind``."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, kind):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def memory_for(store_url: str, namespace: str, limit: int) -> CtxGuardMemory:
    return CtxGuardMemory.from_defaults(
        store_url, session_id="s", namespace=namespace, limit=limit, max_tokens=RESERVE
    )


def snapshot(memory: CtxGuardMemory, url: str) -> store_diff.Snapshot:
    return store_diff.take(memory.ref.sync().store, url)


async def test_a_function_agent_s_refused_message_is_not_stored(
    store_url: str, namespace: str
) -> None:
    memory = memory_for(store_url, namespace, AGENT_LIMIT)
    seen: list[list[ChatMessage]] = []
    agent = FunctionAgent(llm=weather_llm(seen), tools=[TOOL], system_prompt=None)
    ctx = Context(agent)
    result: Any = await agent.run("turn 0: what is the weather like today?", ctx=ctx, memory=memory)
    assert str(result.response.content).startswith("It is mild (0)")
    stored = await memory.aget_all()  # the turn, its tool steps put after the last aget
    assert [m.role.value for m in stored] == ["user", "assistant", "tool", "tool", "assistant"]
    before = snapshot(memory, store_url)
    with pytest.raises(Exception) as caught:
        await agent.run(f"turn 1: {BIG}", ctx=ctx, memory=memory)
    assert raised(caught.value, BudgetError)
    assert len(seen) == 2  # the refused request never reached the model
    store_diff.assert_taken_back(before, snapshot(memory, store_url), also=("refused",))
    assert [m.role.value for m in await memory.aget_all()] == [m.role.value for m in stored]
    memory.close()


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_chat_engine_s_refused_message_is_not_stored(
    store_url: str, namespace: str, mode: str
) -> None:
    memory = memory_for(store_url, namespace, LIMIT)
    llm = RecordingLLM()
    engine = SimpleChatEngine.from_defaults(llm=llm, memory=memory)
    if mode == "sync":
        engine.chat("a first question")
    else:
        await engine.achat("a first question")
    before = snapshot(memory, store_url)
    with pytest.raises(BudgetError):
        if mode == "sync":
            engine.chat(BIG)
        else:
            await engine.achat(BIG)
    assert len(llm.seen) == 1
    store_diff.assert_taken_back(before, snapshot(memory, store_url), also=("refused",))
    assert [m.content for m in memory.get_all() if m.role.value == "user"] == ["a first question"]
    memory.close()


async def test_a_write_between_the_put_and_the_get_is_never_taken_back(
    store_url: str, namespace: str
) -> None:
    """The take-back checks the session is as the put left it: another writer's message
    between leaves everything stored (the refusal raised as is)."""
    memory = memory_for(store_url, namespace, LIMIT)
    other = memory_for(store_url, namespace, LIMIT)
    await memory.aput(ChatMessage(role="user", content=BIG))
    await other.aput(ChatMessage(role="assistant", content="from elsewhere"))
    with pytest.raises(BudgetError):
        await memory.aget()
    assert [m.content for m in await memory.aget_all()] == [BIG, "from elsewhere"]
    memory.close()
    other.close()


async def test_steps_put_after_a_window_are_never_taken_back(
    store_url: str, namespace: str
) -> None:
    """What is put after a window without a new user message (an agent's steps answering
    that window's request) is not a refused request's: it stays."""
    memory = memory_for(store_url, namespace, LIMIT)
    await memory.aput(ChatMessage(role="user", content="a question"))
    assert len(await memory.aget()) == 1
    await memory.aput(ChatMessage(role="assistant", content=BIG))  # fits no window
    with pytest.raises(BudgetError):
        await memory.aget()
    assert [m.content for m in await memory.aget_all()] == ["a question", BIG]
    memory.close()


def llm_for(memory: CtxGuardMemory, seen: list[list[ChatMessage]], city: str) -> CtxGuardLLM:
    """A FunctionAgent's LLM behind CtxGuardLLM: a call of ``weather(city)``, then an answer."""

    def respond(messages: Sequence[ChatMessage], **kwargs: Any) -> ChatMessage:
        seen.append(list(messages))
        if messages[-1].role.value == "tool":
            return ChatMessage(role="assistant", content="done")
        call = ToolCallBlock(tool_call_id="c1", tool_name="weather", tool_kwargs={"city": city})
        return ChatMessage(role="assistant", blocks=[call])

    return CtxGuardLLM(MockFunctionCallingLLM(response_generator=respond), memory)


@pytest.mark.parametrize(
    ("prompt", "city", "calls"),
    [("You answer. " * 40, "Lima", 0), (None, BIG, 1)],
    ids=["first-call", "mid-run"],
)
async def test_a_call_ctxguard_llm_refuses_stores_nothing_of_the_run(
    store_url: str, namespace: str, prompt: str | None, city: str, calls: int
) -> None:
    """The memory's window fits, the call it goes into does not (the agent's system
    prompt, or this run's tool call, added): CtxGuardLLM's refusal takes back what the
    memory stored of the run (its user message); the store keeps the fitted windows'
    ``request`` records."""
    memory = memory_for(store_url, namespace, LIMIT)  # the message fits; with either, not
    await memory.aput(ChatMessage(role="user", content="an earlier question"))
    await memory.aput(ChatMessage(role="assistant", content="an earlier answer"))
    seen: list[list[ChatMessage]] = []
    agent = FunctionAgent(llm=llm_for(memory, seen, city), tools=[TOOL], system_prompt=prompt)
    before = snapshot(memory, store_url)
    with pytest.raises(Exception) as caught:
        await agent.run("turn 1: " + "word " * 60, ctx=Context(agent), memory=memory)
    assert raised(caught.value, BudgetError)
    assert len(seen) == calls
    store_diff.assert_taken_back(before, snapshot(memory, store_url), also=("request",))
    assert [m.content for m in await memory.aget_all()] == [
        "an earlier question",
        "an earlier answer",
    ]
    memory.close()
