"""Observers run off the request path: ``background(*observers)``.

A guard calls its observer when each operation ends, on the caller's thread. Wrapped in
:func:`background`, that call only appends the event to a queue (``deque.append``, a C
call; no thread is woken) with a copy of the caller's :mod:`contextvars` context, and one
daemon thread per :class:`BackgroundObserver` wakes every ``interval`` (10 ms) to hand
each pending event to every observer inside that copy (so a span's parent is still the
caller's span). The observers' work then runs in a batch, partly while the caller waits
on Redis or the model server (the GIL released), not in the turn; run in a batch their
code is also several times faster than run between two of the guard's steps.

* The thread pauses (a real sleep: the GIL let go) after each 0.2 ms of delivery, so a
  caller back from its I/O waits that long at most, never for a whole batch.
* ``flush(timeout)`` returns once every event enqueued so far is delivered (tests,
  shutdown, scrapes); every ``PrometheusObserver`` among the observers flushes it
  before its registry is collected, so ``registry.get_sample_value`` and a scrape see
  every finished operation with no explicit flush. An ``atexit`` hook flushes too.
* The queue is bounded (``max_pending``, 10,000; at most :data:`MAX_PENDING`, a
  million): a full queue drops the event and counts it
  (``dropped``, and ``ctxguard_observer_events_dropped_total`` on each Prometheus
  observer) instead of ever blocking the request.
* ``close()`` flushes, then stops the thread; it is idempotent, and an event after it
  is delivered inline, on the caller's thread (nothing is lost); one enqueued while it
  runs is delivered once, by the thread's last drain or else inline by its caller.
* A thread does not survive ``os.fork``: the child starts its own on its first event,
  with an empty queue (the parent's pending events are the parent's to deliver); a fork
  waits for the step being delivered, so no observer's lock is inherited held.
"""

from __future__ import annotations

import atexit
import collections
import contextvars
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from ctxguard import _validate as v
from ctxguard._nocopy import NotCopyable
from ctxguard.errors import ConfigError
from ctxguard.guard.events import Observer, OperationEvent

__all__ = ["BackgroundObserver", "background"]

_STOP = object()
# the most events a queue holds: each keeps its event (the prepared window, its messages)
# and a context alive; a million already pins gigabytes behind a stuck observer
MAX_PENDING = 1_000_000


