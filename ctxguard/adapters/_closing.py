"""``close()`` / ``aclose()`` and ``with`` / ``async with`` for an adapter that may have
opened its guard from a store URL (LangChain's history, LlamaIndex's chat store and
memory). Only a guard the adapter opened is closed (its ``GuardRef`` knows); a Guard or
AsyncGuard passed in belongs to the caller and stays open. Idempotent; a later call opens
a new guard. The Agents SDK session closes with ``await close()`` (the SDK's own shape).
"""

from __future__ import annotations

from typing import Protocol, Self


class _Ref(Protocol):
    def close(self) -> None: ...
    async def aclose(self) -> None: ...


class ClosesOwnGuard:
    """Mixin: the adapter names its ``GuardRef`` in :meth:`_guard_ref`."""

    def _guard_ref(self) -> _Ref:
        raise NotImplementedError

    def close(self) -> None:
        """Release the connections of the guard this adapter opened from a store URL (a
        Guard or AsyncGuard passed in is yours and stays open). Idempotent."""
        self._guard_ref().close()

    async def aclose(self) -> None:
        """:meth:`close`, and the AsyncGuard it opened on the running loop."""
        await self._guard_ref().aclose()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
