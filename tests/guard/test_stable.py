"""The stable-prefix policy on hand-worked windows (pure, no store)."""

from __future__ import annotations

import pytest

from ctxguard import BudgetError, ConfigError, GuardConfig, Message
from ctxguard.guard.plan import Budget, Item, Plan
from ctxguard.guard.stable import StablePolicy, plan_stable


def chat(count: int, tokens: int = 10) -> list[Item]:
    """user, assistant, user, ... (``count`` messages, the last one a user message)."""
    roles = ["user", "assistant"]
    return [Item(s, Message(role=roles[s % 2], content=f"m{s}"), tokens) for s in range(count)]


def plan(
    items: list[Item],
    *,
    offset: int = 0,
    reached: bool = True,
    summary: tuple[int, int] | None = None,
    low: int | float = 50,
    summarize_after: int | None = None,
    pinned: list[Item] | None = None,
) -> tuple[int, Plan]:
    summary_item = None
    if summary is not None:
        summary_item = Item(-1, Message(role="system", content="sum", id="s1"), summary[1])
    result = plan_stable(
        pinned or [],
        items,
        Budget(100, 0, 0, 0, "test"),
        offset=offset,
        reached_start=reached,
        history_start=0,
        summary=summary_item,
        summary_version=1 if summary else 0,
        summary_covers_to=summary[0] if summary else 0,
        summary_text="sum" if summary else None,
        policy=StablePolicy(low_water=low, summarize_after=summarize_after),
    )
    return result.window[0].seq, result


# prompt budget 100, low-water 50: cut points on a 50-token grid; 10 tokens a message


@pytest.mark.parametrize(
    ("count", "start"),
    [(1, 0), (9, 0), (11, 6), (13, 6), (15, 6), (17, 10), (19, 10), (23, 16)],
)
def test_the_window_grows_at_its_end_then_cuts_once_to_a_user_message(
    count: int, start: int
) -> None:
    # 11 messages (110 tokens) overflow: the first grid point is 50, the first user message
    # at or after it is seq 6 (position 60); that start holds until 6..16 (110) overflows
    first, result = plan(chat(count))
    assert first == start
    assert result.window[0].message.role == "user" or start == 0


def test_a_sliding_window_would_have_moved_every_turn() -> None:
    from ctxguard.guard.policies import WindowPolicy, plan_request

    starts = []
    for count in (11, 13, 15):
        sliding = plan_request(
            [],
            chat(count),
            Budget(100, 0, 0, 0, "test"),
            history_start=0,
            summary=None,
            summary_version=0,
            summary_covers_to=0,
            summary_text=None,
            policy=WindowPolicy(),
        )
        starts.append(sliding.window[0].seq)
    assert starts == [2, 4, 6]  # moves every turn (on the user turn, start_on_user)
    assert {plan(chat(c))[0] for c in (11, 13, 15)} == {6}


def test_a_fetch_that_covers_the_budget_decides_as_the_whole_history() -> None:
    for count in range(11, 31, 2):
        whole, _ = plan(chat(count))
        fetched = chat(count)[count - 11 :]  # the walk: 100 tokens back, plus one
        offset = 10 * (count - 11)
        assert plan(fetched, offset=offset, reached=count == 11)[0] == whole


def test_a_grid_point_older_than_the_fetch_is_never_taken() -> None:
    # only 8.. fetched (offset 80): cut 1 (grid 50) lies before the fetch, cut 2 is taken
    first, _ = plan(chat(15)[8:], offset=80, reached=False)
    assert first == 10


def test_low_water_as_a_fraction_of_the_prompt_budget() -> None:
    assert plan(chat(11), low=0.5)[0] == 6
    assert plan(chat(11), low=0.8)[0] == 2  # step 20: first user at position >= 20


def test_the_summary_goes_in_at_a_cut_and_covers_exactly_what_the_cut_dropped() -> None:
    first, result = plan(chat(17), summarize_after=1)
    assert first == 10
    request = result.summarize
    assert request is not None
    assert (request.covers_from, request.covers_to) == (0, 10)
    # committed: the summary stands in for 0..9 and nothing more is asked until the next cut
    first, result = plan(chat(17), summary=(10, 20), summarize_after=1)
    assert first == 10 and result.summary_message is not None
    assert result.summarize is None
    # 10..18 is 90 tokens, 80 left beside the summary: the next cut (grid 150), a new request
    first, result = plan(chat(19), summary=(10, 20), summarize_after=1)
    assert first == 16
    request = result.summarize
    assert request is not None
    assert (request.covers_from, request.covers_to) == (10, 16)


def test_a_summary_that_does_not_fit_beside_the_newest_turn_is_skipped() -> None:
    items = chat(17)
    big = [*items[:-1], Item(16, Message(role="user", content="big"), 90)]
    first, result = plan(big, summary=(10, 20))
    assert first == 16 and result.summary_message is None


def test_pinned_messages_and_admission_hold() -> None:
    pinned = [Item(0, Message(role="system", content="sys"), 30)]
    items = [Item(s + 1, i.message, i.tokens) for s, i in enumerate(chat(9))]
    _first, result = plan(items, pinned=pinned)
    assert result.pinned == pinned
    assert sum(i.tokens for i in result.window) <= 70
    with pytest.raises(BudgetError):
        plan([Item(1, Message(role="user", content="x"), 80)], pinned=pinned)


def test_config_validates_the_policy_and_low_water() -> None:
    GuardConfig(window_policy="stable", low_water=1000)
    GuardConfig(window_policy="stable", low_water=0.25)
    for bad in ({"window_policy": "fixed"}, {"low_water": 1.0}, {"low_water": -1}):
        with pytest.raises(ConfigError):
            GuardConfig(**bad)
    with pytest.raises(ConfigError):
        GuardConfig(low_water=True)
