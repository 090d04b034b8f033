"""``async`` face of the in-process store: the same object behind ``async def``.

There is no I/O to wait for, so each method calls :class:`~ctxguard.stores.memory.MemoryStore`.
Imported as ``from ctxguard.stores.memory import AsyncMemoryStore``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from ctxguard._nocopy import NotCopyable
from ctxguard.errors import CorruptRecordError
from ctxguard.stores.base import (
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
)
from ctxguard.stores.integrity import RawSession, RepairPlan

if TYPE_CHECKING:
    from ctxguard.stores.memory import MemoryStore


# what a memory store says when copied or pickled (a copy would be another store)
MEMORY_HOLDS = "this process's in-memory sessions"
MEMORY_ADVICE = (
    "open the same memory:// URL again in this process (no other process can see its "
    "sessions: use a redis:// store to share them)"
)


class AsyncMemoryStore(NotCopyable):
    """``async`` face of :class:`MemoryStore`; the same state and logic."""

    _holds = MEMORY_HOLDS
    _advice = MEMORY_ADVICE

    def __init__(
        self, namespace: str = "ctxg", tenant: str = "default", *, sync: MemoryStore | None = None
    ) -> None:
        from ctxguard.stores.memory import MemoryStore  # it re-exports this class

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

    async def read_with_token(
        self, session_id: str, start: int = 0, stop: int | None = None
    ) -> tuple[list[StoredMessage], str]:
        return self.sync.read_with_token(session_id, start, stop)

    async def state_token(self, session_id: str) -> str:
        return self.sync.state_token(session_id)

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
        self,
        session_id: str,
        count: int = 1,
        expected_count: int | None = None,
        ttl: int = 0,
        expected_state: str | None = None,
    ) -> list[StoredMessage]:
        return self.sync.retract(
            session_id, count, expected_count, ttl, expected_state=expected_state
        )

    async def replace_tail(
        self,
        session_id: str,
        start: int,
        messages: Sequence[NewMessage],
        expected_count: int | None = None,
        options: WriteOptions = WriteOptions(),  # noqa: B008
        expected_state: str | None = None,
    ) -> ReplaceResult:
        return self.sync.replace_tail(
            session_id, start, messages, expected_count, options, expected_state=expected_state
        )

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

    async def read_audit(
        self, session_id: str, *, damaged: list[CorruptRecordError] | None = None
    ) -> list[dict[str, Any]]:
        return self.sync.read_audit(session_id, damaged=damaged)

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

    async def acquire_lease(self, session_id: str, name: str, holder: str, seconds: float) -> bool:
        return self.sync.acquire_lease(session_id, name, holder, seconds)

    async def release_lease(self, session_id: str, name: str, holder: str) -> bool:
        return self.sync.release_lease(session_id, name, holder)

    async def close(self) -> None:
        self.sync.close()
