"""One session read in full, tolerating undecodable records.

``show``, ``audit``, ``replay``, ``report`` and ``export`` all need the same
picture of a session. An operator inspecting a damaged session must still see
everything that decodes, so a bad record becomes an entry in ``corrupt``
instead of aborting the read.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from ctxguard.cli.import_file import record_problem
from ctxguard.errors import CorruptRecordError, StoreConnectionError, StoreError
from ctxguard.guard.replay import summaries_from_audit
from ctxguard.guard.sent import SUMMARY_ID_PREFIX, sent_ids, sent_seqs
from ctxguard.stores.base import SessionInfo, SessionStore, StoredMessage, Summary
from ctxguard.stores.integrity import KeyProblem, RawSession, find_problems


@dataclass(frozen=True)
class Corrupt:
    """A record that does not decode: where it is and what the decoder said."""

    position: str
    detail: str


@dataclass
class Snapshot:
    """Everything the CLI knows about one session."""

    session_id: str
    info: SessionInfo
    messages: list[StoredMessage] = field(default_factory=list)
    summary: Summary | None = None
    audit: list[dict[str, Any]] = field(default_factory=list)
    corrupt: list[Corrupt] = field(default_factory=list)
    damaged_keys: list[KeyProblem] = field(default_factory=list)

    @property
    def corrupt_messages(self) -> list[Corrupt]:
        """Undecodable message records (their position is a number)."""
        return [c for c in self.corrupt if c.position.isdigit()]

    @property
    def requests(self) -> list[dict[str, Any]]:
        return [r for r in self.audit if r.get("kind") == "request"]

    @property
    def usages(self) -> list[dict[str, Any]]:
        return [r for r in self.audit if r.get("kind") == "usage"]

    def sent_ids(self, record: dict[str, Any]) -> list[str] | None:
        """The ids a request sent, rebuilt from the history; None if it changed since."""
        by_seq = {s.seq: s.message.id for s in self.messages}
        return sent_ids(record, by_seq.get)

    def summary_texts(self) -> dict[int, Summary]:
        """Every summary version whose text we know: the audit trail's, plus the current one."""
        found = summaries_from_audit(self.audit)
        if self.summary is not None:
            found[self.summary.version] = self.summary
        return found


def load_snapshot(store: SessionStore, session_id: str) -> Snapshot | None:
    """Read a whole session; None when it does not exist.

    A damaged key (found by the store's ``inspect``) may make a script refuse
    to read the session; that becomes a finding too, not a crash.
    """
    inspect = getattr(store, "inspect", None)
    raw: RawSession | None = inspect(session_id) if inspect is not None else None
    damaged = [] if raw is None else find_problems(session_id, raw)
    try:
        info = store.info(session_id)
    except CorruptRecordError as exc:
        if not damaged:
            raise
        info = _placeholder_info(session_id)
        damaged.append(KeyProblem("meta", f"cannot be read ({_detail(exc)})"))
    if info is None:
        return None
    snap = Snapshot(session_id, info, damaged_keys=damaged)
    try:
        snap.messages = read_messages(store, session_id, snap.corrupt)
    except StoreError as exc:
        if not damaged or isinstance(exc, StoreConnectionError):
            raise
        snap.corrupt.append(Corrupt("msgs", f"cannot be read until repaired ({_short(exc)})"))
    try:
        snap.summary = store.get_summary(session_id)
    except CorruptRecordError as exc:
        snap.corrupt.append(Corrupt("summary", _detail(exc)))
    except StoreError as exc:
        if not damaged or isinstance(exc, StoreConnectionError):
            raise
    damaged_audit: list[CorruptRecordError] = []
    try:
        audit = store.read_audit(session_id, damaged=damaged_audit)
        snap.audit = _typed_audit(audit, damaged_audit, snap.corrupt)
    except CorruptRecordError as exc:  # e.g. the ctx key: no record can be trusted
        snap.corrupt.append(Corrupt(str(exc.position), _detail(exc)))
    except StoreError as exc:
        if not damaged or isinstance(exc, StoreConnectionError):
            raise
        snap.corrupt.append(Corrupt("audit", f"cannot be read ({_short(exc)})"))
    return snap


def _placeholder_info(session_id: str) -> SessionInfo:
    zero = datetime.fromtimestamp(0, UTC)
    return SessionInfo(session_id, 0, 0, None, zero, zero, None, 0)


def _short(exc: Exception) -> str:
    return str(exc).split(": ", 1)[-1][:160]


def read_messages(
    store: SessionStore, session_id: str, corrupt: list[Corrupt]
) -> list[StoredMessage]:
    """Read in runs, stepping over each record that fails (its position is in the error)."""
    out: list[StoredMessage] = []
    start = 0
    while True:
        try:
            out += store.read(session_id, start)
            return out
        except CorruptRecordError as exc:
            if not isinstance(exc.position, int) or exc.position < start:
                raise
            out += store.read(session_id, start, exc.position)
            corrupt.append(Corrupt(str(exc.position), _detail(exc)))
            start = exc.position + 1


def _typed_audit(
    audit: list[dict[str, Any]], damaged: list[CorruptRecordError], corrupt: list[Corrupt]
) -> list[dict[str, Any]]:
    """The records that decode and whose fields have the types the commands compute
    with; each one that does not is in ``corrupt`` at its position in the trail."""
    skipped = {str(exc.position) for exc in damaged}
    corrupt += [Corrupt(str(exc.position), _detail(exc)) for exc in damaged]
    positions = (p for p in (f"audit {i}" for i in itertools.count()) if p not in skipped)
    out = []
    for record, position in zip(audit, positions, strict=False):
        problem = record_problem(record)
        if problem is None:
            out.append(record)
        else:
            corrupt.append(Corrupt(position, problem))
    return out


def _detail(exc: CorruptRecordError) -> str:
    text = str(exc)
    inner = text.split("does not decode (", 1)[-1]
    return inner.split("); it was written", 1)[0]


def dropped_ranges(record: dict[str, Any]) -> list[tuple[int, int]]:
    """The request's ``dropped`` ranges ``[a, b)`` without the messages it did send.

    The planner records the range of history left out of the window; pinned
    messages (the system prompt) inside that range were sent all the same and
    are not "dropped".
    """
    sent = set(sent_seqs(record))
    out: list[tuple[int, int]] = []
    for pair in record.get("dropped") or []:
        if not (isinstance(pair, list | tuple) and len(pair) == 2):
            continue
        a, b = pair
        if not (isinstance(a, int) and isinstance(b, int)):
            continue
        start = None
        for seq in range(a, b):
            if seq in sent:
                if start is not None:
                    out.append((start, seq))
                start = None
            elif start is None:
                start = seq
        if start is not None:
            out.append((start, b))
    return out


def format_ranges(ranges: list[tuple[int, int]]) -> str:
    return " ".join(f"[{a},{b})" for a, b in ranges)


def summary_version_of(message_id: str) -> int | None:
    """N for the id ``ctxguard-summary-vN`` the guard gives summary messages, else None."""
    if not message_id.startswith(SUMMARY_ID_PREFIX):
        return None
    tail = message_id[len(SUMMARY_ID_PREFIX) :]
    return int(tail) if tail.isdigit() else None


def require_snapshot(store: SessionStore, session_id: str) -> Snapshot:
    """The session's snapshot, or exit with "not found" (a typo should not look like success)."""
    from ctxguard.cli.common import EXIT_NOT_FOUND, fail

    snap = load_snapshot(store, session_id)
    if snap is None:
        fail(f"session {session_id!r} not found in this namespace/tenant", EXIT_NOT_FOUND)
    return snap
