"""An event (or a flush) that meets ``close()`` halfway is delivered exactly once.

``BackgroundObserver.__call__`` checks that it is open, then appends the event; a
``close()`` between the two drained the queue and ended the thread, and the event
appended after it stayed in the queue for ever: not delivered, not counted as dropped
(the module's contract: "an event after close() is delivered inline; nothing is lost").
The interleavings are forced with a queue whose ``append`` runs a hook (no sleeps).
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from typing import Any

from ctxguard.guard.events import OperationEvent
from ctxguard.observe import BackgroundObserver, background


def event(i: int) -> OperationEvent:
    return OperationEvent("prepare", f"s{i}", i, i)


class HookedQueue(collections.deque[Any]):
    """A deque whose next ``append`` of a matching item runs ``hook`` first (or after)."""

    def __init__(self) -> None:
        super().__init__()
        self.hook: Callable[[], None] | None = None
        self.when: Callable[[object], bool] = lambda item: True
        self.after = False

    def append(self, item: Any) -> None:
        hook = self.hook
        if hook is not None and self.when(item):
            self.hook = None
            if not self.after:
                hook()
            super().append(item)
            if self.after:
                hook()
            return
        super().append(item)


def deliverer_with_hooked_queue(
    seen: list[OperationEvent],
) -> tuple[BackgroundObserver, HookedQueue]:
    deliverer = background(seen.append)
    queue = HookedQueue()
    deliverer._pending = queue  # before the thread starts: it takes this queue
    deliverer(event(0))  # starts the thread
    assert deliverer.flush()
    assert deliverer._thread is not None and deliverer._thread.is_alive()
    return deliverer, queue


def _close_fully(deliverer: BackgroundObserver) -> None:
    deliverer.close()
    thread = deliverer._thread
    assert thread is not None and not thread.is_alive()  # drained and ended


def test_an_event_enqueued_after_close_drained_is_delivered_not_lost() -> None:
    seen: list[OperationEvent] = []
    deliverer, queue = deliverer_with_hooked_queue(seen)
    queue.hook = lambda: _close_fully(deliverer)  # between the open check and the append
    late = event(1)
    deliverer(late)
    assert seen == [event(0), late] and seen[1] is late  # delivered, once
    assert deliverer.pending == 0 and deliverer.dropped == 0
    assert deliverer.flush()  # closed, nothing left: answered at once


def test_an_event_the_drain_took_is_not_delivered_again() -> None:
    seen: list[OperationEvent] = []
    deliverer, queue = deliverer_with_hooked_queue(seen)
    queue.after = True  # appended, then close() runs (its drain delivers the event)
    queue.hook = lambda: _close_fully(deliverer)
    late = event(2)
    deliverer(late)
    assert seen == [event(0), late]  # once: by the drain, not again inline
    assert deliverer.pending == 0 and deliverer.dropped == 0


def test_a_flush_enqueued_after_close_drained_is_answered() -> None:
    seen: list[OperationEvent] = []
    deliverer, queue = deliverer_with_hooked_queue(seen)
    queue.when = lambda item: isinstance(item, threading.Event)  # the flush's mark
    queue.hook = lambda: _close_fully(deliverer)
    # (before: the mark sat behind the ended thread and the flush waited out its
    # timeout, then said False: "not everything delivered")
    assert deliverer.flush(timeout=5.0) is True
    assert deliverer.pending == 0


def test_events_after_close_are_still_delivered_inline() -> None:
    seen: list[OperationEvent] = []
    deliverer, _ = deliverer_with_hooked_queue(seen)
    _close_fully(deliverer)
    deliverer(event(3))
    assert seen == [event(0), event(3)] and deliverer.pending == 0


def test_a_late_event_is_not_held_up_by_an_observer_a_timed_out_close_left_running() -> None:
    """close(timeout) can return with the thread still in a stuck observer; an event
    that meets it is delivered inline at once, not behind that observer."""
    gate, entered, delivered = threading.Event(), threading.Event(), threading.Event()
    seen: list[OperationEvent] = []

    def stuck_on_the_first(e: OperationEvent) -> None:
        if e.session_id == "s0":
            entered.set()
            gate.wait(60)
        seen.append(e)

    deliverer = background(stuck_on_the_first)
    queue = HookedQueue()
    deliverer._pending = queue
    try:
        deliverer(event(0))
        deliverer._wake.set()  # the thread takes it now, not in 10 ms
        assert entered.wait(30)  # the thread is inside the first event
        queue.hook = lambda: deliverer.close(timeout=0.001)  # returns: the thread is stuck

        def late() -> None:
            deliverer(event(1))
            delivered.set()

        caller = threading.Thread(target=late)
        caller.start()
        assert delivered.wait(30)  # (generous: before, it waited for the stuck observer)
        assert seen == [event(1)]
    finally:
        gate.set()
    thread = deliverer._thread
    assert thread is not None
    thread.join(30)
    caller.join(30)
    assert seen == [event(1), event(0)] and deliverer.pending == 0
