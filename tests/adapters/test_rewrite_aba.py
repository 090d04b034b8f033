"""An adapter's rewrite by index is refused when the session was written since its read.

The adapters read a session, then rewrite its tail by index (LlamaIndex
``delete_message``, the Agents session's ``pop_item``). Another writer that, between
the read and the write, retracts the newest message and appends another leaves the
message COUNT as it was (ABA): checked by the count alone, ``pop_item`` removed the
other writer's new message and returned the one already gone, and ``delete_message``
lost the new message and put the retracted one back. Each rewrite now passes the state
token of its read (``store.read_with_token``): ``pop_item`` is refused and retried on
fresh data, ``delete_message`` is refused (ConflictError, nothing written). Over
memory:// and Redis, sync and async.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

pytest.importorskip("llama_index.core")
pytest.importorskip("agents")

from ctxguard import AsyncGuard, ConflictError, Guard, Message
from ctxguard.adapters.llamaindex import CtxGuardChatStore
from ctxguard.adapters.openai_agents import CtxGuardSession
from ctxguard.stores import NewMessage, open_async_store, open_store

from .conftest import LIMIT

SESSION = "k"
READS = frozenset({"read", "read_last", "read_with_token"})


async def _settle(result: Any) -> Any:
    return await result if inspect.isawaitable(result) else result


class InterleavedStore:
    """A store whose first read is followed, before its caller gets the answer, by
    another writer's writes: the newest message retracted, ``late`` appended."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.pending = False

    async def _meddle(self) -> None:
        await _settle(self.inner.retract(SESSION, 1))
        late = NewMessage(Message(role="user", content="late", id="late"))
        await _settle(self.inner.append(SESSION, [late]))

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if name not in READS:
            return attr
        if inspect.iscoroutinefunction(attr):

            async def acall(*args: Any, **kwargs: Any) -> Any:
                result = await attr(*args, **kwargs)
                if self.pending:
                    self.pending = False
                    await self._meddle()
                return result

            return acall

        def call(*args: Any, **kwargs: Any) -> Any:
            result = attr(*args, **kwargs)
            if self.pending:
                self.pending = False
                # (the sync store's writes return plain values: no loop is needed)
                self.inner.retract(SESSION, 1)
                late = NewMessage(Message(role="user", content="late", id="late"))
                self.inner.append(SESSION, [late])
            return result

        return call


@pytest.fixture(params=["sync", "async"])
async def interleaved(
    request: pytest.FixtureRequest, store_url: str, namespace: str
) -> AsyncIterator[tuple[Guard | AsyncGuard, InterleavedStore]]:
    if request.param == "sync":
        store = InterleavedStore(open_store(store_url, namespace=namespace))
        yield Guard(store, limit=LIMIT, counter="approx"), store  # type: ignore[arg-type]
    else:
        store = InterleavedStore(open_async_store(store_url, namespace=namespace))
        yield AsyncGuard(store, limit=LIMIT, counter="approx"), store  # type: ignore[arg-type]
    await _settle(store.inner.close())


async def _texts(store: InterleavedStore) -> list[str]:
    return [s.message.text for s in await _settle(store.inner.read(SESSION))]


def _seed(n: int) -> list[NewMessage]:
    return [NewMessage(Message(role="user", content=f"m{i}", id=f"m{i}")) for i in range(n)]


async def test_pop_item_pops_the_newest_after_another_writer_retracted_and_appended(
    interleaved: tuple[Guard | AsyncGuard, InterleavedStore],
) -> None:
    guard, store = interleaved
    await _settle(store.inner.append(SESSION, _seed(3)))
    session = CtxGuardSession(SESSION, guard)
    store.pending = True
    popped = await session.pop_item()
    # the other writer took m2 and appended "late": the newest is "late", and it goes
    assert popped is not None and "late" in str(popped) and "m2" not in str(popped)
    assert await _texts(store) == ["m0", "m1"]
    audit = await _settle(store.inner.read_audit(SESSION))
    assert [r["ids"] for r in audit if r["kind"] == "retract"] == [["m2"], ["late"]]


@pytest.mark.parametrize("call", ["delete_message", "adelete_message"])
async def test_delete_message_is_refused_after_another_writer_retracted_and_appended(
    interleaved: tuple[Guard | AsyncGuard, InterleavedStore], call: str
) -> None:
    guard, store = interleaved
    if call == "delete_message" and isinstance(guard, AsyncGuard):
        pytest.skip("a sync call over an AsyncGuard is refused by design")
    await _settle(store.inner.append(SESSION, _seed(4)))
    chat_store = CtxGuardChatStore(guard)
    store.pending = True
    op: Callable[[str, int], Any] = getattr(chat_store, call)
    with pytest.raises(ConflictError):
        await _settle(op(SESSION, 1))
    # nothing written: "late" kept, m3 (retracted by the other writer) not put back
    assert await _texts(store) == ["m0", "m1", "m2", "late"]
    assert await _settle(op(SESSION, 1)) is not None  # read again: it goes through
    assert await _texts(store) == ["m0", "m2", "late"]


def test_guard_replace_tail_checks_the_state_token_it_is_given(guard: Guard) -> None:
    from ctxguard import InvalidInputError

    guard.append(SESSION, [{"role": "user", "content": "a"}])
    _, token = guard.store.read_with_token(SESSION)
    guard.append(SESSION, [{"role": "user", "content": "b"}])
    new = [{"role": "user", "content": "c"}]
    with pytest.raises(ConflictError):
        guard.replace_tail(SESSION, 0, new, expected_state=token)
    with pytest.raises(InvalidInputError, match="expected_state"):
        guard.replace_tail(SESSION, 0, new, expected_state=1)  # type: ignore[arg-type]
    assert [m.text for m in _stored(guard)] == ["a", "b"]
    _, token = guard.store.read_with_token(SESSION)
    guard.replace_tail(SESSION, 0, new, expected_state=token)
    assert [m.text for m in _stored(guard)] == ["c"]


def _stored(guard: Guard) -> list[Message]:
    return [s.message for s in guard.store.read(SESSION)]
