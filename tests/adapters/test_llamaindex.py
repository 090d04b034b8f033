"""LlamaIndex adapter: BaseChatStore semantics, lossless messages, a budgeted memory."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("llama_index.core")

from llama_index.core.base.llms.types import ImageBlock, ThinkingBlock, ToolCallBlock
from llama_index.core.chat_engine import SimpleChatEngine
from llama_index.core.llms import ChatMessage, ChatResponse, MockLLM, TextBlock
from llama_index.core.storage.chat_store import SimpleChatStore
from pydantic import Field

from ctxguard.adapters.llamaindex import (
    CtxGuardChatStore,
    CtxGuardMemory,
    to_ctxguard,
    to_llamaindex,
)
from ctxguard.errors import CtxGuardError, InvalidMessageError, UncountableContentError
from ctxguard.guard import AsyncGuard, Guard
from tests.conftest import private_memory_url

from .conftest import RESERVE, assert_fits, assert_prepared_fits


def call(i: int) -> dict[str, Any]:
    return {"id": f"c{i}", "type": "function", "function": {"name": "f", "arguments": "{}"}}


def rich_conversation() -> list[ChatMessage]:
    return [
        ChatMessage(role="system", content="be brief"),
        ChatMessage(role="user", content="hi", additional_kwargs={"name": "ann"}),
        ChatMessage(role="assistant", content="", additional_kwargs={"tool_calls": [call(1)]}),
        ChatMessage(role="tool", content="r1", additional_kwargs={"tool_call_id": "c1"}),
        ChatMessage(
            role="assistant",
            blocks=[
                ThinkingBlock(content="hmm"),
                TextBlock(text="checking"),
                ToolCallBlock(tool_call_id="c2", tool_name="g", tool_kwargs={"x": 1}),
            ],
        ),
        ChatMessage(role="tool", content="r2", additional_kwargs={"tool_call_id": "c2"}),
        ChatMessage(role="chatbot", content="legacy role"),
        ChatMessage(role="assistant", content="done"),
    ]


def test_conversion_round_trips() -> None:
    for message in rich_conversation():
        assert to_llamaindex(to_ctxguard(message)) == message
    assert to_ctxguard(rich_conversation()[4]).to_openai()["tool_calls"][0]["id"] == "c2"


def test_sdk_tool_call_objects_come_back_as_their_json() -> None:
    """llama-index-llms-openai keeps the OpenAI SDK's tool-call objects in
    ``additional_kwargs`` (streamed: ``ChoiceDeltaToolCall``); they are stored, not refused."""
    from openai.types.chat.chat_completion_chunk import ChoiceDeltaToolCall

    delta = ChoiceDeltaToolCall.model_validate({"index": 0, **call(1)})
    message = ChatMessage(
        role="assistant",
        additional_kwargs={"tool_calls": [delta]},
        blocks=[ToolCallBlock(tool_call_id="c1", tool_name="f", tool_kwargs="{}")],
    )
    back = to_llamaindex(to_ctxguard(message))
    assert back.additional_kwargs == {"tool_calls": [delta.model_dump(mode="json")]}
    assert back.blocks == message.blocks


@pytest.mark.parametrize(
    "tool_calls",
    [
        [{"type": "function", "function": {"name": "f", "arguments": "{}"}}],
        {"id": "c1", "function": {"name": "f", "arguments": "{}"}},
        ["c1"],
        [{"id": "c1", "function": "f"}],
    ],
    ids=["no-id", "a-dict", "strings", "function-str"],
)
def test_malformed_tool_calls_are_invalid_message_errors(tool_calls: Any) -> None:
    """additional_kwargs['tool_calls'] that are not a list of OpenAI tool calls with ids
    are a one-line InvalidMessageError (they were a bare KeyError or AttributeError)."""
    message = ChatMessage(role="assistant", additional_kwargs={"tool_calls": tool_calls})
    with pytest.raises(InvalidMessageError) as info:
        to_ctxguard(message)
    assert "\n" not in str(info.value) and "tool_calls" in str(info.value)
    store = CtxGuardChatStore(private_memory_url())
    with pytest.raises(InvalidMessageError):
        store.add_message("k", message)
    assert store.get_messages("k") == []


@pytest.fixture
def chat_store(guard: Guard) -> CtxGuardChatStore:
    return CtxGuardChatStore(guard)


def test_chat_store_matches_simple_chat_store(chat_store: CtxGuardChatStore) -> None:
    """Every method returns what LlamaIndex's in-memory SimpleChatStore returns."""
    reference = SimpleChatStore()
    conversation = rich_conversation()

    def both(method: str, *args: Any) -> Any:
        ours, theirs = getattr(chat_store, method)(*args), getattr(reference, method)(*args)
        assert ours == theirs, method
        return ours

    both("set_messages", "k1", conversation[:3])
    both("add_message", "k1", conversation[3])
    both("add_message", "k2", conversation[0])
    both("get_messages", "k1")
    assert sorted(chat_store.get_keys()) == sorted(reference.get_keys()) == ["k1", "k2"]
    both("delete_message", "k1", 1)
    both("delete_message", "k1", 99)
    both("delete_last_message", "k1")
    both("get_messages", "k1")
    both("delete_messages", "k2")
    both("get_messages", "k2")
    both("delete_last_message", "k2")
    both("set_messages", "k1", conversation)
    both("get_messages", "k1")


