"""One deadline per async store operation, kept by one timer for all of them.

An async store operation (every retry, the attempt under way, its connection's
handshake and replies) ends by its deadline, connect timeout plus read timeout after it
began: past it, the task running it is cancelled where it waits, as ``asyncio.timeout``
would, and ``AsyncRedisStore._io`` turns that into a ``StoreConnectionError``. redis-py
drops a connection whose command or handshake was cancelled, so no reply stays on a
pooled connection for a later command to read (see ``redis_async``'s docstring).

Why not ``asyncio.timeout`` itself: each one is a timer handle pushed on the event loop's
heap and cancelled there (``TimerHandle.__lt__`` is Python, so every push and the loop's
clean-up of cancelled handles cost Python calls): +79k instructions per warm AsyncGuard
turn, +3.7% (benchmarks/bench_client_instr.py). Every operation of a store has the same
length, so their deadlines come in the order the operations began: a queue, its head's
deadline the only timer, armed when the queue was empty, fired rarely (an operation
ending takes itself off the queue's head). An operation costs a list, an append and a pop
(~4.6k instructions, callgrind): per warm turn (two operations) +6.8k and +13.3k in two
A/B runs (2,102.4 -> 2,109.2k, 2,096.4 -> 2,109.7k), about +0.5%; four runs of the base
alone spread 2,096.2 to 2,102.5k.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import Any

_RUNNING, _DONE, _CUT = 0, 1, 2
# an entry: [deadline (time.monotonic()), task, the task's cancelling() when it began, state]
Entry = list[Any]


class OperationDeadlines:
    """The running operations of one store on one event loop, oldest first."""

    __slots__ = ("_loop", "_queue", "_timer")

    def __init__(self, loop: asyncio.AbstractEventLoop | None) -> None:
        self._loop = loop  # (None: not used yet; start() then sets no deadline)
        self._queue: deque[Entry] = deque()
        self._timer: asyncio.TimerHandle | None = None

    def start(self, end: float) -> Entry | None:
        """An operation of the running task begins, to end by ``end`` (``time.monotonic()``,
        the clock of asyncio's loops; None outside a task: no deadline)."""
        loop = self._loop
        task = asyncio.current_task(loop)
        if task is None or loop is None:
            return None
        entry = [end, task, task.cancelling(), _RUNNING]
        queue = self._queue
        while queue and queue[0][3] != _RUNNING:  # ended out of order behind the head
            queue.popleft()
        queue.append(entry)
        if self._timer is None:  # (a timer armed is never later than the head's deadline)
            self._arm(loop, end)
        return entry

    @staticmethod
    def cut(entry: Entry | None) -> bool:
        """Whether the deadline cut this operation (then the CancelledError under way is
        its own, to be answered as a timeout): False when another cancellation came too
        (the caller's, which goes on)."""
        if entry is None or entry[3] != _CUT:
            return False
        entry[3] = _DONE
        return bool(entry[1].uncancel() <= entry[2])

    def end(self, entry: Entry | None) -> None:
        """The operation ended (call it in a ``finally``, after :meth:`cut` if any)."""
        if entry is None:
            return
        if entry[3] == _CUT:  # cut, and whatever it raised was not the cancellation
            entry[1].uncancel()
        entry[3] = _DONE
        queue = self._queue
        if queue and queue[0] is entry:
            queue.popleft()

    def _arm(self, loop: asyncio.AbstractEventLoop, end: float) -> None:
        # (the loop's own clock for its timer: a loop not on time.monotonic() is off by
        # the difference of the two clocks' moves between now and the deadline, no more)
        self._timer = loop.call_at(loop.time() + (end - time.monotonic()), self._fire)

    def _fire(self) -> None:
        self._timer = None
        queue, loop = self._queue, self._loop
        if loop is None:
            return
        now = time.monotonic()
        while queue:
            entry = queue[0]
            if entry[3] != _RUNNING:
                queue.popleft()
            elif entry[0] > now:
                self._arm(loop, entry[0])
                return
            else:
                queue.popleft()
                entry[3] = _CUT
                entry[1].cancel()  # where it waits, inside the operation (it has not ended)
