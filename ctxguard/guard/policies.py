"""Budget policies: pure functions from (messages, budget) to a plan.

No Redis, no clock, no tokenizer calls, no LLM calls in here: every count is
already on the items, and summarization is only *asked for* (the plan's
``summarize``); the guard calls the user's summarizer and commits the result.
That keeps every decision replayable by the CLI from stored data alone.

Order of application for one request:

1. pinning: system/developer messages are always kept and counted first;
2. admission: pinned + the newest user turn + reserved output must fit, else
   degrade (shrink the newest turn's largest tool result) or raise
   :class:`~ctxguard.errors.BudgetError` with the numbers;
3. sliding window by tokens (newest groups that fit) and by message count;
4. tool-call integrity: an assistant message with tool_calls travels with all
   of its results, or neither goes; checked again on the final window;
5. summary placement: a committed summary stands in for the messages it covers
   when the window no longer reaches back to them;
6. user start (``start_on_user``, on by default): a window that leaves older
   messages out begins, after the pinned messages and the summary, on a user
   message, as Bedrock Converse, Gemini and Mistral's templates require and as
   LangChain's ``trim_messages(start_on="human")`` and LlamaIndex's memories do.
   The leading assistant/tool groups whose user turn was dropped go too (a user
   message never sits inside a tool group, so no group is split). When the
   newest user message is the only one that fits, the window is that turn. A
   window with no user message at all (a tool-only continuation whose user turn
   lies in the summary, or a history of assistant/tool messages only) is sent
   as it is: dropping it would leave nothing to answer. A window that reaches
   back to the history's first message is never cut (a history may open with
   an assistant greeting).

Kept whole at ~410 lines on purpose: the six steps run in this order on one list, and
each step's edge cases are the next one's inputs.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ctxguard.errors import BudgetError
from ctxguard.guard.plan import Budget, Item, Plan, SummaryRequest
from ctxguard.messages import Message

Shrinker = Callable[[Item, int], Item]


@dataclass(frozen=True, slots=True)
class WindowPolicy:
    """Settings of the pure policies (the guard's config passes them through)."""

    max_window_messages: int | None = None
    summarize_after: int | None = None
    degrade_tool_results: bool = True
    start_on_user: bool = True


def group(items: Sequence[Item]) -> list[list[Item]]:
    """Split into atomic groups: a tool-calling assistant message and its results."""
    groups: list[list[Item]] = []
    append = groups.append
    size = len(items)
    index = 0
    while index < size:
        item = items[index]
        index += 1
        message = item.message
        calls = message.tool_calls
        if not calls or message.role != "assistant":
            append([item])
            continue
        current = [item]
        ids = {c.id for c in calls}  # calls not answered yet (a second result is an orphan)
        while index < size and items[index].message.role == "tool":
            answers = items[index].message.tool_call_id
            if answers not in ids:
                break
            ids.discard(answers)
            current.append(items[index])
            index += 1
        append(current)
    return groups


def tool_problems(messages: Sequence[Message]) -> list[str]:
    """Provider rules on tool calls; an empty list means the request is valid."""
    problems: list[str] = []
    pending: set[str] = set()
    for index, message in enumerate(messages):
        if message.role == "tool":
            if message.tool_call_id not in pending:
                problems.append(
                    f"message {index}: tool result {message.tool_call_id!r} has no call"
                )
            pending.discard(message.tool_call_id or "")
            continue
        if pending:
            problems.append(f"message {index}: tool calls {sorted(pending)} have no results")
            pending = set()
        if message.role == "assistant" and message.tool_calls:
            pending = {c.id for c in message.tool_calls}
            if len(pending) < len(message.tool_calls):
                ids = [c.id for c in message.tool_calls]
                repeated = sorted({i for i in ids if ids.count(i) > 1})
                problems.append(f"message {index}: tool calls repeat the ids {repeated}")
    if pending:
        problems.append(f"end: tool calls {sorted(pending)} have no results")
    return problems


def repair(items: Sequence[Item]) -> tuple[list[Item], list[Item]]:
    """Drop incomplete tool groups and orphaned results; returns (kept, removed)."""
    kept, removed, _ = _repair(group(items))
    return kept, removed


def _repair(groups: list[list[Item]]) -> tuple[list[Item], list[Item], list[list[Item]]]:
    """:func:`repair` on groups already made; also returns the kept groups."""
    kept: list[Item] = []
    removed: list[Item] = []
    kept_groups: list[list[Item]] = []
    for grp in groups:
        head = grp[0].message
        if len(grp) == 1 and head.role != "tool" and not head.tool_calls:
            kept.append(grp[0])
            kept_groups.append(grp)
            continue
        head = grp[0].message
        if head.role == "tool":
            removed += grp
        elif head.role == "assistant" and head.tool_calls:
            # whole: one result for each call. A message giving two calls one id (stored
            # or imported; new ones are refused) is never whole: its group holds one
            # result per distinct id, and strict servers refuse the repeated id.
            calls = head.tool_calls
            answered = {i.message.tool_call_id for i in grp[1:]}
            if len(grp) - 1 == len(calls) and answered == {c.id for c in calls}:
                kept += grp
                kept_groups.append(grp)
            else:
                removed += grp
        else:
            kept += grp
            kept_groups.append(grp)
    return kept, removed, kept_groups


def tail_start(items: Sequence[Item]) -> int:
    """Index of the newest user message: the turn that must always go out. Without one
    (a tool-only continuation), the start of the newest group: a tool result goes with
    the assistant message that calls it, never alone."""
    for index in range(len(items) - 1, -1, -1):
        if items[index].message.role == "user":
            return index
    index = len(items) - 1
    while index > 0 and items[index].message.role == "tool":
        index -= 1  # (items are repaired: the tool results' call is just before them)
    return max(0, index)


def select_window(
    items: Sequence[Item],
    available: int,
    max_messages: int | None,
    keep_from: int,
    groups: list[list[Item]] | None = None,
) -> list[Item]:
    """Newest whole groups that fit ``available`` tokens (and ``max_messages``).

    Groups at index ``keep_from`` and later (the newest turn) are always kept;
    the walk stops at the first older group that does not fit, so the window
    is contiguous. ``groups`` may pass ``group(items)`` when it is already known.
    """
    if groups is None:
        groups = group(items)
    used = count = 0
    position = len(items)
    for grp in reversed(groups):
        n = len(grp)
        position -= n
        size = grp[0].tokens if n == 1 else sum(i.tokens for i in grp)
        if position < keep_from and (
            used + size > available or (max_messages is not None and count + n > max_messages)
        ):
            break
        used += size
        count += n
    # the chosen groups are the newest ones, that is the last ``count`` items
    return list(items[len(items) - count :]) if count else []


def _plain(items: Sequence[Item]) -> bool:
    """True when no item is a tool result or calls tools: then ``group`` would make one
    group per item and ``_repair`` keep them all."""
    for item in items:
        message = item.message
        if message.tool_calls or message.role == "tool":
            return False
    return True


def _select_plain(
    items: Sequence[Item], available: int, max_messages: int | None, keep_from: int
) -> list[Item]:
    """:func:`select_window` when every item is its own group (see :func:`_plain`)."""
    used = count = 0
    position = len(items)
    while position > 0:
        position -= 1
        size = items[position].tokens
        if position < keep_from and (
            used + size > available or (max_messages is not None and count + 1 > max_messages)
        ):
            break
        used += size
        count += 1
    return list(items[len(items) - count :]) if count else []


def from_user_turn(window: Sequence[Item]) -> int:
    """How many leading items to drop so ``window`` starts on a user message (0 if none)."""
    for index, item in enumerate(window):
        if item.message.role == "user":
            return index
    return 0


def admit(
    pinned: Sequence[Item],
    items: list[Item],
    budget: Budget,
    shrink: Shrinker | None,
    plan: Plan,
) -> list[Item]:
    """Check the newest turn fits with the pinned messages; degrade or raise."""
    start = tail_start(items)
    fixed = budget.overhead + sum(i.tokens for i in pinned)
    needed = fixed + sum(i.tokens for i in items[start:])
    if needed <= budget.prompt:
        return items
    if shrink is not None:
        items = _shrink_tool_results(items, start, budget.prompt - fixed, shrink, plan)
        needed = fixed + sum(i.tokens for i in items[start:])
        if needed <= budget.prompt:
            return items
    raise BudgetError(
        "the system prompt and the newest turn cannot fit the request budget",
        needed=needed + budget.reserved_output + budget.safety_margin,
        limit=budget.limit,
        reserved=budget.reserved_output + budget.safety_margin,
    )


def _shrink_tool_results(
    items: list[Item], start: int, room: int, shrink: Shrinker, plan: Plan
) -> list[Item]:
    """Shrink the newest turn's tool results, largest first, until the turn fits ``room``."""
    items = list(items)
    order = sorted(
        (k for k in range(start, len(items)) if items[k].message.role == "tool"),
        key=lambda k: -items[k].tokens,
    )
    for k in order:
        excess = sum(i.tokens for i in items[start:]) - room
        if excess <= 0:
            break
        target = max(1, items[k].tokens - excess)
        shrunk = shrink(items[k], target)
        plan.decide(
            "degrade", seq=items[k].seq, tokens_before=items[k].tokens, tokens_after=shrunk.tokens
        )
        items[k] = shrunk
    return items


def plan_request(
    pinned: Sequence[Item],
    items: Sequence[Item],
    budget: Budget,
    *,
    history_start: int,
    summary: Item | None,
    summary_version: int,
    summary_covers_to: int,
    summary_text: str | None,
    policy: WindowPolicy,
    shrink: Shrinker | None = None,
    plain: bool | None = None,
) -> Plan:
    """The whole policy chain for one request (see the module docstring). ``plain``:
    what :func:`_plain` says of ``items``, when the caller knows it (the window cache)."""
    plan = Plan(pinned=list(pinned), window=[])
    groups: list[list[Item]] | None
    removed: list[Item]
    if plain is None:
        plain = _plain(items)
    if plain:  # no tool messages (most chats): every item is its own whole group
        plan.plain = True
        candidates, removed, groups = list(items), [], None
    else:
        candidates, removed, groups = _repair(group(items))
    if removed:
        plan.decide("tool_integrity", removed=[i.seq for i in removed])
    admitted = admit(
        pinned, candidates, budget, shrink if policy.degrade_tool_results else None, plan
    )
    if admitted is not candidates:  # a tool result was shrunk: group again
        candidates = admitted
        groups = group(candidates)
    keep_from = tail_start(candidates)
    available = budget.prompt - budget.overhead - sum(i.tokens for i in pinned)
    if groups is None:
        window = _select_plain(candidates, available, policy.max_window_messages, keep_from)
    else:
        window = select_window(candidates, available, policy.max_window_messages, keep_from, groups)
    pinned_seqs = sorted(i.seq for i in pinned)

    def left_out(low: int, high: int) -> int:
        return unpinned_between(pinned_seqs, low, high)

    first = window[0].seq if window else history_start
    if left_out(history_start, first) and summary is not None:
        window = _with_summary(
            plan, candidates, window, summary, summary_covers_to, available, policy
        )
        if plan.summary_message is not None:
            plan.summary_version = summary_version
            plan.summary_covers_to = summary_covers_to
    first = window[0].seq if window else history_start
    if policy.start_on_user and left_out(history_start, first):
        skip = from_user_turn(window)
        if skip:
            plan.decide("user_start", skipped=[i.seq for i in window[:skip]])
            window = window[skip:]
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


def unpinned_between(pinned_seqs: Sequence[int], low: int, high: int) -> int:
    """How many non-pinned messages lie in positions [low, high) (``pinned_seqs`` sorted)."""
    inside = bisect.bisect_left(pinned_seqs, high) - bisect.bisect_left(pinned_seqs, low)
    return max(0, high - low - inside)


def close_window(
    plan: Plan,
    window: list[Item],
    pinned_seqs: Sequence[int],
    history_start: int,
    summary_text: str | None,
    summary_version: int,
    summary_covers_to: int,
    summarize_after: int | None,
) -> Plan:
    """The last step of every window policy: set the window, record the history it leaves
    out, and ask for a summary once enough of it is not summarized yet."""
    plan.window = window
    start = window[0].seq if window else history_start
    dropped = unpinned_between(pinned_seqs, history_start, start)
    if dropped:
        plan.dropped = [(history_start, start)]
        plan.decide("window", first_seq=start, dropped_messages=dropped)
    unsummarized = unpinned_between(pinned_seqs, max(history_start, summary_covers_to), start)
    if summarize_after is not None and unsummarized >= max(1, summarize_after):
        plan.summarize = SummaryRequest(summary_text, summary_version, summary_covers_to, start)
    return plan


def _with_summary(
    plan: Plan,
    candidates: list[Item],
    window: list[Item],
    summary: Item,
    covers_to: int,
    available: int,
    policy: WindowPolicy,
) -> list[Item]:
    """Re-select the window after the summary, never overlapping what it covers."""
    after = [i for i in candidates if i.seq >= covers_to]
    keep_from = tail_start(after) if after else 0
    turn_tokens = sum(i.tokens for i in after[keep_from:])
    if summary.tokens + turn_tokens > available:
        plan.decide("summary_skipped", reason="summary does not fit beside the newest turn")
        return window
    chosen = select_window(after, available - summary.tokens, policy.max_window_messages, keep_from)
    plan.summary_message = summary.message
    plan.summary_tokens = summary.tokens
    plan.decide("summary", covers_to=covers_to, tokens=summary.tokens)
    return chosen


def check_plan(
    messages: Sequence[Message],
    budget: Budget,
    total: int,
    required: Message | None = None,
    plain: bool = False,
) -> list[str]:
    """Post-conditions every returned request must meet (raised on as a bug if broken):
    tool calls whole, within budget, not empty, and ``required`` (the newest user or
    tool message the caller gave) sent. ``plain`` (the plan's: no window message is a
    tool result or calls tools; pinned and summary messages are never either) skips
    the tool check, which cannot find anything then."""
    problems = [] if plain else tool_problems(messages)
    if not messages:
        problems.append("request has no messages")
    if required is not None and not any(m.id == required.id for m in reversed(messages)):
        problems.append(f"request lacks the newest new message {required.id!r}")
    if total > budget.prompt:
        problems.append(f"request is {total} tokens, over the prompt budget {budget.prompt}")
    return problems
