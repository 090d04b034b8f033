"""LangChain's chat-history suites, on :class:`CtxGuardChatMessageHistory`.

Follows, for langchain-core 1.8.3 (installed): ``libs/core/tests/unit_tests/
chat_history/test_chat_history.py`` and the ``RunnableWithMessageHistory``
scenarios of ``libs/core/tests/unit_tests/runnables/test_history.py`` and
``libs/core/tests/unit_tests/chat_history/test_file_chat_message_history.py``
(``FileChatMessageHistory``, the persistent history langchain-core ships: a
second history on the same session id is upstream's reopened file). The newest
stored upstream revisions of these files predate 1.x; the scenarios taken use
APIs unchanged since, the schema-comparison tests written against pydantic v1
are not taken;
and, for langchain-redis (not installed; its repository's
``libs/redis/tests/integration_tests/test_chat_message_history.py``), the
``RedisChatMessageHistory`` scenarios that the ``BaseChatMessageHistory``
interface covers. RediSearch-only features (``search_messages``, index and
JSON layout, TTL by sleeping) are not taken; ``len()`` is kept as xfail.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("langchain_core")

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from langchain_core.runnables import RunnableConfig, RunnableLambda
from langchain_core.runnables.history import RunnableWithMessageHistory
from langchain_core.runnables.utils import ConfigurableFieldSpec

from ctxguard.adapters.langchain import CtxGuardChatMessageHistory

History = CtxGuardChatMessageHistory
MakeHistory = Callable[[str], History]


@pytest.fixture
def make_history(any_store_url: str, namespace: str) -> MakeHistory:
    def make(session_id: str) -> History:
        return History(any_store_url, session_id, namespace=namespace)

    return make


@pytest.fixture
def history(make_history: MakeHistory) -> History:
    return make_history(f"test_session_{uuid.uuid4().hex}")


# -- langchain-core: chat_history/test_chat_history.py ------------------------------


def test_add_message_and_add_messages(history: History) -> None:
    history.add_message(HumanMessage(content="Hello"))
    assert history.messages == [HumanMessage(content="Hello")]
    history.add_message(HumanMessage(content="World"))
    assert len(history.messages) == 2 and history.messages[1] == HumanMessage(content="World")
    history.add_messages([HumanMessage(content="Hello"), HumanMessage(content="World")])
    stored = history.messages
    assert len(stored) == 4
    assert stored[2] == HumanMessage(content="Hello") and stored[3] == HumanMessage(content="World")


async def test_async_interface(history: History) -> None:
    await history.aadd_messages([HumanMessage(content="Hello"), HumanMessage(content="World")])
    assert await history.aget_messages() == [
        HumanMessage(content="Hello"),
        HumanMessage(content="World"),
    ]
    await history.aadd_messages([HumanMessage(content="!")])
    assert await history.aget_messages() == [
        HumanMessage(content="Hello"),
        HumanMessage(content="World"),
        HumanMessage(content="!"),
    ]
    await history.aclear()
    assert await history.aget_messages() == []


# -- langchain-core: chat_history/test_file_chat_message_history.py -----------------


def test_file_history_add_messages(history: History) -> None:
    history.add_user_message("Hello!")
    history.add_ai_message("Hi there!")
    messages = history.messages
    assert len(messages) == 2
    assert isinstance(messages[0], HumanMessage)
    assert isinstance(messages[1], AIMessage)
    assert messages[0].content == "Hello!"
    assert messages[1].content == "Hi there!"


def test_file_history_clear_messages(history: History) -> None:
    history.add_user_message("Hello!")
    history.add_ai_message("Hi there!")
    history.clear()
    assert len(history.messages) == 0


def test_file_history_multiple_sessions(make_history: MakeHistory) -> None:
    first = make_history("file_session")
    first.add_user_message("Hello, AI!")
    first.add_ai_message("Hello, how can I help you?")
    first.add_user_message("Tell me a joke.")
    first.add_ai_message("Why did the chicken cross the road? To get to the other side!")
    expected = [
        "Hello, AI!",
        "Hello, how can I help you?",
        "Tell me a joke.",
        "Why did the chicken cross the road? To get to the other side!",
    ]
    assert [m.content for m in first.messages] == expected
    second = make_history("file_session")  # upstream: FileChatMessageHistory(same path)
    assert [m.content for m in second.messages] == expected


# -- langchain-core: runnables/test_history.py --------------------------------------


def test_interfaces(history: History) -> None:
    history.add_message(SystemMessage(content="system"))
    history.add_user_message("human 1")
    history.add_ai_message("ai")
    history.add_message(HumanMessage(content="human 2"))
    assert str(history) == "System: system\nHuman: human 1\nAI: ai\nHuman: human 2"


def _said(messages: list[BaseMessage]) -> list[str]:
    return [str(m.content) for m in messages if isinstance(m, HumanMessage)]


def _factory(make_history: MakeHistory) -> Callable[..., History]:
    def get_session_history(session_id: str, **kw: Any) -> History:
        return make_history(session_id)

    return get_session_history


def _config(session_id: str) -> RunnableConfig:
    return {"configurable": {"session_id": session_id}}


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_input_messages(make_history: MakeHistory, mode: str) -> None:
    runnable = RunnableLambda(lambda messages: "you said: " + "\n".join(_said(messages)))
    chain = RunnableWithMessageHistory(runnable, _factory(make_history))  # type: ignore[arg-type]

    async def call(text: str) -> Any:
        given = [HumanMessage(content=text)]
        if mode == "sync":
            return chain.invoke(given, _config("1"))
        return await chain.ainvoke(given, _config("1"))

    assert await call("hello") == "you said: hello"
    assert await call("good bye") == "you said: hello\ngood bye"


def test_input_dict(make_history: MakeHistory) -> None:
    runnable = RunnableLambda(lambda given: "you said: " + "\n".join(_said(given["messages"])))
    chain = RunnableWithMessageHistory(
        runnable,  # type: ignore[arg-type]
        _factory(make_history),
        input_messages_key="messages",
    )
    assert (
        chain.invoke({"messages": [HumanMessage(content="hello")]}, _config("2"))
        == "you said: hello"
    )
    out = chain.invoke({"messages": [HumanMessage(content="good bye")]}, _config("2"))
    assert out == "you said: hello\ngood bye"


def _echo(given: dict[str, Any]) -> str:
    return "you said: " + "\n".join([*_said(given["history"]), given["input"]])


def _keyed(make_history: MakeHistory, runnable: Any, **kw: Any) -> RunnableWithMessageHistory:
    return RunnableWithMessageHistory(
        runnable,
        _factory(make_history),
        input_messages_key="input",
        history_messages_key="history",
        **kw,
    )


def test_input_dict_with_history_key(make_history: MakeHistory) -> None:
    chain = _keyed(make_history, RunnableLambda(_echo))
    assert chain.invoke({"input": "hello"}, _config("3")) == "you said: hello"
    assert chain.invoke({"input": "good bye"}, _config("3")) == "you said: hello\ngood bye"


def test_output_message(make_history: MakeHistory) -> None:
    chain = _keyed(make_history, RunnableLambda(lambda given: AIMessage(content=_echo(given))))
    assert chain.invoke({"input": "hello"}, _config("4")) == AIMessage(content="you said: hello")
    out = chain.invoke({"input": "good bye"}, _config("4"))
    assert out == AIMessage(content="you said: hello\ngood bye")


def test_output_messages(make_history: MakeHistory) -> None:
    chain = _keyed(make_history, RunnableLambda(lambda given: [AIMessage(content=_echo(given))]))
    assert chain.invoke({"input": "hello"}, _config("5")) == [AIMessage(content="you said: hello")]
    out = chain.invoke({"input": "good bye"}, _config("5"))
    assert out == [AIMessage(content="you said: hello\ngood bye")]


def test_output_dict(make_history: MakeHistory) -> None:
    runnable = RunnableLambda(lambda given: {"output": [AIMessage(content=_echo(given))]})
    chain = _keyed(make_history, runnable, output_messages_key="output")
    assert chain.invoke({"input": "hello"}, _config("6")) == {
        "output": [AIMessage(content="you said: hello")]
    }
    out = chain.invoke({"input": "good bye"}, _config("6"))
    assert out == {"output": [AIMessage(content="you said: hello\ngood bye")]}


def test_custom_config_specs(make_history: MakeHistory) -> None:
    def fake_llm(given: dict[str, Any]) -> list[BaseMessage]:
        return [AIMessage(content="you said: " + "\n".join(_said(given["messages"])))]

    opened: dict[tuple[str, str], History] = {}

    def get_session_history(user_id: str, conversation_id: str) -> History:
        key = (user_id, conversation_id)
        opened.setdefault(key, make_history(f"{user_id}/{conversation_id}"))
        return opened[key]

    chain = RunnableWithMessageHistory(
        RunnableLambda(fake_llm),
        get_session_history=get_session_history,
        input_messages_key="messages",
        history_messages_key="history",
        history_factory_config=[
            ConfigurableFieldSpec(id="user_id", annotation=str, default="", is_shared=True),
            ConfigurableFieldSpec(
                id="conversation_id", annotation=str, default=None, is_shared=True
            ),
        ],
    )

    def call(text: str, user: str) -> Any:
        config: RunnableConfig = {"configurable": {"user_id": user, "conversation_id": "1"}}
        return chain.invoke({"messages": [HumanMessage(content=text)]}, config)

    def stored() -> dict[tuple[str, str], list[BaseMessage]]:
        return {key: h.messages for key, h in opened.items()}

    assert call("hello", "user1") == [AIMessage(content="you said: hello")]
    hello = [HumanMessage(content="hello"), AIMessage(content="you said: hello")]
    assert stored() == {("user1", "1"): hello}
    assert call("goodbye", "user1") == [AIMessage(content="you said: goodbye")]
    goodbye = [HumanMessage(content="goodbye"), AIMessage(content="you said: goodbye")]
    assert stored() == {("user1", "1"): hello + goodbye}
    assert call("meow", "user2") == [AIMessage(content="you said: meow")]
    meow = [HumanMessage(content="meow"), AIMessage(content="you said: meow")]
    assert stored() == {("user1", "1"): hello + goodbye, ("user2", "1"): meow}


# -- langchain-redis: integration_tests/test_chat_message_history.py ----------------


def test_add_and_retrieve_messages(history: History) -> None:
    history.add_message(HumanMessage(content="Hello, AI!"))
    history.add_message(AIMessage(content="Hello, human!"))
    got = history.messages
    assert len(got) == 2
    assert isinstance(got[0], HumanMessage) and isinstance(got[1], AIMessage)
    assert got[0].content == "Hello, AI!" and got[1].content == "Hello, human!"


def test_clear_messages(history: History) -> None:
    history.add_message(HumanMessage(content="Test message"))
    assert len(history.messages) == 1
    history.clear()
    assert len(history.messages) == 0


def test_add_multiple_messages(history: History) -> None:
    for message in (
        HumanMessage(content="Message 1"),
        AIMessage(content="Response 1"),
        HumanMessage(content="Message 2"),
    ):
        history.add_message(message)
    assert [m.content for m in history.messages] == ["Message 1", "Response 1", "Message 2"]


@pytest.mark.xfail(
    reason="len() is RedisChatMessageHistory's own addition, not BaseChatMessageHistory's",
    strict=True,
)
def test_length(history: History) -> None:
    for i in range(5):
        history.add_message(HumanMessage(content=f"Message {i}"))
    assert len(history) == 5  # type: ignore[arg-type]


def test_multiple_sessions(make_history: MakeHistory) -> None:
    one, two = make_history(f"s1_{uuid.uuid4().hex}"), make_history(f"s2_{uuid.uuid4().hex}")
    one.add_message(HumanMessage(content="Message for session 1"))
    two.add_message(HumanMessage(content="Message for session 2"))
    assert len(one.messages) == 1 and len(two.messages) == 1
    assert one.messages[0].content != two.messages[0].content


@pytest.mark.parametrize("kind", [HumanMessage, AIMessage, SystemMessage])
def test_different_message_types(history: History, kind: type[BaseMessage]) -> None:
    history.add_message(kind(content="Test content"))
    got = history.messages[-1]
    assert isinstance(got, BaseMessage) and isinstance(got, kind)
    assert got.content == "Test content"


def test_large_number_of_messages(history: History) -> None:
    for i in range(1000):
        history.add_message(HumanMessage(content=f"Message {i}"))
    got = history.messages
    assert [m.content for m in got] == [f"Message {i}" for i in range(1000)]
    assert got[-1].content == "Message 999"


def test_empty_messages(history: History) -> None:
    assert len(history.messages) == 0


def test_add_message_to_existing_session(make_history: MakeHistory) -> None:
    session_id = f"existing_session_{uuid.uuid4().hex}"
    first, second = make_history(session_id), make_history(session_id)
    first.add_message(HumanMessage(content="First message"))
    second.add_message(HumanMessage(content="Second message"))
    assert len(first.messages) == 2 and len(second.messages) == 2


def test_session_id_with_special_characters(make_history: MakeHistory) -> None:
    history = make_history("550e8400-e29b-41d4-a716-446655440000")
    history.add_message(HumanMessage(content="Hello with UUID session!"))
    history.add_message(AIMessage(content="Hello back!"))
    assert [m.content for m in history.messages] == ["Hello with UUID session!", "Hello back!"]
    history.clear()
    assert len(history.messages) == 0


def test_order_is_kept(history: History) -> None:
    texts = ["First message", "Second message", "Third message", "Fourth message"]
    for i, text in enumerate(texts):
        history.add_message(HumanMessage(content=text) if i % 2 == 0 else AIMessage(content=text))
    got = history.messages
    assert [m.content for m in got] == texts
    assert [type(m) for m in got] == [HumanMessage, AIMessage, HumanMessage, AIMessage]


def test_session_sensitive_clear(make_history: MakeHistory) -> None:
    one, two = (
        make_history(f"session1_{uuid.uuid4().hex}"),
        make_history(f"session2_{uuid.uuid4().hex}"),
    )
    one.add_messages(
        [HumanMessage(content="Session 1 message 1"), AIMessage(content="Session 1 message 2")]
    )
    two.add_messages(
        [HumanMessage(content="Session 2 message 1"), AIMessage(content="Session 2 message 2")]
    )
    assert len(one.messages) == 2 and len(two.messages) == 2
    one.clear()
    assert len(one.messages) == 0
    assert [m.content for m in two.messages] == ["Session 2 message 1", "Session 2 message 2"]


@pytest.mark.parametrize("bad", ["", None])
def test_empty_or_none_session_id(any_store_url: str, bad: Any) -> None:
    with pytest.raises(ValueError):
        History(any_store_url, bad)


def test_unicode_session_id(make_history: MakeHistory) -> None:
    history = make_history(f"session_测试_🚀_{uuid.uuid4().hex}")
    history.add_message(HumanMessage(content="Unicode session test"))
    assert [m.content for m in history.messages] == ["Unicode session test"]


def test_empty_message_content(history: History) -> None:
    history.add_message(HumanMessage(content=""))
    history.add_message(AIMessage(content=""))
    assert [m.content for m in history.messages] == ["", ""]


def test_very_large_message_content(history: History) -> None:
    large = "x" * 100000
    history.add_message(HumanMessage(content=large))
    assert [m.content for m in history.messages] == [large]


def test_unicode_message_content(history: History) -> None:
    text = "Hello 世界! 🌍🚀 Testing Unicode: αβγδε ñáéíóú"
    history.add_message(HumanMessage(content=text))
    assert [m.content for m in history.messages] == [text]
