"""Re-running context preparation over a stored session: the what-if tool.

Replay reads the raw history and the audit trail, rebuilds what each request
saw (the history up to that turn and the summary version it used, whose text
the audit trail keeps) and runs the same policies through
:class:`~ctxguard.guard.core.GuardCore`, with the recorded settings or with
overrides (limit, max_tokens, counter, window policy, user start). No summarizer is
called: a replay never writes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from ctxguard.errors import BudgetError
from ctxguard.guard.config import GuardConfig
from ctxguard.guard.core import GuardCore
from ctxguard.guard.plan import Budget
from ctxguard.guard.sent import seen_by, sent_ids
from ctxguard.kv.prefix import DEFAULT_BLOCK_SIZE, PrefixCache
from ctxguard.messages import Message
from ctxguard.stores.base import SessionInfo, StoredMessage, Summary, WindowFetch
from ctxguard.stores.walk import walk_back
from ctxguard.tokens._protocol import TokenCounter
from ctxguard.tokens.prompt_ids import prompt_ids


@dataclass(frozen=True)
class ReplayOverrides:
    """What to change for a what-if replay; None keeps the recorded value."""

    limit: int | None = None
    max_tokens: int | None = None
    safety_margin: int | None = None
    max_window_messages: int | None = None
    summaries: bool = True
    start_on_user: bool | None = None
    window_policy: Literal["sliding", "stable"] | None = None
    low_water: int | float | None = None


@dataclass(frozen=True)
class ReplayedTurn:
    """One turn: what was recorded as sent, what the policies send now, and the difference."""

    turn: int
    recorded_ids: tuple[str, ...]
    replayed_ids: tuple[str, ...]
    recorded_tokens: int
    replayed_tokens: int | None
    limit: int
    reserved_output: int
    error: str | None = None
    recorded_start: str | None = None
    replayed_start: str | None = None
    recorded_reused: int | None = None
    recorded_prefilled: int | None = None
    replayed_reused: int | None = None
    replayed_prefilled: int | None = None
    prefix_recorded: bool = False  # recorded_reused / _prefilled come from the record

    @property
    def same(self) -> bool:
        return self.error is None and self.recorded_ids == self.replayed_ids

    @property
    def added(self) -> tuple[str, ...]:
        return tuple(i for i in self.replayed_ids if i not in set(self.recorded_ids))

    @property
    def removed(self) -> tuple[str, ...]:
        return tuple(i for i in self.recorded_ids if i not in set(self.replayed_ids))


def summaries_from_audit(audit: Sequence[Mapping[str, Any]]) -> dict[int, Summary]:
    """Committed summary versions with their text, as the audit trail recorded them."""
    found: dict[int, Summary] = {}
    for record in audit:
        if record.get("kind") == "summary" and record.get("committed") and "text" in record:
            version = int(record["version"])
            found[version] = Summary(
                version=version,
                text=str(record["text"]),
                covers_to=int(record["covers_to"]),
                from_id=record.get("from_id"),
                to_id=record.get("to_id"),
                tokens=None,
            )
    return found


def replay_turn(
    core: GuardCore,
    history: Sequence[StoredMessage],
    record: Mapping[str, Any],
    summary: Summary | None,
    overrides: ReplayOverrides,
) -> ReplayedTurn:
    """Re-run one recorded request against the history it saw."""
    seen = (
        seen_by(record, history)
        if "unseen" in record
        else [s for s in history if s.seq < int(record["message_count"])]
    )
    same_counter = record.get("counter") == core.counter.fingerprint
    if not same_counter:
        seen = [replace(s, tokens=None) for s in seen]
    limit = overrides.limit or int(record["limit"])
    reserved = (
        overrides.max_tokens if overrides.max_tokens is not None else int(record["reserved_output"])
    )
    margin = (
        overrides.safety_margin
        if overrides.safety_margin is not None
        else int(record["safety_margin"])
    )
    overhead = int(record["overhead"]) if same_counter else core.counter.request_overhead()
    budget = Budget(limit, reserved, margin, overhead, str(record.get("limit_source", "replay")))
    used = summary if overrides.summaries else None
    if core.stable is not None:
        fetch = walked_fetch(seen, used, core.counter, budget.prompt)
    else:
        fetch = _full_fetch(seen, used, core.counter)
    by_seq = {s.seq: s.message.id for s in history}
    recorded = tuple(sent_ids(record, by_seq.get) or ())
    roles = {s.message.id: s.message.role for s in seen}
    base = ReplayedTurn(
        int(record.get("turn", 0)),
        recorded,
        (),
        int(record["tokens"]),
        None,
        limit,
        reserved,
        recorded_start=window_start_role([roles.get(i) for i in recorded]),
        **recorded_prefix(record),
    )
    try:
        plan, _ = core.plan(fetch, budget)
        total, _ = core.finalize(plan, budget, None)
    except BudgetError as exc:
        return replace(base, error=str(exc))
    replayed = tuple(m.id for m in plan.messages())
    start = window_start_role([roles.get(i) for i in replayed])
    return replace(base, replayed_ids=replayed, replayed_tokens=total, replayed_start=start)


def recorded_prefix(record: Mapping[str, Any]) -> dict[str, Any]:
    """The record's own prefix-cache estimate (``reused``, ``prefilled``), if it has one."""
    reused, prefilled = record.get("reused"), record.get("prefilled")
    if not all(
        isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in (reused, prefilled)
    ):
        return {}
    return {"recorded_reused": reused, "recorded_prefilled": prefilled, "prefix_recorded": True}


