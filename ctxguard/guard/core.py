"""The guard's logic without I/O, shared by :class:`Guard` and :class:`AsyncGuard`.

The shells fetch and write; everything between (counting new messages once,
budgets, the policy chain, the exact count, audit records, summary checks)
happens here, so the sync and async guards cannot behave differently. The
audit records (and the ones held for a reply) are built in ``audit.py``, mixed in.

Kept whole at ~420 lines on purpose: ``plan``, ``refetch`` and ``finalize`` are the three
steps of one request and read each other's state; intake and audit are already split out.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ctxguard._frozen import fast_init
from ctxguard._secrets import redact_urls
from ctxguard.errors import (
    BudgetError,
    CtxGuardError,
    InvalidInputError,
    OutputReserveError,
)
from ctxguard.guard.audit import AuditRecords
from ctxguard.guard.config import GuardConfig
from ctxguard.guard.events import Observer
from ctxguard.guard.intake import NewMessages, unsent_result
from ctxguard.guard.plan import Budget, Item, Plan, Sent
from ctxguard.guard.policies import (
    WindowPolicy,
    check_plan,
    from_user_turn,
    group,
    plan_request,
    tail_start,
)
from ctxguard.guard.prefix_estimate import PrefixEstimates
from ctxguard.guard.stable import StablePolicy, fetch_positions, plan_stable
from ctxguard.guard.summary_checks import SummaryChecks
from ctxguard.guard.truncate import shrink_message
from ctxguard.guard.window_cache import WindowCache, all_plain, speculate
from ctxguard.kv.limit import ContextLimit
from ctxguard.messages import PINNED_ROLES, Message
from ctxguard.stores.base import (
    AppendResult,
    NewMessage,
    RecordWrite,
    StoredMessage,
    WindowFetch,
    WindowHit,
    WriteOptions,
)
from ctxguard.tokens._protocol import TokenCounter, validate_request


def _seq(stored: StoredMessage) -> int:
    return stored.seq


Tools = Sequence[Mapping[str, Any]]


@fast_init
@dataclasses.dataclass(frozen=True, slots=True)
class Speculation:
    """A request planned on the cached window, to commit if the session is unchanged."""

    fetch: WindowFetch
    plan: Plan
    sent: Sent
    total: int
    record: dict[str, Any]
    write: RecordWrite | None
    items: list[Item]  # the window's items, kept with the cached window for the next plan


class GuardCore(AuditRecords, SummaryChecks, NewMessages):
    """Counting, planning and record-keeping for one counter and one config."""

    def __init__(
        self, counter: TokenCounter, config: GuardConfig, counter_spec: str | None = None
    ) -> None:
        self.counter = counter
        # as each request record names it: a vllm: spec's URL may carry credentials
        self.counter_spec = None if counter_spec is None else redact_urls(counter_spec)
        super().__init__()
        self.config = config
        self.policy = WindowPolicy(
            max_window_messages=config.max_window_messages,
            summarize_after=config.summarize_after if config.summarizer else None,
            degrade_tool_results=config.degrade_tool_results,
            start_on_user=config.start_on_user,
        )
        self.stable = (
            StablePolicy(
                low_water=config.low_water,
                max_window_messages=config.max_window_messages,
                summarize_after=self.policy.summarize_after,
                degrade_tool_results=config.degrade_tool_results,
            )
            if config.window_policy == "stable"
            else None
        )
        self.write_options = WriteOptions(
            counter=counter.fingerprint,
            ttl_seconds=config.ttl_seconds,
            max_messages=config.max_stored_messages,
        )
        self.cache = WindowCache(config.window_cache_size, config.window_cache_bytes)
        self.observer: Observer | None = None  # set by the guard (see guard/events.py)
        # how a commit="with_reply" prepare reads the state token (set by the guard): "send"
        # (sent before the plan, its reply taken after: the plain Redis client), "state_token"
        # (its store's own read) or "read_with_token" (a store the caller wrote)
        self.token_read = "read_with_token"
        sessions = config.window_cache_size or 1024  # as many as the window cache holds
        self.prefix = PrefixEstimates(config.prefix_block_size, sessions)

    # -- budget and plan -------------------------------------------------------

    def budget(self, limit: ContextLimit, max_tokens: int | None, tools: Tools | None) -> Budget:
        reserved = self.config.max_tokens if max_tokens is None else max_tokens
        if not isinstance(reserved, int) or reserved < 0:
            raise BudgetError(
                "max_tokens must be a non-negative int", needed=0, limit=limit.tokens, reserved=0
            )
        budget = Budget(
            limit=limit.tokens,
            reserved_output=reserved,
            safety_margin=self.config.safety_margin,
            overhead=self.counter.request_overhead(tools=tools),
            limit_source=limit.source,
        )
        if budget.prompt - budget.overhead <= 0:
            raise OutputReserveError(
                self._no_room(limit.tokens, max_tokens, reserved),
                # the smallest prompt: the fixed overhead plus at least one token of messages
                needed=budget.overhead + 1 + reserved + budget.safety_margin,
                limit=limit.tokens,
                reserved=reserved + budget.safety_margin,
                asked=max_tokens,
            )
        return budget

    def _no_room(self, limit: int, asked: int | None, reserved: int) -> str:
        """Which setting ate the limit, and how to change it."""
        margin = self.config.safety_margin
        and_margin = f" plus safety_margin={margin}" if margin else ""
        if asked is None:
            return (
                f"the default output reserve max_tokens={reserved}{and_margin} leaves no room "
                f"for a prompt in the {limit}-token limit; pass max_tokens=... to prepare() "
                "or set the guard's max_tokens= setting (GuardConfig.max_tokens) lower"
            )
        return (
            f"max_tokens={reserved} passed to prepare(){and_margin} leaves no room for a "
            f"prompt in the {limit}-token limit; ask for fewer output tokens"
        )

    def items(self, stored: Iterable[StoredMessage], recounts: dict[int, int]) -> list[Item]:
        """Stored messages as items; counts missing or from another counter are made now
        (once: a count already in ``recounts`` is reused)."""
        out: list[Item] = []
        append = out.append
        for s in stored:
            tokens = s.tokens
            if tokens is None:
                tokens = recounts.get(s.seq)
                if tokens is None:
                    tokens = self.counter.count_message(s.message)
                    recounts[s.seq] = tokens
            append(Item(s.seq, s.message, tokens))
        return out

    def plan(
        self, fetch: WindowFetch, budget: Budget, recounts: dict[int, int] | None = None
    ) -> tuple[Plan, dict[int, int]]:
        """Plan on ``fetch``; ``recounts`` (counts made on an earlier fetch of the same
        state) grows with the counts made now and is returned."""
        plan, recounts, _ = self._plan(fetch, budget, recounts, None)
        return plan, recounts

    def _plan(
        self,
        fetch: WindowFetch,
        budget: Budget,
        recounts: dict[int, int] | None,
        reuse: Mapping[int, Item] | None,
        plain: bool | None = None,
    ) -> tuple[Plan, dict[int, int], list[Item]]:
        """:meth:`plan`, also giving the window's items; ``reuse`` (the items of the last
        plan on this session's cached window, by seq) saves making an Item per message per
        turn: one is taken only if it is the one this fetch's message would make (the same
        seq, Message object and count: Items are frozen values); ``plain`` (True: no
        message of ``fetch.recent`` is a tool result or calls tools, as the cache knows)
        goes to ``plan_request``."""
        if recounts is None:
            recounts = {}
        # one pass over the window: pinned roles go with the older pinned messages, the
        # others become items (when every count is known, as on a cached window)
        pinned_stored = list(fetch.pinned)
        made: list[Item] = []
        known: list[Item] | None = made
        add = made.append
        take = reuse.get if reuse else None
        for s in fetch.recent:
            message = s.message
            if message.role in PINNED_ROLES:
                pinned_stored.append(s)
            elif s.tokens is not None:
                seq, tokens = s.seq, s.tokens
                item = take(seq) if take is not None else None
                if (
                    item is None
                    or item.message is not message
                    or item.tokens != tokens
                    or item.seq != seq
                ):
                    item = Item(seq, message, tokens)
                add(item)
            else:
                known = None  # a count to make: two passes, the pinned ones counted first
                break
        others: list[StoredMessage] = []
        if known is None:
            pinned_stored = list(fetch.pinned)
            for s in fetch.recent:
                (pinned_stored if s.message.role in PINNED_ROLES else others).append(s)
        pinned_stored.sort(key=_seq)
        pinned = self.items(pinned_stored, recounts)
        items = known if known is not None else self.items(others, recounts)
        summary = fetch.summary
        if self.stable is not None:
            offset, before = fetch_positions(fetch)
            plan = plan_stable(
                pinned,
                items,
                budget,
                offset=offset,
                reached_start=fetch.reached_start,
                before=before,
                history_start=0,
                summary=self.summary_item(summary),
                summary_version=summary.version if summary else 0,
                summary_covers_to=summary.covers_to if summary else 0,
                summary_text=summary.text if summary else None,
                policy=self.stable,
                shrink=self._shrink_item,
            )
            return plan, recounts, items
        plan = plan_request(
            pinned,
            items,
            budget,
            history_start=0,
            summary=self.summary_item(summary),
            summary_version=summary.version if summary else 0,
            summary_covers_to=summary.covers_to if summary else 0,
            summary_text=summary.text if summary else None,
            policy=self.policy,
            shrink=self._shrink_item,
            plain=True if plain else None,
        )
        return plan, recounts, items

    def speculate(
        self, session_id: str, new: Sequence[NewMessage], budget: Budget, tools: Tools | None
    ) -> Speculation | None:
        """Plan on the cached window, or None when only a fetch can tell.

        Everything a fetch would lead to other than a plain request (recounts,
        a refetch, a summary, a refusal) is left to the fetch path, which then
        does it exactly as without a cache.
        """
        found = self.cache.get_for_plan(session_id)
        if found is None:
            return None
        entry, reuse, plain = found
        fetch = speculate(entry, new, budget.prompt, len(new))
        if fetch is None:
            return None
        plain = plain and all_plain(new)
        try:
            plan, recounts, items = self._plan(fetch, budget, None, reuse, plain)
            if recounts or plan.summarize is not None or self.refetch(fetch, plan, budget):
                return None
            total, sent = self.finalize(plan, budget, tools, newest_sent(new))
        except CtxGuardError:
            return None  # the fetch path raises the same error (and audits the refusal)
        record = self.audit_record(plan, sent, total, budget, fetch, tools)
        write = None if self.config.audit_mode == "with_reply" else self.write({}, record)
        return Speculation(fetch, plan, sent, total, record, write, items)

    def committed(
        self,
        session_id: str,
        spec: WindowFetch,
        hit: WindowHit,
        items: Sequence[Item] = (),
        plain: bool = False,
    ) -> None:
        """The store took the request planned on ``spec`` (its ``items``, from a plan on
        the cached window; ``plain``: that plan's, see ``Plan.plain``): the cache moves
        to the new state."""
        fetch = WindowFetch(
            spec.info,
            spec.pinned,
            spec.recent,
            spec.summary,
            spec.reached_start,
            hit.appended,
            hit.token,
            spec.stop_tokens,
        )
        if (
            not hit.token  # a retried commit: the state after it is not known
            or hit.appended.message_count != fetch.info.message_count
            or hit.appended.duplicates
        ):
            self.cache.evict(session_id)  # cannot happen when the token held; never trust it
        else:
            self.cache.put(session_id, fetch, {i.seq: i for i in items} if items else None, plain)

    def replied(self, session_id: str, reply: Message, result: AppendResult) -> None:
        """A reply stored now (not a retry's) extends the session's prefix-cache chain."""
        if (
            self.prefix.block_size is not None
            and isinstance(reply.content, str)
            and reply.id in result.stored
        ):
            self.prefix.replied(session_id, self.counter, reply.content)

    def refetch(self, fetch: WindowFetch, plan: Plan, budget: Budget) -> tuple[int, int] | None:
        """(budget, min_messages) for a second fetch when the first stopped short; else None.

        Rare: the newest user message lay beyond the budget walk (it alone is
        over budget, which admission must then see), or estimated counts for
        messages stored under another counter made the walk stop too early.
        """
        if fetch.reached_start:
            return None
        if not any(s.message.role == "user" for s in reversed(fetch.recent)):
            return budget.prompt, 2 * len(fetch.recent) + 8
        used = plan.item_tokens() + budget.overhead
        start = plan.window_start  # where the walk's window began, before the user-start trim
        for decision in plan.decisions:
            if decision["policy"] == "user_start":
                start = min(start, decision["skipped"][0])
        if fetch.recent and start <= fetch.recent[0].seq and used < budget.prompt // 2:
            return budget.prompt * 4, len(fetch.recent)
        return None

    def _shrink_item(self, item: Item, target: int) -> Item:
        shrunk = shrink_message(item.message, target, self.counter.count_message)
        return Item(item.seq, shrunk, self.counter.count_message(shrunk))

    # -- checks on the new messages, against the fetched window ------------------

    # -- the exact count -------------------------------------------------------

    def finalize(
        self, plan: Plan, budget: Budget, tools: Tools | None, required: Message | None = None
    ) -> tuple[int, Sent]:
        """The exact prompt count and what is sent; non-additive templates are rendered
        (and trimmed if over). ``required`` (the newest new user/tool message) must be sent."""
        sent = plan.sent()  # (made once: a render that trims the window makes it again)
        if not sent.messages:  # every stored message was an incomplete tool group
            raise InvalidInputError(
                "nothing to send: the stored messages are tool calls without their results "
                "or results without their call; pass the tool results or the next message"
            )
        if self.counter.additive:
            # what a render refuses
            validate_request(self.counter, list(sent.messages), tools=tools)
            total = budget.overhead + plan.item_tokens()
        else:
            total = self._render_to_fit(plan, budget, tools)
            sent = plan.sent()
        if (
            required is not None
            and required.role == "tool"
            and not any(m.id == required.id for m in reversed(sent.messages))
        ):
            raise unsent_result(required)
        problems = check_plan(sent.messages, budget, total, required, plan.plain)
        if problems:
            raise CtxGuardError("internal error, request failed its checks: " + "; ".join(problems))
        return total, sent

    def _render_to_fit(self, plan: Plan, budget: Budget, tools: Tools | None) -> int:
        while True:
            total = self.counter.count_request(plan.messages(), tools=tools)
            if total <= budget.prompt:
                return total
            keep_from = tail_start(plan.window)
            groups = group(plan.window[:keep_from])
            if not groups:
                raise BudgetError(
                    "the rendered prompt is over budget even with only the newest turn",
                    needed=total + budget.reserved_output + budget.safety_margin,
                    limit=budget.limit,
                    reserved=budget.reserved_output + budget.safety_margin,
                )
            excess, dropped = total - budget.prompt, 0
            while groups and excess > 0:
                oldest = groups.pop(0)
                excess -= sum(i.tokens for i in oldest)
                dropped += len(oldest)
            if self.policy.start_on_user:
                dropped += from_user_turn(plan.window[dropped:])
            plan.window = plan.window[dropped:]
            plan.dropped = [(0, plan.window_start)]
            plan.decide("render_trim", rendered=total, dropped_messages=dropped)

    def write(self, counts: Mapping[int, int], record: Mapping[str, Any] | None) -> RecordWrite:
        """Recounted tokens and an audit record, as one store write."""
        return RecordWrite(
            counter=self.counter.fingerprint,
            counts=counts,
            audit=record,
            retention=self.config.audit_retention,
            ttl=self.config.ttl_seconds or 0,
        )


def newest_sent(new: Sequence[NewMessage]) -> Message | None:
    """The newest user or tool message of a batch: every request must send it."""
    for n in reversed(new):
        if n.message.role in ("user", "tool"):
            return n.message
    return None
