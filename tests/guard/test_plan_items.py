"""``GuardCore.plan`` makes the window's items in one pass when every count is known, and
otherwise counts the missing ones in the usual order (older pinned messages first, then
the others oldest first): the same items, the same recounts in the same order."""

from __future__ import annotations

from datetime import UTC, datetime

from ctxguard import Guard
from ctxguard.guard.plan import Budget
from ctxguard.messages import Message
from ctxguard.stores.base import SessionInfo, StoredMessage, WindowFetch
from tests.conftest import private_memory_url

ROLES = ["system", "user", "assistant", "user", "system", "assistant", "user"]


def fetch_of(tokens: list[int | None]) -> WindowFetch:
    now = datetime.now(UTC)
    recent = tuple(
        StoredMessage(i + 1, Message(role=ROLES[i % 7], content=f"m{i}" * 3, id=f"m{i}"), t)
        for i, t in enumerate(tokens)
    )
    pinned = (StoredMessage(0, Message(role="system", content="first", id="p0"), None),)
    info = SessionInfo("s", len(tokens) + 1, 0, "c", now, now, None, 0)
    return WindowFetch(info, pinned, recent, None, True, None, "t", None)


def test_known_and_unknown_counts_make_the_same_items_and_recount_order() -> None:
    guard = Guard(private_memory_url(), counter="approx", limit=4000, max_tokens=100)
    core = guard.core
    budget = Budget(4000, 100, 0, 3, "static")
    counted: list[str] = []
    real = core.counter.count_message

    def counting(message: Message) -> int:
        counted.append(message.id)
        return real(message)

    core.counter.count_message = counting  # type: ignore[method-assign]
    tokens: list[int | None] = [4, 5, None, 6, None, 7, 8, None, 9]
    plan, recounts = core.plan(fetch_of(tokens), budget)
    # pinned first (seq order), then the others oldest first
    assert counted == ["p0", "m4", "m7", "m2"]  # m0, m4, m7 are system messages
    assert list(recounts) == [0, 5, 8, 3]
    recent = fetch_of(tokens).recent
    known: list[int | None] = [
        real(s.message) if t is None else t for s, t in zip(recent, tokens, strict=True)
    ]
    plan2, recounts2 = core.plan(fetch_of(known), budget)
    assert [(i.seq, i.tokens) for i in plan.ordered()] == [
        (i.seq, i.tokens if i.seq else recounts[0]) for i in plan2.ordered()
    ]
    assert list(recounts2) == [0]
