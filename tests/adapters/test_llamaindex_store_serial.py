"""LlamaIndex chat store: rebuilt from its own serialisation (``to_dict``/``from_dict``,
pickle, a workflow ``Context`` saved with ``JsonSerializer``) it is the same store.

It was rebuilt as ``CtxGuardChatStore()``: a fresh in-process ``memory://`` store, so a
Redis-backed chat store restored from a saved workflow read an empty history and every
later write vanished with the process, silently.
"""

from __future__ import annotations

import asyncio
import json
import pickle
from typing import Any

import pydantic
import pytest

pytest.importorskip("llama_index.core")

from llama_index.core.llms import ChatMessage
from llama_index.core.workflow import Context, JsonSerializer, Workflow, step
from llama_index.core.workflow.events import StartEvent, StopEvent

from ctxguard import ConfigError
from ctxguard.adapters import _llamaindex_fields
from ctxguard.adapters.llamaindex import CtxGuardChatStore, CtxGuardMemory
from ctxguard.errors import InvalidInputError
from ctxguard.guard import Guard

HELLO = [ChatMessage(role="user", content="hello"), ChatMessage(role="assistant", content="hi")]


@pytest.fixture
def store(store_url: str, namespace: str) -> CtxGuardChatStore:
    chat_store = CtxGuardChatStore(store_url, namespace=namespace, limit=400)
    chat_store.set_messages("k", HELLO)
    return chat_store


def test_from_dict_of_to_dict_is_the_same_store(store: CtxGuardChatStore) -> None:
    data = json.loads(json.dumps(store.to_dict()))
    assert CtxGuardChatStore.from_dict(data).get_messages("k") == HELLO
    _llamaindex_fields._LIVE.clear()  # as if in another process: opened from the fields
    elsewhere = CtxGuardChatStore.from_dict(data)
    assert elsewhere.get_messages("k") == HELLO
    elsewhere.add_message("k", ChatMessage(role="user", content="more"))
    assert len(store.get_messages("k")) == 3
    elsewhere.close()


def test_a_pickled_store_is_the_same_store(store: CtxGuardChatStore) -> None:
    again = pickle.loads(pickle.dumps(store))
    assert again.get_messages("k") == HELLO


def test_a_store_on_a_guard_object_is_found_again(guard: Guard) -> None:
    chat_store = CtxGuardChatStore(guard)
    chat_store.set_messages("g", HELLO)
    data = chat_store.to_dict()
    assert data["limit"] == 400 and data["counter"] == "approx"
    assert CtxGuardChatStore.from_dict(data).get_messages("g") == HELLO


class _Keeps(Workflow):
    @step
    async def keep(self, ctx: Context, ev: StartEvent) -> StopEvent:
        await ctx.store.set("chat_store", ev.chat_store)
        return StopEvent(result="ok")


async def test_a_saved_workflow_context_keeps_the_store(store: CtxGuardChatStore) -> None:
    workflow = _Keeps()
    ctx = Context(workflow)
    await workflow.run(ctx=ctx, chat_store=store)
    data = ctx.to_dict(serializer=JsonSerializer())
    restored = Context.from_dict(workflow, data, serializer=JsonSerializer())
    again = await restored.store.get("chat_store")
    assert isinstance(again, CtxGuardChatStore)
    assert await again.aget_messages("k") == HELLO


def test_the_password_is_never_serialised(monkeypatch: pytest.MonkeyPatch) -> None:
    url = "redis://:s3cret-pw@127.0.0.1:1/0"
    chat_store = CtxGuardChatStore(url, limit=400)
    text = json.dumps(chat_store.to_dict())
    assert "s3cret" not in text and "***" in text
    assert b"s3cret" not in pickle.dumps(chat_store)
    _llamaindex_fields._LIVE.clear()
    monkeypatch.delenv("CTXGUARD_URL", raising=False)
    with pytest.raises(ConfigError, match="CTXGUARD_URL") as info:
        CtxGuardChatStore.from_dict(json.loads(text)).get_keys()
    assert "s3cret" not in str(info.value)
    monkeypatch.setenv("CTXGUARD_URL", url)
    assert CtxGuardChatStore.from_dict(json.loads(text)).ref.owns  # opened lazily


BUILDS = {
    "direct": lambda fields: CtxGuardChatStore(**fields),
    "from_dict": lambda fields: CtxGuardChatStore.from_dict(fields),
    "model_validate": lambda fields: CtxGuardChatStore.model_validate(fields),
    "model_validate_json": lambda fields: CtxGuardChatStore.model_validate_json(json.dumps(fields)),
}


@pytest.mark.parametrize("build", sorted(BUILDS))
@pytest.mark.parametrize(
    "fields",
    [{"store": 5}, {"settings": "no"}, {"handle": 5}, {"store": "memory://x", "limit": -1}],
    ids=["store-int", "settings-str", "handle-int", "limit"],
)
def test_bad_fields_are_a_typed_one_line_error(build: str, fields: dict[str, object]) -> None:
    with pytest.raises(InvalidInputError) as info:
        BUILDS[build](fields)
    assert not isinstance(info.value, pydantic.ValidationError)
    assert "\n" not in str(info.value)


def _closers() -> dict[str, Any]:
    async def aclose(obj: Any) -> None:
        await obj.aclose()

    def with_block(obj: Any) -> None:
        with obj:
            pass

    return {
        "close": lambda obj: obj.close(),
        "aclose": lambda obj: asyncio.run(aclose(obj)),
        "with": with_block,
    }


@pytest.mark.parametrize("how", sorted(_closers()))
@pytest.mark.parametrize("kind", ["memory", "store"])
def test_closing_a_rebuilt_object_never_used_opens_nothing(
    monkeypatch: pytest.MonkeyPatch, kind: str, how: str
) -> None:
    """Rebuilt in another process without ``CTXGUARD_URL``, closing it (a ``with`` block's
    exit too, which would hide the block's own error) opened the store to close it, and
    raised ConfigError for the password it does not have."""
    url = "redis://:s3cret-pw@127.0.0.1:1/0"
    built: Any = (
        CtxGuardMemory.from_defaults(url, session_id="p", limit=400)
        if kind == "memory"
        else CtxGuardChatStore(url, limit=400)
    )
    data = json.loads(json.dumps(built.to_dict()))
    _llamaindex_fields._LIVE.clear()
    monkeypatch.delenv("CTXGUARD_URL", raising=False)
    again = type(built).from_dict(data)
    _closers()[how](again)
    assert again._ref is None
