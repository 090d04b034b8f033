"""The in-process store: zero setup, the default, and the reference semantics.

Everything lives in one dict guarded by one lock, so each operation is atomic
for every thread of the process, as a Lua script is on Redis. Nothing survives
the process. :class:`AsyncMemoryStore` is the same object behind ``async def``:
there is no I/O to wait for.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import threading
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from ctxguard._validate import check_count, check_prefix, check_range, check_store_args, show
from ctxguard.errors import ConflictError, InvalidInputError, SessionFullError
from ctxguard.ids import validate_id
from ctxguard.stores.base import (
    REQUEST_RECORD_HEAD,
    UNKNOWN_TOKENS,
    AppendResult,
    NewMessage,
    RecordWrite,
    SessionInfo,
    StoredMessage,
    Summary,
    WindowFetch,
    WindowHit,
    WriteOptions,
    audit_rid,
    check_summary,
    check_window_args,
    decode_audit,
    decode_message,
    decode_summary,
    encode_audit,
    estimate_unknown_tokens,
    ms_to_datetime,
    tokens_or_none,
    virtual_window,
    walk_back,
    with_rid,
)
from ctxguard.stores.integrity import RawSession, RepairPlan
from ctxguard.stores.keys import SUFFIXES

_EPOCHS = itertools.count(1)  # each session object created in this process gets its own


class _Counts:
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
class _Session:
    created_ms: int
    updated_ms: int
    records: list[str] = field(default_factory=list)
    tokens: _Counts = field(default_factory=_Counts)
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


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _datetime_ms(when: datetime) -> int:
    aware = when if when.tzinfo is not None else when.replace(tzinfo=UTC)
    return int(aware.timestamp() * 1000)


class MemoryStore:
    """In-process session store (``memory://``). Thread-safe."""

    def __init__(self, namespace: str = "ctxg", tenant: str = "default") -> None:
        self.namespace = namespace
        self.tenant = tenant
        self._sessions: dict[str, _Session] = {}
        self._lock = threading.RLock()

    # -- helpers -------------------------------------------------------------

    def _live(self, session_id: str) -> _Session | None:
        validate_id(session_id, "session id")
        session = self._sessions.get(session_id)
        expires = None if session is None else session.expires_at
        if expires is not None and expires <= time.monotonic():
            del self._sessions[session_id]
            return None
        return session

    def _for_write(self, session_id: str, options: WriteOptions) -> _Session:
        session = self._live(session_id)
        if session is None:
            now = _now_ms()
            session = self._sessions.setdefault(session_id, _Session(now, now))
        if options.counter and session.counter != options.counter:
            session.counter = options.counter
            session.tokens.forget()
            session.changed()
        return session

    @staticmethod
    def _touch(session: _Session, options: WriteOptions) -> None:
        session.updated_ms = _now_ms()
        if options.ttl_seconds:
            session.expires_at = time.monotonic() + options.ttl_seconds

    def _check_cap(
        self, session_id: str, messages: Sequence[NewMessage], options: WriteOptions
    ) -> None:
        """Refuse a batch that would pass max_messages, before anything is written."""
        cap = options.max_messages
        session = self._live(session_id)
        if not cap or not messages:
            return
        held = 0 if session is None else len(session.records)
        known = set() if session is None else session.ids.keys()
        fresh = {n.message.id for n in messages} - known
        if held + len(fresh) > cap:
            raise SessionFullError(session_id, held)

    def _append_checked(
        self, session_id: str, messages: Sequence[NewMessage], options: WriteOptions
    ) -> tuple[_Session, AppendResult]:
        """Cap check, create or switch counter, append (the lock is held)."""
        self._check_cap(session_id, messages, options)
        found = self._live(session_id)
        before = None if found is None else found.state_token
        session = self._for_write(session_id, options)
        return session, self._append_locked(session, messages, options, before)

    def _append_locked(
        self,
        session: _Session,
        messages: Sequence[NewMessage],
        options: WriteOptions,
        before: str | None,
    ) -> AppendResult:
        stored: list[str] = []
        duplicates: list[str] = []
        for new in messages:
            msg_id = new.message.id
            if msg_id in session.ids:
                duplicates.append(msg_id)
                continue
            seq = len(session.records)
            session.ids[msg_id] = seq
            session.records.append(new.encoded())
            counted = bool(options.counter) and new.tokens is not None
            session.tokens.append(new.tokens if counted and new.tokens is not None else -1)
            if new.message.is_pinned_role:
                session.pins.append(seq)
            stored.append(msg_id)
        if stored:
            session.changed()
        self._touch(session, options)
        count = len(session.records)
        return AppendResult(tuple(stored), tuple(duplicates), count, before, session.state_token)

    def _stored(
        self, session_id: str, session: _Session, seq: int, counts_valid: bool = True
    ) -> StoredMessage:
        message = decode_message(session_id, seq, session.records[seq])
        tokens = tokens_or_none(session.tokens[seq]) if counts_valid else None
        return StoredMessage(seq, message, tokens)

    def _info(self, session_id: str, session: _Session) -> SessionInfo:
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

    # -- the contract ---------------------------------------------------------

    def append(
        self,
        session_id: str,
        messages: Sequence[NewMessage],
        options: WriteOptions = WriteOptions(),  # noqa: B008 - frozen, shared safely
    ) -> AppendResult:
        check_store_args(new=messages, options=options)
        with self._lock:
            if not messages:
                found = self._live(session_id)
                return AppendResult((), (), 0 if found is None else len(found.records))
            return self._append_checked(session_id, messages, options)[1]

    def read(self, session_id: str, start: int = 0, stop: int | None = None) -> list[StoredMessage]:
        check_range(start, stop)
        with self._lock:
            session = self._live(session_id)
            if session is None:
                return []
            seqs = range(len(session.records))[start:stop]
            return [self._stored(session_id, session, seq) for seq in seqs]

    def read_last(self, session_id: str, count: int) -> list[StoredMessage]:
        check_count(count, "count")
        with self._lock:
            session = self._live(session_id)
            if session is None or count == 0:
                return []
            first = max(0, len(session.records) - count)
            return [
                self._stored(session_id, session, s) for s in range(first, len(session.records))
            ]

    def info(self, session_id: str) -> SessionInfo | None:
        with self._lock:
            session = self._live(session_id)
            return None if session is None else self._info(session_id, session)

    def delete(self, session_id: str) -> bool:
        with self._lock:
            existed = self._live(session_id) is not None
            self._sessions.pop(session_id, None)
            return existed

    def list_sessions(self, prefix: str = "") -> Iterator[str]:
        check_prefix(prefix)
        with self._lock:
            names = sorted(self._sessions)
        for name in names:
            if name.startswith(prefix) and self.info(name) is not None:
                yield name

    def fetch_window(
        self,
        session_id: str,
        budget: int,
        options: WriteOptions = WriteOptions(),  # noqa: B008
        new: Sequence[NewMessage] = (),
        min_messages: int = 0,
    ) -> WindowFetch:
        """The window as if ``new`` were appended; writes nothing (see WindowFetch)."""
        check_window_args(budget, min_messages)
        check_store_args(new=new, options=options)
        with self._lock:
            self._check_cap(session_id, new, options)
            session = self._live(session_id)
            return self._window_locked(session_id, session, budget, options, min_messages, new)

    def _window_locked(
        self,
        session_id: str,
        session: _Session | None,
        budget: int,
        options: WriteOptions,
        min_messages: int,
        new: Sequence[NewMessage],
    ) -> WindowFetch:
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
            empty = _empty_window(session_id)
            return virtual_window(
                empty.info, 0, first, (), (), None, None, stop, new, flags, counted
            )
        recent = tuple(
            self._stored(session_id, session, s, same) for s in range(first, stored_count)
        )
        pinned = tuple(
            self._stored(session_id, session, s, same) for s in session.pins if s < first
        )
        summary = check_summary(
            session_id, decode_summary(session_id, session.summary), stored_count
        )
        info = self._info(session_id, session)
        token = session.state_token
        return virtual_window(
            info, stored_count, first, recent, pinned, summary, token, stop, new, flags, counted
        )

    def commit_if_unchanged(
        self,
        session_id: str,
        token: str,
        budget: int,
        options: WriteOptions,
        new: Sequence[NewMessage],
        min_messages: int,
        write: RecordWrite | None,
    ) -> WindowHit | WindowFetch:
        """Append ``new`` and write ``write`` (recounts by ``options.counter``, audit
        record) if the session's state token is ``token`` ('' = no session yet) and
        no id of ``new`` is stored; else answer as :meth:`fetch_window` (no write)."""
        check_window_args(budget, min_messages)
        check_store_args(new=new, options=options, write=write, text={"token": token})
        with self._lock:
            self._check_cap(session_id, new, options)
            session = self._live(session_id)
            ids = [n.message.id for n in new]
            current = "" if session is None else session.state_token
            unchanged = (
                current == token
                and len(set(ids)) == len(ids)
                and not (session is not None and any(i in session.ids for i in ids))
            )
            if not unchanged:
                # as window.lua: a commit whose audit record is already written (a retry
                # after a lost reply) is a hit, with the turn its first attempt was given
                turn = self._audit_turn(session_id, write)
                if turn is not None:
                    count = 0 if session is None else len(session.records)
                    return WindowHit(AppendResult(tuple(ids), (), count), turn, "")
                return self._window_locked(session_id, session, budget, options, min_messages, new)
            if new:
                session, appended = self._append_checked(session_id, new, options)
            else:
                count = 0 if session is None else len(session.records)
                appended = AppendResult((), (), count, current or None, current or None)
            if session is None:
                return WindowHit(appended, 0, "")
            turn = 0
            if write is not None:
                if write.counts and options.counter:
                    self.set_token_counts(session_id, options.counter, write.counts)
                if write.audit is not None:
                    turn = self.add_audit(session_id, write.audit, write.retention, write.ttl)
            self._touch(session, options)
            after = session.state_token
            appended = dataclasses.replace(appended, token_after=after)
            return WindowHit(appended, turn, after)

    def set_token_counts(self, session_id: str, counter: str, counts: Mapping[int, int]) -> None:
        check_store_args(text={"counter": counter}, counts=counts)
        with self._lock:
            session = self._live(session_id)
            if session is None or not counter:  # counts without a counter mean nothing
                return
            if session.counter != counter:
                session.counter = counter
                session.tokens.forget()
                session.changed()
            written = 0
            for seq, value in counts.items():
                if 0 <= seq < len(session.tokens):
                    session.tokens.set(seq, int(value))
                    written += 1
            if written:
                session.changed()

    def get_summary(self, session_id: str) -> Summary | None:
        with self._lock:
            session = self._live(session_id)
            return None if session is None else decode_summary(session_id, session.summary)

    def retract(
        self, session_id: str, count: int = 1, expected_count: int | None = None, ttl: int = 0
    ) -> list[StoredMessage]:
        """Remove the newest ``count`` messages (explicit deletion, audited); returns them."""
        if not isinstance(count, int) or count < 0:
            raise InvalidInputError(f"count must be a non-negative int, got {show(count)}")
        check_store_args(ints={"expected_count": expected_count, "ttl": ttl})
        with self._lock:
            session = self._live(session_id)
            if session is None:
                return []
            if expected_count is not None and expected_count != len(session.records):
                raise ConflictError(
                    f"session {session_id!r} now holds {len(session.records)} messages, not the "
                    "expected count; read it again and retry"
                )
            keep = len(session.records) - min(count, len(session.records))
            removed = [
                self._stored(session_id, session, s) for s in range(keep, len(session.records))
            ]
            if not removed:  # as retract.lua: nothing removed, nothing recorded
                return []
            _drop_tail(session, keep)
            session.changed()
            record = {
                "kind": "retract",
                "at": datetime.now(UTC).isoformat(),
                "count": len(removed),
                "ids": [r.message.id for r in removed],
            }
            session.audit.append(encode_audit(record))
            self._touch(session, WriteOptions(ttl_seconds=ttl or None))
            return removed

    def restore(
        self,
        session_id: str,
        turns: int,
        summary: Summary | None,
        ttl: int = 0,
        *,
        created_at: datetime | None = None,
    ) -> tuple[int, int]:
        """For import: raise the turn counter, set the summary if there is none yet,
        and move the creation time back to ``created_at`` when that is earlier."""
        check_store_args(summary=summary, ints={"turns": turns, "ttl": ttl})
        with self._lock:
            session = self._live(session_id)
            if session is None:
                return 0, 0
            session.turns = max(session.turns, turns)
            if created_at is not None:
                session.created_ms = min(session.created_ms, _datetime_ms(created_at))
            if summary is not None and session.summary_version == 0:
                session.summary = summary.model_dump_json()
                session.summary_version = summary.version
                session.changed()
            self._touch(session, WriteOptions(ttl_seconds=ttl or None))
            return session.turns, session.summary_version

    def commit_summary(self, session_id: str, summary: Summary, expected_version: int) -> bool:
        check_store_args(summary=summary, ints={"expected_version": expected_version})
        if summary is None:
            raise InvalidInputError("summary must be a Summary, got None")
        with self._lock:
            session = self._live(session_id)
            if session is None:
                return False
            if session.summary_version != expected_version:
                # this very summary already committed (as commit_summary.lua): still committed
                return (
                    session.summary_version == summary.version
                    and session.summary == summary.model_dump_json()
                )
            if summary.covers_to > len(session.records) or summary.version != expected_version + 1:
                return False
            session.summary = summary.model_dump_json()
            session.summary_version = summary.version
            session.changed()
            return True

    def add_audit(
        self, session_id: str, record: Mapping[str, Any], retention: int, ttl: int = 0
    ) -> int:
        """Append an audit record; request records get the next turn number (returned)."""
        check_store_args(record=record, ints={"retention": retention, "ttl": ttl})
        with self._lock:
            session = self._live(session_id)
            if session is None:
                return 0
            raw = encode_audit(with_rid(record))
            rid = audit_rid(raw)
            if rid is not None and rid in session.audit_rids:  # written already: a retry
                return session.audit_rids[rid]
            turn = 0
            if raw.startswith(REQUEST_RECORD_HEAD):
                session.turns += 1
                turn = session.turns
                raw = f'{{"turn":{turn},' + raw[len(REQUEST_RECORD_HEAD) :]
            session.audit.append(raw)
            if rid is not None:
                session.audit_rids[rid] = turn
            if retention > 0 and len(session.audit) > retention:
                dropped = len(session.audit) - retention
                for old in session.audit[:dropped]:
                    session.audit_rids.pop(audit_rid(old) or "", None)
                del session.audit[:dropped]
            self._touch(session, WriteOptions(ttl_seconds=ttl or None))
            return turn

    def _audit_turn(self, session_id: str, write: RecordWrite | None) -> int | None:
        """The turn of ``write``'s audit record if it is in the trail already, else None."""
        if write is None or write.audit is None:
            return None
        session = self._live(session_id)
        rid = write.audit.get("rid")
        if session is None or not isinstance(rid, str):
            return None
        return session.audit_rids.get(rid)

    def record(self, session_id: str, write: RecordWrite) -> int:
        check_store_args(write=write)
        if write is None:
            raise InvalidInputError("write must be a RecordWrite, got None")
        with self._lock:
            if write.counts and write.counter:
                self.set_token_counts(session_id, write.counter, write.counts)
            if write.audit is None:
                return 0
            return self.add_audit(session_id, write.audit, write.retention, write.ttl)

    def append_with_audit(
        self,
        session_id: str,
        messages: Sequence[NewMessage],
        options: WriteOptions,
        write: RecordWrite,
    ) -> AppendResult:
        check_store_args(new=messages, options=options, write=write)
        if write is None:
            raise InvalidInputError("write must be a RecordWrite, got None")
        with self._lock:
            result = self.append(session_id, messages, options)
            self.record(session_id, write)
            return result

    def read_audit(self, session_id: str) -> list[dict[str, Any]]:
        with self._lock:
            session = self._live(session_id)
            raw = [] if session is None else list(session.audit)
        return [decode_audit(session_id, i, r) for i, r in enumerate(raw)]

    def inspect(self, session_id: str) -> RawSession | None:
        """The session's state laid out as its Redis keys (see :mod:`.integrity`)."""
        with self._lock:
            session = self._live(session_id)
            return None if session is None else _raw(session)

    def repair(self, session_id: str, plan: RepairPlan, record: Mapping[str, Any]) -> bool:
        """Apply ``plan`` and add ``record`` if the session is as inspected; False if not."""
        with self._lock:
            session = self._live(session_id)
            if session is None or _raw(session).fingerprint != plan.fingerprint:
                return False
            counts = _Counts()
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
            return True

    def close(self) -> None:
        """Nothing to release; present so every store closes the same way."""


def _raw(session: _Session) -> RawSession:
    """A session as its keys would hold it; the fingerprint covers all of it."""
    meta = {
        "created": str(session.created_ms),
        "updated": str(session.updated_ms),
        "count": str(len(session.records)),
        "tokens": str(session.tokens.total),
        "sumver": str(session.summary_version),
        "turns": str(session.turns),
        "ver": str(session.version),
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


def _drop_tail(session: _Session, keep: int) -> None:
    """Forget positions ``keep`` and later, as retract.lua does."""
    del session.records[keep:]
    session.tokens.truncate(keep)
    session.ids = {k: v for k, v in session.ids.items() if v < keep}
    session.pins = [p for p in session.pins if p < keep]
    summary = decode_summary("", session.summary) if session.summary else None
    if summary is not None and summary.covers_to > keep:
        session.summary = None


def _empty_window(session_id: str) -> WindowFetch:
    now = ms_to_datetime(_now_ms())
    info = SessionInfo(session_id, 0, 0, None, now, now, None, 0)
    return WindowFetch(info, (), (), None, True, None)


class AsyncMemoryStore:
    """``async`` face of :class:`MemoryStore`; the same state and logic."""

    def __init__(
        self, namespace: str = "ctxg", tenant: str = "default", *, sync: MemoryStore | None = None
    ) -> None:
        self.sync = sync or MemoryStore(namespace, tenant)

    async def append(
        self,
        session_id: str,
        messages: Sequence[NewMessage],
        options: WriteOptions = WriteOptions(),  # noqa: B008
    ) -> AppendResult:
        return self.sync.append(session_id, messages, options)

    async def read(
        self, session_id: str, start: int = 0, stop: int | None = None
    ) -> list[StoredMessage]:
        return self.sync.read(session_id, start, stop)

    async def read_last(self, session_id: str, count: int) -> list[StoredMessage]:
        return self.sync.read_last(session_id, count)

    async def info(self, session_id: str) -> SessionInfo | None:
        return self.sync.info(session_id)

    async def delete(self, session_id: str) -> bool:
        return self.sync.delete(session_id)

    async def list_sessions(self, prefix: str = "") -> AsyncIterator[str]:
        for name in self.sync.list_sessions(prefix):
            yield name

    async def fetch_window(
        self,
        session_id: str,
        budget: int,
        options: WriteOptions = WriteOptions(),  # noqa: B008
        new: Sequence[NewMessage] = (),
        min_messages: int = 0,
    ) -> WindowFetch:
        return self.sync.fetch_window(session_id, budget, options, new, min_messages)

    async def commit_if_unchanged(
        self,
        session_id: str,
        token: str,
        budget: int,
        options: WriteOptions,
        new: Sequence[NewMessage],
        min_messages: int,
        write: RecordWrite | None,
    ) -> WindowHit | WindowFetch:
        return self.sync.commit_if_unchanged(
            session_id, token, budget, options, new, min_messages, write
        )

    async def set_token_counts(
        self, session_id: str, counter: str, counts: Mapping[int, int]
    ) -> None:
        self.sync.set_token_counts(session_id, counter, counts)

    async def get_summary(self, session_id: str) -> Summary | None:
        return self.sync.get_summary(session_id)

    async def retract(
        self, session_id: str, count: int = 1, expected_count: int | None = None, ttl: int = 0
    ) -> list[StoredMessage]:
        return self.sync.retract(session_id, count, expected_count, ttl)

    async def restore(
        self,
        session_id: str,
        turns: int,
        summary: Summary | None,
        ttl: int = 0,
        *,
        created_at: datetime | None = None,
    ) -> tuple[int, int]:
        return self.sync.restore(session_id, turns, summary, ttl, created_at=created_at)

    async def commit_summary(
        self, session_id: str, summary: Summary, expected_version: int
    ) -> bool:
        return self.sync.commit_summary(session_id, summary, expected_version)

    async def add_audit(
        self, session_id: str, record: Mapping[str, Any], retention: int, ttl: int = 0
    ) -> int:
        return self.sync.add_audit(session_id, record, retention, ttl)

    async def read_audit(self, session_id: str) -> list[dict[str, Any]]:
        return self.sync.read_audit(session_id)

    async def record(self, session_id: str, write: RecordWrite) -> int:
        return self.sync.record(session_id, write)

    async def append_with_audit(
        self,
        session_id: str,
        messages: Sequence[NewMessage],
        options: WriteOptions,
        write: RecordWrite,
    ) -> AppendResult:
        return self.sync.append_with_audit(session_id, messages, options, write)

    async def inspect(self, session_id: str) -> RawSession | None:
        return self.sync.inspect(session_id)

    async def repair(self, session_id: str, plan: RepairPlan, record: Mapping[str, Any]) -> bool:
        return self.sync.repair(session_id, plan, record)

    async def close(self) -> None:
        self.sync.close()
