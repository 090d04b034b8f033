"""The guard's audit records: what each one holds, and the request records held for a reply.

Mixed into :class:`~ctxguard.guard.core.GuardCore` (which the flows call): building
the request, refusal, usage and summary records, the :class:`PreparedRequest` a
prepare answers with, and ``audit_mode="with_reply"``'s held records. No I/O.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ctxguard._record_time import now_iso
from ctxguard.errors import BudgetError, CtxGuardError, TemplateRefusedError
from ctxguard.guard.plan import Budget, Plan, Sent, SummaryRequest
from ctxguard.guard.prepared import PreparedRequest, Unstored
from ctxguard.guard.sent import sent_fields
from ctxguard.ids import new_message_id
from ctxguard.stores.base import NewMessage, Summary, WindowFetch, WindowHit

if TYPE_CHECKING:
    from ctxguard.guard.config import GuardConfig
    from ctxguard.guard.core import Tools
    from ctxguard.guard.policies import WindowPolicy
    from ctxguard.guard.prefix_estimate import PrefixEstimates
    from ctxguard.tokens._protocol import TokenCounter


# policy settings a request record leaves out when they hold these (replay's defaults)
_POLICY_DEFAULTS: dict[str, Any] = {"degrade_tool_results": True, "summary_role": "system"}


class AuditRecords:
    """Record-keeping half of :class:`~ctxguard.guard.core.GuardCore`."""

    counter: TokenCounter
    counter_spec: str | None
    config: GuardConfig
    policy: WindowPolicy
    prefix: PrefixEstimates

    def __init__(self) -> None:
        self._pending: dict[str, list[dict[str, Any]]] = {}
        self._pending_lock = threading.Lock()
        self._policy_made: tuple[GuardConfig, WindowPolicy, dict[str, Any]] | None = None

    @staticmethod
    def refusal_record(exc: CtxGuardError, new: Sequence[NewMessage]) -> dict[str, Any]:
        """The audit record of a refused prepare: why, the numbers, the ids (no content)."""
        record: dict[str, Any] = {
            "kind": "refused",
            "at": now_iso(),
            "error": type(exc).__name__,
            "ids": [n.message.id for n in new],
        }
        if isinstance(exc, BudgetError):
            record.update(needed=exc.needed, limit=exc.limit, reserved=exc.reserved)
        if not isinstance(exc, TemplateRefusedError):  # a template's text may quote content
            record["detail"] = str(exc).splitlines()[0][:300] if str(exc) else ""
        return record

    def audit_record(
        self,
        plan: Plan,
        sent: Sent,
        total: int,
        budget: Budget,
        fetch: WindowFetch,
        tools: Tools | None,
    ) -> dict[str, Any]:
        """The request record (``turn`` first and 0: the store numbers it; then its ``rid``).

        Fields at their default (no summary, no tools, nothing dropped, default
        policy settings) are left out: one record per request, so its size is most
        of what a session's audit trail costs. Readers take a missing field as its
        default (``guard.replay``, the CLI). The fields that are the same on every
        request of a session (``kind`` to ``policy``; the overhead and the tool count
        change with the tools only) stand together: Redis stores them once per
        session (``stores.audit_context``).
        """
        session_id = fetch.info.session_id
        record: dict[str, Any] = {
            "turn": 0,
            "rid": new_message_id(),
            "kind": "request",
            "session": session_id,
            "exact": self.counter.exact,
            "additive": self.counter.additive,
            "counter": self.counter.fingerprint,
            "counter_spec": self.counter_spec,
            "limit": budget.limit,
            "limit_source": budget.limit_source,
            "reserved_output": budget.reserved_output,
            "safety_margin": budget.safety_margin,
            "overhead": budget.overhead,
        }
        if tools:
            record["tools"] = len(tools)
        policy = self._record_policy()
        if policy:
            record["policy"] = dict(policy)  # (each record its own dict)
        record.update(
            at=now_iso(),
            **sent_fields(
                [i.seq for i in sent.items],
                [m.id for m in sent.messages],
                summary_index(sent) if plan.summary_message else None,
            ),
            tokens=total,
            message_count=fetch.info.message_count,
        )
        if plan.summary_message:
            record.update(
                summary_version=plan.summary_version,
                summary_covers_to=plan.summary_covers_to,
                summary_tokens=plan.summary_tokens,
            )
        optional = {
            "dropped": [list(r) for r in plan.dropped],
            "decisions": plan.decisions,
        }
        record.update((k, v) for k, v in optional.items() if v)
        if self.prefix.block_size is not None:
            estimate = self.prefix.estimate(
                session_id, record["rid"], self.counter, sent.messages, tools
            )
            if estimate is not None:
                record["reused"], record["prefilled"] = estimate
        return record

    def _record_policy(self) -> dict[str, Any]:
        """:meth:`policy_settings` a request record keeps (not None, not replay's default),
        made once per config and policy (both frozen: the same objects, the same settings)."""
        made = self._policy_made
        if made is None or made[0] is not self.config or made[1] is not self.policy:
            policy = {
                k: v
                for k, v in self.policy_settings().items()
                if v is not None and v != _POLICY_DEFAULTS.get(k)
            }
            made = self._policy_made = (self.config, self.policy, policy)
        return made[2]

    def policy_settings(self) -> dict[str, Any]:
        """The settings replay needs to re-run this request's policies."""
        return {
            "max_window_messages": self.config.max_window_messages,
            "summarize_after": self.policy.summarize_after,
            "degrade_tool_results": self.config.degrade_tool_results,
            "summary_role": self.config.summary_role,
            "start_on_user": self.config.start_on_user,
            "window_policy": self.config.window_policy,
            "low_water": self.config.low_water,
        }

    def prepared(
        self,
        session_id: str,
        turn: int,
        plan: Plan,
        sent: Sent,
        total: int,
        budget: Budget,
        tools: Tools | None,
        pending: Mapping[str, Any] | None = None,
        *,
        write: WindowHit | None = None,
        unstored: Unstored | None = None,
    ) -> PreparedRequest:
        """``write``: the commit that stored the request, whose new messages' ids and
        state token the request carries (none when the store answered a repeated
        commit: its token is '')."""
        stored = write.appended.stored if write is not None and write.token else ()
        return PreparedRequest(
            stored_ids=tuple(stored),
            state_token=write.token if stored and write is not None else "",
            pending_audit=pending,
            unstored=unstored,
            session_id=session_id,
            turn=turn,
            messages=sent.messages,
            tokens=total,
            exact=self.counter.exact,
            limit=budget.limit,
            limit_source=budget.limit_source,
            reserved_output=budget.reserved_output,
            safety_margin=budget.safety_margin,
            dropped=tuple(plan.dropped),
            summary_version=plan.summary_version if plan.summary_message else 0,
            decisions=tuple(plan.decisions),
            tools=tuple(tools) if tools else None,
            counter=self.counter.fingerprint,
            sent_seqs=tuple([i.seq for i in sent.items]),
        )

    def hold(self, session_id: str, record: dict[str, Any]) -> None:
        """Keep a request record until ``complete`` writes it (audit_mode="with_reply")."""
        with self._pending_lock:
            self._pending.setdefault(session_id, []).append(record)

    def take(self, session_id: str, record: Mapping[str, Any] | None) -> dict[str, Any] | None:
        """Take one held record of a session for ``complete``: ``record`` (by its rid; None
        if it is no longer held), or without one the newest. Put it back with
        :meth:`put_back` if the write fails."""
        with self._pending_lock:
            held = self._pending.get(session_id)
            if not held:
                return None
            index = len(held) - 1
            if record is not None:
                rids = [candidate.get("rid") for candidate in held]
                if record.get("rid") not in rids:
                    return None  # written already (by the next prepare): not another's
                index = rids.index(record.get("rid"))
            taken = held.pop(index)
            if not held:
                del self._pending[session_id]
            return taken

    def release(self, session_id: str | None = None) -> list[dict[str, Any]]:
        """Take the held records of one session (or of all, for ``close``), oldest first."""
        with self._pending_lock:
            if session_id is None:
                held = [r for records in self._pending.values() for r in records]
                self._pending.clear()
                return held
            return self._pending.pop(session_id, [])

    def put_back(self, records: Sequence[dict[str, Any]]) -> None:
        """Hold again records whose write failed (before any held since): a retry writes
        them, once, by their rid."""
        with self._pending_lock:
            for record in reversed(records):
                self._pending.setdefault(str(record["session"]), []).insert(0, record)

    @staticmethod
    def with_usage(record: Mapping[str, Any], usage: Mapping[str, Any] | None) -> dict[str, Any]:
        """The request record completed with the server's usage (one record per turn)."""
        out = {**record, "completed": True}
        prompt = usage.get("prompt_tokens") if usage else None
        if usage is not None:
            out["prompt_tokens"] = prompt
            out["completion_tokens"] = usage.get("completion_tokens")
        if isinstance(prompt, int):
            out["drift"] = prompt - int(record["tokens"])
        return out

    @staticmethod
    def usage_record(
        prepared: PreparedRequest | None, usage: Mapping[str, Any] | None, reply_id: str
    ) -> dict[str, Any]:
        """Server-reported usage against the estimate, so drift is visible.

        Its rid comes from the reply's id: a complete() repeated with the same reply
        stores neither the reply nor its usage twice.
        """
        digest = hashlib.blake2b(reply_id.encode("utf-8", "surrogatepass"), digest_size=12)
        record: dict[str, Any] = {
            "rid": "u-" + digest.hexdigest(),
            "kind": "usage",
            "at": now_iso(),
        }
        if prepared is not None:
            record.update(of_turn=prepared.turn, estimated=prepared.tokens)
        if usage is not None:
            prompt = usage.get("prompt_tokens")
            record["prompt_tokens"] = prompt
            record["completion_tokens"] = usage.get("completion_tokens")
            if prepared is not None and isinstance(prompt, int):
                record["drift"] = prompt - prepared.tokens
        return record

    @staticmethod
    def summary_record(
        request: SummaryRequest, summary: Summary | None, error: str | None, committed: bool
    ) -> dict[str, Any]:
        record: dict[str, Any] = {
            "rid": new_message_id(),
            "kind": "summary" if error is None else "summary_failed",
            "at": now_iso(),
            "covers_from": request.covers_from,
            "covers_to": request.covers_to,
            "previous_version": request.previous_version,
        }
        if summary is not None:
            record.update(version=summary.version, tokens=summary.tokens, committed=committed)
            record.update(from_id=summary.from_id, to_id=summary.to_id, text=summary.text)
        if error is not None:
            record["error"] = error
        return record


def summary_index(sent: Sent) -> int:
    """Where the summary stands among the sent messages: after the pinned ones before it."""
    for index, message in enumerate(sent.messages):
        if index >= len(sent.items) or message is not sent.items[index].message:
            return index
    return len(sent.items)
