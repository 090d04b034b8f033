"""The summary half of :class:`~ctxguard.guard.core.GuardCore`: the summary as a message
and an item, and the checks a summarizer's output passes before it is committed.

Mixed into GuardCore (as ``audit.py`` is), so the core stays one screen of flow steps.
No I/O.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ctxguard.errors import SummarizerError
from ctxguard.guard.plan import Item, SummaryRequest
from ctxguard.messages import Message
from ctxguard.stores.base import StoredMessage, Summary, WindowFetch

if TYPE_CHECKING:
    from ctxguard.guard.config import GuardConfig
    from ctxguard.tokens._protocol import TokenCounter

SUMMARY_PREFIX = "Summary of the earlier conversation:\n"


class SummaryChecks:
    """Summaries as the policies and the store see them."""

    counter: TokenCounter
    config: GuardConfig

    def summary_item(self, summary: Summary | None) -> Item | None:
        if summary is None:
            return None
        message = self.summary_message(summary.text, summary.version)
        tokens = summary.tokens
        if tokens is None or summary.counter != self.counter.fingerprint:
            tokens = self.counter.count_message(message)
        return Item(-1, message, tokens)

    def summary_message(self, text: str, version: int) -> Message:
        return Message(
            role=self.config.summary_role,
            content=SUMMARY_PREFIX + text,
            id=f"ctxguard-summary-v{version}",
            metadata={"ctxguard": "summary", "version": version},
        )

    def summary_inputs(self, stored: Sequence[StoredMessage]) -> list[Message]:
        return [s.message for s in stored if not s.message.is_pinned_role]

    def accept_summary(
        self, text: object, request: SummaryRequest, stored: Sequence[StoredMessage]
    ) -> Summary:
        """Turn summarizer output into a Summary, or raise SummarizerError; never guess."""
        if not isinstance(text, str) or not text.strip():
            raise SummarizerError(f"summarizer returned {type(text).__name__}, not non-empty text")
        version = request.previous_version + 1
        tokens = self.counter.count_message(self.summary_message(text, version))
        if tokens > self.config.summary_max_tokens:
            limit = self.config.summary_max_tokens
            raise SummarizerError(f"summary is {tokens} tokens, over summary_max_tokens={limit}")
        return Summary(
            version=version,
            text=text,
            covers_to=request.covers_to,
            from_id=stored[0].message.id if stored else None,
            to_id=stored[-1].message.id if stored else None,
            tokens=tokens,
            counter=self.counter.fingerprint,
        )

    @staticmethod
    def is_summary(stored: Summary | None, summary: Summary) -> bool:
        """Whether ``stored`` is ``summary`` (read back after a lost commit reply)."""
        return stored is not None and (
            stored.version,
            stored.covers_to,
            stored.from_id,
            stored.to_id,
            stored.text,
        ) == (summary.version, summary.covers_to, summary.from_id, summary.to_id, summary.text)

    @staticmethod
    def with_summary(fetch: WindowFetch, summary: Summary) -> WindowFetch:
        return dataclasses.replace(fetch, summary=summary)
