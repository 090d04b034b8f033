"""Every adapter door under ``GuardConfig(commit="with_reply")``: it works (the user's
messages and the reply are stored, a request with no reply stores nothing) or it refuses
the setting when built, in one typed line (a door that prepares without completing would
lose the new messages or the request's record).

Works: the LangChain middleware, the Pydantic AI capability, LangChain's
``fit_messages``, the LlamaIndex chat store and ``CtxGuardLLM``, the Agents session
without ``window`` (and its filter), the LiteLLM guardrail. Refused: LangChain's
``CtxGuardChatMessageHistory``, LlamaIndex's ``CtxGuardMemory``, the Agents session with
``window=True``.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from ctxguard import GuardConfig
from ctxguard.adapters import _served, _shared
from ctxguard.errors import ConfigError
from ctxguard.guard import Guard
from ctxguard.messages import Message
from tests import store_diff

from .conftest import LIMIT, RESERVE

WITH_REPLY = GuardConfig(commit="with_reply", max_tokens=RESERVE)
REFUSED = r'^[^\n]*does not support GuardConfig\(commit="with_reply"\)[^\n]*commit="prepare"'


@pytest.fixture
def wguard(store_url: str, namespace: str) -> Any:
    guard = Guard(store_url, namespace=namespace, limit=LIMIT, counter="approx", config=WITH_REPLY)
    yield guard
    guard.close()


def scratch_free(ids: list[str]) -> list[str]:
    """``ids`` (a session's, in order), checked to hold none of the scratch store's batch."""
    assert not [i for i in ids if i.startswith("fit-")], ids  # (the scratch store's batch)
    return ids


def _no_fit_ids(guard: Guard, session: str) -> list[str]:
    return scratch_free([s.message.id for s in guard.store.read(session)])


# -- the shared pieces the agent-loop doors stand on ------------------------------------------


def test_a_fitted_request_carries_nothing_to_store(wguard: Guard) -> None:
    """``_shared.fit`` (LangChain's fit_messages / window_runnable / middleware, Pydantic
    AI, LlamaIndex's CtxGuardLLM, the Agents filter) plans on a scratch store: under
    with_reply its request carried the scratch batch (``fit-<i>`` ids) for a complete."""
    messages = [Message(role="user", content="hello")]
    prepared, origins = _shared.fit(wguard, messages, RESERVE)
    assert origins == [0]
    assert prepared.unstored is None


def test_a_request_as_sent_leaves_the_messages_to_persist(wguard: Guard) -> None:
    """``_served.as_sent``: what ``complete`` takes after the run's messages were appended
    holds nothing to store, whatever the request carried."""
    held = wguard.prepare("scratch", [Message(role="user", content="hi", id="u-1")])
    assert held.unstored is not None
    sent = _served.as_sent(held, "s")
    assert sent.unstored is None and sent.session_id == "s"
    reply = Message(role="assistant", content="yo", id="a-1")
    wguard.append("s", [Message(role="user", content="hi", id="u-1"), reply])
    wguard.complete("s", reply, prepared=sent, usage={"prompt_tokens": 9, "completion_tokens": 2})
    assert [s.message.id for s in wguard.store.read("s")] == ["u-1", "a-1"]
    assert wguard.store.read("scratch") == []


# -- doors that work --------------------------------------------------------------------------


def test_langchain_middleware_stores_the_run_and_its_usage(wguard: Guard) -> None:
    pytest.importorskip("langchain.agents")
    from ctxguard.adapters.langchain import CtxGuardMiddleware

    from .test_langchain_agent import WeatherModel, run_turns, weather_agent

    model = WeatherModel()
    agent = weather_agent(model, CtxGuardMiddleware(wguard, max_tokens=RESERVE))
    state = asyncio.run(run_turns(agent, "sync", 4))
    assert _no_fit_ids(wguard, "chat-1") == [m.id for m in state]  # whole, ordered, once
    usage = [r for r in wguard.store.read_audit("chat-1") if r["kind"] == "usage"]
    assert [r["prompt_tokens"] for r in usage] == [10 * len(c) for c in model.seen]


async def test_pydantic_ai_capability_stores_the_run_and_its_usage(wguard: Guard) -> None:
    pytest.importorskip("pydantic_ai")
    from ctxguard.adapters.pydantic_ai import CtxGuardCapability, dump

    from .test_pydantic_ai import run_turns, weather_agent, weather_model

    calls: list[Any] = []
    capability = CtxGuardCapability(wguard, session_id="weather", max_tokens=RESERVE)
    history = await run_turns(weather_agent(weather_model(calls), capability), "async", 4)
    _no_fit_ids(wguard, "weather")
    assert [dump(m) for m in await capability.aload()] == [dump(m) for m in history]
    usage = [r for r in wguard.store.read_audit("weather") if r["kind"] == "usage"]
    assert len(usage) == len(calls)


def test_langchain_fit_messages_stores_nothing(wguard: Guard, store_url: str) -> None:
    pytest.importorskip("langchain_core")
    from langchain_core.messages import HumanMessage, SystemMessage

    from ctxguard.adapters.langchain import fit_messages

    before = store_diff.take(wguard.store, store_url)
    window = fit_messages(wguard, [SystemMessage("sys"), HumanMessage("hi")], max_tokens=RESERVE)
    assert [m.content for m in window] == ["sys", "hi"]
    assert store_diff.take(wguard.store, store_url) == before


def test_llamaindex_chat_store_and_llm_work(wguard: Guard) -> None:
    pytest.importorskip("llama_index.core")
    from llama_index.core.base.llms.types import ChatMessage
    from llama_index.core.llms.mock import MockLLM

    from ctxguard.adapters.llamaindex import CtxGuardChatStore, CtxGuardLLM

    store = CtxGuardChatStore(wguard)
    store.add_message("k", ChatMessage(role="user", content="hello"))
    store.add_message("k", ChatMessage(role="assistant", content="hi"))
    assert [m.content for m in store.get_messages("k")] == ["hello", "hi"]
    llm = CtxGuardLLM(MockLLM(max_tokens=RESERVE), wguard)
    assert llm.chat([ChatMessage(role="user", content="ping")]).message.content
    assert llm.last_prepared is not None and llm.last_prepared.unstored is None
    assert _no_fit_ids(wguard, "k") == [s.message.id for s in wguard.store.read("k")]
    assert list(wguard.store.list_sessions()) == ["k"]


async def test_agents_session_without_window_stores_every_item(wguard: Guard) -> None:
    pytest.importorskip("agents")
    from ctxguard.adapters.openai_agents import CtxGuardSession

    session = CtxGuardSession("a", wguard)
    items = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    await session.add_items(items)
    assert await session.get_items() == items
    fit = session.model_input_filter(max_tokens=RESERVE)
    from agents.run_config import CallModelData, ModelInputData

    data = CallModelData(
        model_data=ModelInputData(input=list(items), instructions="sys"), agent=None, context=None
    )
    fitted = await fit(data)
    assert fitted.input == items
    assert session.last_prepared is not None and session.last_prepared.unstored is None
    assert len(_no_fit_ids(wguard, "a")) == 2


async def test_litellm_guardrail_stores_the_turn_with_the_reply(
    with_reply_guardrail: Any, store_url: str
) -> None:
    from litellm.types.proxy.auth.user_api_key_auth import UserAPIKeyAuth

    from .test_litellm import call_model, post_call, pre_call, request

    g = with_reply_guardrail
    guard = g.gateway.guard(None)
    before = store_diff.take(guard.store, store_url)
    data = await pre_call(g, request([{"role": "user", "content": "hello"}], header="s"))
    assert store_diff.take(guard.store, store_url) == before  # nothing at pre_call
    await g.async_post_call_failure_hook(data, RuntimeError("down"), UserAPIKeyAuth())
    assert store_diff.take(guard.store, store_url) == before  # a failed call: nothing

    data = await pre_call(g, request([{"role": "user", "content": "hello"}], header="s"))
    await post_call(g, data, await call_model(data, reply="hi"))
    stored = [(s.message.role, s.message.text) for s in guard.store.read("s")]
    assert stored == [("user", "hello"), ("assistant", "hi")]
    kinds = [r["kind"] for r in guard.store.read_audit("s")]
    assert kinds == ["request"]  # one record, written with the reply


# -- doors that refuse it ------------------------------------------------------------------------


def test_langchain_history_refuses_it(wguard: Guard, store_url: str, namespace: str) -> None:
    pytest.importorskip("langchain_core")
    from ctxguard.adapters.langchain import CtxGuardChatMessageHistory

    with pytest.raises(ConfigError, match=REFUSED):
        CtxGuardChatMessageHistory(wguard, "s")
    with pytest.raises(ConfigError, match=REFUSED):
        CtxGuardChatMessageHistory(store_url, "s", namespace=namespace, config=WITH_REPLY)
    history = CtxGuardChatMessageHistory(store_url, "s", namespace=namespace, limit=LIMIT)
    from langchain_core.messages import HumanMessage

    history.budgeted_messages([HumanMessage("hi")], max_tokens=RESERVE)  # prepare stores it
    assert [m.content for m in history.messages] == ["hi"]
    history.close()


def test_llamaindex_memory_refuses_it(wguard: Guard, store_url: str, namespace: str) -> None:
    pytest.importorskip("llama_index.core")
    from ctxguard.adapters.llamaindex import CtxGuardMemory

    with pytest.raises(ConfigError, match=REFUSED):
        CtxGuardMemory.from_defaults(wguard, session_id="m")
    with pytest.raises(ConfigError, match=REFUSED):
        CtxGuardMemory.from_defaults(
            store_url, session_id="m", namespace=namespace, limit=LIMIT, config=WITH_REPLY
        )
    with pytest.raises(ConfigError, match=REFUSED):  # rebuilt from its fields (to_dict)
        CtxGuardMemory(store=store_url, limit=LIMIT, settings={"commit": "with_reply"})
    assert list(wguard.store.list_sessions()) == []
    memory = CtxGuardMemory.from_defaults(
        store_url, session_id="m", namespace=namespace, limit=LIMIT
    )
    memory.close()


async def test_agents_session_with_window_refuses_it(
    wguard: Guard, store_url: str, namespace: str
) -> None:
    pytest.importorskip("agents")
    from ctxguard.adapters.openai_agents import CtxGuardSession

    with pytest.raises(ConfigError, match=REFUSED):
        CtxGuardSession("w", wguard, window=True)
    with pytest.raises(ConfigError, match=REFUSED):
        CtxGuardSession(
            "w", store_url, window=True, namespace=namespace, limit=LIMIT, config=WITH_REPLY
        )
    session = CtxGuardSession("w", store_url, window=True, namespace=namespace, limit=LIMIT)
    await session.close()
