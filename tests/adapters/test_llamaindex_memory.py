"""LlamaIndex memory: it survives its own serialisation, and engines' system prompts fit."""

from __future__ import annotations

import json
from typing import Any

import pydantic
import pytest

pytest.importorskip("llama_index.core")

from llama_index.core.agent.workflow import FunctionAgent
from llama_index.core.chat_engine import SimpleChatEngine
from llama_index.core.llms import ChatMessage, ChatResponse, MockLLM
from llama_index.core.llms.mock import MockFunctionCallingLLM
from llama_index.core.workflow import Context, JsonSerializer
from pydantic import Field

from ctxguard import ConfigError
from ctxguard.adapters import _llamaindex_fields
from ctxguard.adapters.llamaindex import CtxGuardMemory, to_ctxguard
from ctxguard.errors import InvalidIdError, InvalidInputError
from ctxguard.guard import Guard

from .conftest import assert_fits


def history() -> list[ChatMessage]:
    return [
        ChatMessage(role="system", content="Be brief."),
        ChatMessage(role="user", content="hello"),
        ChatMessage(role="assistant", content="hi"),
    ]


def test_from_dict_of_to_dict_works(store_url: str, namespace: str) -> None:
    memory = CtxGuardMemory.from_defaults(
        store_url,
        session_id="s",
        namespace=namespace,
        limit=400,
        max_tokens=50,
        chat_history=history(),
    )
    data = json.loads(json.dumps(memory.to_dict()))
    again = CtxGuardMemory.from_dict(data)
    assert again.get() == history() and again.get_all() == history()
    _llamaindex_fields._LIVE.clear()  # as if in another process: opened from the fields
    elsewhere = CtxGuardMemory.from_dict(data)
    assert elsewhere.get() == history()
    elsewhere.ref.sync().close()


def test_built_directly(store_url: str, namespace: str) -> None:
    memory = CtxGuardMemory(
        session_id="d", store=store_url, namespace=namespace, limit=400, max_tokens=50
    )
    memory.put(ChatMessage(role="user", content="hi"))
    assert [m.content for m in memory.get()] == ["hi"]
    memory.ref.sync().close()


def test_built_on_a_guard_object(guard: Guard) -> None:
    memory = CtxGuardMemory.from_defaults(
        guard, session_id="g", max_tokens=50, chat_history=history()
    )
    data = memory.to_dict()
    assert data["limit"] == 400 and data["counter"] == "approx"
    assert CtxGuardMemory.from_dict(data).get() == history()


def test_the_password_is_never_serialised(monkeypatch: pytest.MonkeyPatch) -> None:
    url = "redis://:s3cret-pw@127.0.0.1:1/0"
    memory = CtxGuardMemory.from_defaults(url, session_id="p", limit=400)
    text = json.dumps(memory.to_dict())
    assert "s3cret" not in text and "***" in text
    _llamaindex_fields._LIVE.clear()
    monkeypatch.delenv("CTXGUARD_URL", raising=False)
    with pytest.raises(ConfigError, match="CTXGUARD_URL") as info:
        _ = CtxGuardMemory.from_dict(json.loads(text)).ref
    assert "s3cret" not in str(info.value)
    monkeypatch.setenv("CTXGUARD_URL", url)
    assert CtxGuardMemory.from_dict(json.loads(text)).ref is not None  # opened lazily


@pytest.mark.parametrize(
    "fields", [{"session_id": ""}, {"max_tokens": -1}, {"store": None, "limit": 10}]
)
def test_bad_fields_are_refused(fields: dict[str, Any]) -> None:
    with pytest.raises(ConfigError if fields.get("store", 1) is None else Exception):
        memory = CtxGuardMemory(**fields)
        _ = memory.ref


BUILDS = {
    "direct": lambda fields: CtxGuardMemory(**fields),
    "from_dict": lambda fields: CtxGuardMemory.from_dict(fields),
    "model_validate": lambda fields: CtxGuardMemory.model_validate(fields),
    "model_validate_json": lambda fields: CtxGuardMemory.model_validate_json(json.dumps(fields)),
}