class BackgroundObserver(NotCopyable):
    """Delivers each event to ``observers`` on its own thread (see the module docstring)."""

    _holds = "its delivery thread and queue"
    _advice = "make one per process (background() again with the same observers)"

    def __init__(
        self, *observers: Observer, max_pending: int = 10_000, interval: float = 0.01
    ) -> None:
        if not observers:
            raise ConfigError("background() needs at least one observer")
        for observer in observers:
            if not callable(observer):
                raise ConfigError(
                    "observers must be callables taking one OperationEvent, "
                    f"got {v.type_name(observer)}"
                )
        if type(max_pending) is not int or not 1 <= max_pending <= MAX_PENDING:
            raise ConfigError(
                f"max_pending must be an int from 1 to {MAX_PENDING:,} (events held before "
                f"one is dropped), got {v.show(max_pending)}"
            )
        if (
            isinstance(interval, bool)
            or not isinstance(interval, int | float)
            or not 0 < interval <= 10
        ):
            raise ConfigError(f"interval must be a number of seconds in (0, 10], got {interval!r}")
        self.observers: tuple[Observer, ...] = tuple(_flatten(observers))
        self.max_pending = max_pending
        self.interval = float(interval)
        self.dropped = 0  # events a full queue refused
        self._on_drop: list[Callable[[], object]] = []
        self._lock = threading.Lock()  # starting/stopping the thread, counting drops
        self._step = threading.RLock()  # held per delivered event; a fork waits for it
        self._pending: collections.deque[Any] = collections.deque()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False
        for observer in self.observers:
            attach = getattr(observer, "attach_background", None)
            if callable(attach):
                attach(self)  # PrometheusObserver: flush before collect, count drops
        _register(self)  # fork and exit hooks: one set per process, whatever the count

    def __repr__(self) -> str:
        names = ", ".join(type(o).__name__ for o in self.observers)
        return f"BackgroundObserver({names}; pending={self.pending}, dropped={self.dropped})"

    @property
    def pending(self) -> int:
        """Events (and flush marks) not yet delivered."""
        return len(self._pending)

    # -- the request path ----------------------------------------------------------

    def __call__(self, event: OperationEvent) -> None:
        if (self._thread is None or self._closed) and not self._start():
            self._deliver(event)  # closed: inline, on the caller's thread
            return
        if len(self._pending) >= self.max_pending:
            self._drop()
            return
        # no wake-up: the thread takes what is there every ``interval`` (a wake per event
        # costs the caller a thread switch, and the observers' code run in a batch is
        # several times faster than run between two turns of the guard's own)
        # (a token first: the item equals only itself, told apart in C, see _late; a
        # class of our own cost the caller 0.3 µs more per event, the token 0.07 µs)
        item = (object(), event, contextvars.copy_context())
        pending = self._pending
        pending.append(item)
        if self._closed:  # a close() ran since the check: its drain may be over
            self._late(pending, item)

    def _late(self, pending: collections.deque[Any], item: _Pending) -> None:
        """An event enqueued while ``close()`` ran: delivered here unless the thread's
        drain took it (exactly once: the item is one object, taken out by one of the two;
        ``deque.remove`` and ``popleft`` are each atomic). ``remove`` compares the items
        before ours: their tokens differ from ours, an identity test in C, so no
        event's ``__eq__`` runs (Python code there could let the thread pop meanwhile:
        "deque mutated during iteration")."""
        try:
            pending.remove(item)
        except ValueError:
            return  # the drain took it, and delivers it
        # inline, as after close(): not under the thread's step lock (a close that timed
        # out on a stuck observer must not hold up the request path behind it)
        self._deliver(item[1])

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
            return not self._pending
        if threading.current_thread() is thread:
            return False  # an observer waiting for itself would wait for ever
        done = threading.Event()
        pending = self._pending
        pending.append(done)  # behind every event enqueued so far: one reader, in order
        self._wake.set()
        if self._closed:  # a close() ran since the check: its drain may be over, and
            try:  # then nothing would answer the mark (it waited out ``timeout``)
                pending.remove(done)
            except ValueError:
                return done.wait(timeout)  # the thread took it: answered
            thread.join(timeout)  # the drain delivers what was enqueued, then ends
            return not thread.is_alive()
        return done.wait(timeout)

    def close(self, timeout: float | None = 5.0) -> None:
        """Flush, then stop the thread (idempotent); later events are delivered inline."""
        v.check_timeout(timeout)
        with self._lock:
            if self._closed:
                return
            self._closed = True
            thread = self._thread
        if thread is None:
            return
        _stop(self._pending, self._wake)
        if threading.current_thread() is not thread:
            thread.join(timeout)

    # -- the delivering thread -----------------------------------------------------

    def _start(self) -> bool:
        with self._lock:
            if self._closed:
                return False
            if self._thread is None:
                pending, wake = self._pending, self._wake
                thread = threading.Thread(
                    target=_run,
                    args=(weakref.ref(self), pending, wake, self.interval),
                    name="ctxguard-observer",
                )
                thread.daemon = True
                thread.start()
                self._thread = thread
                weakref.finalize(self, _stop, pending, wake)  # collected: the thread ends
            return True

    def _deliver(self, event: OperationEvent) -> None:
        for observer in self.observers:
            try:  # noqa: SIM105 (one observer's bug does not blind the rest)
                observer(event)
            except Exception:
                pass

    def _deliver_in(self, event: OperationEvent, context: contextvars.Context) -> None:
        with self._step:
            context.run(self._deliver, event)

    # -- fork ------------------------------------------------------------------------

    def _before_fork(self) -> None:
        self._step.acquire()  # between two events: no observer mid-update

    def _after_fork_parent(self) -> None:
        self._step.release()

    def _after_fork_child(self) -> None:
        self._step = threading.RLock()  # the parent's is held (by the forking thread)
        self._lock = threading.Lock()
        self._pending = collections.deque()  # the parent's pending events stay the parent's
        self._wake = threading.Event()
        self._thread = None  # started again on the child's first event


