"""The policies' path for windows without tool messages (``policies._plain``: one group
per message) chooses exactly what the grouping path chooses: the same window, drops,
decisions and summary request, for any counts, budget, pins and settings."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxguard.guard import policies
from ctxguard.guard.plan import Budget, Item
from ctxguard.guard.policies import WindowPolicy, _select_plain, plan_request, select_window
from ctxguard.messages import Message

ROLES = st.sampled_from(["user", "assistant", "user", "assistant", "system"])


def items_of(roles: list[str], tokens: list[int], start: int = 0) -> list[Item]:
    return [
        Item(start + i, Message(role=r, content=f"m{i}", id=f"m{start + i}"), t)
        for i, (r, t) in enumerate(zip(roles, tokens, strict=False))
    ]


@settings(max_examples=300, deadline=None)
@given(
    tokens=st.lists(st.integers(0, 60), max_size=30),
    available=st.integers(0, 600),
    max_messages=st.none() | st.integers(1, 30),
    keep_from=st.integers(0, 31),
)
def test_plain_selection_is_the_grouped_selection(
    tokens: list[int], available: int, max_messages: int | None, keep_from: int
) -> None:
    items = items_of(["user"] * len(tokens), tokens)
    assert _select_plain(items, available, max_messages, keep_from) == select_window(
        items, available, max_messages, keep_from
    )


@settings(max_examples=300, deadline=None)
@given(
    roles=st.lists(ROLES, min_size=1, max_size=30),
    tokens=st.lists(st.integers(1, 80), min_size=30, max_size=30),
    prompt=st.integers(60, 900),
    max_messages=st.none() | st.integers(1, 20),
    start_on_user=st.booleans(),
    summarize_after=st.none() | st.integers(1, 6),
    with_summary=st.booleans(),
)
def test_plan_request_is_the_same_on_either_path(
    roles: list[str],
    tokens: list[int],
    prompt: int,
    max_messages: int | None,
    start_on_user: bool,
    summarize_after: int | None,
    with_summary: bool,
) -> None:
    roles[-1] = "user"
    pinned = [i for i in items_of(roles, tokens, 3) if i.message.role == "system"]
    items = [i for i in items_of(roles, tokens, 3) if i.message.role != "system"]
    if not items:
        return
    budget = Budget(limit=prompt + 100, reserved_output=100, safety_margin=0, overhead=3,
                    limit_source="static")  # fmt: skip
    summary = Item(-1, Message(role="system", content="sum", id="s"), 7) if with_summary else None
    policy = WindowPolicy(max_messages, summarize_after, True, start_on_user)

    def run() -> object:
        try:
            plan = plan_request(
                pinned, items, budget, history_start=0, summary=summary,
                summary_version=2 if summary else 0, summary_covers_to=5 if summary else 0,
                summary_text="sum" if summary else None, policy=policy,
            )  # fmt: skip
        except Exception as exc:  # refusals must match too
            return (type(exc).__name__, str(exc))
        return (plan.window, plan.pinned, plan.dropped, plan.decisions, plan.summarize,
                plan.summary_message, plan.summary_tokens, plan.summary_version)  # fmt: skip

    fast = run()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(policies, "_plain", lambda items: False)
        grouped = run()
    assert fast == grouped
