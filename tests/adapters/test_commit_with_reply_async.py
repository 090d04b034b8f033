"""Every adapter door driven by an :class:`~ctxguard.guard.AsyncGuard` (or through its
async entry points) under ``GuardConfig(commit="with_reply")``: the twin of
``test_commit_with_reply.py``, whose helpers it imports.

Works: the LangChain middleware (``ainvoke``/``astream``), ``afit_messages`` and
``window_runnable``'s ``ainvoke``; the Pydantic AI capability (``run``/``run_stream``),
``afit_history`` and ``history_processor``; the LlamaIndex chat store's async methods and
``CtxGuardLLM``'s ``achat``/``astream_chat``/``acomplete``; the Agents session without
``window`` (and its filter); the chat store and the session built from a URL (each
opens its own AsyncGuard per event loop); the LiteLLM guardrail's streamed reply and a retried
``pre_call``. Each stores the user's messages and the reply once, after the turn (ids,
roles, contents as the run holds them; no ``fit-`` scratch ids, no id twice), and a model
call that fails or never completes stores nothing (the store's whole contents, before and
after, by ``tests/store_diff.py``). Refused with an AsyncGuard, in one typed line:
LangChain's ``CtxGuardChatMessageHistory``, LlamaIndex's ``CtxGuardMemory``, the Agents
session with ``window=True``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from typing import Any

import pytest

from ctxguard.errors import ConfigError
from ctxguard.guard import AsyncGuard
from ctxguard.messages import Message
from tests import store_diff

from .conftest import LIMIT, RESERVE
from .test_commit_with_reply import REFUSED, WITH_REPLY, scratch_free


@pytest.fixture
async def waguard(store_url: str, namespace: str) -> AsyncIterator[AsyncGuard]:
    guard = AsyncGuard(
        store_url, namespace=namespace, limit=LIMIT, counter="approx", config=WITH_REPLY
    )
    assert guard.config.commit == "with_reply"
    yield guard
    await guard.aclose()


async def stored(guard: AsyncGuard, session: str) -> list[Message]:
    """The session's messages: no scratch id, no id twice."""
    messages = [s.message for s in await guard.store.read(session)]
    ids = scratch_free([m.id for m in messages])
    assert len(set(ids)) == len(ids), ids
    return messages


def content(messages: Iterable[Message]) -> list[tuple[str, str, str]]:
    return [(m.id, m.role, m.text) for m in messages]


async def usage_records(guard: AsyncGuard, session: str) -> list[dict[str, Any]]:
    return [r for r in await guard.store.read_audit(session) if r["kind"] == "usage"]


def snapshot(guard: AsyncGuard, url: str) -> store_diff.Snapshot:
    return store_diff.take(guard.store, url)


# -- LangChain ------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["async", "stream"])
async def test_langchain_middleware_stores_the_run_and_its_usage(
    waguard: AsyncGuard, mode: str
) -> None:
    pytest.importorskip("langchain.agents")
    from ctxguard.adapters.langchain import CtxGuardMiddleware, to_ctxguard

    from .test_langchain_agent import WeatherModel, run_turns, weather_agent

    model = WeatherModel()
    agent = weather_agent(model, CtxGuardMiddleware(waguard, max_tokens=RESERVE))
    state = await run_turns(agent, mode, 4)
    assert len(state) == 4 * 4 + 2  # user, call(s), result(s), answer: each turn
    held = content(await stored(waguard, "chat-1"))
    assert held == content(to_ctxguard(m) for m in state)  # whole, ordered, once
    usage = await usage_records(waguard, "chat-1")
    assert [r["prompt_tokens"] for r in usage] == [10 * len(c) for c in model.seen]


async def test_langchain_middleware_lays_the_run_back_in_a_session_deleted_elsewhere(
    waguard: AsyncGuard,
) -> None:
    """The relay (``_served._alay_back``: the session moved since the middleware's last
    write) on an AsyncGuard under with_reply: the run's messages are laid back whole."""
    pytest.importorskip("langchain.agents")
    from ctxguard.adapters.langchain import CtxGuardMiddleware, to_ctxguard

    from .test_langchain_agent import WeatherModel, run_turns, weather_agent

    agent = weather_agent(WeatherModel(), CtxGuardMiddleware(waguard, max_tokens=RESERVE))
    await run_turns(agent, "async", 2)
    await waguard.store.delete("chat-1")
    state = await run_turns(agent, "async", 1)
    held = content(await stored(waguard, "chat-1"))
    assert held == content(to_ctxguard(m) for m in state)


