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


def test_a_call_message_repeating_an_id_is_never_whole() -> None:
    """Two calls with one id (a stored or imported message; new ones are refused): one
    result per distinct id is not one per call, and strict servers refuse the repeated
    id (DeepSeek: "Duplicate value for 'tool_call_id'"). The group goes, with its
    result; a second result for the id is an orphan and goes too."""
    items = [
        item(0, "user"),
        item(1, "assistant", tool_calls=calls("a", "a")),
        item(2, "tool", tool_call_id="a"),
        item(3, "tool", tool_call_id="a"),
        item(4, "user"),
        item(5, "assistant", tool_calls=calls("a", "b")),
        item(6, "tool", tool_call_id="b"),
        item(7, "tool", tool_call_id="a"),
    ]
    kept, removed = repair(items)
    assert [i.seq for i in kept] == [0, 4, 5, 6, 7]  # a distinct-id call, answered whole
    assert [i.seq for i in removed] == [1, 2, 3]
    problems = tool_problems([i.message for i in items[:3]])
    assert problems == ["message 1: tool calls repeat the ids ['a']"]
    assert tool_problems([i.message for i in kept]) == []


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


def _plan(items: list[Item], limit: int, **kw: object) -> Plan:
    options: dict[str, object] = {
        "history_start": 0,
        "summary": None,
        "summary_version": 0,
        "summary_covers_to": 0,
        "summary_text": None,
        "policy": WindowPolicy(),
    }
    options.update(kw)
    return plan_request([item(0, "system", 5)], items, budget(limit=limit), **options)  # type: ignore[arg-type]


def _roles(plan: Plan) -> list[str]:
    return [m.role for m in plan.messages()]


def test_a_trimmed_window_starts_on_a_user_turn() -> None:
    # system, then u a u a u: 20 tokens fit the last two, which begin on an assistant
    items = [item(s, "user" if s % 2 else "assistant", 10) for s in range(1, 6)]
    plan = _plan(items, limit=25)
    assert _roles(plan) == ["system", "user"]  # the orphaned assistant goes too
    assert plan.window[0].seq == 5 and plan.dropped == [(0, 5)]
    assert {"policy": "user_start", "skipped": [4]} in plan.decisions
    off = _plan(items, limit=25, policy=WindowPolicy(start_on_user=False))
    assert _roles(off) == ["system", "assistant", "user"]


def test_user_start_keeps_tool_groups_whole_and_the_newest_turn() -> None:
    items = [
        item(1, "user", 10),
        item(2, "assistant", 5, tool_calls=calls("a")),
        item(3, "tool", 5, tool_call_id="a"),
        item(4, "assistant", 5),
        item(5, "user", 5),
        item(6, "assistant", 5, tool_calls=calls("b")),
        item(7, "tool", 5, tool_call_id="b"),
    ]
    plan = _plan(items, limit=35)  # 30 left: 2..7 fit, 1 does not
    assert [i.seq for i in plan.window] == [5, 6, 7]
    assert tool_problems(plan.messages()) == []


def test_a_window_that_reaches_the_start_is_not_cut() -> None:
    items = [item(1, "assistant", 10), item(2, "user", 10)]  # an opening greeting
    assert _roles(_plan(items, limit=100)) == ["system", "assistant", "user"]


def test_a_tool_only_continuation_without_a_user_turn_is_sent_as_is() -> None:
    items = [
        item(1, "assistant", 50),
        item(2, "assistant", 5, tool_calls=calls("a")),
        item(3, "tool", 5, tool_call_id="a"),
    ]
    plan = _plan(items, limit=20)
    assert [i.seq for i in plan.window] == [2, 3]
    assert not any(d["policy"] == "user_start" for d in plan.decisions)


def test_user_start_after_a_summary() -> None:
    items = [item(s, "user" if s % 2 else "assistant", 10) for s in range(10, 20)]
    summary = Item(-1, Message(role="system", content="sum", id="ctxguard-summary-v1"), 15)
    plan = _plan(
        items,
        limit=100,
        summary=summary,
        summary_version=1,
        summary_covers_to=14,
        summary_text="sum",
    )
    assert plan.summary_message is summary.message
    assert _roles(plan)[:3] == ["system", "system", "user"]
    assert plan.window[0].seq == 15
