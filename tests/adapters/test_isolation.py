"""Frameworks sharing a session id: isolated across namespaces, interoperable within one."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

pytest.importorskip("langchain_core")
pytest.importorskip("llama_index.core")
pytest.importorskip("agents")

from langchain_core.messages import AIMessage, HumanMessage
from llama_index.core.llms import ChatMessage

from ctxguard.adapters.langchain import CtxGuardChatMessageHistory
from ctxguard.adapters.llamaindex import CtxGuardChatStore
from ctxguard.adapters.openai_agents import CtxGuardSession


@pytest.fixture
def other_namespace(store_url: str, namespace: str) -> Iterator[str]:
    """Two more namespaces; on Redis their keys are deleted afterwards (SCAN, no FLUSHALL)."""
    other = namespace + "b"
    yield other
    if store_url.startswith("redis"):
        client = redis.Redis.from_url(store_url)
        for ns in (other, other + "c"):
            keys = list(client.scan_iter(match=f"{ns}:*"))
            if keys:
                client.delete(*keys)
        client.close()


async def test_namespaces_isolate_frameworks(
    store_url: str, namespace: str, other_namespace: str
) -> None:
    history = CtxGuardChatMessageHistory(store_url, "shared", namespace=namespace)
    session = CtxGuardSession("shared", store_url, namespace=other_namespace)
    chat_store = CtxGuardChatStore(store_url, namespace=other_namespace + "c")

    history.add_messages([HumanMessage("lc question"), AIMessage("lc answer")])
    await session.add_items([{"role": "user", "content": "agents question"}])
    chat_store.add_message("shared", ChatMessage(role="user", content="li question"))

    assert [m.content for m in history.messages] == ["lc question", "lc answer"]
    assert await session.get_items() == [{"role": "user", "content": "agents question"}]
    assert [m.content for m in chat_store.get_messages("shared")] == ["li question"]

    await session.clear_session()
    assert len(history.messages) == 2
    history.clear()
    assert chat_store.get_messages("shared")[0].content == "li question"
    chat_store.delete_messages("shared")


async def test_one_namespace_shares_the_session_across_frameworks(
    store_url: str, namespace: str
) -> None:
    history = CtxGuardChatMessageHistory(store_url, "shared", namespace=namespace)
    session = CtxGuardSession("shared", store_url, namespace=namespace)
    history.add_messages([HumanMessage("hi"), AIMessage("hello")])
    assert await session.get_items() == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
    ]
    await session.add_items([{"role": "user", "content": "from agents"}])
    assert history.messages[-1] == HumanMessage("from agents", id=history.messages[-1].id)
