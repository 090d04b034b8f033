"""The store contract: what every session store (memory, Redis, Redis Cluster) does.

A store keeps, per session: the ordered raw history (never destroyed by
trimming), one token count per message tagged by the counter that produced it,
the positions of pinned (system/developer) messages, a rolling summary with a
version for compare-and-set, and a capped list of audit records. Sync and async
stores have the same methods; :func:`ctxguard.stores.open_store` picks one by URL.

Positions (``seq``) count from 0 in append order and never change.

Kept whole past ~400 lines on purpose: it is the one contract every backend answers
to, its sync and async halves side by side so that they cannot drift apart.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol, runtime_checkable

import pydantic

from ctxguard._frozen import fast_init
from ctxguard.errors import CorruptRecordError
from ctxguard.messages import Message

UNKNOWN_TOKENS = -1


@fast_init
@dataclass(frozen=True, slots=True)
class StoredMessage:
    """A message as stored: its position, and its token count (if known)."""

    seq: int
    message: Message
    tokens: int | None = None


@fast_init
@dataclass(frozen=True, slots=True)
class AppendResult:
    """What an append did. Retried ids land in ``duplicates`` and store nothing."""

    stored: tuple[str, ...]
    duplicates: tuple[str, ...]
    message_count: int
    # The session's state token before and after the append (see WindowFetch.token);
    # a cached window is extended only when ``token_before`` is the one it holds.
    token_before: str | None = field(default=None, compare=False)
    token_after: str | None = field(default=None, compare=False)

    @property
    def all_duplicates(self) -> bool:
        return not self.stored and bool(self.duplicates)


@fast_init
@dataclass(frozen=True, slots=True)
class ReplaceResult:
    """What a :meth:`~SessionStore.replace_tail` did, in one atomic step: the messages it
    removed (oldest first, with their positions and counts) and the append that followed."""

    removed: tuple[StoredMessage, ...]
    appended: AppendResult


def stored_before(msg_id: str, seq: int) -> str:
    """Why a replace refused a batch: one of its ids names a message the replace keeps."""
    return (
        f"message id {msg_id!r} is stored at position {seq}, before the messages being "
        "replaced; give the new message another id (nothing was written)"
    )


@fast_init
@dataclass(frozen=True, slots=True)
class SessionInfo:
    """A session's metadata, readable without reading its messages."""

    session_id: str
    message_count: int
    token_total: int
    counter: str | None
    created_at: datetime
    updated_at: datetime
    ttl_seconds: float | None
    summary_version: int
    audit_count: int = 0


class Summary(pydantic.BaseModel):
    """A rolling summary that stands for messages ``[0, covers_to)``.

    ``from_id``/``to_id`` name the first and last message it covers so an audit
    can show the id range; ``version`` increases by one per commit.
    """

    model_config = pydantic.ConfigDict(frozen=True)

    version: int
    text: str
    covers_to: int
    from_id: str | None = None
    to_id: str | None = None
    tokens: int | None = None
    counter: str | None = None
    created_at: datetime = pydantic.Field(default_factory=lambda: datetime.now(UTC))


@fast_init
@dataclass(frozen=True, slots=True)
class WindowFetch:
    """Everything one prepare needs, fetched in one round trip.

    A fetch never writes. Given new messages, it answers as if they were
    appended at the end of the history (an id already stored, or repeated in the
    batch, is not appended twice): ``recent`` and ``pinned`` may hold them with
    the positions they would get, ``info`` counts them, and ``appended`` says
    which would be stored (``stored``) and which are there already
    (``duplicates``); its ``token_after`` is None. :meth:`commit_if_unchanged`
    with ``token`` then stores them, if the session is still in that state.

    ``recent`` holds the newest messages, oldest first, walking back until their
    stored token counts exceed the requested budget (unknown counts are
    under-estimated so the walk fetches enough); ``reached_start`` says whether
    it reached the oldest message. ``pinned`` holds pinned messages older than
    ``recent``.

    ``token`` names the session's state after the fetch: every change to what
    a window can hold (messages, counts, counter, summary) gives a new one, so a
    guard that cached this fetch can later ask the store to commit a request
    planned on it only if the token still holds (:meth:`commit_if_unchanged`).
    ``stop_tokens`` is the stored count of the message just older than
    ``recent`` (the one that stopped the walk), or None when there is none or it
    is unknown: with it the walk can be re-run on a cached copy exactly.
    """

    info: SessionInfo
    pinned: tuple[StoredMessage, ...]
    recent: tuple[StoredMessage, ...]
    summary: Summary | None
    reached_start: bool
    appended: AppendResult | None = None
    token: str | None = field(default=None, compare=False)
    stop_tokens: int | None = field(default=None, compare=False)


