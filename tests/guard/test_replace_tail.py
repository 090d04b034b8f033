"""Guard.replace_tail: the public door of the store's atomic replace (sync and async)."""

from __future__ import annotations

import pytest

from ctxguard import AsyncGuard, ConflictError, Guard, InvalidInputError, Message
from tests.conftest import private_memory_url


def said(i: int) -> Message:
    return Message(role="user" if i % 2 == 0 else "assistant", content=f"m{i}", id=f"id{i}")


def test_a_cached_window_sees_the_replaced_history() -> None:
    guard = Guard(private_memory_url(), limit=4000, counter="approx")
    guard.append("s", [said(i) for i in range(4)])
    first = guard.prepare("s", [said(4)], max_tokens=64)  # caches the window
    assert [m.id for m in first.messages] == ["id0", "id1", "id2", "id3", "id4"]
    result = guard.replace_tail("s", 1, [said(9)], expected_count=5)
    assert [r.message.id for r in result.removed] == ["id1", "id2", "id3", "id4"]
    assert result.appended.stored == ("id9",)
    again = guard.prepare("s", [said(10)], max_tokens=64)
    assert [m.id for m in again.messages] == ["id0", "id9", "id10"]
    with pytest.raises(ConflictError):  # the count moved on: nothing written
        guard.replace_tail("s", 0, [said(20)], expected_count=2)
    assert [s.message.id for s in guard.store.read("s")] == ["id0", "id9", "id10"]


@pytest.mark.parametrize(
    ("start", "expected"), [(-1, None), ("0", None), (0, -2), (0, 1.0), (None, None)]
)
async def test_bad_arguments_are_refused_before_anything(start: object, expected: object) -> None:
    url = private_memory_url()
    guard = Guard(url, limit=4000, counter="approx")
    aguard = AsyncGuard(url, limit=4000, counter="approx")
    guard.append("s", [said(0)])
    with pytest.raises(InvalidInputError):
        guard.replace_tail("s", start, [said(1)], expected_count=expected)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError):
        await aguard.replace_tail("s", start, [said(1)], expected_count=expected)  # type: ignore[arg-type]
    assert [s.message.id for s in guard.store.read("s")] == ["id0"]
    assert guard.store.read_audit("s") == []
    result = await aguard.replace_tail("s", 0, [said(1)], expected_count=1)
    assert [r.message.id for r in result.removed] == ["id0"]
    assert [s.message.id for s in guard.store.read("s")] == ["id1"]
    await aguard.aclose()
    guard.close()