async def test_langchain_middleware_a_failed_model_call_stores_nothing(
    waguard: AsyncGuard, store_url: str
) -> None:
    pytest.importorskip("langchain.agents")
    from ctxguard.adapters.langchain import CtxGuardMiddleware

    from .test_langchain_agent import WeatherModel, run_turns, weather_agent

    class DownModel(WeatherModel):
        down: bool = False

        def _generate(self, messages: Any, *args: Any, **kwargs: Any) -> Any:
            if self.down:
                raise RuntimeError("model down")
            return super()._generate(messages, *args, **kwargs)

    model = DownModel(down=True)
    agent = weather_agent(model, CtxGuardMiddleware(waguard, max_tokens=RESERVE))
    empty = snapshot(waguard, store_url)
    with pytest.raises(RuntimeError, match="model down"):
        await run_turns(agent, "async", 1, thread="fresh")  # a new session's first call
    assert snapshot(waguard, store_url) == empty

    model.down = False
    await run_turns(agent, "async", 2)
    before = snapshot(waguard, store_url)
    model.down = True
    with pytest.raises(RuntimeError, match="model down"):
        await run_turns(agent, "async", 1)  # a session that holds turns
    assert snapshot(waguard, store_url) == before


async def test_langchain_afit_messages_and_window_runnable_store_nothing(
    waguard: AsyncGuard, store_url: str
) -> None:
    pytest.importorskip("langchain_core")
    from langchain_core.messages import HumanMessage, SystemMessage

    from ctxguard.adapters.langchain import afit_messages, window_runnable

    before = snapshot(waguard, store_url)
    prompt = [SystemMessage("sys"), HumanMessage("hi")]
    window = await afit_messages(waguard, prompt, max_tokens=RESERVE)
    assert [m.content for m in window] == ["sys", "hi"]
    window = await window_runnable(waguard, max_tokens=RESERVE).ainvoke(prompt)
    assert [m.content for m in window] == ["sys", "hi"]
    assert snapshot(waguard, store_url) == before


# -- Pydantic AI ------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["async", "stream"])
async def test_pydantic_ai_capability_stores_the_run_and_its_usage(
    waguard: AsyncGuard, mode: str
) -> None:
    pytest.importorskip("pydantic_ai")
    from ctxguard.adapters.pydantic_ai import CtxGuardCapability, dump, to_pieces

    from .test_pydantic_ai import run_turns, weather_agent, weather_model

    calls: list[Any] = []
    capability = CtxGuardCapability(waguard, session_id="weather", max_tokens=RESERVE)
    history = await run_turns(weather_agent(weather_model(calls), capability), mode, 4)
    held = await stored(waguard, "weather")
    whole = to_pieces(history, keep=True).messages
    assert [(m.role, m.text) for m in held] == [(m.role, m.text) for m in whole]  # once each
    assert [dump(m) for m in await capability.aload()] == [dump(m) for m in history]
    assert len(await usage_records(waguard, "weather")) == len(calls)


async def test_pydantic_ai_a_failed_model_call_stores_nothing(
    waguard: AsyncGuard, store_url: str
) -> None:
    pytest.importorskip("pydantic_ai")
    from pydantic_ai import Agent
    from pydantic_ai.models.function import FunctionModel
    from pydantic_ai.models.test import TestModel

    from ctxguard.adapters.pydantic_ai import CtxGuardCapability

    def down(messages: Any, info: Any) -> Any:
        raise RuntimeError("model down")

    capability = CtxGuardCapability(waguard, session_id="down", max_tokens=RESERVE)
    empty = snapshot(waguard, store_url)
    with pytest.raises(RuntimeError, match="model down"):
        await Agent(FunctionModel(down), capabilities=[capability]).run("hello")
    assert snapshot(waguard, store_url) == empty

    await Agent(TestModel(), capabilities=[capability]).run("hello")
    assert [m.role for m in await stored(waguard, "down")] == ["user", "assistant"]
    before = snapshot(waguard, store_url)
    with pytest.raises(RuntimeError, match="model down"):
        await Agent(FunctionModel(down), capabilities=[capability]).run(
            "again", message_history=await capability.aload()
        )
    assert snapshot(waguard, store_url) == before


async def test_pydantic_ai_afit_history_and_history_processor_store_nothing(
    waguard: AsyncGuard, store_url: str
) -> None:
    pytest.importorskip("pydantic_ai")
    from pydantic_ai import Agent
    from pydantic_ai import messages as pai
    from pydantic_ai.capabilities import ProcessHistory
    from pydantic_ai.models.test import TestModel

    from ctxguard.adapters.pydantic_ai import afit_history, history_processor

    before = snapshot(waguard, store_url)
    history: list[Any] = [pai.ModelRequest(parts=[pai.UserPromptPart("hi")])]
    fitted = await afit_history(waguard, history, max_tokens=RESERVE)
    assert fitted.messages == history and fitted.prepared.unstored is None
    agent = Agent(
        TestModel(), capabilities=[ProcessHistory(history_processor(waguard, max_tokens=RESERVE))]
    )
    await agent.run("hello")
    assert snapshot(waguard, store_url) == before


