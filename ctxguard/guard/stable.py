"""The stable-prefix window: cut rarely and deeply so the server's prefix cache stays warm.

The sliding window (:func:`~ctxguard.guard.policies.plan_request`) drops the oldest
group every turn once a conversation is over budget, so the prompt changes right
after the pinned messages and the server re-prefills the whole window each turn
(see :mod:`ctxguard.kv.prefix`). This policy instead:

* grows the window only at its end while it fits;
* when it would not fit, cuts once, down to about the *low-water mark* (a number
  of prompt tokens, or a fraction of the prompt budget), at a turn boundary that
  leaves a user message first; then grows again;
* inserts a summary only at such a cut (the summary it asks for covers exactly
  what the cut dropped, so the summary text stays fixed until the next cut).

Pinned first, admission (degrade or :class:`~ctxguard.errors.BudgetError`),
tool-group integrity, the newest user message always sent and the raw history
left unchanged all hold as for the sliding window: the same helpers do them.

**Where the cut point lives.** Nowhere: it is derived from the stored history and
the budget alone, so another process, a cold cache or a replay decides the same
window. Every non-pinned message has a *position*: the tokens of the non-pinned
messages before it since the session began (the store's token total minus the
counts of what the fetch returned gives the position of the first fetched one).
Cut points lie on a fixed grid of ``step = prompt budget - low-water mark``
tokens (at most the room beside the pinned messages): cut ``k`` starts the
window at the first user message at position ``k * step`` or later (cut 0: the
oldest message, or the first one after the summary). Each request takes the
smallest ``k`` whose window fits; as the conversation grows that ``k`` never
decreases, so the window start stays put until the window would overflow and
then jumps by about ``step`` tokens, leaving about the low-water mark. A change
of budget, low-water mark or counter moves the grid (one extra cut).

The fetch (the store's budget walk, itself a function of the stored counts and
the prompt budget) always covers the prompt budget, so a start older than it
would not fit. A grid point at or before the position of the message that
stopped the walk (any point before the fetch when that message is pinned or
uncounted) is not taken: the fetch cannot tell whether that message is a user
message. :func:`ctxguard.guard.replay.walked_fetch` walks the same way.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ctxguard.guard.plan import Budget, Item, Plan
from ctxguard.guard.policies import (
    Shrinker,
    _repair,
    admit,
    close_window,
    group,
    tail_start,
    unpinned_between,
)

if TYPE_CHECKING:
    from ctxguard.stores.base import WindowFetch


@dataclass(frozen=True, slots=True)
class StablePolicy:
    """Settings of the stable-prefix window.

    ``low_water`` is how much of the prompt budget a cut leaves: an int is tokens,
    a float in (0, 1) a fraction of the prompt budget.
    """

    low_water: int | float = 0.5
    max_window_messages: int | None = None
    summarize_after: int | None = None
    degrade_tool_results: bool = True

    def step(self, prompt: int) -> int:
        """Tokens between two cut points of the grid (at least 1)."""
        low = int(prompt * self.low_water) if isinstance(self.low_water, float) else self.low_water
        return max(1, prompt - low)


@dataclass(frozen=True, slots=True)
class _Run:
    """Candidates from one base (the history start or the summary's end) with their sums."""

    items: list[Item]
    suffix: list[int]  # suffix[i]: tokens of items[i:]
    users: list[int]  # indexes of user messages before the newest turn, and the newest
    user_pos: list[int]  # their positions
    tail: int  # index of the newest user message
    start_known: bool  # the run's first item is the base (cut 0 is known)


def fetch_positions(fetch: WindowFetch) -> tuple[int, int | None]:
    """(``offset``, ``before``) for :func:`plan_stable` from what a fetch holds.

    ``offset``: the session's token total less the stored counts of what the fetch
    returned (every pinned message and the recent run), i.e. the tokens of the
    non-pinned messages older than the fetch. ``before``: the position of the
    message that stopped the walk, if it is non-pinned and counted.
    """
    fetched = sum([s.tokens or 0 for s in fetch.pinned]) + sum(
        [s.tokens or 0 for s in fetch.recent]
    )
    offset = max(0, fetch.info.token_total - fetched)
    if fetch.reached_start or fetch.stop_tokens is None or not fetch.recent:
        return offset, None
    stop_seq = fetch.recent[0].seq - 1
    if any(s.seq == stop_seq for s in fetch.pinned):
        return offset, None
    return offset, offset - fetch.stop_tokens


def positions(items: Sequence[Item], offset: int) -> dict[int, int]:
    """Each item's position: ``offset`` plus the tokens of the items before it."""
    out: dict[int, int] = {}
    at = offset
    for item in items:
        out[item.seq] = at
        at += item.tokens
    return out


def _run(candidates: list[Item], where: dict[int, int], tail: int, start_known: bool) -> _Run:
    suffix = [0] * (len(candidates) + 1)
    for index in range(len(candidates) - 1, -1, -1):
        suffix[index] = suffix[index + 1] + candidates[index].tokens
    users = [i for i in range(tail) if candidates[i].message.role == "user"] + [tail]
    user_pos = [where.get(candidates[i].seq, 0) for i in users]
    return _Run(candidates, suffix, users, user_pos, tail, start_known)


def _start(run: _Run, k: int, step: int, unknown_below: int) -> int | None:
    """Index where cut ``k`` starts the window, or None when the fetch cannot tell."""
    if k == 0:
        return 0 if run.start_known else None
    grid = k * step
    if grid < unknown_below:  # a message older than the fetch may be at or after it
        return None
    found = bisect.bisect_left(run.user_pos, grid)
    return run.users[found] if found < len(run.users) else run.tail


def _choose(
    run: _Run, room: int, step: int, unknown_below: int, most: int | None
) -> tuple[int, int]:
    """(smallest k whose window fits, its start index); the newest turn alone always goes."""

    def fits(k: int) -> bool:
        index = _start(run, k, step, unknown_below)
        if index is None:
            return False
        if index >= run.tail:
            return True
        count = len(run.items) - index
        return run.suffix[index] <= room and (most is None or count <= most)

    top = run.user_pos[-1] // step + 1 if run.user_pos else 1
    low, high = 0, top
    while low < high:
        middle = (low + high) // 2
        if fits(middle):
            high = middle
        else:
            low = middle + 1
    index = _start(run, low, step, unknown_below)
    return low, run.tail if index is None else min(index, run.tail)


def plan_stable(
    pinned: Sequence[Item],
    items: Sequence[Item],
    budget: Budget,
    *,
    offset: int,
    reached_start: bool,
    before: int | None = None,
    history_start: int,
    summary: Item | None,
    summary_version: int,
    summary_covers_to: int,
    summary_text: str | None,
    policy: StablePolicy,
    shrink: Shrinker | None = None,
) -> Plan:
    """The stable-prefix policy chain for one request (see the module docstring).

    ``items`` are the fetched non-pinned messages in order, ``offset`` the position
    of the first one, ``reached_start`` whether the fetch reached the oldest message,
    ``before`` the position of the non-pinned message just older than the fetch when
    it is the one that stopped the walk and its count is known (else grid points
    below ``offset`` are taken as unknown).
    """
    plan = Plan(pinned=list(pinned), window=[])
    where = positions(items, offset)
    candidates, removed, _ = _repair(group(items))
    if removed:
        plan.decide("tool_integrity", removed=[i.seq for i in removed])
    candidates = admit(
        pinned, candidates, budget, shrink if policy.degrade_tool_results else None, plan
    )
    pinned_seqs = sorted(i.seq for i in pinned)

    def left_out(low: int, high: int) -> int:
        return unpinned_between(pinned_seqs, low, high)

    first_seq = items[0].seq if items else history_start
    room = budget.prompt - budget.overhead - sum(i.tokens for i in pinned)
    step = min(policy.step(budget.prompt), max(1, room))
    unknown_below = 0 if reached_start else offset if before is None else before + 1
    most = policy.max_window_messages

    def window_from(base: int, space: int) -> tuple[list[Item], int]:
        run_items = [i for i in candidates if i.seq >= base]
        if not run_items:
            return [], 0
        known = reached_start or left_out(base, first_seq) == 0
        run = _run(run_items, where, tail_start(run_items), known)
        k, index = _choose(run, space, step, unknown_below, most)
        return run_items[index:], k

    window, k = window_from(history_start, room)
    start = window[0].seq if window else history_start
    if summary is not None and left_out(history_start, start):
        after = [i for i in candidates if i.seq >= summary_covers_to]
        turn = sum(i.tokens for i in after[tail_start(after) :]) if after else 0
        if summary.tokens + turn > room:
            plan.decide("summary_skipped", reason="summary does not fit beside the newest turn")
        else:
            window, k = window_from(summary_covers_to, room - summary.tokens)
            plan.summary_message = summary.message
            plan.summary_tokens = summary.tokens
            plan.summary_version = summary_version
            plan.summary_covers_to = summary_covers_to
            plan.decide("summary", covers_to=summary_covers_to, tokens=summary.tokens)
    start = window[0].seq if window else history_start
    plan.decide("stable", cut=k, step=step, first_seq=start)
    return close_window(
        plan,
        window,
        pinned_seqs,
        history_start,
        summary_text,
        summary_version,
        summary_covers_to,
        policy.summarize_after,
    )
