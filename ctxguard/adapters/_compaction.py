"""Folding old turns into a session's rolling summary on demand (a framework's compaction hook).

ctxguard never trims the raw history: a committed summary stands in for the
messages it covers once a window leaves them out. Frameworks that call a
"compact now" hook after each turn (the Agents SDK's ``run_compaction``) get
the summary made there, off the request path, instead of inline in a later
``prepare``. What to fold is decided here, purely; the guard's summarizer and
its compare-and-set commit (``Guard.summarize``) do the rest.

The fold ends where the ``keep_turns``-th newest user turn starts, so it never
splits a tool call from its results, and it waits while the newest turn's
tool calls have no results yet.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ctxguard._validate import show, type_name
from ctxguard.adapters._shared import GuardRef
from ctxguard.errors import ConfigError, InvalidInputError
from ctxguard.guard.plan import SummaryRequest
from ctxguard.guard.sync import Guard
from ctxguard.stores.base import StoredMessage, Summary

KEEP_TURNS = 4  # user turns left out of the fold
THRESHOLD = 10  # messages to fold before a fold is worth a summarizer call (the SDK's default)


def check_args(args: object) -> bool:
    """The SDK's compaction args (a dict or None): whether ``force`` is set."""
    if args is None:
        return False
    if not isinstance(args, Mapping):
        raise InvalidInputError(f"compaction args must be a dict or None, got {type_name(args)}")
    force = args.get("force", False)
    if type(force) is not bool:
        raise InvalidInputError(f"compaction args['force'] must be a bool, got {show(force)}")
    return force


def waiting_for_tools(stored: Sequence[StoredMessage]) -> bool:
    """Whether a tool call after the newest user message still lacks its result."""
    waiting: set[str] = set()
    for s in reversed(stored):
        message = s.message
        if message.role == "user":
            break
        if message.role == "tool":
            waiting.add(f"result:{message.tool_call_id}")
        elif message.role == "assistant" and message.tool_calls:
            for call in message.tool_calls:
                if f"result:{call.id}" not in waiting:
                    return True
    return False


@dataclass(frozen=True, slots=True)
class Folding:
    """When and how far to fold: all but the newest ``keep_turns`` user turns,
    once at least ``threshold`` messages would be folded (or when forced)."""

    keep_turns: int = KEEP_TURNS
    threshold: int = THRESHOLD

    def __post_init__(self) -> None:
        for name in ("keep_turns", "threshold"):
            value = getattr(self, name)
            if type(value) is not int or not 0 < value < 2**31:
                raise ConfigError(f"compact_{name} must be a positive int, got {show(value)}")

    def request(
        self, stored: Sequence[StoredMessage], summary: Summary | None, force: bool
    ) -> SummaryRequest | None:
        """The summary to make from ``stored`` (the history after the summary), or None."""
        start = summary.covers_to if summary is not None else 0
        if waiting_for_tools(stored):
            return None
        users = [s.seq for s in stored if s.seq >= start and s.message.role == "user"]
        if len(users) < self.keep_turns:
            return None
        end = users[-self.keep_turns]
        folded = [s for s in stored if start <= s.seq < end and not s.message.is_pinned_role]
        if not folded or (not force and len(folded) < self.threshold):
            return None
        if summary is None:
            return SummaryRequest(None, 0, start, end)
        return SummaryRequest(summary.text, summary.version, start, end)

    def run(self, guard: Guard, session_id: str, *, force: bool = False) -> None:
        if guard.config.summarizer is None:
            return
        summary = guard.store.get_summary(session_id)
        stored = guard.store.read(session_id, summary.covers_to if summary else 0)
        request = self.request(stored, summary, force)
        if request is not None:
            guard.summarize(session_id, request)

    async def arun(self, ref: GuardRef, session_id: str, *, force: bool = False) -> None:
        guard = ref.aio()
        if guard is None:
            await asyncio.to_thread(self.run, ref.sync(), session_id, force=force)
            return
        if guard.config.summarizer is None:
            return
        summary = await guard.store.get_summary(session_id)
        stored = await guard.store.read(session_id, summary.covers_to if summary else 0)
        request = self.request(stored, summary, force)
        if request is not None:
            await guard.summarize(session_id, request)
