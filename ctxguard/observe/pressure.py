"""Budgets that follow the model server's live KV pressure.

:class:`PressureLimit` wraps any limit source. On each resolve it reads the
server's ``/metrics`` (at most once per ``interval`` seconds, one reader per URL
shared by every guard of the process) and, from the KV-cache usage (vLLM
``vllm:kv_cache_usage_perc``, older ``vllm:gpu_cache_usage_perc``, SGLang
``sglang:token_usage``; fractions 0-1, a reading past 1 left out and said once) and
the waiting queue (``vllm:num_requests_waiting``,
``sglang:num_queue_reqs``), picks a level:

* ``ok``: the wrapped limit, unchanged;
* ``lowered``: the limit times ``lowered_fraction`` (a shorter prompt, less KV);
* ``refused``: :class:`~ctxguard.errors.ServerBusyError` with the numbers (after
  holding up to ``hold_seconds`` for the pressure to fall), audited as a refusal:
  at ``waiting_refuse`` queued requests, or at ``refuse_at`` KV usage *with* a queue
  (``waiting_lower`` or more, or a server that does not report its queue). A full
  cache with no queue is how vLLM runs under load (it fills the cache by design):
  refusing then only reorders the sessions and lengthens the tail
  (``benchmarks/bench_pressure_sim.py``).

A level is entered when a threshold is reached and left only when the numbers are
``kv_margin`` / ``waiting_margin`` below it (hysteresis: budgets do not flap). The
level and the numbers are in the limit's ``source`` (so in every request's audit
record) and ``details``. A server whose ``/metrics`` cannot be read is treated as
``ok`` once the last good reading is older than ``stale_after`` seconds (fail open:
the wrapped limit still holds). Every call has a deadline (``timeout``).
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections.abc import Mapping
from typing import Any, Literal

import httpx

from ctxguard import _http
from ctxguard._validate import MAX_SECONDS, check_arg_types, check_http_url
from ctxguard.errors import ConfigError, ServerBusyError
from ctxguard.guard.setup import make_limit
from ctxguard.kv.limit import ContextLimit, LimitSource
from ctxguard.kv.server import redact
from ctxguard.observe.pressure_metrics import (
    KV_USAGE,
    WAITING,
    Pressure,
    parse_metrics,
    read_metrics,
)

Level = Literal["ok", "lowered", "refused"]
LEVELS: tuple[Level, ...] = ("ok", "lowered", "refused")
_SECONDS = ("hold_seconds", "interval", "timeout", "stale_after")
log = logging.getLogger("ctxguard.observe")
__all__ = [
    "KV_USAGE",
    "WAITING",
    "Pressure",
    "PressureLimit",
    "PressureMonitor",
    "describe",
    "parse_metrics",
    "read_metrics",
]


class PressureMonitor:
    """Reads one server's ``/metrics`` at most once per ``interval`` (shared per URL)."""

    def __init__(self, metrics_url: str, interval: float, timeout: float) -> None:
        self.url, self.interval, self.timeout = metrics_url, interval, timeout
        self.shown = redact(metrics_url)
        self.last: Pressure | None = None
        self.error: str | None = None
        self._checked = -math.inf
        self._lock = threading.Lock()  # held across a sync reading (see sample)
        self._answered = False  # a reading has answered (or failed): nobody waits now
        self._claim_lock = threading.Lock()  # held only to claim the next reading
        self._client: httpx.Client | None = None
        self._warned = False  # a KV reading past 1 was logged
        self._silent_warned = False  # a reply without any gauge was logged

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
        usage, waiting, past_one = read_metrics(reply.text)
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

    def _failed(self, exc: Exception) -> None:
        self._checked, self._answered = time.monotonic(), True
        self.error = type(exc).__name__


_MONITORS: dict[tuple[str, float, float], PressureMonitor] = {}
_MONITORS_LOCK = threading.Lock()