def window_start_role(roles: Sequence[str | None]) -> str | None:
    """The role the window opens with after the pinned messages and the summary
    (ids not in the history, such as the summary's, are None); None if empty."""
    for role in roles:
        if role is not None and role not in ("system", "developer"):
            return role
    return None


def replay_records(
    core: GuardCore,
    history: Sequence[StoredMessage],
    audit: Sequence[Mapping[str, Any]],
    overrides: ReplayOverrides | None = None,
) -> list[ReplayedTurn]:
    """Replay every request record of a session, oldest first."""
    overrides = overrides or ReplayOverrides()
    summaries = summaries_from_audit(audit)
    turns = []
    for record in audit:
        if record.get("kind") != "request":
            continue
        version = int(record.get("summary_version") or 0)
        summary = summaries.get(version) if version else None
        turns.append(replay_turn(core, history, record, summary, overrides))
    return turns


def with_prefix_estimates(
    turns: Sequence[ReplayedTurn],
    history: Sequence[StoredMessage],
    summaries: Mapping[int, Summary],
    core: GuardCore,
    block_size: int = DEFAULT_BLOCK_SIZE,
) -> list[ReplayedTurn]:
    """Each turn with the prefix-cache model's reused / prefilled tokens, recorded and replayed.

    The recorded requests and the replayed ones each go through their own
    :class:`~ctxguard.kv.prefix.PrefixCache` (vLLM's rules, one session alone),
    with the counter's token ids (:func:`~ctxguard.tokens.prompt_ids.prompt_ids`;
    turns stay None when the counter has none). Replies are not fed to the model
    (the audit trail does not say which stored message answered which request),
    so a reply counts as prefilled in the request after it; tool schemas are not
    recorded and are left out of both. A recorded request whose record holds the
    guard's own estimate (``prefix_block_size``: made with the replies as
    generated) keeps it; the model still runs over it, for the turns after.
    """
    by_id = {s.message.id: s.message for s in history}
    for version, summary in summaries.items():
        message = core.summary_message(summary.text, version)
        by_id[message.id] = message
    caches = (PrefixCache(block_size), PrefixCache(block_size))
    out = []
    for turn in turns:
        numbers: list[int | None] = []
        for cache, ids in zip(caches, (turn.recorded_ids, turn.replayed_ids), strict=True):
            found = [by_id.get(i) for i in ids]
            messages = [m for m in found if m is not None]
            tokens = prompt_ids(core.counter, messages) if len(messages) == len(ids) else None
            if not tokens:
                numbers += [None, None]
                continue
            use = cache.request(tokens)
            numbers += [use.reused, use.prefilled]
        rec_reused, rec_filled, new_reused, new_filled = numbers
        if turn.prefix_recorded:
            rec_reused, rec_filled = turn.recorded_reused, turn.recorded_prefilled
        out.append(
            replace(
                turn,
                recorded_reused=rec_reused,
                recorded_prefilled=rec_filled,
                replayed_reused=new_reused,
                replayed_prefilled=new_filled,
            )
        )
    return out


def core_for_record(
    counter: TokenCounter, record: Mapping[str, Any], overrides: ReplayOverrides
) -> GuardCore:
    """A core configured as the recorded request was (policy settings in the record)."""
    policy = dict(record.get("policy") or {})
    window = overrides.max_window_messages or policy.get("max_window_messages")
    # records made before the policy existed were planned without it
    start_on_user = overrides.start_on_user
    if start_on_user is None:
        start_on_user = bool(policy.get("start_on_user", False))
    recorded_low = policy.get("low_water", 0.5)
    config = GuardConfig(
        max_window_messages=window,
        degrade_tool_results=bool(policy.get("degrade_tool_results", True)),
        summary_role=policy.get("summary_role", "system"),
        start_on_user=start_on_user,
        window_policy=overrides.window_policy or policy.get("window_policy", "sliding"),
        low_water=overrides.low_water if overrides.low_water is not None else recorded_low,
    )
    return GuardCore(counter, config)


def walked_fetch(
    seen: Sequence[StoredMessage], summary: Summary | None, counter: TokenCounter, budget: int
) -> WindowFetch:
    """The fetch the store would have answered: its budget walk over the history.

    The stable policy decides from what a fetch holds (see :mod:`ctxguard.guard.stable`),
    so a replay walks back as the store does (unknown counts counted now) instead of
    handing it the whole history.
    """
    counted = [
        s if s.tokens is not None else replace(s, tokens=counter.count_message(s.message))
        for s in seen
    ]
    costs = ((s.seq, s.tokens or 0) for s in reversed(counted))
    first = walk_back(costs, len(counted), budget, 1)[0]
    now = seen[-1].message.created_at if seen else Message(role="user", content="").created_at
    total = sum([s.tokens or 0 for s in counted])
    info = SessionInfo("replay", len(seen), total, counter.fingerprint, now, now, None, 0)
    pinned = tuple(s for s in counted[:first] if s.message.is_pinned_role)
    stop = counted[first - 1].tokens if first > 0 else None
    return WindowFetch(info, pinned, tuple(counted[first:]), summary, first == 0, None, None, stop)


def _full_fetch(
    seen: Sequence[StoredMessage], summary: Summary | None, counter: TokenCounter
) -> WindowFetch:
    now = seen[-1].message.created_at if seen else Message(role="user", content="").created_at
    total = sum([s.tokens or 0 for s in seen])
    info = SessionInfo("replay", len(seen), total, counter.fingerprint, now, now, None, 0)
    return WindowFetch(info, (), tuple(seen), summary, True)
