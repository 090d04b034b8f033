"""``GET /metrics``: the gateway's guards and upstream calls in Prometheus' text format.

Needs ``ctxguard[metrics]`` (``prometheus_client``) and is on unless ``metrics =
false`` (``--no-metrics``, ``CTXGUARD_SERVE_METRICS=0``); without the extra nothing of
``prometheus_client`` is imported and ``/metrics`` answers 404 saying what to install.

Every tenant's guard reports to one :class:`~ctxguard.observe.metrics.PrometheusObserver`
(``ctxguard_*``), delivered off the request path by
:func:`~ctxguard.observe.background.background` (a scrape flushes it first, so it sees
every finished turn); the gateway adds ``ctxguard_gateway_upstream_request_duration_seconds``
by ``outcome`` (ok, rejected, error, timeout, unavailable; to the upstream's response
headers, so time to first chunk when streaming). No session or user labels.

With several worker processes (``--workers N``) :func:`multiprocess_dir` gives the
workers one directory (``PROMETHEUS_MULTIPROC_DIR``, emptied at start), each worker
writes its values there, and a scrape on any worker adds up every worker's files
(``MultiProcessCollector``); the live-gauge files of a worker that is gone are dropped
at the next scrape, or when it stops. There the observer is called inline, before the
turn answers: a scrape on one worker cannot flush another worker's queue, and a turn
answered must be in the next scrape whichever worker takes it.
"""

from __future__ import annotations

import contextlib
import glob
import importlib.util
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from typing import TYPE_CHECKING

from ctxguard.errors import ConfigError
from ctxguard.guard.events import Observer
from ctxguard.serve.dirwatch import removed_at_exit

if TYPE_CHECKING:
    from ctxguard.observe.background import BackgroundObserver

DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"
UPSTREAM_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 120.0)
_LIVE_FILE = re.compile(r"gauge_live\w+?_(\d+)\.db$")


def installed() -> bool:
    """Whether ``prometheus_client`` can be imported (without importing it)."""
    try:
        return importlib.util.find_spec("prometheus_client") is not None
    except ValueError:  # present in sys.modules without a spec
        return False


class GatewayMetrics:
    """One worker's metrics: the guards' observer, the upstream histogram, the scrape."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Histogram

        from ctxguard.observe.background import background
        from ctxguard.observe.metrics import PrometheusObserver

        self.path = os.environ.get(DIR_ENV) or None  # multiprocess mode when set
        # values are written here; in multiprocess mode they go to the files and a
        # scrape reads those, never this registry (that would count them twice)
        self.registry = CollectorRegistry()
        self.prometheus = PrometheusObserver(self.registry)
        self.background: BackgroundObserver | None = None
        self.observer: Observer = self.prometheus
        if self.path is None:  # one process: off the request path, flushed by each scrape
            self.background = self.observer = background(self.prometheus)
        self.upstream = Histogram(
            "ctxguard_gateway_upstream_request_duration_seconds",
            "Requests to the model server, to its response headers, by outcome "
            "(ok, rejected, error, timeout, unavailable)",
            ["outcome"],
            buckets=UPSTREAM_BUCKETS,
            registry=self.registry,
        )

    def render(self) -> tuple[bytes, str]:
        """The exposition text and its content type."""
        from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

        if self.path is None:
            return generate_latest(self.registry), CONTENT_TYPE_LATEST
        from prometheus_client import multiprocess

        _forget_dead_workers(self.path)
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, path=self.path)  # type: ignore[no-untyped-call]
        return generate_latest(registry), CONTENT_TYPE_LATEST

    def close(self) -> None:
        if self.background is not None:
            self.background.close()
        if self.path is not None:
            from prometheus_client import multiprocess

            multiprocess.mark_process_dead(os.getpid(), self.path)  # type: ignore[no-untyped-call]


def _forget_dead_workers(path: str) -> None:
    """``mark_process_dead`` for every worker whose live-gauge files outlive it."""
    from prometheus_client import multiprocess

    pids = {
        int(m[1])
        for f in glob.glob(os.path.join(path, "gauge_live*.db"))
        if (m := _LIVE_FILE.search(f))
    }
    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            multiprocess.mark_process_dead(pid, path)  # type: ignore[no-untyped-call]
        except PermissionError:
            pass  # alive, someone else's


@contextlib.contextmanager
def multiprocess_dir(workers: int, enabled: bool) -> Iterator[str | None]:
    """For ``--workers N > 1``: the directory the workers share, set in the environment
    before they start. ``PROMETHEUS_MULTIPROC_DIR`` if given (its ``*.db`` files removed,
    as prometheus_client asks), else a temporary one removed at the end (or, by a
    watcher, when this process is killed: :mod:`ctxguard.serve.dirwatch`)."""
    if workers < 2 or not enabled or not installed():
        yield None
        return
    given = os.environ.get(DIR_ENV)
    made: str | None = None
    try:
        if given:
            os.makedirs(given, exist_ok=True)
            for old in glob.glob(os.path.join(given, "*.db")):
                with contextlib.suppress(OSError):
                    os.remove(old)
            path = given
        else:
            path = made = tempfile.mkdtemp(prefix="ctxguard-metrics-")
            os.environ[DIR_ENV] = path
    except OSError as exc:  # (a traceback: the CLI answers the library's errors in a line)
        raise ConfigError(
            f"cannot make the workers' metrics directory ({exc.strerror or type(exc).__name__}); "
            f"set {DIR_ENV} or TMPDIR to a writable directory, or pass --no-metrics"
        ) from None
    try:
        with removed_at_exit(made) if made is not None else contextlib.nullcontext():
            yield path
    finally:
        if made is not None:
            os.environ.pop(DIR_ENV, None)
            shutil.rmtree(made, ignore_errors=True)


def make_metrics(enabled: bool) -> GatewayMetrics | None:
    return GatewayMetrics() if enabled and installed() else None


__all__: list[str] = ["DIR_ENV", "GatewayMetrics", "installed", "make_metrics", "multiprocess_dir"]