# -- LlamaIndex -------------------------------------------------------------------------------


async def test_llamaindex_chat_store_async_methods_work(waguard: AsyncGuard) -> None:
    pytest.importorskip("llama_index.core")
    from llama_index.core.base.llms.types import ChatMessage

    from ctxguard.adapters.llamaindex import CtxGuardChatStore

    store = CtxGuardChatStore(waguard)
    await store.async_add_message("k", ChatMessage(role="user", content="hello"))
    await store.async_add_message("k", ChatMessage(role="assistant", content="hi"))
    assert [(m.role.value, m.content) for m in await store.aget_messages("k")] == [
        ("user", "hello"),
        ("assistant", "hi"),
    ]
    assert [(m.role, m.text) for m in await stored(waguard, "k")] == [
        ("user", "hello"),
        ("assistant", "hi"),
    ]
    await store.aset_messages("k", [ChatMessage(role="user", content="again")])
    assert [(m.role, m.text) for m in await stored(waguard, "k")] == [("user", "again")]
    assert await store.aget_keys() == ["k"]


async def test_llamaindex_llm_async_calls_store_nothing(
    waguard: AsyncGuard, store_url: str
) -> None:
    pytest.importorskip("llama_index.core")
    from llama_index.core.base.llms.types import ChatMessage
    from llama_index.core.llms.mock import MockLLM

    from ctxguard.adapters.llamaindex import CtxGuardLLM

    class DownLLM(MockLLM):
        async def achat(self, messages: Any, **kwargs: Any) -> Any:
            raise RuntimeError("model down")

    before = snapshot(waguard, store_url)
    llm = CtxGuardLLM(MockLLM(max_tokens=RESERVE), waguard)
    assert (await llm.achat([ChatMessage(role="user", content="ping")])).message.content
    assert llm.last_prepared is not None and llm.last_prepared.unstored is None
    chunks = [c async for c in await llm.astream_chat([ChatMessage(role="user", content="p")])]
    assert chunks
    assert (await llm.acomplete("ping")).text
    with pytest.raises(RuntimeError, match="model down"):
        await CtxGuardLLM(DownLLM(max_tokens=RESERVE), waguard).achat(
            [ChatMessage(role="user", content="ping")]
        )
    assert snapshot(waguard, store_url) == before


async def test_llamaindex_chat_store_from_a_url_opens_an_async_guard_with_it(
    store_url: str, namespace: str
) -> None:
    pytest.importorskip("llama_index.core")
    from llama_index.core.base.llms.types import ChatMessage

    from ctxguard.adapters.llamaindex import CtxGuardChatStore

    store = CtxGuardChatStore(store_url, namespace=namespace, limit=LIMIT, config=WITH_REPLY)
    await store.async_add_message("k", ChatMessage(role="user", content="hello"))
    opened = store.ref.aio()
    assert isinstance(opened, AsyncGuard) and opened.config.commit == "with_reply"
    assert [(m.role, m.text) for m in await stored(opened, "k")] == [("user", "hello")]
    await store.aclose()


# -- the OpenAI Agents SDK -----------------------------------------------------------------


async def test_agents_session_without_window_stores_every_item(
    waguard: AsyncGuard, store_url: str
) -> None:
    pytest.importorskip("agents")
    from agents.run_config import CallModelData, ModelInputData

    from ctxguard.adapters.openai_agents import CtxGuardSession

    session = CtxGuardSession("a", waguard)
    items = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    await session.add_items(items)
    assert await session.get_items() == items
    held = await stored(waguard, "a")
    assert [(m.role, m.text) for m in held] == [("user", "hi"), ("assistant", "hello")]

    before = snapshot(waguard, store_url)
    fit = session.model_input_filter(max_tokens=RESERVE)
    data = CallModelData(
        model_data=ModelInputData(input=list(items), instructions="sys"), agent=None, context=None
    )
    fitted = await fit(data)
    assert fitted.input == items
    assert session.last_prepared is not None and session.last_prepared.unstored is None
    assert snapshot(waguard, store_url) == before  # the filter stores nothing


