"""retract: explicit removal of the newest messages, on every backend, sync and async."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from ctxguard import ConflictError, Message
from ctxguard.stores import NewMessage, Summary, WriteOptions

if TYPE_CHECKING:
    from tests.conftest import StoreFacade

OPTIONS = WriteOptions(counter="c1")


def batch(n: int, start: int = 0) -> list[NewMessage]:
    return [
        NewMessage(
            Message(role="user" if i % 2 == 0 else "assistant", content=f"m{i}", id=f"id{i}"), 3
        )
        for i in range(start, start + n)
    ]


async def test_retract_removes_the_newest_and_frees_their_ids(store: StoreFacade) -> None:
    await store.append(
        "s", [NewMessage(Message(role="system", content="sys", id="sys"), 2)], OPTIONS
    )
    await store.append("s", batch(5), OPTIONS)
    removed = await store.retract("s", 2)
    assert [(r.seq, r.message.id, r.tokens) for r in removed] == [(4, "id3", 3), (5, "id4", 3)]
    info = await store.info("s")
    assert info.message_count == 4 and info.token_total == 2 + 3 * 3
    assert [m.message.id for m in await store.read("s")] == ["sys", "id0", "id1", "id2"]
    again = await store.append("s", batch(1, start=4), OPTIONS)  # the id may be stored again
    assert again.stored == ("id4",) and again.message_count == 5
    audit = await store.read_audit("s")
    assert audit[-1]["kind"] == "retract" and audit[-1]["ids"] == ["id3", "id4"]


async def test_retract_checks_the_expected_count(store: StoreFacade) -> None:
    await store.append("s", batch(3), OPTIONS)
    with pytest.raises(ConflictError):
        await store.retract("s", 1, 2)
    assert (await store.info("s")).message_count == 3
    assert [r.message.id for r in await store.retract("s", 1, 3)] == ["id2"]


async def test_retract_drops_pins_and_a_summary_it_cuts_into(store: StoreFacade) -> None:
    await store.append("s", batch(4), OPTIONS)
    await store.append(
        "s", [NewMessage(Message(role="system", content="late", id="late"), 2)], OPTIONS
    )
    assert await store.commit_summary("s", Summary(version=1, text="t", covers_to=4), 0)
    await store.retract("s", 2)
    assert await store.get_summary("s") is None
    window = await store.fetch_window("s", 1000, OPTIONS)
    assert [m.message.id for m in window.recent] == ["id0", "id1", "id2"] and window.pinned == ()


async def test_retract_of_everything_empties_the_session(store: StoreFacade) -> None:
    await store.append("s", batch(3), OPTIONS)
    assert len(await store.retract("s", 5)) == 3
    assert await store.read("s") == [] and (await store.info("s")).message_count == 0
    assert (await store.append("s", batch(1), OPTIONS)).stored == ("id0",)
    assert [m.seq for m in await store.read("s")] == [0]


async def test_retract_on_a_missing_session_removes_nothing(store: StoreFacade) -> None:
    assert await store.retract("nobody", 3) == []


async def test_retracting_nothing_records_nothing(store: StoreFacade) -> None:
    await store.append("s", batch(2), OPTIONS)
    assert await store.retract("s", 0) == []
    assert await store.read_audit("s") == []
    assert len(await store.read("s")) == 2
    await store.retract("s", 1)
    assert [r["kind"] for r in await store.read_audit("s")] == ["retract"]
