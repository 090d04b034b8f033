"""restore: what an import puts back that appends cannot (turn counter, summary)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ctxguard import Message
from ctxguard.stores import NewMessage, Summary, WriteOptions

if TYPE_CHECKING:
    from tests.conftest import StoreFacade


async def test_restore_raises_turns_and_sets_a_missing_summary(store: StoreFacade) -> None:
    assert await store.restore("s", 5, None) == (0, 0)  # no session: nothing to restore into
    await store.append(
        "s", [NewMessage(Message(role="user", content="hi", id="a"))], WriteOptions()
    )
    summary = Summary(version=3, text="so far", covers_to=1)
    assert await store.restore("s", 7, summary) == (7, 3)
    assert (await store.get_summary("s")) == summary
    assert await store.record("s", _request()) == 8  # numbering continues after the restore
    assert await store.restore("s", 2, Summary(version=9, text="other", covers_to=0)) == (8, 3)
    assert (await store.get_summary("s")).text == "so far"  # an existing summary is kept
    assert await store.commit_summary("s", Summary(version=4, text="next", covers_to=1), 3)


def _request() -> object:
    from ctxguard.stores.base import RecordWrite

    return RecordWrite(audit={"turn": 0, "kind": "request"})