async def test_agents_session_from_a_url_opens_an_async_guard_with_it(
    store_url: str, namespace: str
) -> None:
    pytest.importorskip("agents")
    from ctxguard.adapters.openai_agents import CtxGuardSession

    session = CtxGuardSession("a", store_url, namespace=namespace, limit=LIMIT, config=WITH_REPLY)
    await session.add_items([{"role": "user", "content": "hi"}])
    opened = session.ref.aio()
    assert isinstance(opened, AsyncGuard) and opened.config.commit == "with_reply"
    assert [(m.role, m.text) for m in await stored(opened, "a")] == [("user", "hi")]
    assert await session.get_items() == [{"role": "user", "content": "hi"}]
    await session.close()


# -- the LiteLLM guardrail (its hooks are async; its guards are the gateway's) ------------
# (with_reply_guardrail: tests/adapters/conftest.py)


async def _stream_hook(g: Any, data: dict[str, Any], stream: Any) -> str:
    from litellm.types.proxy.auth.user_api_key_auth import UserAPIKeyAuth

    hook = g.async_post_call_streaming_iterator_hook(
        user_api_key_dict=UserAPIKeyAuth(), response=stream, request_data=data
    )
    return "".join([c.choices[0].delta.content or "" async for c in hook])


async def test_litellm_a_streamed_reply_is_stored_with_the_turn_at_its_end(
    with_reply_guardrail: Any, store_url: str
) -> None:
    import litellm

    from .test_litellm import pre_call, request

    g = with_reply_guardrail
    guard = g.gateway.guard(None)
    before = store_diff.take(guard.store, store_url)

    async def cut(stream: Any) -> AsyncIterator[Any]:  # the client went away mid-stream
        async for chunk in stream:
            yield chunk
            return

    data = await pre_call(g, request([{"role": "user", "content": "tell"}], header="st"))
    assert store_diff.take(guard.store, store_url) == before  # nothing at pre_call
    stream = await litellm.acompletion(
        model="openai/local", messages=data["messages"], stream=True, mock_response="one two three"
    )
    assert await _stream_hook(g, data, cut(stream)) != "one two three"
    assert store_diff.take(guard.store, store_url) == before  # cut short: nothing

    data = await pre_call(g, request([{"role": "user", "content": "tell"}], header="st"))
    stream = await litellm.acompletion(
        model="openai/local", messages=data["messages"], stream=True, mock_response="one two three"
    )
    assert await _stream_hook(g, data, stream) == "one two three"
    held = [(s.message.role, s.message.text) for s in guard.store.read("st")]
    assert held == [("user", "tell"), ("assistant", "one two three")]
    scratch_free([s.message.id for s in guard.store.read("st")])
    assert [r["kind"] for r in guard.store.read_audit("st")] == ["request"]


async def test_litellm_a_retried_request_is_stored_once(
    with_reply_guardrail: Any, store_url: str
) -> None:
    from .test_litellm import call_model, post_call, pre_call, request

    g = with_reply_guardrail
    guard = g.gateway.guard(None)
    before = store_diff.take(guard.store, store_url)
    first = [{"role": "user", "content": "hello"}]
    await pre_call(g, request(first, header="s2"))  # the call failed; the client retries
    await pre_call(g, request(first, header="s2"))
    assert store_diff.take(guard.store, store_url) == before
    data = await pre_call(g, request(first, header="s2"))
    await post_call(g, data, await call_model(data, reply="hi"))
    held = [(s.message.role, s.message.text) for s in guard.store.read("s2")]
    assert held == [("user", "hello"), ("assistant", "hi")]
    assert [r["kind"] for r in guard.store.read_audit("s2")] == ["request"]


# -- doors that refuse it -------------------------------------------------------------------


async def test_langchain_history_refuses_an_async_guard_with_it(waguard: AsyncGuard) -> None:
    pytest.importorskip("langchain_core")
    from ctxguard.adapters.langchain import CtxGuardChatMessageHistory

    with pytest.raises(ConfigError, match=REFUSED):
        CtxGuardChatMessageHistory(waguard, "s")
    assert [k async for k in waguard.store.list_sessions()] == []


async def test_llamaindex_memory_refuses_an_async_guard_with_it(waguard: AsyncGuard) -> None:
    pytest.importorskip("llama_index.core")
    from ctxguard.adapters.llamaindex import CtxGuardMemory

    with pytest.raises(ConfigError, match=REFUSED):
        CtxGuardMemory.from_defaults(waguard, session_id="m")
    assert [k async for k in waguard.store.list_sessions()] == []


async def test_agents_session_with_window_refuses_an_async_guard_with_it(
    waguard: AsyncGuard,
) -> None:
    pytest.importorskip("agents")
    from ctxguard.adapters.openai_agents import CtxGuardSession

    with pytest.raises(ConfigError, match=REFUSED):
        CtxGuardSession("w", waguard, window=True)
    assert [k async for k in waguard.store.list_sessions()] == []
