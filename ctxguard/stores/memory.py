"""The in-process store: zero setup, the default, and the reference semantics.

Everything lives in one dict guarded by one lock, so each operation is atomic
for every thread of the process, as a Lua script is on Redis. Nothing survives
the process. :class:`AsyncMemoryStore` (``memory_async.py``, re-exported here) is
the same object behind ``async def``: there is no I/O to wait for. The session's
data and the walks every operation shares are in ``memory_session.py``.
What stays here (~590 lines) is one method per operation, each atomic under the
one lock as its Lua script is on Redis.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from ctxguard._nocopy import NotCopyable
from ctxguard._validate import (
    check_count,
    check_prefix,
    check_range,
    check_state_arg,
    check_store_args,
    check_tail_args,
    show,
)
from ctxguard.errors import (
    ConflictError,
    CorruptRecordError,
    InvalidInputError,
    InvalidMessageError,
    SessionFullError,
)
from ctxguard.ids import validate_id, validate_name
from ctxguard.stores.base import (
    REQUEST_RECORD_HEAD,
    AppendResult,
    NewMessage,
    RecordWrite,
    ReplaceResult,
    SessionInfo,
    StoredMessage,
    Summary,
    WindowFetch,
    WindowHit,
    WriteOptions,
    audit_rid,
    check_window_args,
    decode_audits,
    decode_summary,
    encode_audit,
    stored_before,
    with_rid,
)
from ctxguard.stores.integrity import RawSession, RepairPlan
from ctxguard.stores.leases import MemoryLeases
from ctxguard.stores.memory_async import MEMORY_ADVICE, MEMORY_HOLDS, AsyncMemoryStore
from ctxguard.stores.memory_session import (
    Session,
    apply_repair,
    check_reused,
    datetime_ms,
    drop_tail,
    now_ms,
    raw_session,
    session_info,
    session_window,
    stored_message,
)


class MemoryStore(NotCopyable):
    """In-process session store (``memory://``). Thread-safe. Not copyable nor
    picklable (a copy would be another store): open its URL again in this process."""

    _holds = MEMORY_HOLDS
    _advice = MEMORY_ADVICE

    def __init__(self, namespace: str = "ctxg", tenant: str = "default") -> None:
        # checked as a Redis store checks them (what it reports as its namespace and tenant)
        self.namespace = validate_name(namespace, "namespace")
        self.tenant = validate_name(tenant, "tenant")
        self._sessions: dict[str, Session] = {}
        self._lock = threading.RLock()
        self._leases = MemoryLeases()

    # -- helpers -------------------------------------------------------------

    def _live(self, session_id: str, stored: bool = False) -> Session | None:
        """The session, None if there is none or it expired. ``stored``: a read or delete
        of what is stored, the id held to the older rule (see ``KeySpace.session_keys``)."""
        validate_id(session_id, "session id", stored=stored)
        session = self._sessions.get(session_id)
        expires = None if session is None else session.expires_at
        if expires is not None and expires <= time.monotonic():
            del self._sessions[session_id]
            return None
        return session

    def _for_write(self, session_id: str, options: WriteOptions) -> Session:
        session = self._live(session_id)
        if session is None:
            now = now_ms()
            session = self._sessions.setdefault(session_id, Session(now, now))
        if options.counter and session.counter != options.counter:
            session.counter = options.counter
            session.tokens.forget()
            session.changed()
        return session

    @staticmethod
    def _touch(session: Session, options: WriteOptions) -> None:
        session.updated_ms = now_ms()
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
    ) -> tuple[Session, AppendResult]:
        """Cap check, create or switch counter, append (the lock is held)."""
        self._check_cap(session_id, messages, options)
        found = self._live(session_id)
        check_reused(session_id, found, messages)  # before anything is written
        before = None if found is None else found.state_token
        session = self._for_write(session_id, options)
        return session, self._append_locked(session, messages, options, before)

    def _append_locked(
        self,
        session: Session,
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
            session = self._live(session_id, stored=True)
            if session is None:
                return []
            seqs = range(len(session.records))[start:stop]
            return [stored_message(session_id, session, seq) for seq in seqs]

    def read_with_token(
        self, session_id: str, start: int = 0, stop: int | None = None
    ) -> tuple[list[StoredMessage], str]:
        """:meth:`read` and the session's state token ('' = no session), together."""
        check_range(start, stop)
        with self._lock:
            session = self._live(session_id, stored=True)
            if session is None:
                return [], ""
            seqs = range(len(session.records))[start:stop]
            found = [stored_message(session_id, session, seq) for seq in seqs]
            return found, session.state_token

    def read_last(self, session_id: str, count: int) -> list[StoredMessage]:
        check_count(count, "count")
        with self._lock:
            session = self._live(session_id, stored=True)
            if session is None or count == 0:
                return []
            first = max(0, len(session.records) - count)
            return [
                stored_message(session_id, session, s) for s in range(first, len(session.records))
            ]

    def state_token(self, session_id: str) -> str:
        """The session's state token ('' = no session), as a commit would check it."""
        with self._lock:
            session = self._live(session_id, stored=True)
            return "" if session is None else session.state_token

    def info(self, session_id: str) -> SessionInfo | None:
        with self._lock:
            session = self._live(session_id, stored=True)
            return None if session is None else session_info(session_id, session)

    def delete(self, session_id: str) -> bool:
        with self._lock:
            existed = self._live(session_id, stored=True) is not None
            self._sessions.pop(session_id, None)
            self._leases.drop(session_id)  # (under the store's lock: one step)
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
            return session_window(session_id, session, budget, options, min_messages, new)

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
        raw = _audit_raw(write)  # a refused record (a NaN) before anything is written
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
                check_reused(session_id, session, new)  # before the retry's answer
                # as window.lua: a commit whose audit record is already written (a retry
                # after a lost reply) is a hit, with the turn its first attempt was given
                turn = self._audit_turn(session_id, write)
                if turn is not None:
                    count = 0 if session is None else len(session.records)
                    return WindowHit(AppendResult(tuple(ids), (), count), turn, "")
                return session_window(session_id, session, budget, options, min_messages, new)
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
                if raw is not None:
                    turn = self._add_raw(session_id, raw, write.retention, write.ttl)
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
            session = self._live(session_id, stored=True)
            return None if session is None else decode_summary(session_id, session.summary)

    def retract(
        self,
        session_id: str,
        count: int = 1,
        expected_count: int | None = None,
        ttl: int = 0,
        expected_state: str | None = None,
    ) -> list[StoredMessage]:
        """Remove the newest ``count`` messages (explicit deletion, audited); returns them."""
        if not isinstance(count, int) or count < 0:
            raise InvalidInputError(f"count must be a non-negative int, got {show(count)}")
        check_store_args(ints={"expected_count": expected_count, "ttl": ttl})
        check_state_arg(expected_state)
        with self._lock:
            session = self._live(session_id)
            if session is None:
                _check_state(session_id, None, expected_state)
                return []
            if expected_count is not None and expected_count != len(session.records):
                raise ConflictError(
                    f"session {session_id!r} now holds {len(session.records)} messages, not the "
                    "expected count; read it again and retry"
                )
            _check_state(session_id, session, expected_state)
            keep = len(session.records) - min(count, len(session.records))
            removed = [
                stored_message(session_id, session, s) for s in range(keep, len(session.records))
            ]
            if not removed:  # as retract.lua: nothing removed, nothing recorded
                return []
            drop_tail(session, keep)
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

    def replace_tail(
        self,
        session_id: str,
        start: int,
        messages: Sequence[NewMessage],
        expected_count: int | None = None,
        options: WriteOptions = WriteOptions(),  # noqa: B008
        expected_state: str | None = None,
    ) -> ReplaceResult:
        """Messages ``start`` and later replaced by ``messages`` (as replace.lua): every
        check first, then the removal (as :meth:`retract`) and the append, under the lock."""
        check_tail_args(start, expected_count)
        check_store_args(new=messages, options=options)
        check_state_arg(expected_state)
        with self._lock:
            session = self._live(session_id)
            held = 0 if session is None else len(session.records)
            if start > held or expected_count not in (None, held):
                raise ConflictError(
                    f"session {session_id!r} now holds {held} messages, not the expected "
                    "count; read it again and retry"
                )
            _check_state(session_id, session, expected_state)
            ids = {} if session is None else session.ids
            fresh = {n.message.id for n in messages}
            for msg_id in fresh:
                if ids.get(msg_id, start) < start:
                    raise InvalidMessageError(stored_before(msg_id, ids[msg_id]))
            cap = options.max_messages
            if cap and messages and start + len(fresh) > cap:
                raise SessionFullError(session_id, held)
            removed: tuple[StoredMessage, ...] = ()
            before = None
            if session is not None:  # (None: start is 0, nothing to remove)
                removed = tuple(stored_message(session_id, session, s) for s in range(start, held))
                before = session.state_token
            if not removed and not messages:
                return ReplaceResult((), AppendResult((), (), held, before, before))
            if session is not None and removed:
                drop_tail(session, start)
                session.changed()
            session = self._for_write(session_id, options)
            appended = self._append_locked(session, messages, options, before)
            if removed:
                record = {
                    "kind": "replace",
                    "at": datetime.now(UTC).isoformat(),
                    "start": start,
                    "count": len(removed),
                    "ids": [r.message.id for r in removed],
                    "stored": list(appended.stored),
                }
                session.audit.append(encode_audit(record))
            return ReplaceResult(removed, appended)

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
                session.created_ms = min(session.created_ms, datetime_ms(created_at))
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
        raw = encode_audit(with_rid(record))
        with self._lock:
            return self._add_raw(session_id, raw, retention, ttl)

    def _add_raw(self, session_id: str, raw: str, retention: int, ttl: int) -> int:
        """add_audit of an encoded record (the lock is held)."""
        session = self._live(session_id)
        if session is None:
            return 0
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
        raw = _audit_raw(write)
        with self._lock:
            return self._record(session_id, write, raw)

    def _record(self, session_id: str, write: RecordWrite, raw: str | None) -> int:
        if write.counts and write.counter:
            self.set_token_counts(session_id, write.counter, write.counts)
        return 0 if raw is None else self._add_raw(session_id, raw, write.retention, write.ttl)

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
        raw = _audit_raw(write)
        with self._lock:
            result = self.append(session_id, messages, options)
            self._record(session_id, write, raw)
            session = self._live(session_id)
            if write.counts and write.counter and session is not None:
                # the token after is the one the recounts left (as append.lua answers)
                result = dataclasses.replace(result, token_after=session.state_token)
            return result

    def read_audit(
        self, session_id: str, *, damaged: list[CorruptRecordError] | None = None
    ) -> list[dict[str, Any]]:
        with self._lock:
            session = self._live(session_id, stored=True)
            raw = [] if session is None else list(session.audit)
        return decode_audits(session_id, raw, damaged)

    def inspect(self, session_id: str) -> RawSession | None:
        """The session's state laid out as its Redis keys (see :mod:`.integrity`)."""
        with self._lock:
            session = self._live(session_id, stored=True)
            return None if session is None else raw_session(session)

    def repair(self, session_id: str, plan: RepairPlan, record: Mapping[str, Any]) -> bool:
        """Apply ``plan`` and add ``record`` if the session is as inspected; False if not."""
        with self._lock:
            session = self._live(session_id)
            if session is None or raw_session(session).fingerprint != plan.fingerprint:
                return False
            apply_repair(session, plan, record)
            return True

    def acquire_lease(self, session_id: str, name: str, holder: str, seconds: float) -> bool:
        """Take or renew the lease on ``name`` (see :mod:`.leases`); False if another holds it."""
        return self._leases.acquire(session_id, name, holder, seconds)

    def release_lease(self, session_id: str, name: str, holder: str) -> bool:
        return self._leases.release(session_id, name, holder)

    def close(self) -> None:
        """Nothing to release; present so every store closes the same way."""


def _check_state(session_id: str, session: Session | None, expected: str | None) -> None:
    """A rewrite's expected state token (None: no check; '' = no session), as
    ``state_holds`` in _lib.lua: a mismatch writes nothing."""
    if expected is not None and expected != ("" if session is None else session.state_token):
        raise ConflictError(
            f"session {session_id!r} was written since it was read (its state token moved "
            "on); read it again and retry"
        )


def _audit_raw(write: RecordWrite | None) -> str | None:
    """``write``'s audit record encoded (refused if it cannot be), before any write."""
    return None if write is None or write.audit is None else encode_audit(with_rid(write.audit))


__all__ = ["AsyncMemoryStore", "MemoryStore"]