@fast_init
@dataclass(frozen=True, slots=True)
class WindowHit:
    """:meth:`commit_if_unchanged` found the session as the caller's token says.

    The new messages were appended and the audit record (if any) written, in
    the same atomic step; ``turn`` is the record's number (0 without one) and
    ``token`` the session's state token afterwards.
    """

    appended: AppendResult
    turn: int
    token: str


@fast_init
@dataclass(frozen=True, slots=True)
class NewMessage:
    """A message ready to append: its record and (optionally) its token count."""

    message: Message
    tokens: int | None = None
    record: str = field(default="", compare=False)

    def encoded(self) -> str:
        return self.record or self.message.to_record()


@dataclass(frozen=True, slots=True)
class WriteOptions:
    """Per-write settings shared by every mutating operation."""

    counter: str | None = None
    ttl_seconds: int | None = None
    max_messages: int | None = None


@fast_init
@dataclass(frozen=True, slots=True)
class RecordWrite:
    """What a prepare writes back: lazily recounted tokens and/or one audit record."""

    counter: str | None = None
    counts: Mapping[int, int] = field(default_factory=dict)
    audit: Mapping[str, Any] | None = None
    retention: int = 0
    ttl: int = 0


@runtime_checkable
class SessionStore(Protocol):
    """Synchronous session store."""

    def append(
        self,
        session_id: str,
        messages: Sequence[NewMessage],
        options: WriteOptions = ...,
    ) -> AppendResult: ...
    def read(
        self, session_id: str, start: int = 0, stop: int | None = None
    ) -> list[StoredMessage]: ...
    def read_with_token(
        self, session_id: str, start: int = 0, stop: int | None = None
    ) -> tuple[list[StoredMessage], str]:
        """:meth:`read`, and the session's state token at that read ('' = no session),
        in one atomic step: what a rewrite based on the read passes as ``expected_state``
        to :meth:`retract` or :meth:`replace_tail`."""
        ...

    def read_last(self, session_id: str, count: int) -> list[StoredMessage]: ...
    def info(self, session_id: str) -> SessionInfo | None: ...
    def delete(self, session_id: str) -> bool: ...
    def list_sessions(self, prefix: str = "") -> Iterator[str]: ...
    def fetch_window(
        self,
        session_id: str,
        budget: int,
        options: WriteOptions = ...,
        new: Sequence[NewMessage] = (),
        min_messages: int = 0,
    ) -> WindowFetch: ...
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
        """Commit a request planned on a cached window, if the session is unchanged.

        When the session's state token is ``token`` and no id of ``new`` is
        stored yet, append ``new`` and write ``write`` (its audit record) in
        one atomic step and return a :class:`WindowHit`. Otherwise do exactly
        what :meth:`fetch_window` does with the same arguments (``write`` is
        not applied) and return its :class:`WindowFetch`, to plan again on;
        except when ``write``'s audit record (by its ``rid``) is already in
        the trail: the call is a repeat of one that committed, and answers a
        :class:`WindowHit` with that record's turn and an empty token.
        """
        ...

    def set_token_counts(
        self, session_id: str, counter: str, counts: Mapping[int, int]
    ) -> None: ...
    def get_summary(self, session_id: str) -> Summary | None: ...
    def commit_summary(self, session_id: str, summary: Summary, expected_version: int) -> bool: ...
    def retract(
        self,
        session_id: str,
        count: int = 1,
        expected_count: int | None = None,
        ttl: int = 0,
        expected_state: str | None = None,
    ) -> list[StoredMessage]:
        """Remove the newest ``count`` messages (explicit deletion, audited in a
        ``retract`` record of their ids) and return them, oldest first.

        Refused with ConflictError, nothing written: the session does not hold
        ``expected_count`` messages, or its state token is not ``expected_state`` (the
        one :meth:`read_with_token` returned, '' for no session). The count alone misses
        a writer that removed k messages and appended k others since the caller read:
        a caller that chose what to remove from a read passes that read's token. Refused
        with CorruptRecordError, nothing written: a message to remove does not decode as
        a record (a record that is JSON with an id but not a message this version reads,
        a newer ctxguard's, is removed and returned unvalidated, flagged
        ``metadata["ctxguard_undecodable"]``: the write is never followed by an error)."""
        ...

    def replace_tail(
        self,
        session_id: str,
        start: int,
        messages: Sequence[NewMessage],
        expected_count: int | None = None,
        options: WriteOptions = ...,
        expected_state: str | None = None,
    ) -> ReplaceResult:
        """Remove messages ``start`` and later (0: all) and append ``messages`` in their
        place, in one atomic step: a reader sees the history before or after, never
        between. Removing is as :meth:`retract` (their ids freed, their pins and a summary
        covering one of them dropped; a record that does not decode refused, one this
        version cannot read returned flagged); the turn counter and the audit trail are
        kept, and when something was removed a ``replace`` record names the removed and
        the stored ids. Refused, with nothing written: fewer than ``start`` messages, not
        ``expected_count``, or not the state token ``expected_state`` (ConflictError; see
        :meth:`retract`); an id of ``messages`` stored before ``start``
        (InvalidMessageError); more than ``options.max_messages`` after
        (SessionFullError)."""
        ...

    def restore(
        self,
        session_id: str,
        turns: int,
        summary: Summary | None,
        ttl: int = 0,
        *,
        created_at: datetime | None = None,
    ) -> tuple[int, int]: ...
    def add_audit(
        self, session_id: str, record: Mapping[str, Any], retention: int, ttl: int = 0
    ) -> int:
        """Append ``record`` (given a ``rid`` by :func:`with_rid`), keeping the newest
        ``retention``; a request record gets the next turn (returned). A record whose
        rid is in the trail already is not written again: its turn is returned."""
        ...

    def read_audit(
        self, session_id: str, *, damaged: list[CorruptRecordError] | None = None
    ) -> list[dict[str, Any]]:
        """The trail, oldest first; an undecodable record raises
        :class:`CorruptRecordError`, or, when ``damaged`` is a list, is put there and
        left out."""
        ...

    def record(self, session_id: str, write: RecordWrite) -> int: ...
    def append_with_audit(
        self,
        session_id: str,
        messages: Sequence[NewMessage],
        options: WriteOptions,
        write: RecordWrite,
    ) -> AppendResult: ...
    def acquire_lease(self, session_id: str, name: str, holder: str, seconds: float) -> bool:
        """Take the lease on ``name`` in the session for ``seconds`` (or renew ``holder``'s
        own); False while another holder's lease lasts (see :mod:`ctxguard.stores.leases`)."""
        ...

    def release_lease(self, session_id: str, name: str, holder: str) -> bool:
        """Give back ``holder``'s lease; False if it expired or was taken over."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class AsyncSessionStore(Protocol):
    """Asynchronous session store: the same methods as :class:`SessionStore`."""

    async def append(
        self,
        session_id: str,
        messages: Sequence[NewMessage],
        options: WriteOptions = ...,
    ) -> AppendResult: ...
    async def read(
        self, session_id: str, start: int = 0, stop: int | None = None
    ) -> list[StoredMessage]: ...
    async def read_with_token(
        self, session_id: str, start: int = 0, stop: int | None = None
    ) -> tuple[list[StoredMessage], str]: ...
    async def read_last(self, session_id: str, count: int) -> list[StoredMessage]: ...
    async def info(self, session_id: str) -> SessionInfo | None: ...
    async def delete(self, session_id: str) -> bool: ...
    def list_sessions(self, prefix: str = "") -> AsyncIterator[str]: ...
    async def fetch_window(
        self,
        session_id: str,
        budget: int,
        options: WriteOptions = ...,
        new: Sequence[NewMessage] = (),
        min_messages: int = 0,
    ) -> WindowFetch: ...
    async def commit_if_unchanged(
        self,
        session_id: str,
        token: str,
        budget: int,
        options: WriteOptions,
        new: Sequence[NewMessage],
        min_messages: int,
        write: RecordWrite | None,
    ) -> WindowHit | WindowFetch: ...
    async def set_token_counts(
        self, session_id: str, counter: str, counts: Mapping[int, int]
    ) -> None: ...
    async def get_summary(self, session_id: str) -> Summary | None: ...
    async def commit_summary(
        self, session_id: str, summary: Summary, expected_version: int
    ) -> bool: ...
    async def retract(
        self,
        session_id: str,
        count: int = 1,
        expected_count: int | None = None,
        ttl: int = 0,
        expected_state: str | None = None,
    ) -> list[StoredMessage]: ...
    async def replace_tail(
        self,
        session_id: str,
        start: int,
        messages: Sequence[NewMessage],
        expected_count: int | None = None,
        options: WriteOptions = ...,
        expected_state: str | None = None,
    ) -> ReplaceResult: ...
    async def restore(
        self,
        session_id: str,
        turns: int,
        summary: Summary | None,
        ttl: int = 0,
        *,
        created_at: datetime | None = None,
    ) -> tuple[int, int]: ...
    async def add_audit(
        self, session_id: str, record: Mapping[str, Any], retention: int, ttl: int = 0
    ) -> int: ...
    async def read_audit(
        self, session_id: str, *, damaged: list[CorruptRecordError] | None = None
    ) -> list[dict[str, Any]]: ...
    async def record(self, session_id: str, write: RecordWrite) -> int: ...
    async def append_with_audit(
        self,
        session_id: str,
        messages: Sequence[NewMessage],
        options: WriteOptions,
        write: RecordWrite,
    ) -> AppendResult: ...
    async def acquire_lease(
        self, session_id: str, name: str, holder: str, seconds: float
    ) -> bool: ...
    async def release_lease(self, session_id: str, name: str, holder: str) -> bool: ...
    async def close(self) -> None: ...
