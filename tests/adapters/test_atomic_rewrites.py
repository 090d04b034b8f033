"""Adapter writes that rewrite stored history are ONE store write each.

LlamaIndex ``set_messages`` / ``aset_messages`` / the memory's ``set`` / ``aset`` /
``from_defaults(chat_history=...)``, ``delete_message`` / ``adelete_message``, and the
Agents session's ``pop_item`` of one of several parallel calls were a removal and then an
append: a crash between the two lost messages, and a reader saw the shorter history.
Here the guard's store is wrapped so that every store write is counted, a reader looks at
the session after each one, and a "crash" (the process killed) can be planted after the
first: each operation is one ``replace_tail`` (or ``retract``), every state a reader can
see is the history before or after, and a crash after the first write loses nothing.
Over memory:// and Redis, sync and async.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from typing import Any

import pytest

pytest.importorskip("llama_index.core")

from llama_index.core.llms import ChatMessage

from ctxguard import AsyncGuard, Guard, load_counter
from ctxguard.adapters.llamaindex import CtxGuardChatStore, CtxGuardMemory
from ctxguard.stores import open_async_store, open_store
from ctxguard.tokens.approx import ApproxCounter

from .conftest import LIMIT
from .watched_store import Crash, WatchedStore


class CountingCounter(ApproxCounter):
    """The approx counter, counting the messages it counts."""

    counted = 0

    def count_message(self, message: Any) -> int:
        CountingCounter.counted += 1
        return super().count_message(message)


def counting() -> CountingCounter:
    assert type(load_counter("approx")) is ApproxCounter  # what the wrapper stands for
    CountingCounter.counted = 0
    return CountingCounter()


SESSION = "k"


@pytest.fixture
def watched(store_url: str, namespace: str) -> Iterator[tuple[Guard, WatchedStore]]:
    store = WatchedStore(open_store(store_url, namespace=namespace), SESSION)
    guard = Guard(store, limit=LIMIT, counter=counting())  # type: ignore[arg-type]
    yield guard, store
    store.inner.close()


@pytest.fixture
async def awatched(store_url: str, namespace: str) -> Any:
    store = WatchedStore(open_async_store(store_url, namespace=namespace), SESSION)
    guard = AsyncGuard(store, limit=LIMIT, counter=counting())  # type: ignore[arg-type]
    yield guard, store
    await store.inner.close()


def chat(n: int, prefix: str = "m") -> list[ChatMessage]:
    return [
        ChatMessage(role="user" if i % 2 == 0 else "assistant", content=f"{prefix}{i}")
        for i in range(n)
    ]


async def run_op(op: Callable[[], Any]) -> Any:
    result = op()
    if inspect.isawaitable(result):
        result = await result
    return result


async def stored_ids(store: WatchedStore) -> list[str]:
    return [s.message.id for s in await run_op(lambda: store.inner.read(SESSION))]


# -- one write, counted once ---------------------------------------------------------


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("how", ["set_messages", "memory.set", "from_defaults"])
async def test_a_set_is_one_write_and_counts_the_batch_once(
    watched: tuple[Guard, WatchedStore],
    awatched: tuple[AsyncGuard, WatchedStore],
    mode: str,
    how: str,
) -> None:
    guard, store = watched if mode == "sync" else awatched
    if how == "from_defaults" and mode == "async":
        pytest.skip("from_defaults is sync")
    chat_store = CtxGuardChatStore(guard)
    old, new = chat(4, "old"), chat(3, "new")
    await run_op(lambda: chat_store.aset_messages(SESSION, old))
    before = [s.message.id for s in await run_op(lambda: store.inner.read(SESSION))]
    store.reset()
    CountingCounter.counted = 0
    memory = CtxGuardMemory.from_defaults(guard, session_id=SESSION)
    if how == "set_messages":
        op = chat_store.set_messages if mode == "sync" else chat_store.aset_messages
        await run_op(lambda: op(SESSION, new))
    elif how == "memory.set":
        await run_op(lambda: (memory.set if mode == "sync" else memory.aset)(new))
    else:
        CtxGuardMemory.from_defaults(guard, session_id=SESSION, chat_history=new)
    assert store.writes == ["replace_tail"]
    assert CountingCounter.counted == len(new)  # counted once: no scratch pre-check
    after = await stored_ids(store)
    assert store.seen == [after]  # no reader ever saw an empty or half session
    assert before != after
    assert await run_op(lambda: chat_store.aget_messages(SESSION)) == new
    audit = await run_op(lambda: store.inner.read_audit(SESSION))
    assert audit[-1]["kind"] == "replace" and audit[-1]["ids"] == before
    assert audit[-1]["stored"] == after


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("idx", [0, 2, 4])
async def test_delete_message_is_one_write(
    watched: tuple[Guard, WatchedStore],
    awatched: tuple[AsyncGuard, WatchedStore],
    mode: str,
    idx: int,
) -> None:
    guard, store = watched if mode == "sync" else awatched
    chat_store = CtxGuardChatStore(guard)
    history = chat(5)
    await run_op(lambda: chat_store.aset_messages(SESSION, history))
    ids = await stored_ids(store)
    store.reset()
    op = chat_store.delete_message if mode == "sync" else chat_store.adelete_message
    assert await run_op(lambda: op(SESSION, idx)) == history[idx]
    assert store.writes == ["replace_tail"]
    left = history[:idx] + history[idx + 1 :]
    assert store.seen == [ids[:idx] + ids[idx + 1 :]]  # the ids kept, the only state seen
    assert await run_op(lambda: chat_store.aget_messages(SESSION)) == left


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("op_name", ["set_messages", "delete_message"])
async def test_a_crash_after_the_first_write_loses_nothing(
    watched: tuple[Guard, WatchedStore],
    awatched: tuple[AsyncGuard, WatchedStore],
    mode: str,
    op_name: str,
) -> None:
    """The process dies right after the operation's first store write: the session is
    the history before or after the operation, never an empty or shortened one."""
    guard, store = watched if mode == "sync" else awatched
    chat_store = CtxGuardChatStore(guard)
    history, new = chat(5), chat(3, "new")
    await run_op(lambda: chat_store.aset_messages(SESSION, history))
    store.reset(crash_after=1)
    try:
        if op_name == "set_messages":
            call = chat_store.set_messages if mode == "sync" else chat_store.aset_messages
            await run_op(lambda: call(SESSION, new))
            whole = [new]
        else:
            call = chat_store.delete_message if mode == "sync" else chat_store.adelete_message
            await run_op(lambda: call(SESSION, 1))
            whole = [history[:1] + history[2:]]
    except Crash:
        pass
    stored = await run_op(lambda: chat_store.aget_messages(SESSION))
    assert stored in [history, *whole], [m.content for m in stored]


# -- a refused batch changes nothing ------------------------------------------------


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_refused_set_writes_nothing(
    watched: tuple[Guard, WatchedStore], awatched: tuple[AsyncGuard, WatchedStore], mode: str
) -> None:
    """An image for a text counter is refused by the guard before the store is called;
    a batch over the session cap is refused by the store's one write, which writes
    nothing: the session, its audit trail and summary as they were."""
    from llama_index.core.llms import ImageBlock, TextBlock

    from ctxguard import SessionFullError, UncountableContentError

    guard, store = watched if mode == "sync" else awatched
    chat_store = CtxGuardChatStore(guard)
    history = chat(4)
    await run_op(lambda: chat_store.aset_messages(SESSION, history))
    trail = await run_op(lambda: store.inner.read_audit(SESSION))
    store.reset()
    image = ChatMessage(
        role="user", blocks=[TextBlock(text="see"), ImageBlock(url="http://a/b.png")]
    )
    op = chat_store.set_messages if mode == "sync" else chat_store.aset_messages
    with pytest.raises(UncountableContentError):
        await run_op(lambda: op(SESSION, [*chat(2, "x"), image]))
    assert store.writes == []
    capped = CtxGuardChatStore(
        type(guard)(store, limit=LIMIT, counter="approx", max_stored_messages=3)  # type: ignore[arg-type]
    )
    op = capped.set_messages if mode == "sync" else capped.aset_messages
    with pytest.raises(SessionFullError):
        await run_op(lambda: op(SESSION, chat(5, "y")))
    assert store.writes == ["replace_tail"] and store.seen == []  # the one write refused
    assert await run_op(lambda: chat_store.aget_messages(SESSION)) == history
    assert await run_op(lambda: store.inner.read_audit(SESSION)) == trail
