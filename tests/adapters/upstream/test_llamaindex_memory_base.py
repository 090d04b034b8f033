"""LlamaIndex's ``Memory`` suite, on :class:`CtxGuardMemory` (the ``BaseMemory`` it shares).

Follows llama-index-core 0.14.25 (installed): ``llama-index-core/tests/memory/
test_memory_base.py``. ``Memory(token_limit=T, chat_history_token_ratio=r)`` keeps a
chat window of ``T * r`` tokens; here that is ``limit=T`` with ``T * (1 - r)`` reserved
(``max_tokens``), counted by tiktoken's cl100k_base as LlamaIndex's default tokenizer
does. ``token_flush_size`` and message status (ACTIVE/ARCHIVED) have no ctxguard
counterpart: a window is chosen per request and the stored history never shrinks, so
``aget_all(status=ACTIVE)`` is ``aget_all()``. Not taken: the ``_estimate_token_count``
checks (a private method of ``Memory``; ctxguard counts with the guard's counter).
Not taken either: ``ChatSummaryMemoryBuffer``'s suite, an interface ctxguard does not
implement (its rolling summary is the guard's ``summarizer``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("llama_index.core")
pytest.importorskip("tiktoken")

from llama_index.core.base.llms.types import ChatMessage, ToolCallBlock

from ctxguard.adapters.llamaindex import CtxGuardMemory
from ctxguard.errors import BudgetError, InvalidMessageError

MakeMemory = Callable[..., CtxGuardMemory]


@pytest.fixture
def make_memory(any_store_url: str, namespace: str) -> MakeMemory:
    def make(token_limit: int, ratio: float, session_id: str) -> CtxGuardMemory:
        return CtxGuardMemory.from_defaults(
            any_store_url,
            session_id=session_id,
            namespace=namespace,
            limit=token_limit,
            max_tokens=round(token_limit * (1 - ratio)),
            counter="tiktoken:cl100k_base",
        )

    return make


@pytest.fixture
def memory(make_memory: MakeMemory) -> CtxGuardMemory:
    return make_memory(1000, 0.9, "test_user")


async def test_initialization(memory: CtxGuardMemory) -> None:
    assert memory.limit == 1000
    assert memory.session_id == "test_user"


async def test_manage_queue_flushes_large_tool_calls(make_memory: MakeMemory) -> None:
    memory = make_memory(50, 1.0, "tool_flush")
    big_args = {"query": "word " * 200}
    for i in range(10):
        await memory.aput(ChatMessage(role="user", content="hi"))
        await memory.aput(
            ChatMessage(
                role="assistant",
                blocks=[
                    ToolCallBlock(tool_call_id=f"c{i}", tool_name="search", tool_kwargs=big_args)
                ],
            )
        )
    active = await memory.aget()  # the window: what Memory keeps ACTIVE
    assert len(active) < 20


async def test_manage_queue_under_limit(memory: CtxGuardMemory) -> None:
    await memory.aput_messages([ChatMessage(role="user", content="Short message")])
    current = await memory.aget()
    assert len(current) == 1
    assert current[0].content == "Short message"


async def test_manage_queue_over_limit(memory: CtxGuardMemory) -> None:
    await memory.aput_messages(
        [
            ChatMessage(role="user", content="x " * 500),
            ChatMessage(role="assistant", content="y " * 500),
            ChatMessage(role="user", content="z " * 500),
        ]
    )
    current = await memory.aget()
    assert len(current) == 1
    assert "z " in str(current[0].content)


async def test_aput(memory: CtxGuardMemory) -> None:
    await memory.aput(ChatMessage(role="user", content="New message"))
    messages = await memory.aget()
    assert len(messages) == 1
    assert messages[0].content == "New message"


async def test_aput_messages(memory: CtxGuardMemory) -> None:
    await memory.aput_messages(
        [
            ChatMessage(role="user", content="Message 1"),
            ChatMessage(role="assistant", content="Response 1"),
        ]
    )
    messages = await memory.aget()
    assert len(messages) == 2
    assert messages[0].content == "Message 1"
    assert messages[1].content == "Response 1"


async def test_aset(memory: CtxGuardMemory) -> None:
    await memory.aset(
        [
            ChatMessage(role="user", content="Message 1"),
            ChatMessage(role="assistant", content="Response 1"),
        ]
    )
    messages = await memory.aget()
    assert len(messages) == 2
    assert messages[0].content == "Message 1"
    assert messages[1].content == "Response 1"


async def test_aget_all(memory: CtxGuardMemory) -> None:
    await memory.aput_messages(
        [
            ChatMessage(role="user", content="Message 1"),
            ChatMessage(role="assistant", content="Response 1"),
        ]
    )
    messages = await memory.aget_all()
    assert len(messages) == 2
    assert messages[0].content == "Message 1"
    assert messages[1].content == "Response 1"


async def test_areset(memory: CtxGuardMemory) -> None:
    await memory.aput(ChatMessage(role="user", content="New message"))
    await memory.areset()
    assert len(await memory.aget()) == 0


@pytest.mark.xfail(
    reason="the newest user turn is always sent: BudgetError, not a window without it",
    raises=BudgetError,
    strict=True,
)
async def test_manage_queue_first_message_must_be_user(make_memory: MakeMemory) -> None:
    memory = make_memory(100, 0.5, "test_first_message_user")
    await memory.aput_messages(
        [ChatMessage(role="user", content="x " * 100), ChatMessage(role="assistant", content="ok")]
    )
    current = await memory.aget()
    assert len(current) > 0
    assert current[0].role == "user"


@pytest.mark.xfail(
    reason="token arithmetic differs: ctxguard counts each message's template overhead",
    raises=BudgetError,
    strict=True,
)
async def test_manage_queue_preserves_conversation_turn(make_memory: MakeMemory) -> None:
    memory = make_memory(200, 0.5, "test_preserve_turn")
    await memory.aput_messages(
        [
            ChatMessage(role="user", content="a " * 50),
            ChatMessage(role="assistant", content="b " * 50),
            ChatMessage(role="user", content="c " * 50),
            ChatMessage(role="assistant", content="d " * 50),
        ]
    )
    current = await memory.aget()
    assert len(current) >= 2
    assert current[0].role == "user"
    for i in range(len(current) - 1):
        if current[i].role == "user":
            assert current[i + 1].role in ("assistant", "tool")


@pytest.mark.xfail(
    reason="a tool message with no tool_call_id answering no call is refused",
    raises=InvalidMessageError,
    strict=True,
)
async def test_manage_queue_with_tool_messages(make_memory: MakeMemory) -> None:
    memory = make_memory(150, 0.5, "test_tool_calling")
    await memory.aput_messages(
        [
            ChatMessage(role="user", content="a " * 40),
            ChatMessage(role="assistant", content="b " * 20),
            ChatMessage(role="tool", content="c " * 20),
            ChatMessage(role="assistant", content="d " * 20),
        ]
    )
    current = await memory.aget()
    assert len(current) > 0
    assert current[0].role == "user"
    for i, message in enumerate(current):
        if message.role == "tool":
            assert i > 0
            assert current[i - 1].role in ("assistant", "tool")


def tool_turn(user: str, call: str, result: str) -> list[ChatMessage]:
    """Upstream's turn with the call and its result linked by id, as ctxguard requires."""
    return [
        ChatMessage(role="user", content=user),
        ChatMessage(
            role="assistant",
            blocks=[ToolCallBlock(tool_call_id="t1", tool_name="f", tool_kwargs={"q": call})],
        ),
        ChatMessage(role="tool", content=result, additional_kwargs={"tool_call_id": "t1"}),
    ]


async def test_manage_queue_only_tool_message_remaining(make_memory: MakeMemory) -> None:
    memory = make_memory(80, 0.5, "test_only_tool")
    messages: list[Any] = tool_turn("x " * 50, "call", "result")
    try:
        await memory.aput_messages(messages)
        current = await memory.aget()
    except BudgetError:  # ctxguard's answer when the one turn cannot fit: nothing sent
        current = []
    if len(current) > 0:
        assert current[0].role == "user"
