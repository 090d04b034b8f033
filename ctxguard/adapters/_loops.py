"""One value per running event loop, for adapters that frameworks call from many loops
and threads at once.

The Agents SDK's ``Runner.run_sync`` and plain ``asyncio.run`` make a new loop per
call, often in a thread pool; an async Redis connection and an ``asyncio.Lock`` belong
to the loop that made them, so an adapter keeps one of each per loop. Three things
this module gets right that a bare dict did not:

- threads: the map is read and written under a ``threading.Lock`` (two threads that
  both found the same closed loop both deleted it, and the second raised ``KeyError``
  out of ``add_items``);
- closed loops: what was kept for a loop that has closed is dropped on the next call
  (a WeakKeyDictionary never drops it: the value refers to its own loop);
- shutdown: a value that needs closing (an async guard and its connections) is closed
  by the loop's own shutdown (``asyncio.run`` and ``asyncio.Runner`` run
  ``loop.shutdown_asyncgens()`` before they close the loop), through an async
  generator registered on that loop. Without it every call's guard was left open:
  sockets until garbage collection, and an "Unclosed RedisCluster client" error in the
  log per call. A loop that lives on after its shutdown (the Agents SDK's
  ``run_sync`` keeps one per thread and shuts down its generators after each run)
  makes a new value next time, kept as long as the loop; a loop closed without the
  shutdown has its value dropped on the next call.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")


def _start(hook: AsyncGenerator[None, None]) -> None:
    """Run an async generator to its first ``yield``, here and now: its first step
    registers it with the running loop's shutdown (``sys.set_asyncgen_hooks``)."""
    step = hook.asend(None).__await__()
    try:
        step.send(None)
    except StopIteration:
        return
    raise RuntimeError("a loop-shutdown hook suspended before its yield")  # pragma: no cover


def _shut_down(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether ``loop.shutdown_asyncgens()`` has run (the Agents SDK's ``run_sync`` runs
    it after each run and keeps the loop): an async generator started after it is not
    closed by the loop, so a value made then lives as long as the loop does."""
    return bool(getattr(loop, "_asyncgens_shutdown_called", False))


class PerLoop(Generic[T]):
    """``get()`` returns this loop's value, made by ``make()`` on first use.

    With ``close``, the value is closed when its loop shuts down (see the module
    docstring). Safe to call from any thread's running loop.
    """

    def __init__(
        self, make: Callable[[], T], close: Callable[[T], Awaitable[None]] | None = None
    ) -> None:
        self._make = make
        self._close = close
        self._lock = threading.Lock()
        self._kept: dict[
            asyncio.AbstractEventLoop, tuple[T, AsyncGenerator[None, None] | None]
        ] = {}
        self._latest: T | None = None

    def get(self) -> T:
        """This loop's value (call it from a coroutine: it needs a running loop)."""
        loop = asyncio.get_running_loop()
        return self._get(loop, here=loop)

    def get_for(self, loop: asyncio.AbstractEventLoop) -> T:
        """``loop``'s value; the close hook is registered only when ``loop`` is the
        loop running here (an async generator joins the loop of the thread it starts
        in)."""
        try:
            here: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            here = None
        return self._get(loop, here)

    def _get(self, loop: asyncio.AbstractEventLoop, here: asyncio.AbstractEventLoop | None) -> T:
        with self._lock:
            kept = self._kept.get(loop)
            if kept is not None:
                return kept[0]
            self._forget_closed()
            value = self._make()
            hook = None
            if self._close is not None and loop is here and not _shut_down(loop):
                hook = self._close_at_shutdown(loop, value, self._close)
                _start(hook)
            self._kept[loop] = (value, hook)  # the loop holds its hooks weakly
            self._latest = value
            return value

    def latest(self) -> T | None:
        """The value made most recently, whatever its loop (for a loop-free question
        such as "which counter does this guard use")."""
        return self._latest

    async def close_here(self) -> None:
        """Close and forget the running loop's value now (a later ``get()`` makes a new
        one): its shutdown hook runs here, so the loop does not close it a second time."""
        loop = asyncio.get_running_loop()
        with self._lock:
            kept = self._kept.pop(loop, None)
        if kept is None:
            return
        value, hook = kept
        if self._latest is value:
            self._latest = None
        if hook is not None:
            await hook.aclose()  # (its finally closes the value)
        elif self._close is not None:
            await self._close(value)

    def __len__(self) -> int:
        with self._lock:
            return len(self._kept)

    async def _close_at_shutdown(
        self,
        loop: asyncio.AbstractEventLoop,
        value: T,
        close: Callable[[T], Awaitable[None]],
    ) -> AsyncGenerator[None, None]:
        try:
            yield
        finally:
            with self._lock:  # a loop that lives on (run_sync's) makes a new one next
                if self._kept.get(loop, (None,))[0] is value:
                    del self._kept[loop]
            if not loop.is_closed():  # closed: nothing can be awaited; it is dropped
                await close(value)

    def _forget_closed(self) -> None:
        # A closed loop's hook needs nothing more: had the loop shut down, it would have
        # run; once the hook is let go, its finalizer sees the loop closed and does not
        # ask it to run.
        for loop in [loop for loop in self._kept if loop.is_closed()]:
            del self._kept[loop]
