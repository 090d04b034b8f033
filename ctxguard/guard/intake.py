"""New messages, the intake half of :class:`~ctxguard.guard.core.GuardCore`: validated,
capped and counted exactly once, and refused when no window could send them.

Mixed into GuardCore (as ``audit.py`` and ``summary_checks.py`` are). No I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from ctxguard.errors import BudgetError, InvalidInputError, InvalidMessageError, MessageTooLongError
from ctxguard.guard.plan import Budget, Plan
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
        if len(out) > 1:
            _check_repeated_ids(out)
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
    def check_call_ids(new: Sequence[NewMessage]) -> None:
        """Refuse a new assistant message that gives two of its tool calls one id: no
        result could say which call it answers (InvalidMessageError names the id).
        Checked for every new message (append, prepare, complete); a stored or
        imported one is left out of every request with its results (``policies._repair``:
        its group is never whole), and a new result for it is refused (:meth:`check_new`)."""
        for n in new:
            calls = n.message.tool_calls
            if calls is None or len(calls) < 2:
                continue
            seen: set[str] = set()
            for c in calls:
                if c.id in seen:
                    raise InvalidMessageError(
                        f"assistant message {n.message.id!r} gives two of its tool_calls "
                        f"the id {c.id!r}; give each call its own id"
                    )
                seen.add(c.id)

    @classmethod
    def check_batch(cls, new: Sequence[NewMessage]) -> None:
        """Refuse, before any store call, a batch no request can send as given: tool
        calls with nothing after them to send (their results are not in the batch),
        two calls with one id in one message, or two results in a row for one
        tool_call_id (InvalidMessageError names the ids; an id may recur in a later
        call: some models number their calls per turn)."""
        cls.check_call_ids(new)
        answered: dict[str, str] = {}  # the results since the last message of another role
        waiting: Message | None = None
        for n in new:
            message = n.message
            role = message.role
            if role != "tool":
                answered.clear()
            if role == "tool":
                call_id = message.tool_call_id or ""
                if call_id in answered:
                    raise InvalidMessageError(
                        f"tool results {answered[call_id]!r} and {message.id!r} both answer "
                        f"tool_call_id {call_id!r}; send one result per tool call"
                    )
                answered[call_id] = message.id
                waiting = None
            elif role == "user":
                waiting = None
            elif role == "assistant" and message.tool_calls:
                waiting = message
        if waiting is not None and waiting.tool_calls:
            raise InvalidMessageError(
                f"assistant message {waiting.id!r} calls tools "
                f"{[c.id for c in waiting.tool_calls]} and nothing after it answers them, so "
                "no request can send it; pass its tool results after it in the same batch, "
                "or store the model's reply with complete()"
            )

    @staticmethod
    def check_required(plan: Plan, required: Message | None) -> None:
        """Refuse a plan that leaves out ``required`` when it is a new tool result (its
        group is incomplete), before a summary is folded in or anything is written."""
        if (
            required is not None
            and required.role == "tool"
            and not any(i.message.id == required.id for i in reversed(plan.window))
        ):
            raise unsent_result(required)

    @staticmethod
    def check_new(
        session_id: str, fetch: WindowFetch, new: Sequence[NewMessage], budget: Budget
    ) -> None:
        """Refuse what no window can send: nothing at all, or a tool result whose call
        is not the assistant message right before it or whose call is answered already
        (InvalidMessageError names the ids). When the call may lie before a window the
        budget cut short, the tool group cannot fit: BudgetError."""
        if fetch.info.message_count == 0:
            raise InvalidInputError(
                f"session {session_id!r} holds no messages and none were given: "
                "nothing to send; pass the user's message to prepare"
            )
        if not any(n.message.role == "tool" for n in new):
            return  # only a new tool result is checked below (the common turn has none)
        fresh = {n.message.id for n in new}
        if fetch.appended is not None:
            fresh &= set(fetch.appended.stored)
        elif new:
            return  # a refetch given none of them: every one is stored (a resend)
        run = fetch.recent
        for index, stored in enumerate(run):
            message = stored.message
            if message.role != "tool" or message.id not in fresh:
                continue
            j = index - 1
            while j >= 0 and run[j].message.role == "tool":
                if run[j].message.tool_call_id == message.tool_call_id:
                    raise InvalidMessageError(
                        f"tool result {message.id!r} answers tool_call_id "
                        f"{message.tool_call_id!r}, which the stored result "
                        f"{run[j].message.id!r} answers already; send one result per tool call"
                    )
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
            ids = {c.id for c in calls} if calls else set()
            if calls and caller is not None and len(ids) < len(calls):
                raise InvalidMessageError(
                    f"tool result {message.id!r} answers the stored assistant message "
                    f"{caller.id!r}, which gives two of its tool_calls one id: no request "
                    "can send that message, so it is left out of every request; go on "
                    "with a new user message"
                )
            if message.tool_call_id not in ids:
                raise InvalidMessageError(
                    f"tool result {message.id!r} answers tool_call_id "
                    f"{message.tool_call_id!r}, which the assistant message just before it "
                    "did not call; send tool results right after the assistant message "
                    "whose tool_calls they answer"
                )


def unsent_result(required: Message) -> InvalidMessageError:
    """A new tool result that tool integrity left out: the assistant message calling it
    called other tools whose results are not stored (or it is not stored); no server
    accepts a group without all of them, and nothing was stored yet."""
    return InvalidMessageError(
        f"tool result {required.id!r} (tool_call_id {required.tool_call_id!r}) cannot "
        "be sent: the session holds no assistant message calling it, or that message "
        "called other tools whose results are not stored; pass all of that message's "
        "tool results in one batch"
    )


def _check_repeated_ids(new: Sequence[NewMessage]) -> None:
    """One id, one message: a batch may repeat a message whole (stored once, as a resend
    is), never give one id to two different messages (the second was dropped unseen)."""
    first: dict[str, int] = {}
    for index, n in enumerate(new):
        at = first.setdefault(n.message.id, index)
        if at != index and _content(new[at].message) != _content(n.message):
            raise InvalidMessageError(
                f"messages {at} and {index} of the batch have the same id "
                f"{n.message.id!r} and differ; give each message its own id"
            )


def _content(message: Message) -> dict[str, Any]:
    return message.model_dump(exclude={"created_at"})
