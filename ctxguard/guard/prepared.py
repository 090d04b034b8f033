"""What :meth:`Guard.prepare` returns: the request to send and the reasons for it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ctxguard._frozen import fast_init
from ctxguard.messages import Message
from ctxguard.stores.contract import NewMessage, WindowFetch


@fast_init
@dataclass(frozen=True, slots=True)
class Unstored:
    """What a ``commit="with_reply"`` prepare left for :meth:`Guard.complete` to store.

    ``new``: the messages to store before the reply (those the state planned on did
    not hold), ``min_messages``: how many the prepare was given (its walk's minimum),
    ``prompt``: the prompt budget, ``fetch``: the window planned on, as if ``new`` were
    appended (its ``token`` is the state planned on), ``record``: the request record,
    ``counts``: recounted tokens to write with it, ``items`` / ``plain``: the plan's
    items for the window cache (``None``: none kept), ``keep``: whether the window
    cache may move on to the state the commit leaves (not after recounts or a summary).
    """

    new: tuple[NewMessage, ...]
    min_messages: int
    prompt: int
    fetch: WindowFetch
    record: Mapping[str, Any]
    counts: Mapping[int, int]
    items: tuple[Any, ...] | None
    plain: bool
    keep: bool


@fast_init
@dataclass(frozen=True)
class PreparedRequest:
    """A request that fits: ``tokens + reserved_output + safety_margin <= limit``.

    ``tokens`` is the exact prompt count by the guard's counter (``exact`` is
    False only for the approximate counter). ``dropped`` lists the position
    ranges left out; ``decisions`` says which policy did what.

    ``stored_ids`` are the ids of the new messages this prepare stored (a message
    already stored, a retry's, is not among them) and ``state_token`` the session's
    state token its write left ('' when it stored nothing, or cannot say: a repeated
    commit). A caller that must take the request back (the server refused it) retracts
    ``len(stored_ids)`` messages with ``expected_state=state_token``: refused, nothing
    written, when another write came between.

    ``unstored`` (``commit="with_reply"``): what :meth:`Guard.complete` stores with the
    reply, given this request (``prepared=``); ``None`` when the prepare stored it.
    """

    session_id: str
    turn: int
    messages: tuple[Message, ...]
    tokens: int
    exact: bool
    limit: int
    limit_source: str
    reserved_output: int
    safety_margin: int
    dropped: tuple[tuple[int, int], ...]
    summary_version: int
    decisions: tuple[Mapping[str, Any], ...]
    tools: tuple[Mapping[str, Any], ...] | None = None
    counter: str = ""
    sent_seqs: tuple[int, ...] = field(default=())
    pending_audit: Mapping[str, Any] | None = field(default=None, repr=False, compare=False)
    stored_ids: tuple[str, ...] = field(default=(), repr=False, compare=False)
    state_token: str = field(default="", repr=False, compare=False)
    unstored: Unstored | None = field(default=None, repr=False, compare=False)

    @property
    def prompt_budget(self) -> int:
        return self.limit - self.reserved_output - self.safety_margin

    def openai_messages(self) -> list[dict[str, Any]]:
        """The messages as OpenAI chat-completions dicts, ready to send."""
        return [m.to_openai() for m in self.messages]

    def request_kwargs(self) -> dict[str, Any]:
        """``messages``, ``max_tokens`` and ``tools`` for an OpenAI-compatible client."""
        kwargs: dict[str, Any] = {
            "messages": self.openai_messages(),
            "max_tokens": self.reserved_output,
        }
        if self.tools:
            kwargs["tools"] = [dict(t) for t in self.tools]
        return kwargs


def ids_of(messages: Sequence[Message]) -> list[str]:
    return [m.id for m in messages]
