"""New messages, the intake half of :class:`~ctxguard.guard.core.GuardCore`: validated,
capped and counted exactly once, and refused when no window could send them.

Mixed into GuardCore (as ``audit.py`` and ``summary_checks.py`` are). No I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from ctxguard.errors import BudgetError, InvalidInputError, InvalidMessageError, MessageTooLongError
from ctxguard.guard.plan import Budget
from ctxguard.guard.truncate import shrink_message
from ctxguard.messages import Message, MessageLike, record_of, to_messages
from ctxguard.stores.base import NewMessage, WindowFetch

if TYPE_CHECKING:
    from ctxguard.guard.config import GuardConfig
    from ctxguard.tokens._protocol import TokenCounter


class NewMessages:
    """What a prepare or an append is given, before any store call."""

    counter: TokenCounter
    config: GuardConfig

    def encode_new(
        self, values: Iterable[MessageLike], what: str = "messages", record: str = ""
    ) -> list[NewMessage]:
        """``values`` validated, capped and counted; ``record``, when given, is the JSON of
        the one message in ``values``, made by the guard with it (used unless it shrinks)."""
        out: list[NewMessage] = []
        for message in to_messages(values, what):
            tokens = self.counter.count_message(message)
            cap = self.config.max_message_tokens
            made = record
            if cap is not None and tokens > cap:
                message, tokens = self._oversized(message, tokens, cap)
                made = ""  # shrunk: another message
            out.append(NewMessage(message, tokens, made or record_of(message)))
        return out

    def _oversized(self, message: Message, tokens: int, cap: int) -> tuple[Message, int]:
        if self.config.oversized == "reject" or not isinstance(message.content, str):
            raise MessageTooLongError(
                f"message {message.id!r} ({message.role}) is over max_message_tokens",
                needed=tokens,
                limit=cap,
                reserved=0,
            )
        shrunk = shrink_message(message, cap, self.counter.count_message)
        return shrunk, self.counter.count_message(shrunk)

    @staticmethod
    def fresh(fetch: WindowFetch, new: Sequence[NewMessage]) -> list[NewMessage]:
        """The new messages ``fetch`` says a commit would store (first of a repeated id)."""
        if fetch.appended is None:
            return []
        wanted = set(fetch.appended.stored)
        out: list[NewMessage] = []
        for n in new:
            if n.message.id in wanted:
                wanted.discard(n.message.id)
                out.append(n)
        return out

    @staticmethod
    def check_new(
        session_id: str, fetch: WindowFetch, new: Sequence[NewMessage], budget: Budget
    ) -> None:
        """Refuse what no window can send: nothing at all, or a tool result whose call
        is not the assistant message right before it (InvalidMessageError names the
        id). When the call may lie before a window the budget cut short, the tool
        group cannot fit: BudgetError."""
        if fetch.info.message_count == 0:
            raise InvalidInputError(
                f"session {session_id!r} holds no messages and none were given: "
                "nothing to send; pass the user's message to prepare"
            )
        fresh = {n.message.id for n in new}
        if fetch.appended is not None:
            fresh &= set(fetch.appended.stored)
        run = fetch.recent
        for index, stored in enumerate(run):
            message = stored.message
            if message.role != "tool" or message.id not in fresh:
                continue
            j = index - 1
            while j >= 0 and run[j].message.role == "tool":
                j -= 1
            if j < 0 and not fetch.reached_start:
                used = sum(s.tokens or 0 for s in run) + (fetch.stop_tokens or 1)
                raise BudgetError(
                    f"tool result {message.id!r} and the tool call it answers "
                    f"({message.tool_call_id!r}) cannot fit the request budget together",
                    needed=budget.overhead + used + budget.reserved_output + budget.safety_margin,
                    limit=budget.limit,
                    reserved=budget.reserved_output + budget.safety_margin,
                )
            caller = run[j].message if j >= 0 else None
            calls = caller.tool_calls if caller is not None and caller.role == "assistant" else None
            if not calls or message.tool_call_id not in {c.id for c in calls}:
                raise InvalidMessageError(
                    f"tool result {message.id!r} answers tool_call_id "
                    f"{message.tool_call_id!r}, which the assistant message just before it "
                    "did not call; send tool results right after the assistant message "
                    "whose tool_calls they answer"
                )