@pytest.mark.parametrize("build", sorted(BUILDS))
@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"session_id": ""}, InvalidIdError),
        ({"session_id": "x\ny"}, InvalidIdError),
        ({"limit": -1}, InvalidInputError),
        ({"max_tokens": -1}, InvalidInputError),
        ({"session_id": 5}, InvalidInputError),
        ({"settings": "no"}, InvalidInputError),
    ],
    ids=["empty-id", "newline-id", "limit", "max_tokens", "int-id", "settings-str"],
)
def test_bad_fields_raise_the_ctxguard_error_itself(
    build: str, fields: dict[str, Any], error: type[Exception]
) -> None:
    """Built directly, from_dict or model_validate(_json), a bad field is the ctxguard
    error on one line (it was a pydantic ValidationError of many lines wrapping it)."""
    with pytest.raises(error) as info:
        BUILDS[build](fields)
    assert not isinstance(info.value, pydantic.ValidationError)
    assert "\n" not in str(info.value)


async def test_function_agent_state_round_trips(store_url: str, namespace: str) -> None:
    memory = CtxGuardMemory.from_defaults(
        store_url, session_id="agent", namespace=namespace, limit=2000
    )
    agent = FunctionAgent(llm=MockFunctionCallingLLM(), tools=[], system_prompt="Be brief.")
    ctx = Context(agent)
    await agent.run("hello", ctx=ctx, memory=memory)
    data = ctx.to_dict(serializer=JsonSerializer())
    assert "s3cret" not in json.dumps(data)
    restored = Context.from_dict(agent, data, serializer=JsonSerializer())
    again = await restored.store.get("memory")
    assert isinstance(again, CtxGuardMemory)
    await agent.run("again", ctx=restored)
    contents = [m.content for m in await again.aget_all()]
    assert contents[0] == "hello" and "again" in contents


class RecordingLLM(MockLLM):
    seen: list[list[ChatMessage]] = Field(default_factory=list)

    def chat(self, messages: Any, **kwargs: Any) -> ChatResponse:
        self.seen.append(list(messages))
        return ChatResponse(message=ChatMessage(role="assistant", content="a reply " * 8))

    async def achat(self, messages: Any, **kwargs: Any) -> ChatResponse:
        return self.chat(messages, **kwargs)


SYSTEM_PROMPT = " ".join(f"rule{i}: answer politely." for i in range(14))


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_an_engine_system_prompt_fits(
    store_url: str, namespace: str, guard: Guard, mode: str
) -> None:
    llm = RecordingLLM()
    memory = CtxGuardMemory.from_defaults(
        store_url, session_id="e", namespace=namespace, limit=360, max_tokens=40
    )
    system = guard.counter.count_message(
        to_ctxguard(ChatMessage(role="system", content=SYSTEM_PROMPT))
    )
    assert system >= 60
    engine = SimpleChatEngine.from_defaults(llm=llm, memory=memory, system_prompt=SYSTEM_PROMPT)
    for i in range(8):
        question = f"question {i}: what should I pack for a trip to city number {i}?"
        await engine.achat(question) if mode == "async" else engine.chat(question)
    assert len(llm.seen) == 8
    for sent in llm.seen:
        assert sent[0].content == SYSTEM_PROMPT
        tokens = guard.counter.count_request([to_ctxguard(m) for m in sent])
        assert tokens + 40 <= 360, tokens
    assert_fits(guard, [to_ctxguard(m) for m in llm.seen[-1]], 40)


async def test_an_empty_memory_gets_no_messages(store_url: str, namespace: str) -> None:
    memory = CtxGuardMemory.from_defaults(
        store_url, session_id="empty", namespace=namespace, limit=1000, max_tokens=100
    )
    assert memory.get() == [] and await memory.aget() == []
    memory.put(ChatMessage(role="user", content="hi"))
    assert [m.content for m in memory.get()] == ["hi"]
    memory.reset()
    assert memory.get() == [] and await memory.aget() == []
