"""A store wrapper for the adapters' one-write tests: every write logged, a reader after
each, a crash planted after the first (see test_atomic_rewrites.py)."""

from __future__ import annotations

import inspect
from typing import Any

WRITES = frozenset(
    {
        "append",
        "append_with_audit",
        "commit_if_unchanged",
        "delete",
        "retract",
        "replace_tail",
        "record",
        "add_audit",
        "set_token_counts",
        "commit_summary",
        "restore",
    }
)


class Crash(BaseException):
    """The process was killed: nothing after this point runs."""


class WatchedStore:
    """A store whose every write is logged (by method name); after each one a reader
    takes the session's ids, and from ``crash_after`` writes on the next write "crashes"
    (raises :class:`Crash` instead of writing)."""

    def __init__(self, inner: Any, session_id: str) -> None:
        self.inner = inner
        self.session_id = session_id
        self.writes: list[str] = []
        self.seen: list[list[str]] = []
        self.crash_after: int | None = None

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if name not in WRITES:
            return attr
        if inspect.iscoroutinefunction(attr):

            async def acall(*args: Any, **kwargs: Any) -> Any:
                self._before(name)
                result = await attr(*args, **kwargs)
                stored = await self.inner.read(self.session_id)
                self.seen.append([s.message.id for s in stored])
                return result

            return acall

        def call(*args: Any, **kwargs: Any) -> Any:
            self._before(name)
            result = attr(*args, **kwargs)
            self.seen.append([s.message.id for s in self.inner.read(self.session_id)])
            return result

        return call

    def _before(self, name: str) -> None:
        if self.crash_after is not None and len(self.writes) >= self.crash_after:
            raise Crash(name)
        self.writes.append(name)

    def reset(self, crash_after: int | None = None) -> None:
        self.writes.clear()
        self.seen.clear()
        self.crash_after = crash_after
