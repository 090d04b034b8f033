"""The in-process session: its data, and the reads every memory store operation shares.

:class:`Session` is what a session's Redis keys hold (see ``stores/keys.py``), as one
Python object; :func:`session_window` is ``window.lua``'s budget walk on it;
:func:`raw_session` and :func:`apply_repair` lay it out as its keys for
``ctxguard audit`` / ``repair``. The caller (:class:`~ctxguard.stores.memory.MemoryStore`)
holds the lock.
"""

from __future__ import annotations

import hashlib
import itertools
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from ctxguard._record_time import comparable_record
from ctxguard.errors import MessageIdReusedError
from ctxguard.stores.base import (
    UNKNOWN_TOKENS,
    NewMessage,
    SessionInfo,
    StoredMessage,
    WindowFetch,
    WriteOptions,
    check_summary,
    decode_message,
    decode_summary,
    encode_audit,
    estimate_unknown_tokens,
    ms_to_datetime,
    tokens_or_none,
    virtual_window,
    walk_back,
)
from ctxguard.stores.integrity import RawSession, RepairPlan
from ctxguard.stores.keys import SUFFIXES

_EPOCHS = itertools.count(1)  # each session object created in this process gets its own


class Counts:
    """Per-message token counts (-1 unknown) with their known sum kept up to date.

    The sum is what ``info`` reports; keeping it incremental keeps every
    operation independent of the history's length, as the Redis meta hash does.
    """

    def __init__(self) -> None:
        self.values: list[int] = []
        self.total = 0

    def __len__(self) -> int:
        return len(self.values)

    def __getitem__(self, seq: int) -> int:
        return self.values[seq]

    def append(self, value: int) -> None:
        self.values.append(value)
        self.total += max(value, 0)

    def set(self, seq: int, value: int) -> None:
        self.total += max(value, 0) - max(self.values[seq], 0)
        self.values[seq] = value

    def forget(self) -> None:
        """Another counter took over: every count becomes unknown."""
        self.values = [UNKNOWN_TOKENS] * len(self.values)
        self.total = 0

    def truncate(self, keep: int) -> None:
        self.total -= sum(max(v, 0) for v in self.values[keep:])
        del self.values[keep:]


@dataclass
class Session:
    created_ms: int
    updated_ms: int
    records: list[str] = field(default_factory=list)
    tokens: Counts = field(default_factory=Counts)
    ids: dict[str, int] = field(default_factory=dict)
    pins: list[int] = field(default_factory=list)
    counter: str | None = None
    summary: str | None = None
    summary_version: int = 0
    audit: list[str] = field(default_factory=list)
    audit_rids: dict[str, int] = field(default_factory=dict)  # rid -> turn, as `rids` in Redis
    turns: int = 0
    expires_at: float | None = None
    epoch: int = field(default_factory=lambda: next(_EPOCHS))
    version: int = 0

    def token_total(self) -> int:
        return self.tokens.total

    @property
    def state_token(self) -> str:
        """Moves on with every change a window could see (as ``state_token`` in _lib.lua)."""
        return f"m{self.epoch}:{self.version}"

    def changed(self) -> None:
        self.version += 1


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def datetime_ms(when: datetime) -> int:
    aware = when if when.tzinfo is not None else when.replace(tzinfo=UTC)
    return int(aware.timestamp() * 1000)


def stored_message(
    session_id: str, session: Session, seq: int, counts_valid: bool = True
) -> StoredMessage:
    message = decode_message(session_id, seq, session.records[seq])
    tokens = tokens_or_none(session.tokens[seq]) if counts_valid else None
    return StoredMessage(seq, message, tokens)


def session_info(session_id: str, session: Session) -> SessionInfo:
    ttl = None
    if session.expires_at is not None:
        ttl = max(0.0, session.expires_at - time.monotonic())
    return SessionInfo(
        session_id=session_id,
        message_count=len(session.records),
        token_total=session.token_total(),
        counter=session.counter,
        created_at=ms_to_datetime(session.created_ms),
        updated_at=ms_to_datetime(session.updated_ms),
        ttl_seconds=ttl,
        summary_version=session.summary_version,
        audit_count=len(session.audit),
    )


def check_reused(session_id: str, session: Session | None, new: Sequence[NewMessage]) -> None:
    """Refuse the first new message whose id is stored with another message (anything but
    the time and the metadata differs: ``comparable_record``), as ``_reuse.lua`` does;
    writes nothing."""
    if session is None:
        return
    for n in new:
        msg_id = n.message.id
        seq = session.ids.get(msg_id)
        if seq is None or not 0 <= seq < len(session.records):
            continue
        stored, record = session.records[seq], n.encoded()
        if stored != record and comparable_record(stored, msg_id) != comparable_record(
            record, msg_id
        ):
            raise MessageIdReusedError(session_id, msg_id)


