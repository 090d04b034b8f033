"""Every refused write through an adapter changes nothing stored (tests/store_diff.py:
every key of the namespace): a bad item 3rd of 5, a message id reused with other
content, a counter failing on the 3rd message of 5, a batch past max_stored_messages,
through LangChain's history, LlamaIndex's chat store and memory, and the Agents SDK
session; on memory:// and Redis."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("langchain_core")
pytest.importorskip("llama_index.core")
pytest.importorskip("agents")

from langchain_core.messages import HumanMessage
from llama_index.core.llms import ChatMessage

from ctxguard import Guard, GuardConfig
from ctxguard.adapters.langchain import CtxGuardChatMessageHistory
from ctxguard.adapters.llamaindex import CtxGuardChatStore, CtxGuardMemory
from ctxguard.adapters.openai_agents import CtxGuardSession
from ctxguard.errors import CtxGuardError
from tests import store_diff
from tests.guard.test_refusal_matrix import SEEDED, MidBatchCounter

SID = "s"


def lc_batch(n: int) -> list[Any]:
    return [HumanMessage(content=f"line {i}") for i in range(n)]


def li_batch(n: int) -> list[Any]:
    return [ChatMessage(role="user", content=f"line {i}") for i in range(n)]


def ag_batch(n: int) -> list[Any]:
    return [{"role": "user", "content": f"line {i}"} for i in range(n)]


def _bad_3rd(batch: list[Any]) -> list[Any]:
    return [*batch[:2], 5, *batch[3:]]


# door -> (make the adapter from (url, namespace, options), batch maker, call)
DOORS: dict[str, tuple[Callable[..., Any], Callable[[int], list[Any]], Callable[..., Any]]] = {
    "langchain-add_messages": (
        lambda url, ns, **o: CtxGuardChatMessageHistory(url, SID, namespace=ns, **o),
        lc_batch,
        lambda a, batch: a.add_messages(batch),
    ),
    "langchain-aadd_messages": (
        lambda url, ns, **o: CtxGuardChatMessageHistory(url, SID, namespace=ns, **o),
        lc_batch,
        lambda a, batch: a.aadd_messages(batch),
    ),
    "llamaindex-set_messages": (
        lambda url, ns, **o: CtxGuardChatStore(url, namespace=ns, **o),
        li_batch,
        lambda a, batch: a.set_messages(SID, batch),
    ),
    "llamaindex-aset_messages": (
        lambda url, ns, **o: CtxGuardChatStore(url, namespace=ns, **o),
        li_batch,
        lambda a, batch: a.aset_messages(SID, batch),
    ),
    "llamaindex-memory-put_messages": (
        lambda url, ns, **o: CtxGuardMemory.from_defaults(url, session_id=SID, namespace=ns, **o),
        li_batch,
        lambda a, batch: a.put_messages(batch),
    ),
    "llamaindex-memory-set": (
        lambda url, ns, **o: CtxGuardMemory.from_defaults(url, session_id=SID, namespace=ns, **o),
        li_batch,
        lambda a, batch: a.set(batch),
    ),
    "agents-add_items": (
        lambda url, ns, **o: CtxGuardSession(SID, url, namespace=ns, **o),
        ag_batch,
        lambda a, batch: a.add_items(batch),
    ),
}

CLASSES = ["bad-item-3rd-of-5", "counter-raises-3rd-of-5", "session-full"]


def run(result: Any) -> Any:
    return asyncio.run(result) if inspect.isawaitable(result) else result


@pytest.mark.parametrize("name", CLASSES)
@pytest.mark.parametrize("door", list(DOORS))
def test_a_refused_adapter_write_stores_nothing(
    store_url: str, namespace: str, door: str, name: str
) -> None:
    make, batch_of, call = DOORS[door]
    options: dict[str, Any] = {"limit": 4000, "counter": "approx"}
    counter = None
    if name == "counter-raises-3rd-of-5":
        counter = options["counter"] = MidBatchCounter(3)
    if name == "session-full":
        options["config"] = GuardConfig(max_stored_messages=4)
    seed = Guard(store_url, namespace=namespace, limit=4000, counter=options["counter"])
    seed.append(SID, SEEDED)
    seed.append("other", [{"role": "user", "content": "keep"}])
    adapter = make(store_url, namespace, **options)
    store = seed.store
    try:
        batch = batch_of(5)
        if name == "bad-item-3rd-of-5":
            batch = _bad_3rd(batch)
        if counter is not None:
            counter.armed = True
        before = store_diff.take(store, store_url)
        with pytest.raises(CtxGuardError) as caught:
            run(call(adapter, batch))
        assert "\n" not in str(caught.value)
        store_diff.assert_refused_only(before, store_diff.take(store, store_url))
    finally:
        closing = getattr(adapter, "close", None) or getattr(adapter, "aclose", None)
        if closing is not None:
            run(closing())
        seed.close()