def monitor_for(metrics_url: str, interval: float, timeout: float) -> PressureMonitor:
    """The process's one monitor of ``metrics_url`` (with these settings)."""
    key = (metrics_url, float(interval), float(timeout))
    with _MONITORS_LOCK:
        monitor = _MONITORS.get(key)
        if monitor is None:
            monitor = _MONITORS[key] = PressureMonitor(metrics_url, interval, timeout)
        return monitor


class PressureLimit:
    """A limit source that lowers or refuses while the server is under KV pressure.

    >>> # Guard(url, limit=PressureLimit(32768, "http://vllm:8000/metrics"))
    """

    def __init__(
        self,
        limit: int | ContextLimit | LimitSource,
        metrics_url: str,
        *,
        lower_at: float = 0.85,
        refuse_at: float = 0.97,
        waiting_lower: float = 8,
        waiting_refuse: float = 64,
        kv_margin: float = 0.1,
        waiting_margin: float = 4,
        lowered_fraction: float = 0.5,
        hold_seconds: float = 0.0,
        interval: float = 1.0,
        timeout: float = 1.0,
        stale_after: float = 10.0,
    ) -> None:
        check_arg_types("PressureLimit", metrics_url=(metrics_url, "str"))
        numbers = {
            "lower_at": lower_at,
            "refuse_at": refuse_at,
            "waiting_lower": waiting_lower,
            "waiting_refuse": waiting_refuse,
            "kv_margin": kv_margin,
            "waiting_margin": waiting_margin,
            "lowered_fraction": lowered_fraction,
            "hold_seconds": hold_seconds,
            "interval": interval,
            "timeout": timeout,
            "stale_after": stale_after,
        }
        for name, value in numbers.items():
            seconds = name in _SECONDS  # past MAX_SECONDS a deadline overflows time_t
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not (math.isfinite(value) and value >= 0)
                or (seconds and value > MAX_SECONDS)
            ):
                unit = f" of seconds, at most {MAX_SECONDS:,}" if seconds else ""
                raise ConfigError(f"{name} must be a non-negative number{unit}, got {value!r}")
        # the KV gauges are fractions: a lower_at past 1 (85 for 85%) was never reached,
        # the KV check silently off (refuse_at past 1 turns only KV refusals off); a
        # margin at or past the lower threshold never let a level go back to ok
        if not 0 < lower_at <= min(1, refuse_at):
            raise ConfigError(
                "need 0 < lower_at <= refuse_at, lower_at at most 1 (KV usage is a "
                f"fraction 0-1), got {lower_at}, {refuse_at}"
            )
        if not 0 < waiting_lower <= waiting_refuse:
            raise ConfigError("need 0 < waiting_lower <= waiting_refuse")
        if kv_margin >= lower_at or waiting_margin >= waiting_lower:
            raise ConfigError(
                "kv_margin and waiting_margin must be below lower_at and waiting_lower "
                "(else a budget once lowered never comes back)"
            )
        if not 0 < lowered_fraction <= 1 or timeout <= 0:
            raise ConfigError("lowered_fraction must be in (0, 1] and timeout positive")
        check_http_url(metrics_url, "PressureLimit metrics_url", base=False)
        self.inner = make_limit(limit)
        self.monitor = monitor_for(metrics_url, interval, timeout)
        self.lower_at, self.refuse_at = lower_at, refuse_at
        self.waiting_lower, self.waiting_refuse = waiting_lower, waiting_refuse
        self.kv_margin, self.waiting_margin = kv_margin, waiting_margin
        self.lowered_fraction, self.hold_seconds = lowered_fraction, hold_seconds
        self.stale_after = stale_after
        self.level: Level = "ok"
        self._lock = threading.Lock()

    # -- the level, with hysteresis ---------------------------------------------------

    def _target(self, kv: float, waiting: float, queue_known: bool = True) -> Level:
        # a full KV cache alone is how vLLM runs under load (it fills the cache by
        # design): it refuses only with a queue forming (or when the queue is not served)
        queue = waiting >= self.waiting_lower or not queue_known
        if waiting >= self.waiting_refuse or (kv >= self.refuse_at and queue):
            return "refused"
        if kv >= self.lower_at or waiting >= self.waiting_lower:
            return "lowered"
        return "ok"

    def update(self, pressure: Pressure | None) -> Level:
        """Move the level on ``pressure`` (up at a threshold, down only past the margin)."""
        with self._lock:
            if pressure is None or time.monotonic() - pressure.at > self.stale_after:
                self.level = "ok"  # nothing known (fail open: the wrapped limit holds)
                return self.level
            kv, waiting = pressure.kv_usage or 0.0, pressure.waiting or 0.0
            known = pressure.waiting is not None
            up = self._target(kv, waiting, known)
            down = self._target(kv + self.kv_margin, waiting + self.waiting_margin, known)
            rank = LEVELS.index
            if rank(up) > rank(self.level):
                self.level = up
            elif rank(down) < rank(self.level):
                self.level = down
            return self.level

    def _limit(self, base: ContextLimit, level: Level, pressure: Pressure | None) -> ContextLimit:
        kv = None if pressure is None else pressure.kv_usage
        waiting = None if pressure is None else pressure.waiting
        numbers = f"kv={_show(kv)} waiting={_show(waiting)}"
        if level == "refused":
            raise ServerBusyError(
                f"the model server at {self.monitor.shown} is under KV pressure ({numbers}; "
                f"refusing at kv>={self.refuse_at} with waiting>={self.waiting_lower}, "
                f"or waiting>={self.waiting_refuse}); "
                "nothing was stored: retry later",
                kv_usage=kv,
                waiting=waiting,
                kv_threshold=self.refuse_at,
                waiting_threshold=self.waiting_refuse,
            )
        details: dict[str, Any] = {
            **base.details,
            "pressure": {
                "level": level,
                "kv_usage": kv,
                "waiting": waiting,
                "error": self.monitor.error,
            },
        }
        if level == "ok":
            return ContextLimit(base.tokens, f"{base.source}; pressure ok {numbers}", details)
        tokens = max(1, int(base.tokens * self.lowered_fraction))
        source = f"{base.source}; pressure lowered {base.tokens}->{tokens} {numbers}"
        return ContextLimit(tokens, source, details)

    # -- LimitSource ------------------------------------------------------------------

    def resolve(self) -> ContextLimit:
        base = self.inner.resolve()
        pressure = self.monitor.sample()
        level = self.update(pressure)
        deadline = time.monotonic() + self.hold_seconds
        while level == "refused" and time.monotonic() < deadline:
            time.sleep(_pause(self.monitor.interval, deadline))
            pressure = self.monitor.sample()
            level = self.update(pressure)
        return self._limit(base, level, pressure)

    async def aresolve(self) -> ContextLimit:
        base = await self.inner.aresolve()
        pressure = await self.monitor.asample()
        level = self.update(pressure)
        deadline = time.monotonic() + self.hold_seconds
        while level == "refused" and time.monotonic() < deadline:
            await asyncio.sleep(_pause(self.monitor.interval, deadline))
            pressure = await self.monitor.asample()
            level = self.update(pressure)
        return self._limit(base, level, pressure)


def _pause(interval: float, deadline: float) -> float:
    """Until the next reading, never past the deadline, never negative: the deadline can
    pass between the loop's check and this (time.sleep(-0.001) is a ValueError)."""
    return max(0.0, min(max(interval, 0.01), deadline - time.monotonic()))


def _show(value: float | None) -> str:
    return "?" if value is None else f"{value:g}"


def describe(limit: ContextLimit) -> Mapping[str, Any] | None:
    """The pressure decision a limit carries (None for limits not from PressureLimit)."""
    found = limit.details.get("pressure")
    return found if isinstance(found, Mapping) else None
