"""The I/O requests a guard flow yields (see :mod:`ctxguard.guard.flows`), and the flow type."""

from __future__ import annotations

import random
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, TypeVar

from ctxguard._frozen import fast_init
from ctxguard.guard.plan import SummaryRequest

T = TypeVar("T")
MAX_COMMITS = 64  # plans of one prepare before ConflictError (each after another writer's change)
FRESH_REPLANS = 2  # plans on what a lost commit sent back, before waiting (then a fresh fetch)


@fast_init
@dataclass(frozen=True, slots=True)
class StoreCall:
    """Call ``store.<method>(*args)``."""

    method: str
    args: tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class ResolveLimit:
    """Ask the limit source for the current :class:`ContextLimit`."""


@dataclass(frozen=True, slots=True)
class CallSummarizer:
    """Run the user's summarizer (with the configured timeout)."""

    previous: str | None
    messages: tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class Sleep:
    """Wait ``seconds`` (a jittered backoff while other writers hold the session)."""

    seconds: float


@dataclass(frozen=True, slots=True)
class StartBackground:
    """Run :func:`summarize` for ``request`` without waiting for it."""

    session_id: str
    request: SummaryRequest


Op = StoreCall | ResolveLimit | CallSummarizer | StartBackground | Sleep
Flow = Generator[Op, Any, T]


def backoff(attempt: int) -> Sleep:
    """The jittered wait before a flow's ``attempt``-th commit while other writers hold the
    session (up to 0.1 s, doubling from 1 ms)."""
    return Sleep(random.uniform(0, min(0.1, 0.001 * (1 << min(attempt, 10)))))
