"""Budgets that follow the model server's live KV pressure.

:class:`PressureLimit` wraps any limit source. On each resolve it reads the
server's ``/metrics`` (at most once per ``interval`` seconds, one reader per URL
shared by every guard of the process) and, from the KV-cache usage (vLLM
``vllm:kv_cache_usage_perc``, older ``vllm:gpu_cache_usage_perc``, SGLang
``sglang:token_usage``; fractions 0-1, a reading past 1 left out and said once) and
the waiting queue (``vllm:num_requests_waiting``,
``sglang:num_queue_reqs``) of one model, picks a level. The model is the page's one
(every sample's ``model_name`` label the same, or none), or the one named with
``model=``: a page of several models with none named, or without the named one, is
no reading (fail open, as below; said in the decision's ``error`` and once in a
WARNING) rather than one model's budget following another's queue. The levels:

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
import math
import threading
import time
from collections.abc import Mapping
from typing import Any, Literal

from ctxguard._nocopy import NotCopyable
from ctxguard._validate import MAX_SECONDS, check_arg_types, check_http_url, show
from ctxguard.errors import ConfigError, ServerBusyError
from ctxguard.guard.setup import make_limit
from ctxguard.kv.limit import ContextLimit, LimitSource
from ctxguard.observe.pressure_metrics import (
    KV_USAGE,
    WAITING,
    Page,
    Pressure,
    parse_metrics,
    read_metrics,
    read_page,
)
from ctxguard.observe.pressure_monitor import PressureMonitor, monitor_for

Level = Literal["ok", "lowered", "refused"]
LEVELS: tuple[Level, ...] = ("ok", "lowered", "refused")
_SECONDS = ("hold_seconds", "interval", "timeout", "stale_after")
__all__ = [
    "KV_USAGE",
    "WAITING",
    "Page",
    "Pressure",
    "PressureLimit",
    "PressureMonitor",
    "describe",
    "parse_metrics",
    "read_metrics",
    "read_page",
]
MAX_MODEL_NAME = 512  # characters of a model= name (a served model name, not a document)


class PressureLimit(NotCopyable):
    """A limit source that lowers or refuses while the server is under KV pressure.

    >>> # Guard(url, limit=PressureLimit(32768, "http://vllm:8000/metrics"))
    """

    _holds = "a reader of the server's /metrics (a connection and locks)"
    _advice = "make one per process from the same settings"

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
        model: str | None = None,
    ) -> None:
        check_arg_types("PressureLimit", metrics_url=(metrics_url, "str"))
        if model is not None and (
            type(model) is not str
            or not 0 < len(model) <= MAX_MODEL_NAME
            or not model.isprintable()
        ):
            raise ConfigError(
                "model must be None or the served model's name as the server's /metrics "
                f"labels it (model_name, printable, at most {MAX_MODEL_NAME} characters), "
                f"got {show(model)}"
            )
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
        self.monitor = monitor_for(metrics_url, interval, timeout, model)
        self.model = model
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
