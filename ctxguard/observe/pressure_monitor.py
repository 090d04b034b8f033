"""Reading one model server's ``/metrics`` for :class:`~ctxguard.observe.pressure.PressureLimit`.

One :class:`PressureMonitor` per URL and model in the process (:func:`monitor_for`), read
at most once per ``interval`` by one caller at a time; the reply is read by the pure
:mod:`ctxguard.observe.pressure_metrics`. A page the monitor cannot take (another page,
a KV reading past 1, several models and none named, the named one absent) leaves the
pressure unknown and says why in ``error``, and once per server in a WARNING.
"""

from __future__ import annotations

import logging
import math
import threading
import time

import httpx

from ctxguard import _http
from ctxguard._http import known_secrets
from ctxguard._nocopy import NotCopyable
from ctxguard._secrets import forget, redact_text
from ctxguard.errors import ConfigError
from ctxguard.kv.server import redact
from ctxguard.observe.pressure_metrics import KV_USAGE, WAITING, Page, Pressure, read_page

log = logging.getLogger("ctxguard.observe")
__all__ = ["PressureMonitor", "monitor_for"]


class PressureMonitor(NotCopyable):
    """Reads one server's ``/metrics`` at most once per ``interval`` (shared per URL and
    model): the pressure of ``model``, or of the page's one model when None."""

    _holds = "a connection to the server's /metrics and its locks"
    _advice = "use monitor_for(url, ...) in each process"

    def __init__(
        self, metrics_url: str, interval: float, timeout: float, model: str | None = None
    ) -> None:
        self.url, self.interval, self.timeout = metrics_url, interval, timeout
        self.model = model
        self.shown = redact(metrics_url)
        # the URL's password, which the page must not echo into our errors and logs
        # through a model_name (a query secret is refused by PressureLimit)
        self._secrets = known_secrets(metrics_url, None)
        self.last: Pressure | None = None
        self.error: str | None = None
        self._checked = -math.inf
        self._lock = threading.Lock()  # held across a sync reading (see sample)
        self._answered = False  # a reading has answered (or failed): nobody waits now
        self._claim_lock = threading.Lock()  # held only to claim the next reading
        self._client: httpx.Client | None = None
        self._warned = False  # a KV reading past 1 was logged
        self._silent_warned = False  # a reply without any gauge was logged
        self._models_warned = False  # a page of several models (or not ours) was logged

    def _claim(self) -> bool:
        """True for the one caller that reads now (until ``interval`` has passed again);
        the others take the last reading. Claimed before the call, so the coroutines of
        an async burst do not each read while the first reading is in flight."""
        with self._claim_lock:
            if time.monotonic() - self._checked < self.interval:
                return False
            self._checked = time.monotonic()
            return True

    def sample(self) -> Pressure | None:
        """The last reading, read again first by the one caller whose turn it is. The
        others take the last one rather than wait for a reading in flight (a slow server
        held every request of the process up to ``timeout`` each ``interval``), except
        before any reading has answered: a first burst is not waved through unread."""
        if self._answered:
            if self._claim():
                with self._lock:
                    self._read()
            return self.last
        with self._lock:
            if self._claim():
                self._read()
            return self.last

    def _read(self) -> None:
        try:
            if self._client is None:  # one client (and TLS context) for every reading
                self._client = _http.client(timeout=self.timeout)
            reply = _http.request(
                self._client,
                "GET",
                self.url,
                seconds=self.timeout,
                shown=self.shown,
                error=ConfigError,
                idempotent=True,  # a GET of /metrics
            )
            self._take(reply)
        except (httpx.HTTPError, ConfigError) as exc:
            self._failed(exc)

    async def asample(self) -> Pressure | None:
        if self._claim():
            try:
                async with httpx.AsyncClient(timeout=self.timeout) as client:
                    reply = await _http.arequest(
                        client,
                        "GET",
                        self.url,
                        seconds=self.timeout,
                        shown=self.shown,
                        error=ConfigError,
                    )
                self._take(reply)
            except (httpx.HTTPError, ConfigError) as exc:
                self._failed(exc)
        return self.last

    def _take(self, reply: _http.Reply) -> None:
        self._checked, self._answered = time.monotonic(), True
        if reply.status_code != 200:
            self.error = f"HTTP {reply.status_code}"
            return
        page = read_page(reply.text, self.model)
        if self._not_ours(page):
            # whose pressure it is is not known: nothing known (fail open, as a page
            # without the gauges), rather than one model's budget on another's queue
            self.last = Pressure(None, None, self._checked)
            return
        usage, waiting, past_one = page.kv_usage, page.waiting, page.past_one
        self.last, self.error = Pressure(usage, waiting, self._checked), None
        if usage is None and waiting is None and past_one is None:
            # another page, or a server not exporting them: nothing known (fail open),
            # and said so (it was an error-free "ok" on every request)
            self.error = "no KV usage or queue gauge in the reply"
            if not self._silent_warned:
                self._silent_warned = True
                log.warning(
                    "the reply from %s has no KV usage gauge (%s) nor queue gauge (%s): is "
                    "it the model server's /metrics? The budget cannot follow its pressure "
                    "(said once per server)",
                    self.shown,
                    ", ".join(KV_USAGE),
                    ", ".join(WAITING),
                )
        if past_one is not None:
            self.error = f"KV usage {past_one:g} is past 1 (a 0-1 fraction): left out"
            if not self._warned:
                self._warned = True
                log.warning(
                    "the model server at %s reports a KV cache usage of %g, past 1: the KV "
                    "gauges (%s) are fractions 0-1, so the reading is left out and only the "
                    "queue counts (said once per server)",
                    self.shown,
                    past_one,
                    ", ".join(KV_USAGE),
                )

    def _not_ours(self, page: Page) -> bool:
        """True (``error`` set, said once per server) when the page's gauges are not
        the pressure of this monitor's model: several models and none named, or the
        named one not among them."""
        shown_models = _names(page.models, self._secrets)
        if self.model is None and len(page.models) > 1:
            self.error = (
                f"the reply holds {len(page.models)} models' gauges ({shown_models}): "
                "name one with PressureLimit(model=...)"
            )
        elif self.model is not None and self.model not in page.models:
            there = f"models there: {shown_models}" if page.models else "no model_name label"
            self.error = f"no KV usage or queue gauge of model {self.model!r} ({there})"
        else:
            return False
        if not self._models_warned:
            self._models_warned = True
            log.warning(
                "the reply from %s: %s; the budget does not follow its pressure (said "
                "once per server)",
                self.shown,
                self.error,
            )
        return True

    def _failed(self, exc: Exception) -> None:
        self._checked, self._answered = time.monotonic(), True
        self.error = type(exc).__name__


_MONITORS: dict[tuple[str, float, float, str | None], PressureMonitor] = {}
_MONITORS_LOCK = threading.Lock()


def monitor_for(
    metrics_url: str, interval: float, timeout: float, model: str | None = None
) -> PressureMonitor:
    """The process's one monitor of ``metrics_url`` and ``model`` (with these settings)."""
    key = (metrics_url, float(interval), float(timeout), model)
    with _MONITORS_LOCK:
        monitor = _MONITORS.get(key)
        if monitor is None:
            monitor = _MONITORS[key] = PressureMonitor(metrics_url, interval, timeout, model)
        return monitor


def _names(models: tuple[str, ...], secrets: list[str], most: int = 4) -> str:
    """A few of the page's model names: the server's text, less our secrets, cut short."""
    shown = ", ".join(
        repr(redact_text(" ".join(forget(m, secrets).split()), 60)) for m in models[:most]
    )
    return shown + (f" and {len(models) - most} more" if len(models) > most else "")
