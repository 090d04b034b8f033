"""Observers run off the request path: ``background(*observers)``.

A guard calls its observer when each operation ends, on the caller's thread. Wrapped in
:func:`background`, that call only enqueues the event (``SimpleQueue.put``, a C call)
with a copy of the caller's :mod:`contextvars` context, and one daemon thread per
:class:`BackgroundObserver` hands each event to every observer inside that copy (so a
span's parent is still the caller's span). The observers' work then runs while the
caller's thread waits on Redis or the model server (the GIL released), not in the turn.

* Each delivery step is one observer on one event, and the thread lets the GIL go
  between steps, so a caller back from its I/O waits for one step at most.
* ``flush(timeout)`` returns once every event enqueued so far is delivered (tests,
  shutdown, scrapes); every ``PrometheusObserver`` among the observers flushes it
  before its registry is collected, so ``registry.get_sample_value`` and a scrape see
  every finished operation with no explicit flush. An ``atexit`` hook flushes too.
* The queue is bounded (``max_pending``): a full queue drops the event and counts it
  (``dropped``, and ``ctxguard_observer_events_dropped_total`` on each Prometheus
  observer) instead of ever blocking the request.
* ``close()`` flushes, then stops the thread; it is idempotent, and an event after it
  is delivered inline, on the caller's thread (nothing is lost).
* A thread does not survive ``os.fork``: the child starts its own on its first event,
  with an empty queue (the parent's pending events are the parent's to deliver); a fork
  waits for the step being delivered, so no observer's lock is inherited held.
"""

from __future__ import annotations

import atexit
import contextvars
import os
import queue
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from ctxguard import _validate as v
from ctxguard.errors import ConfigError
from ctxguard.guard.events import Observer, OperationEvent

__all__ = ["BackgroundObserver", "background"]

_STOP = object()