def session_window(
    session_id: str,
    session: Session | None,
    budget: int,
    options: WriteOptions,
    min_messages: int,
    new: Sequence[NewMessage],
) -> WindowFetch:
    check_reused(session_id, session, new)
    records = session.records if session is not None else []
    stored_count = len(records)
    known: Mapping[str, int] = session.ids if session is not None else {}
    flags: list[int] = []
    seen: set[str] = set()
    for n in new:
        msg_id = n.message.id
        flags.append(0 if msg_id in seen or msg_id in known else 1)
        seen.add(msg_id)
    fresh = [n for n, f in zip(new, flags, strict=True) if f]
    counted = bool(options.counter)
    # Counts made by another counter than the caller's are unknown to it (as in window.lua).
    same = session is not None and (not options.counter or options.counter == session.counter)

    def new_count(n: NewMessage) -> int:
        return n.tokens if counted and n.tokens is not None else UNKNOWN_TOKENS

    def stored_count_at(seq: int) -> int:
        assert session is not None
        return session.tokens[seq] if same else UNKNOWN_TOKENS

    def costs() -> Iterator[tuple[int, int]]:
        for i in range(len(fresh) - 1, -1, -1):
            count = new_count(fresh[i])
            if count < 0:
                count = estimate_unknown_tokens(len(fresh[i].encoded().encode()))
            yield stored_count + i, count
        for seq in range(stored_count - 1, -1, -1):
            count = stored_count_at(seq)
            if count < 0:
                count = estimate_unknown_tokens(len(records[seq].encode()))
            yield seq, count

    first = walk_back(costs(), stored_count + len(fresh), budget, min_messages)[0]
    stop = None
    if first > stored_count:
        stop = tokens_or_none(new_count(fresh[first - 1 - stored_count]))
    elif first > 0:
        stop = tokens_or_none(stored_count_at(first - 1))
    if session is None:
        empty = empty_window(session_id)
        return virtual_window(empty.info, 0, first, (), (), None, None, stop, new, flags, counted)
    recent = tuple(stored_message(session_id, session, s, same) for s in range(first, stored_count))
    pinned = tuple(stored_message(session_id, session, s, same) for s in session.pins if s < first)
    summary = check_summary(session_id, decode_summary(session_id, session.summary), stored_count)
    info = session_info(session_id, session)
    token = session.state_token
    return virtual_window(
        info, stored_count, first, recent, pinned, summary, token, stop, new, flags, counted
    )


def raw_session(session: Session) -> RawSession:
    """A session as its keys would hold it; the fingerprint covers all of it."""
    meta = {
        "created": str(session.created_ms),
        "updated": str(session.updated_ms),
        "count": str(len(session.records)),
        "tokens": str(session.tokens.total),
        "sumver": str(session.summary_version),
        "turns": str(session.turns),
        "ver": str(session.version),
        "epoch": str(session.epoch),
    }
    if session.counter:
        meta["counter"] = session.counter
    toks = [str(t) for t in session.tokens.values]
    ids = {str(k): str(v) for k, v in session.ids.items()}
    pins = [str(p) for p in session.pins]
    records = [r.encode() for r in session.records]
    summary = None if session.summary is None else session.summary.encode()
    state = repr((meta, records, toks, sorted(ids.items()), pins, summary))
    types = {s: "none" for s in SUFFIXES}
    types.update(meta="hash", msgs="list" if records else "none", ids="hash" if ids else "none")
    types.update(toks="list" if toks else "none", pins="list" if pins else "none")
    types.update(sum="string" if summary else "none", audit="list" if session.audit else "none")
    fingerprint = hashlib.sha1(state.encode(), usedforsecurity=False).hexdigest()
    return RawSession(types, meta, records, toks, ids, pins, summary, fingerprint)


def drop_tail(session: Session, keep: int) -> None:
    """Forget positions ``keep`` and later, as retract.lua does."""
    del session.records[keep:]
    session.tokens.truncate(keep)
    session.ids = {k: v for k, v in session.ids.items() if v < keep}
    session.pins = [p for p in session.pins if p < keep]
    summary = decode_summary("", session.summary) if session.summary else None
    if summary is not None and summary.covers_to > keep:
        session.summary = None


def empty_window(session_id: str) -> WindowFetch:
    now = ms_to_datetime(now_ms())
    info = SessionInfo(session_id, 0, 0, None, now, now, None, 0)
    return WindowFetch(info, (), (), None, True, None)


def apply_repair(session: Session, plan: RepairPlan, record: Mapping[str, Any]) -> None:
    """Rewrite ``session`` as ``plan`` says and add the audit ``record`` (as repair.lua)."""
    counts = Counts()
    for value in plan.toks:
        counts.append(value)
    session.tokens = counts
    session.ids = {}
    for seq, msg_id in enumerate(plan.ids):
        session.ids.setdefault(msg_id, seq)
    session.pins = list(plan.pins)
    if plan.drop_summary:
        session.summary = None
    session.summary_version = int(plan.meta["sumver"])
    session.turns = int(plan.meta["turns"])
    session.changed()
    session.audit.append(encode_audit(record))
