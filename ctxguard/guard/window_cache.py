"""The guard's copy of each session's last window, so a turn need not fetch it again.

A chat session's consecutive turns see almost the same window: the previous
one, plus the reply and the new user message, minus a few of the oldest. The
guard keeps the last :class:`~ctxguard.stores.base.WindowFetch` of each session
(with the store's state token), extends it with what it appends itself, and
re-runs the store's window walk on it (:func:`speculate`). The request planned
on that copy is then committed by the store only if the session's state token
is still the cached one (``commit_if_unchanged``): one round trip that appends
the new messages and writes the audit record, with no window to send back or
decode. Any other writer, a summary, a recount or a retraction moves the token
on, and the store answers with a fresh fetch instead: a stale copy costs a
re-plan, never a wrong request.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from types import MappingProxyType

from ctxguard.guard.plan import Item
from ctxguard.stores.base import (
    AppendResult,
    NewMessage,
    SessionInfo,
    StoredMessage,
    WindowFetch,
)

# A copy that grows past this many messages without a prepare (bulk appends) is dropped.
MAX_CACHED_MESSAGES = 4096
_NO_ITEMS: Mapping[int, Item] = MappingProxyType({})


class WindowCache:
    """A thread-safe LRU of the newest window per session, bounded twice.

    ``capacity`` caps the sessions (0 turns the cache off) and ``max_bytes``
    the estimated memory of all copies together (see :func:`estimated_bytes`):
    one long-context session can hold more than a thousand short ones.
    """

    def __init__(self, capacity: int, max_bytes: int = 64 << 20) -> None:
        self.capacity = capacity
        self.max_bytes = max_bytes
        self.bytes = 0
        # (copy, its weight, the items last planned on it, whether they were all plain)
        self._entries: OrderedDict[str, tuple[WindowFetch, int, Mapping[int, Item], bool]] = (
            OrderedDict()
        )
        self._lock = threading.Lock()

    def get(self, session_id: str) -> WindowFetch | None:
        found = self.get_with_items(session_id)
        return None if found is None else found[0]

    def get_with_items(self, session_id: str) -> tuple[WindowFetch, Mapping[int, Item]] | None:
        """The session's copy and the items last planned on it, by seq (see
        ``GuardCore._plan``: an item is reused only if it is the one its message makes)."""
        with self._lock:
            found = self._entries.get(session_id)
            if found is None:
                return None
            self._entries.move_to_end(session_id)
            return found[0], found[2]

    def get_for_plan(self, session_id: str) -> tuple[WindowFetch, Mapping[int, Item], bool] | None:
        """:meth:`get_with_items`, and whether no message of the copy (``recent``) is a
        tool result or calls tools, as the last plan on it found (``Plan.plain``) and
        every message appended since (False: not known)."""
        with self._lock:
            found = self._entries.get(session_id)
            if found is None:
                return None
            self._entries.move_to_end(session_id)
            return found[0], found[2], found[3]

    def put(
        self,
        session_id: str,
        fetch: WindowFetch,
        items: Mapping[int, Item] | None = None,
        plain: bool = False,
    ) -> None:
        """Keep ``fetch`` as the session's copy (only a fetch with a state token is usable),
        with ``items``, the plan's items on it (by seq), if there was one, and ``plain``:
        that plan found no tool message among them (see :meth:`plain`)."""
        weight = estimated_bytes(fetch)
        if (
            self.capacity <= 0
            or fetch.token is None
            or len(fetch.recent) > MAX_CACHED_MESSAGES
            or weight > self.max_bytes
        ):
            self.evict(session_id)
            return
        with self._lock:
            old = self._entries.pop(session_id, None)
            if old is not None:
                self.bytes -= old[1]
            self._entries[session_id] = (
                fetch,
                weight,
                _NO_ITEMS if items is None else items,
                plain,
            )
            self.bytes += weight
            while len(self._entries) > self.capacity or self.bytes > self.max_bytes:
                self.bytes -= self._entries.popitem(last=False)[1][1]

    def evict(self, session_id: str | None = None) -> None:
        with self._lock:
            if session_id is None:
                self._entries.clear()
                self.bytes = 0
                return
            old = self._entries.pop(session_id, None)
            if old is not None:
                self.bytes -= old[1]

    def appended(self, session_id: str, new: Sequence[NewMessage], result: AppendResult) -> None:
        """Extend the copy with messages this guard appended, if nothing else changed."""
        found = self.get_for_plan(session_id)
        if found is None:
            return
        entry, items, plain = found
        extended = extend(entry, new, result)
        if extended is None:
            self.evict(session_id)
        else:
            self.put(session_id, extended, items, plain and all_plain(new))

    def __len__(self) -> int:
        return len(self._entries)


MESSAGE_BYTES = 1500  # a cached Message with its id, time, dicts and slot object
TOKEN_BYTES = 12  # message text per token, as str


def all_plain(new: Sequence[NewMessage]) -> bool:
    """No message of ``new`` is a tool result or calls tools (``policies._plain``'s test)."""
    for n in new:
        message = n.message
        if message.tool_calls or message.role == "tool":
            return False
    return True


def estimated_bytes(fetch: WindowFetch) -> int:
    """Memory a copy keeps alive; measured (tracemalloc) at 1.5-2.2 KB per message
    for 12-120-token messages, which this overestimates by up to 1.3x."""
    recent, pinned = fetch.recent, fetch.pinned  # (twice a turn: list sums, no tuple made)
    tokens = sum([s.tokens or 0 for s in recent]) + sum([s.tokens or 0 for s in pinned])
    return MESSAGE_BYTES * (len(recent) + len(pinned)) + TOKEN_BYTES * tokens


def extend(
    entry: WindowFetch, new: Sequence[NewMessage], result: AppendResult
) -> WindowFetch | None:
    """``entry`` after an append whose result is ``result``; None if it cannot be known.

    It can be known when the append started from the entry's state (its token
    before is the entry's) and stored exactly the messages that were new.
    """
    if result.token_before != entry.token or result.token_after is None:
        return None
    count = entry.info.message_count
    stored = set(result.stored)
    fresh = [n for n in new if n.message.id in stored]
    if len(fresh) != len(stored) or count + len(fresh) != result.message_count:
        return None
    run = entry.recent + tuple(
        StoredMessage(count + i, n.message, n.tokens) for i, n in enumerate(fresh)
    )
    info = _grown(entry.info, result.message_count, fresh)
    return WindowFetch(
        info,
        entry.pinned,
        run,
        entry.summary,
        entry.reached_start,
        None,
        result.token_after,
        entry.stop_tokens,
    )


def speculate(
    entry: WindowFetch, new: Sequence[NewMessage], budget: int, min_messages: int
) -> WindowFetch | None:
    """What ``fetch_window(budget, new, min_messages)`` would return if the session is as cached.

    None when the copy cannot tell: a count the walk needs is unknown, a new id
    repeats, or the walk would reach back past the cached messages. The walk is
    :func:`~ctxguard.stores.base.walk_back`, written out here: it runs every turn.
    """
    ids = [n.message.id for n in new]
    if len(set(ids)) != len(ids):
        return None
    count = entry.info.message_count
    length = count + len(new)
    tail = tuple(StoredMessage(count + i, n.message, n.tokens) for i, n in enumerate(new))
    run = entry.recent + tail
    cut = _walk_run(run, length, budget, min_messages, entry.stop_tokens)
    if cut is None:
        return None
    first = run[cut].seq if cut < len(run) else length
    pinned = entry.pinned + tuple(s for s in run[:cut] if s.message.is_pinned_role)
    stop = run[cut - 1].tokens if cut > 0 else entry.stop_tokens
    info = _grown(entry.info, length, new)
    appended = AppendResult(tuple(ids), (), length)
    return WindowFetch(
        info, pinned, run[cut:], entry.summary, first == 0, appended, entry.token, stop
    )


def _grown(info: SessionInfo, count: int, added: Sequence[NewMessage]) -> SessionInfo:
    """``info`` after appending ``added`` (built directly: this runs twice a turn)."""
    return SessionInfo(
        info.session_id,
        count,
        info.token_total + sum([n.tokens or 0 for n in added]),
        info.counter,
        info.created_at,
        info.updated_at,
        info.ttl_seconds,
        info.summary_version,
        info.audit_count,
    )


def _walk_run(
    run: Sequence[StoredMessage],
    length: int,
    budget: int,
    min_messages: int,
    stop_tokens: int | None,
) -> int | None:
    """Index in ``run`` where the window walk starts, or None if the copy cannot tell."""
    total = 0
    index = len(run)
    while index > 0:
        stored = run[index - 1]
        cost = stored.tokens
        if cost is None:
            return None  # the store would estimate it: leave that to a fetch
        if total + cost > budget and length - stored.seq > min_messages:
            return index
        total += cost
        index -= 1
    start = run[0].seq if run else length
    if start == 0:
        return 0  # reached the first message
    if (
        stop_tokens is not None
        and total + stop_tokens > budget
        and length - start + 1 > min_messages
    ):
        return 0  # the message before the copy stops the walk, as it did before
    return None
