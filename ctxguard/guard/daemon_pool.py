"""A thread pool whose threads never hold the interpreter open: for caller-written code.

``concurrent.futures.ThreadPoolExecutor`` (and asyncio's default executor, which
``asyncio.to_thread`` uses) joins its threads when the interpreter exits, and
``asyncio.run`` joins the default executor's on its way out: a summarizer the caller
wrote that never returns (a hung socket, a lock never released) kept the process from
ever exiting, long after the guard had timed it out and been closed. Here the threads
are daemons: a call that never returns is left behind at exit, as a timed-out call
already is by the guard. ``shutdown`` is ThreadPoolExecutor's (queued calls cancelled
with ``cancel_futures``, ``wait`` joins the threads).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, TypeVar

T = TypeVar("T")
_Work = tuple[Future[Any], Callable[..., Any], tuple[Any, ...], dict[str, Any]]


class DaemonPool(Executor):
    """Up to ``max_workers`` daemon threads, started as calls need them."""

    def __init__(self, max_workers: int, thread_name_prefix: str) -> None:
        self._max = max_workers
        self._prefix = thread_name_prefix
        self._queue: queue.SimpleQueue[_Work | None] = queue.SimpleQueue()
        self._idle = threading.Semaphore(0)  # threads waiting for work
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._closed = False

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        with self._lock:
            if self._closed:
                raise RuntimeError("cannot schedule new futures after shutdown")
            future: Future[T] = Future()
            self._queue.put((future, fn, args, kwargs))
            if not self._idle.acquire(blocking=False) and len(self._threads) < self._max:
                name = f"{self._prefix}_{len(self._threads)}"
                thread = threading.Thread(target=self._work, name=name, daemon=True)
                thread.start()
                self._threads.append(thread)
            return future

    def _work(self) -> None:
        while True:
            work = self._queue.get()
            if work is None:
                return
            future, fn, args, kwargs = work
            del work
            if future.set_running_or_notify_cancel():
                try:
                    result = fn(*args, **kwargs)
                except BaseException as exc:  # as ThreadPoolExecutor: the future holds it
                    future.set_exception(exc)
                    del exc
                else:
                    future.set_result(result)
                    del result
            del future, fn, args, kwargs
            self._idle.release()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._closed = True
            if cancel_futures:
                pending: list[_Work] = []
                while True:
                    try:
                        work = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if work is not None:
                        pending.append(work)
                for future, *_ in pending:
                    future.cancel()
            for _ in self._threads:
                self._queue.put(None)  # one stop per thread, after the work queued
            threads = list(self._threads)
        if wait:
            for thread in threads:
                thread.join()