class BackgroundObserver:
    """Delivers each event to ``observers`` on its own thread (see the module docstring)."""

    def __init__(self, *observers: Observer, max_pending: int = 10_000) -> None:
        if not observers:
            raise ConfigError("background() needs at least one observer")
        for observer in observers:
            if not callable(observer):
                raise ConfigError(
                    "observers must be callables taking one OperationEvent, "
                    f"got {v.type_name(observer)}"
                )
        if type(max_pending) is not int or max_pending < 1:
            raise ConfigError(f"max_pending must be a positive int, got {max_pending!r}")
        self.observers: tuple[Observer, ...] = tuple(_flatten(observers))
        self.max_pending = max_pending
        self.dropped = 0  # events a full queue refused
        self._on_drop: list[Callable[[], object]] = []
        self._lock = threading.Lock()  # starting/stopping the thread, counting drops
        self._step = threading.RLock()  # held per delivery step; a fork waits for it
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._closed = False
        for observer in self.observers:
            attach = getattr(observer, "attach_background", None)
            if callable(attach):
                attach(self)  # PrometheusObserver: flush before collect, count drops
        ref = weakref.ref(self)
        os.register_at_fork(
            before=lambda: _call(ref, "_before_fork"),
            after_in_parent=lambda: _call(ref, "_after_fork_parent"),
            after_in_child=lambda: _call(ref, "_after_fork_child"),
        )
        atexit.register(_call, ref, "close")

    def __repr__(self) -> str:
        names = ", ".join(type(o).__name__ for o in self.observers)
        return f"BackgroundObserver({names}; pending={self.pending}, dropped={self.dropped})"

    @property
    def pending(self) -> int:
        """Events (and flush marks) not yet delivered (approximate)."""
        return self._queue.qsize()

    # -- the request path ----------------------------------------------------------

    def __call__(self, event: OperationEvent) -> None:
        if (self._thread is None or self._closed) and not self._start():
            self._deliver(event)  # closed: inline, on the caller's thread
            return
        if self._queue.qsize() >= self.max_pending:
            self._drop()
            return
        self._queue.put((event, contextvars.copy_context()))

    def _drop(self) -> None:
        with self._lock:
            self.dropped += 1
        for note in self._on_drop:
            try:  # noqa: SIM105 (a counter's bug must not reach the request)
                note()
            except Exception:
                pass

    # -- flush / close ---------------------------------------------------------------

    def flush(self, timeout: float | None = 5.0) -> bool:
        """Wait until every event enqueued so far is delivered; False if ``timeout`` ran out
        (or if called from an observer, on the delivering thread itself)."""
        v.check_timeout(timeout)
        thread = self._thread
        if thread is None or not thread.is_alive():
            return self._queue.qsize() == 0
        if threading.current_thread() is thread:
            return False  # an observer waiting for itself would wait for ever
        done = threading.Event()
        self._queue.put(done)  # behind every event enqueued so far: one reader, in order
        return done.wait(timeout)

    def close(self, timeout: float | None = 5.0) -> None:
        """Flush, then stop the thread (idempotent); later events are delivered inline."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            thread = self._thread
        if thread is None:
            return
        self._queue.put(_STOP)
        if threading.current_thread() is not thread:
            thread.join(timeout)

    # -- the delivering thread -----------------------------------------------------

    def _start(self) -> bool:
        with self._lock:
            if self._closed:
                return False
            if self._thread is None:
                items = self._queue
                thread = threading.Thread(
                    target=_run, args=(weakref.ref(self), items), name="ctxguard-observer"
                )
                thread.daemon = True
                thread.start()
                weakref.finalize(self, items.put, _STOP)  # collected: the thread ends too
                self._thread = thread
            return True

    def _deliver(self, event: OperationEvent) -> None:
        for observer in self.observers:
            try:  # noqa: SIM105 (one observer's bug does not blind the rest)
                observer(event)
            except Exception:
                pass

    def _deliver_in(self, event: OperationEvent, context: contextvars.Context) -> None:
        for _ in self._steps(event, context):
            pass

    def _steps(self, event: OperationEvent, context: contextvars.Context) -> Iterator[None]:
        for observer in self.observers:
            with self._step:
                try:  # noqa: SIM105 (one observer's bug does not blind the rest)
                    context.run(observer, event)
                except Exception:
                    pass
            yield

    # -- fork ------------------------------------------------------------------------

    def _before_fork(self) -> None:
        self._step.acquire()  # between two delivery steps: no observer mid-update

    def _after_fork_parent(self) -> None:
        self._step.release()

    def _after_fork_child(self) -> None:
        self._step = threading.RLock()  # the parent's is held (by the forking thread)
        self._lock = threading.Lock()
        self._queue = queue.SimpleQueue()  # the parent's pending events stay the parent's
        self._thread = None  # started again on the child's first event


def _run(ref: weakref.ref[BackgroundObserver], items: queue.SimpleQueue[Any]) -> None:
    """The delivering thread: one event at a time, in order; the GIL let go between steps."""
    while True:
        item = items.get()
        if isinstance(item, threading.Event):
            item.set()
            continue
        owner = ref()
        if item is _STOP or owner is None:
            while owner is not None:  # what raced with close(): delivered, not lost
                try:
                    item = items.get_nowait()
                except queue.Empty:
                    return
                if isinstance(item, threading.Event):
                    item.set()
                elif item is not _STOP:
                    owner._deliver_in(*item)
            return
        for _ in owner._steps(*item):
            time.sleep(0)  # lets a caller back from its I/O take the GIL now
        del owner, item


def _call(ref: weakref.ref[BackgroundObserver], method: str) -> None:
    owner = ref()
    if owner is not None:
        getattr(owner, method)()


def _flatten(observers: tuple[Observer, ...]) -> Iterator[Observer]:
    """``fan_out(a, b)`` among ``observers`` counts as ``a, b`` (each delivered alone)."""
    for observer in observers:
        inner = getattr(observer, "observers", None)
        if isinstance(inner, tuple) and not isinstance(observer, BackgroundObserver):
            yield from _flatten(inner)
        else:
            yield observer


def background(*observers: Observer, max_pending: int = 10_000) -> BackgroundObserver:
    """One observer delivering each event to every one of ``observers`` off the request
    path, on a thread of its own, in the caller's context (see the module docstring)."""
    return BackgroundObserver(*observers, max_pending=max_pending)