_Pending = tuple[object, OperationEvent, contextvars.Context]  # (token, event, context)

SLICE = 0.0002  # s of delivery between two pauses (a few events; one span-heavy one)
PAUSE = 0.0002  # s: a request thread waiting for the GIL takes it (a real sleep lets it go)


def _run(
    ref: weakref.ref[BackgroundObserver],
    pending: collections.deque[Any],
    wake: threading.Event,
    interval: float,
) -> None:
    """The delivering thread: every ``interval`` (or at a flush) what is pending, in order,
    a pause after each :data:`SLICE` of delivery so that a caller never waits long for
    the GIL."""
    clock = time.perf_counter
    while True:
        wake.wait(interval)
        wake.clear()
        slice_end = clock() + SLICE
        while pending:
            item = pending.popleft()
            if isinstance(item, threading.Event):
                item.set()  # a flush: everything before it is delivered
                continue
            owner = ref()
            if item is _STOP or owner is None:
                _drain(owner, pending)
                return
            owner._deliver_in(item[1], item[2])
            del owner, item
            if clock() >= slice_end:
                time.sleep(PAUSE)
                slice_end = clock() + SLICE


def _drain(owner: BackgroundObserver | None, pending: collections.deque[Any]) -> None:
    """At close: what raced with it is delivered, not lost; flushes waiting are answered."""
    while pending:
        item = pending.popleft()
        if isinstance(item, threading.Event):
            item.set()
        elif item is not _STOP and owner is not None:
            owner._deliver_in(item[1], item[2])


def _stop(pending: collections.deque[Any], wake: threading.Event) -> None:
    pending.append(_STOP)
    wake.set()


# Every live deliverer of the process (weakly: a deliverer collected leaves it), and the
# fork / exit hooks that visit them, registered once: ``os.register_at_fork`` callbacks
# cannot be unregistered, so one per deliverer would pile up with each one made.
_LIVE: weakref.WeakSet[BackgroundObserver] = weakref.WeakSet()
_hooked = threading.Lock()  # adding to _LIVE, registering the hooks; held across a fork
_hooks_registered = False
_forking: list[BackgroundObserver] = []  # the deliverers a fork in progress holds


def _register(deliverer: BackgroundObserver) -> None:
    global _hooks_registered
    with _hooked:
        _LIVE.add(deliverer)
        if not _hooks_registered:
            os.register_at_fork(
                before=_before_fork,
                after_in_parent=_after_fork_parent,
                after_in_child=_after_fork_child,
            )
            atexit.register(_close_all)
            _hooks_registered = True


def _before_fork() -> None:
    _hooked.acquire()
    _forking[:] = list(_LIVE)
    for deliverer in _forking:
        deliverer._before_fork()


def _after_fork_parent() -> None:
    for deliverer in reversed(_forking):
        deliverer._after_fork_parent()
    _forking.clear()
    _hooked.release()


def _after_fork_child() -> None:
    global _hooked
    for deliverer in _forking:
        deliverer._after_fork_child()
    _forking.clear()
    _hooked = threading.Lock()  # the parent's is held by the forking thread


def _close_all() -> None:
    for deliverer in list(_LIVE):
        deliverer.close()


def _flatten(observers: tuple[Observer, ...]) -> Iterator[Observer]:
    """``fan_out(a, b)`` among ``observers`` counts as ``a, b`` (each delivered alone)."""
    for observer in observers:
        inner = getattr(observer, "observers", None)
        if isinstance(inner, tuple) and not isinstance(observer, BackgroundObserver):
            yield from _flatten(inner)
        else:
            yield observer


def background(
    *observers: Observer, max_pending: int = 10_000, interval: float = 0.01
) -> BackgroundObserver:
    """One observer delivering each event to every one of ``observers`` off the request
    path, on a thread of its own, in the caller's context (see the module docstring)."""
    return BackgroundObserver(*observers, max_pending=max_pending, interval=interval)
