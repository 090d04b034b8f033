"""LlamaIndex's chat store and memory suites, on CtxGuardChatStore and CtxGuardMemory.

Follows llama-index-core 0.14.25 (installed): ``llama-index-core/tests/storage/
chat_store/test_simple_chat_store.py`` and ``llama-index-core/tests/memory/
test_chat_memory_buffer.py`` (``token_limit`` is ctxguard's ``limit`` with no
output reserved), and llama-index-storage-chat-store-redis 0.8.0 (installed):
``tests/test_chat_store_redis_chat_store.py`` and ``tests/test_delete_message.py``.
Not taken: ``SimpleChatStore.persist`` to a file (no such thing for a live store)
and the fakeredis ``decode_responses`` axis (ctxguard owns its client). Where
RedisChatStore returns the removed message as raw JSON, BaseChatStore declares a
``ChatMessage``, which ctxguard returns; the check compares its JSON.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("llama_index.core")

from llama_index.core.base.llms.types import ChatMessage, MessageRole
from llama_index.core.storage.chat_store.base import BaseChatStore

from ctxguard.adapters.llamaindex import CtxGuardChatStore, CtxGuardMemory

REDIS_KEY = "redis_chat_store_tests"


@pytest.fixture
def chat_store(any_store_url: str, namespace: str) -> CtxGuardChatStore:
    return CtxGuardChatStore(any_store_url, namespace=namespace)


def user(text: str) -> ChatMessage:
    return ChatMessage(role="user", content=text)


# -- test_simple_chat_store.py ---------------------------------------------------


def test_add_messages(chat_store: CtxGuardChatStore) -> None:
    for key in ("user1", "user2"):
        chat_store.add_message(key, user("hello"))
        chat_store.add_message(key, user("world"))
    assert chat_store.get_messages("user1") == [user("hello"), user("world")]
    assert chat_store.get_messages("user2") == [user("hello"), user("world")]
    assert sorted(chat_store.get_keys()) == ["user1", "user2"]


@pytest.mark.xfail(
    reason="keys are listed sorted on every store, not in insertion order", strict=True
)
def test_keys_in_insertion_order(chat_store: CtxGuardChatStore) -> None:
    # inserted out of sorted order (upstream's user1, user2 is sorted too), so the
    # listing differs from insertion order on every store, every run
    for key in ("user2", "user1"):
        chat_store.add_message(key, user("hello"))
    assert chat_store.get_keys() == ["user2", "user1"]


async def test_keys_are_listed_sorted(chat_store: CtxGuardChatStore) -> None:
    # (not upstream's) enough keys that, were the listing not sorted, SCAN's order would
    # almost never pass
    keys = [f"user{i}" for i in (7, 3, 11, 0, 5, 12, 9, 1)]
    for key in keys:
        chat_store.add_message(key, user("hello"))
    assert chat_store.get_keys() == sorted(keys)
    assert await chat_store.aget_keys() == sorted(keys)


@pytest.mark.xfail(
    reason="add_message(idx=) is SimpleChatStore's own, not BaseChatStore's", strict=True
)
def test_add_message_at_index(chat_store: CtxGuardChatStore) -> None:
    chat_store.add_message("user1", user("hello"))
    chat_store.add_message("user1", user("world"))
    chat_store.add_message("user1", user("hello"), idx=0)  # type: ignore[call-arg]
    assert chat_store.get_messages("user1") == [user("hello"), user("hello"), user("world")]


def test_delete_chat_messages(chat_store: CtxGuardChatStore) -> None:
    for key in ("user1", "user2"):
        chat_store.add_message(key, user("hello"))
        chat_store.add_message(key, user("world"))
    chat_store.delete_messages("user1")
    assert chat_store.get_messages("user1") == []
    assert chat_store.get_messages("user2") == [user("hello"), user("world")]


def test_delete_last_message(chat_store: CtxGuardChatStore) -> None:
    chat_store.add_message("user1", user("hello"))
    chat_store.add_message("user1", user("world"))
    chat_store.delete_last_message("user1")
    assert chat_store.get_messages("user1") == [user("hello")]


def test_delete_message_at_index(chat_store: CtxGuardChatStore) -> None:
    chat_store.add_message("user1", user("hello"))
    chat_store.add_message("user1", user("world"))
    chat_store.delete_message("user1", 0)
    assert chat_store.get_messages("user1") == [user("world")]


def test_delete_message_out_of_bounds(chat_store: CtxGuardChatStore) -> None:
    chat_store.add_message("user1", user("hello"))
    assert chat_store.delete_message("user1", -2) is None
    assert chat_store.get_messages("user1") == [user("hello")]


def test_delete_last_message_until_empty(chat_store: CtxGuardChatStore) -> None:
    message = user("hello")
    chat_store.add_message("user1", message)
    assert chat_store.delete_last_message("user1") == message
    assert chat_store.delete_last_message("user1") is None


# -- llama-index-storage-chat-store-redis: test_chat_store_redis_chat_store.py ---


def test_class() -> None:
    assert BaseChatStore.__name__ in [b.__name__ for b in CtxGuardChatStore.__mro__]


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("extra", [{}, {"metadata": {"foo": "bar", "count": 5}}])
async def test_add_message(chat_store: CtxGuardChatStore, mode: str, extra: dict[str, Any]) -> None:
    message = ChatMessage(
        role=MessageRole.USER, content="test_user_message", additional_kwargs=extra
    )
    if mode == "sync":
        chat_store.add_message(REDIS_KEY, message)
        stored = chat_store.get_messages(REDIS_KEY)
    else:
        await chat_store.async_add_message(REDIS_KEY, message)
        stored = await chat_store.aget_messages(REDIS_KEY)
    assert len(stored) == 1
    assert stored[0].content == "test_user_message" and stored[0].role == "user"
    if extra:
        assert stored[0].additional_kwargs and "metadata" in stored[0].additional_kwargs
        assert stored[0].additional_kwargs["metadata"]["foo"] == "bar"
        assert stored[0].additional_kwargs["metadata"]["count"] == 5


def two() -> list[ChatMessage]:
    return [
        ChatMessage(role=MessageRole.USER, content="test_user_message"),
        ChatMessage(role=MessageRole.SYSTEM, content="test_system_message"),
    ]


async def _set(chat_store: CtxGuardChatStore, mode: str) -> list[ChatMessage]:
    if mode == "sync":
        chat_store.set_messages(REDIS_KEY, two())
        return chat_store.get_messages(REDIS_KEY)
    await chat_store.aset_messages(REDIS_KEY, two())
    return await chat_store.aget_messages(REDIS_KEY)


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_set_messages(chat_store: CtxGuardChatStore, mode: str) -> None:
    stored = await _set(chat_store, mode)
    assert len(stored) == 2
    assert (stored[0].content, stored[0].role) == ("test_user_message", "user")
    assert (stored[1].content, stored[1].role) == ("test_system_message", "system")


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_delete_messages(chat_store: CtxGuardChatStore, mode: str) -> None:
    assert len(await _set(chat_store, mode)) == 2
    if mode == "sync":
        chat_store.delete_messages(REDIS_KEY)
        stored = chat_store.get_messages(REDIS_KEY)
    else:
        await chat_store.adelete_messages(REDIS_KEY)
        stored = await chat_store.aget_messages(REDIS_KEY)
    assert len(stored) == 0 and stored == []


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_delete_message(chat_store: CtxGuardChatStore, mode: str) -> None:
    stored = await _set(chat_store, mode)
    assert len(stored) == 2 and (stored[0].content, stored[0].role) == ("test_user_message", "user")
    if mode == "sync":
        chat_store.delete_message(REDIS_KEY, 0)
        stored = chat_store.get_messages(REDIS_KEY)
    else:
        await chat_store.adelete_message(REDIS_KEY, 0)
        stored = await chat_store.aget_messages(REDIS_KEY)
    assert len(stored) == 1
    assert (stored[0].content, stored[0].role) == ("test_system_message", "system")


def test_delete_last_message_of_two(chat_store: CtxGuardChatStore) -> None:
    chat_store.set_messages(REDIS_KEY, two())
    assert len(chat_store.get_messages(REDIS_KEY)) == 2
    chat_store.delete_last_message(REDIS_KEY)
    stored = chat_store.get_messages(REDIS_KEY)
    assert len(stored) == 1 and (stored[0].content, stored[0].role) == ("test_user_message", "user")


def test_get_keys(chat_store: CtxGuardChatStore) -> None:
    chat_store.add_message(
        REDIS_KEY, ChatMessage(role=MessageRole.USER, content="test_user_message")
    )
    keys = chat_store.get_keys()
    assert len(keys) == 1 and keys[0] == REDIS_KEY


# -- llama-index-storage-chat-store-redis: test_delete_message.py ----------------


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize(
    ("contents", "idx", "expected"),
    [
        pytest.param(["A", "B", "C"], 0, ["B", "C"], id="first"),
        pytest.param(["A", "B", "C"], 1, ["A", "C"], id="middle"),
        pytest.param(["A", "B", "C"], 2, ["A", "B"], id="last"),
        pytest.param(
            ["A"],
            0,
            [],
            id="only-message",
            marks=pytest.mark.xfail(
                reason="an emptied session keeps its audit trail, so its key is still listed",
                strict=True,
            ),
        ),
        pytest.param(["A", "B", "C"], -1, ["A", "B", "C"], id="negative-index"),
        pytest.param(["A", "B", "C"], 3, ["A", "B", "C"], id="out-of-range"),
        pytest.param([], 0, [], id="missing-key"),
        pytest.param(["A", "B", "A"], 2, ["A", "B"], id="duplicate-content"),
    ],
)
async def test_delete_message_cases(
    chat_store: CtxGuardChatStore, mode: str, contents: list[str], idx: int, expected: list[str]
) -> None:
    key = "chat-history"
    messages = [
        ChatMessage(
            role=MessageRole.USER, content=c, additional_kwargs={"metadata": {"source": "test"}}
        )
        for c in contents
    ]
    if mode == "async":
        await chat_store.aset_messages(key, messages)
        removed = await chat_store.adelete_message(key, idx)
        remaining = await chat_store.aget_messages(key)
    else:
        chat_store.set_messages(key, messages)
        removed = chat_store.delete_message(key, idx)
        remaining = chat_store.get_messages(key)
    if 0 <= idx < len(messages):
        assert removed is not None and removed.model_dump_json() == messages[idx].model_dump_json()
    else:
        assert removed is None
    assert [m.content for m in remaining] == expected
    assert all(
        m.role == MessageRole.USER and m.additional_kwargs == {"metadata": {"source": "test"}}
        for m in remaining
    )
    assert (key in chat_store.get_keys()) == bool(expected)


# -- test_chat_memory_buffer.py ---------------------------------------------------

FIRST = ChatMessage(role=MessageRole.USER, content="first message")
ANSWER = ChatMessage(role=MessageRole.ASSISTANT, content="first answer")
SECOND = ChatMessage(role=MessageRole.USER, content="second message")
SECOND_ANSWER = ChatMessage(role=MessageRole.USER, content="second answer")
MakeMemory = Callable[..., CtxGuardMemory]


@pytest.fixture
def make_memory(any_store_url: str, namespace: str) -> MakeMemory:
    def make(token_limit: int = 100_000, **kw: Any) -> CtxGuardMemory:
        return CtxGuardMemory.from_defaults(
            any_store_url, namespace=namespace, limit=token_limit, max_tokens=0, **kw
        )

    return make


EXACT = "token arithmetic differs: ctxguard counts each message's template overhead"
NEWEST = "the newest user message is always sent: BudgetError, not a shorter history"


def test_put_get(make_memory: MakeMemory) -> None:
    history = make_memory(chat_history=[FIRST]).get()
    assert len(history) == 1 and history[0].content == FIRST.content


def test_initial_tokens_less_than_limit(make_memory: MakeMemory) -> None:
    history = make_memory(token_limit=1000, chat_history=[FIRST]).get(initial_token_count=5)
    assert len(history) == 1 and history[0] == FIRST


@pytest.mark.xfail(
    reason="ctxguard raises BudgetError with the numbers, not ValueError", strict=True
)
def test_initial_tokens_exceed_limit(make_memory: MakeMemory) -> None:
    with pytest.raises(ValueError) as error:
        make_memory(token_limit=49).get(initial_token_count=50)
    assert str(error.value) == "Initial token count exceeds token limit"


@pytest.mark.xfail(reason=NEWEST, strict=True)
def test_initial_tokens_same_as_limit(make_memory: MakeMemory) -> None:
    assert len(make_memory(token_limit=5, chat_history=[FIRST]).get(initial_token_count=5)) == 0


@pytest.mark.xfail(reason=NEWEST, strict=True)
def test_no_room_for_the_user_turn(make_memory: MakeMemory) -> None:
    memory = make_memory(token_limit=5, chat_history=[FIRST, ANSWER])
    assert len(memory.get(initial_token_count=3)) == 0


@pytest.mark.xfail(reason=EXACT, strict=True)
def test_room_for_the_second_turn_only(make_memory: MakeMemory) -> None:
    memory = make_memory(token_limit=5, chat_history=[FIRST, ANSWER, SECOND, SECOND_ANSWER])
    assert memory.get(initial_token_count=1) == [SECOND, SECOND_ANSWER]


def test_set(make_memory: MakeMemory) -> None:
    memory = make_memory(chat_history=[FIRST])
    memory.put(FIRST)
    assert len(memory.get()) == 2
    memory.set([FIRST])
    assert len(memory.get()) == 1


@pytest.mark.xfail(reason=EXACT, strict=True)
def test_max_tokens(make_memory: MakeMemory) -> None:
    memory = make_memory(token_limit=5, chat_history=[FIRST])
    memory.put(FIRST)
    assert len(memory.get()) == 2


def test_max_tokens_with_room_for_two(make_memory: MakeMemory) -> None:
    # upstream's test_max_tokens with the limit of two messages in ctxguard's counts
    probe = make_memory(chat_history=[FIRST, FIRST])
    probe.get()
    assert probe.last_prepared is not None
    memory = make_memory(token_limit=probe.last_prepared.tokens, chat_history=[FIRST])
    memory.put(FIRST)
    assert len(memory.get()) == 2
    memory.put(FIRST)
    memory.put(FIRST)
    assert len(memory.get()) == 2
    assert len(memory.get_all()) == 4
    memory.put(ChatMessage(role=MessageRole.USER, content="test message2"))
    assert memory.get()[-1].content == "test message2"
    assert len(memory.get()) == 2


def test_string_save_load(make_memory: MakeMemory) -> None:
    memory = make_memory(token_limit=500, chat_history=[FIRST])
    again = CtxGuardMemory.from_json(memory.to_json())
    assert len(again.get()) == 1 and again.limit == 500


def test_dict_save_load(make_memory: MakeMemory) -> None:
    memory = make_memory(token_limit=500, chat_history=[FIRST])
    again = CtxGuardMemory.from_dict(memory.to_dict())
    assert len(again.get()) == 1 and again.limit == 500


def test_pickle(make_memory: MakeMemory) -> None:
    assert isinstance(pickle.loads(pickle.dumps(make_memory())), CtxGuardMemory)
