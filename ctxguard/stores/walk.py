"""The window walk every backend shares: ``window.lua``'s budget walk and the answer it composes.

The memory store and the window cache walk with :func:`walk_back`; every backend
composes its :class:`~ctxguard.stores.contract.WindowFetch` with
:func:`virtual_window`, so they answer the same way.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ctxguard._validate import show
from ctxguard.errors import CorruptRecordError, InvalidInputError
from ctxguard.stores.contract import (
    AppendResult,
    NewMessage,
    SessionInfo,
    StoredMessage,
    Summary,
    WindowFetch,
)

# bytes of a stored record that are not content (id, created_at, keys): see window.lua
RECORD_SKELETON_BYTES = 120


def check_window_args(budget: int, count: int | None = None) -> None:
    if not isinstance(budget, int) or budget < 0:
        raise InvalidInputError(f"budget must be a non-negative int, got {show(budget)}")
    if count is not None and (not isinstance(count, int) or count < 0):
        raise InvalidInputError(f"count must be a non-negative int, got {show(count)}")


def walk_back(
    costs: Iterable[tuple[int, int]], length: int, budget: int, min_messages: int
) -> tuple[int, bool]:
    """The window walk of ``window.lua``, over ``(seq, tokens)`` pairs newest first.

    Stops before the first message that would push the running total over
    ``budget``, but always takes the newest ``min_messages``. Returns the first
    position taken and whether the walk stopped (False: it ran out of pairs).
    """
    total = 0
    first = length
    for seq, cost in costs:
        if total + cost > budget and length - seq > min_messages:
            return first, True
        total += cost
        first = seq
    return first, False


def estimate_unknown_tokens(record_bytes: int) -> int:
    """A deliberate under-estimate for a message whose count is not stored yet.

    The window walk uses it so that it fetches at least enough messages; the
    guard then counts them exactly and writes the counts back.
    """
    return max(1, (record_bytes - RECORD_SKELETON_BYTES) // 8)


def check_summary(
    session_id: str, summary: Summary | None, stored_count: int, key: str = "sum"
) -> Summary | None:
    """A summary may cover at most the stored history; one beyond it is corrupt.

    Sending it would stand in for messages that do not exist, and the window
    after it would start past the newest message (the request would go out
    without the user's new message).
    """
    if summary is not None and not 0 <= summary.covers_to <= stored_count:
        raise CorruptRecordError(
            session_id,
            "sum",
            f"the summary covers messages up to position {summary.covers_to}, "
            f"but the session holds {stored_count}",
            key=key,
        )
    return summary


def virtual_window(
    info: SessionInfo,
    stored_count: int,
    first: int,
    recent: tuple[StoredMessage, ...],
    pinned: tuple[StoredMessage, ...],
    summary: Summary | None,
    token: str | None,
    stop_tokens: int | None,
    new: Sequence[NewMessage],
    flags: Sequence[int],
    counted: bool,
) -> WindowFetch:
    """A fetch's answer with the new messages put where an append would put them.

    ``recent``/``pinned`` are the stored part of the walk (which started at
    ``first``, counting the new messages flagged 1 as if stored after
    ``stored_count``); ``flags[i]`` says whether ``new[i]`` would be stored.
    Shared by every backend so they compose the window the same way.
    """
    if not new:
        return WindowFetch(info, pinned, recent, summary, first == 0, None, token, stop_tokens)
    fresh = [n for n, f in zip(new, flags, strict=True) if f]
    duplicates = tuple(n.message.id for n, f in zip(new, flags, strict=True) if not f)
    tail = tuple(
        StoredMessage(stored_count + i, n.message, n.tokens if counted else None)
        for i, n in enumerate(fresh)
    )
    if tail:
        recent = recent + tuple(s for s in tail if s.seq >= first)
        pinned = pinned + tuple(s for s in tail if s.seq < first and s.message.is_pinned_role)
    count = stored_count + len(tail)
    appended = AppendResult(tuple(n.message.id for n in fresh), duplicates, count, token, None)
    grown = SessionInfo(
        info.session_id,
        count,
        info.token_total + sum([s.tokens or 0 for s in tail]),
        info.counter,
        info.created_at,
        info.updated_at,
        info.ttl_seconds,
        info.summary_version,
        info.audit_count,
    )
    return WindowFetch(grown, pinned, recent, summary, first == 0, appended, token, stop_tokens)
