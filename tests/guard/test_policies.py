"""The pure policies: grouping, repair, windows and admission, without any store."""

from __future__ import annotations

import pytest

from ctxguard import BudgetError, Message
from ctxguard.guard.plan import Budget, Item, Plan
from ctxguard.guard.policies import (
    WindowPolicy,
    admit,
    group,
    plan_request,
    repair,
    select_window,
    tool_problems,
)


def item(seq: int, role: str, tokens: int = 10, **kw: object) -> Item:
    if role == "tool":
        kw.setdefault("tool_call_id", "c1")
        kw.setdefault("content", "result")
    elif role == "assistant" and "tool_calls" in kw:
        kw.setdefault("content", None)
    else:
        kw.setdefault("content", f"m{seq}")
    return Item(seq, Message(role=role, **kw), tokens)  # type: ignore[arg-type]


def calls(*ids: str) -> list[dict[str, object]]:
    return [{"id": i, "function": {"name": "f", "arguments": "{}"}} for i in ids]


def budget(limit: int = 100, reserved: int = 0, overhead: int = 0) -> Budget:
    return Budget(limit, reserved, 0, overhead, "test")


def test_group_keeps_parallel_tool_results_with_their_call() -> None:
    items = [
        item(0, "user"),
        item(1, "assistant", tool_calls=calls("a", "b")),
        item(2, "tool", tool_call_id="a"),
        item(3, "tool", tool_call_id="b"),
        item(4, "assistant"),
    ]
    assert [[i.seq for i in g] for g in group(items)] == [[0], [1, 2, 3], [4]]


def test_repair_drops_orphan_results_and_unanswered_calls() -> None:
    items = [
        item(0, "tool", tool_call_id="old"),
        item(1, "user"),
        item(2, "assistant", tool_calls=calls("a", "b")),
        item(3, "tool", tool_call_id="a"),
        item(4, "user"),
    ]
    kept, removed = repair(items)
    assert [i.seq for i in kept] == [1, 4]
    assert [i.seq for i in removed] == [0, 2, 3]


def test_tool_problems_names_each_violation() -> None:
    ok = [
        i.message
        for i in [
            item(0, "user"),
            item(1, "assistant", tool_calls=calls("a")),
            item(2, "tool", tool_call_id="a"),
        ]
    ]
    assert tool_problems(ok) == []
    assert tool_problems([item(0, "tool").message])[0].startswith("message 0: tool result")
    assert "have no results" in tool_problems(ok[:2])[0]


def test_window_is_contiguous_newest_groups_that_fit() -> None:
    items = [
        item(0, "user", 50),
        item(1, "assistant", 5),
        item(2, "user", 5),
        item(3, "assistant", 5),
    ]
    window = select_window(items, available=16, max_messages=None, keep_from=3)
    assert [i.seq for i in window] == [1, 2, 3]
    assert [i.seq for i in select_window(items, 100, max_messages=2, keep_from=3)] == [2, 3]


def test_window_never_splits_a_tool_group() -> None:
    items = [
        item(0, "user", 5),
        item(1, "assistant", 5, tool_calls=calls("a", "b")),
        item(2, "tool", 5, tool_call_id="a"),
        item(3, "tool", 5, tool_call_id="b"),
        item(4, "user", 5),
    ]
    window = select_window(items, available=15, max_messages=None, keep_from=4)
    assert [i.seq for i in window] == [4]  # the 15-token group does not fit in the 10 left


def test_admission_raises_with_the_numbers() -> None:
    pinned = [item(0, "system", 30)]
    items = [item(1, "user", 80)]
    with pytest.raises(BudgetError) as info:
        admit(pinned, items, budget(limit=120, reserved=20, overhead=5), None, Plan([], []))
    assert (info.value.needed, info.value.limit, info.value.reserved) == (135, 120, 20)


def test_admission_degrades_the_largest_new_tool_result() -> None:
    items = [
        item(1, "user", 10),
        item(2, "assistant", 5, tool_calls=calls("a")),
        item(3, "tool", 500, tool_call_id="a"),
    ]
    shrunk_to: list[int] = []

    def shrink(it: Item, target: int) -> Item:
        shrunk_to.append(target)
        return Item(it.seq, it.message, target)

    plan = Plan([], [])
    out = admit([], items, budget(limit=100), shrink, plan)
    assert sum(i.tokens for i in out) <= 100
    assert shrunk_to == [85] and plan.decisions[0]["policy"] == "degrade"


def test_summary_replaces_what_it_covers_without_overlap() -> None:
    items = [item(s, "user" if s % 2 else "assistant", 10) for s in range(10, 20)]
    summary = Item(-1, Message(role="system", content="sum", id="ctxguard-summary-v1"), 15)
    plan = plan_request(
        [item(0, "system", 5)],
        items,
        budget(limit=80),
        history_start=0,
        summary=summary,
        summary_version=1,
        summary_covers_to=14,
        summary_text="sum",
        policy=WindowPolicy(),
    )
    assert plan.summary_message is summary.message
    assert plan.window[0].seq >= 14
    assert plan.item_tokens() <= 80
    assert [m.id for m in plan.messages()][:2] == [plan.pinned[0].message.id, "ctxguard-summary-v1"]


def test_summary_is_requested_once_enough_is_dropped() -> None:
    items = [item(s, "user" if s % 2 else "assistant", 10) for s in range(0, 40)]
    plan = plan_request(
        [],
        items,
        budget(limit=100),
        history_start=0,
        summary=None,
        summary_version=0,
        summary_covers_to=0,
        summary_text=None,
        policy=WindowPolicy(summarize_after=20),
    )
    assert plan.summarize is not None
    assert (plan.summarize.covers_from, plan.summarize.covers_to) == (0, plan.window[0].seq)
    quiet = plan_request(
        [],
        items,
        budget(limit=100),
        history_start=0,
        summary=None,
        summary_version=0,
        summary_covers_to=0,
        summary_text=None,
        policy=WindowPolicy(summarize_after=None),
    )
    assert quiet.summarize is None