async def test_chat_store_async(aguard: AsyncGuard) -> None:
    store = CtxGuardChatStore(aguard)
    conversation = rich_conversation()
    await store.aset_messages("k", conversation[:2])
    await store.async_add_message("k", conversation[2])
    await store.async_add_message("k", conversation[3])
    assert await store.aget_messages("k") == conversation[:4]
    assert await store.adelete_last_message("k") == conversation[3]
    assert await store.adelete_message("k", 0) == conversation[0]
    assert await store.aget_messages("k") == conversation[1:3]
    assert await store.aget_keys() == ["k"]
    assert await store.adelete_messages("k") == conversation[1:3]
    assert await store.aget_messages("k") == []
    assert await store.adelete_messages("k") is None


def refused_batches() -> list[tuple[list[ChatMessage], type[CtxGuardError]]]:
    """Batches an append refuses: an image for a text counter, one id for two tool calls."""
    image = ChatMessage(
        role="user", blocks=[TextBlock(text="see"), ImageBlock(url="http://a/b.png")]
    )
    twice = ChatMessage(role="assistant", additional_kwargs={"tool_calls": [call(1), call(1)]})
    new = ChatMessage(role="user", content="new")
    return [([new, image], UncountableContentError), ([new, twice], InvalidMessageError)]


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("where", ["chat_store", "memory"])
async def test_a_refused_set_leaves_the_session_unchanged(
    store_url: str, namespace: str, mode: str, where: str
) -> None:
    """set_messages / set / from_defaults(chat_history=) with a batch the append refuses
    change nothing stored (the whole session was deleted before the append refused)."""
    options: dict[str, Any] = {"namespace": namespace, "limit": 4000}
    store = CtxGuardChatStore(store_url, **options)
    memory = CtxGuardMemory.from_defaults(store_url, session_id="k", **options)
    kept = [
        ChatMessage(role="user", content="keep me"),
        ChatMessage(role="assistant", content="ok"),
    ]
    store.set_messages("k", kept)
    for batch, error in refused_batches():
        with pytest.raises(error):
            if where == "chat_store" and mode == "sync":
                store.set_messages("k", batch)
            elif where == "chat_store":
                await store.aset_messages("k", batch)
            elif mode == "sync":
                memory.set(batch)
            else:
                await memory.aset(batch)
        if where == "memory" and mode == "sync":
            with pytest.raises(error):
                CtxGuardMemory.from_defaults(
                    store_url, session_id="k", chat_history=batch, **options
                )
        assert store.get_messages("k") == kept
        assert await store.aget_messages("k") == kept


def long_history(turns: int) -> list[ChatMessage]:
    out = [ChatMessage(role="system", content="You answer weather questions.")]
    for i in range(turns):
        out += [
            ChatMessage(role="user", content=f"question {i}: weather in city number {i}?"),
            ChatMessage(role="assistant", content="", additional_kwargs={"tool_calls": [call(i)]}),
            ChatMessage(
                role="tool",
                content=f"sunny, {i} degrees",
                additional_kwargs={"tool_call_id": f"c{i}"},
            ),
            ChatMessage(role="assistant", content=f"It is sunny with {i} degrees in city {i}."),
        ]
    return out


def check_window(guard: Guard | AsyncGuard, window: list[ChatMessage], reserve: int) -> None:
    assert window[0].role.value == "system"
    assert_fits(guard, [to_ctxguard(m) for m in window], reserve)


def test_memory_get_is_the_budgeted_window(guard: Guard) -> None:
    memory = CtxGuardMemory.from_defaults(guard, session_id="s1", max_tokens=RESERVE)
    memory.put_messages(long_history(20))
    memory.put(ChatMessage(role="user", content="newest?"))
    window = memory.get()
    assert len(window) < len(memory.get_all())
    assert window[-1].content == "newest?"
    check_window(guard, window, RESERVE)
    assert memory.last_prepared is not None
    assert_prepared_fits(memory.last_prepared)
    smaller = memory.get(initial_token_count=100)  # a system prompt kept outside the memory
    check_window(guard, smaller, RESERVE + 100)
    memory.reset()
    assert memory.get_all() == []


async def test_memory_async(aguard: AsyncGuard) -> None:
    memory = CtxGuardMemory.from_defaults(aguard, session_id="s1", max_tokens=RESERVE)
    await memory.aput_messages(long_history(20))
    await memory.aput(ChatMessage(role="user", content="newest?"))
    window = await memory.aget()
    assert window[-1].content == "newest?"
    check_window(aguard, window, RESERVE)
    await memory.aset(rich_conversation())
    assert await memory.aget_all() == rich_conversation()
    await memory.areset()
    assert await memory.aget_all() == []


class RecordingLLM(MockLLM):
    seen: list[list[ChatMessage]] = Field(default_factory=list)

    def chat(self, messages: Any, **kwargs: Any) -> ChatResponse:
        self.seen.append(list(messages))
        return ChatResponse(message=ChatMessage(role="assistant", content="reply " * 10))

    async def achat(self, messages: Any, **kwargs: Any) -> ChatResponse:
        return self.chat(messages, **kwargs)


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_chat_engine_end_to_end(
    store_url: str, namespace: str, guard: Guard, mode: str
) -> None:
    llm = RecordingLLM()
    memory = CtxGuardMemory.from_defaults(
        store_url,
        session_id="chat",
        limit=guard.limit_source.resolve().tokens,
        namespace=namespace,
        max_tokens=RESERVE,
        llm=llm,
        chat_history=[ChatMessage(role="system", content="You are helpful.")],
    )
    engine = SimpleChatEngine.from_defaults(llm=llm, memory=memory)
    for i in range(15):
        question = f"question {i} about the weather today"
        response = engine.chat(question) if mode == "sync" else await engine.achat(question)
        assert response.response.startswith("reply")
    stored = memory.get_all()
    assert len(stored) == 1 + 2 * 15
    for call_messages in llm.seen:
        check_window(guard, call_messages, RESERVE)
    assert len(llm.seen[-1]) < len(stored)
