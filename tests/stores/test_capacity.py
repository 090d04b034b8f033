"""max_messages: a session never grows past its cap, and a refused batch stores nothing."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from ctxguard import Guard, Message, SessionFullError, StoreError
from ctxguard.stores import NewMessage, WriteOptions
from tests.conftest import private_memory_url

if TYPE_CHECKING:
    from tests.conftest import StoreFacade

CAPPED = WriteOptions(counter="c", max_messages=3)


def batch(*ids: str) -> list[NewMessage]:
    return [NewMessage(Message(role="user", content=i, id=i), 1) for i in ids]


async def test_a_batch_over_the_cap_is_refused_whole(store: StoreFacade) -> None:
    await store.append("s", batch("a", "b"), CAPPED)
    with pytest.raises(SessionFullError) as info:
        await store.append("s", batch("c", "d"), CAPPED)
    assert isinstance(info.value, StoreError) and info.value.held == 2
    assert [m.message.id for m in await store.read("s")] == ["a", "b"]
    with pytest.raises(SessionFullError):
        await store.fetch_window("s", 100, CAPPED, batch("c", "d"))
    assert (await store.info("s")).message_count == 2


async def test_retries_of_stored_ids_do_not_count_against_the_cap(store: StoreFacade) -> None:
    await store.append("s", batch("a", "b", "c"), CAPPED)
    again = await store.append("s", batch("a", "c"), CAPPED)
    assert again.duplicates == ("a", "c") and again.message_count == 3


async def test_a_new_session_over_the_cap_is_not_created(store: StoreFacade) -> None:
    with pytest.raises(SessionFullError):
        await store.append("fresh", batch("a", "b", "c", "d"), CAPPED)
    assert await store.info("fresh") is None


def test_guard_setting_caps_the_session() -> None:
    guard = Guard(
        private_memory_url(), counter="approx", limit=1000, max_tokens=100, max_stored_messages=2
    )
    guard.append("s", [{"role": "user", "content": "one"}, {"role": "assistant", "content": "two"}])
    with pytest.raises(SessionFullError):
        guard.prepare("s", [{"role": "user", "content": "three"}])
    assert len(guard.store.read("s")) == 2
