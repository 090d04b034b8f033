"""Plain data passed between the guard's pure policies and its I/O shells."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from ctxguard._frozen import fast_init
from ctxguard.messages import Message

Decision = dict[str, Any]


@fast_init
@dataclass(frozen=True, slots=True)
class Item:
    """One message as the policies see it: position, message, exact token count."""

    seq: int
    message: Message
    tokens: int

    @property
    def pinned(self) -> bool:
        return self.message.is_pinned_role


@fast_init
@dataclass(frozen=True, slots=True)
class Budget:
    """The numbers one request must respect.

    ``prompt`` is what the prompt may use: ``limit - reserved_output - margin``.
    """

    limit: int
    reserved_output: int
    safety_margin: int
    overhead: int
    limit_source: str

    @property
    def prompt(self) -> int:
        return self.limit - self.reserved_output - self.safety_margin


@dataclass(frozen=True, slots=True)
class SummaryRequest:
    """The plan asks the guard to fold messages ``[covers_from, covers_to)`` into the summary.

    The guard reads them from the store then: they lie outside the fetched window.
    """

    previous_text: str | None
    previous_version: int
    covers_from: int
    covers_to: int


@dataclass(frozen=True, slots=True)
class Sent:
    """A finished plan's output: the items sent (pinned first) and the messages in order."""

    items: tuple[Item, ...]
    messages: tuple[Message, ...]


@dataclass(slots=True)
class Plan:
    """What to send, and why: the output of the policies for one request."""

    pinned: list[Item]
    window: list[Item]
    summary_message: Message | None = None
    summary_tokens: int = 0
    summary_version: int = 0
    summary_covers_to: int = 0
    dropped: list[tuple[int, int]] = field(default_factory=list)
    decisions: list[Decision] = field(default_factory=list)
    summarize: SummaryRequest | None = None
    # every candidate the window was chosen from has no tool role and no tool calls
    # (plan_request; False: not known), so the window holds no tool message either
    plain: bool = False

    @property
    def window_start(self) -> int:
        return self.window[0].seq if self.window else 1 << 62

    def _split(self) -> tuple[list[Item], list[Item]]:
        """(pinned messages older than the window, the window with later pinned ones in place)."""
        start = self.window_start
        head = [i for i in self.pinned if i.seq < start]
        if len(head) == len(self.pinned):  # no pinned message inside: the window is in order
            return head, list(self.window)
        later = [i for i in self.pinned if i.seq >= start]
        return head, sorted(self.window + later, key=_item_seq)

    def ordered(self) -> list[Item]:
        """Pinned messages older than the window, then the window (pinned ones in place)."""
        head, body = self._split()
        return head + body

    def messages(self) -> list[Message]:
        """What is sent: old pinned messages, then the summary, then the window in order."""
        head, body = self._split()
        out = [i.message for i in head]
        if self.summary_message is not None:
            out.append(self.summary_message)
        out += [i.message for i in body]
        return out

    def sent(self) -> Sent:
        """What goes out, in order, made once for the count check, the record and the result."""
        head, body = self._split()
        items = head + body
        messages = [i.message for i in head]
        if self.summary_message is not None:
            messages.append(self.summary_message)
        messages += [i.message for i in body]
        return Sent(tuple(items), tuple(messages))

    def item_tokens(self) -> int:
        return (
            sum([i.tokens for i in self.pinned])
            + sum([i.tokens for i in self.window])
            + self.summary_tokens
        )

    def decide(self, kind: str, **details: Any) -> None:
        self.decisions.append({"policy": kind, **details})


def _item_seq(item: Item) -> int:
    return item.seq


SummaryRole = Literal["system", "user"]
