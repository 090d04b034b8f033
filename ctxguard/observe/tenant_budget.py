"""Per-tenant token budgets over a sliding time window, kept in Redis.

Every process and gateway worker that names the same Redis shares the budget:
one key per tenant (``KeySpace.tenant_budget_key``, a hash of time buckets) and
one atomic Lua script that drops the buckets that left the window, adds the
tokens spent and answers the total, on the server's clock. One key per script
call, so it runs unchanged on Redis Cluster.

Use it twice on a guard: as its limit (the limit becomes what the tenant has left,
and a tenant with less than ``min_tokens`` left is refused with
:class:`~ctxguard.errors.TenantBudgetError`, audited like every refusal) and as its
observer (each ``complete`` with the server's usage charges prompt + completion)::

    budget = TenantBudget("redis://...", tokens=2_000_000, window_seconds=3600, tenant="acme")
    guard = Guard(url, limit=budget.limit(32768), observer=budget)

The check and the charge are two steps, so requests running at the same moment
can pass a budget by at most what they spend together (the budget is a rate
limit, not a reservation). The observer charges with a blocking Redis call (about
one round trip); under AsyncGuard, prefer ``await budget.acharge(n)`` yourself.

A charge the observer could not make (Redis down, a timeout) does not fail the request
(a guard ignores what its observer raises), but it is not silent: the budget counts it
(``charge_failures``, ``uncharged_tokens``: what the window is missing) and logs a
WARNING on the ``ctxguard.observe`` logger, the first at once and then at most one per
``LOG_EVERY`` seconds saying how many more failed, so an outage is not a line per request;
an INFO line says when charges work again. The lines show the store URL redacted.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from importlib import resources
from typing import Any

from redis.exceptions import RedisClusterException, RedisError, ResponseError

from ctxguard._nocopy import NotCopyable
from ctxguard._secrets import describe
from ctxguard._validate import show
from ctxguard.errors import ConfigError, StoreError, TenantBudgetError
from ctxguard.guard.events import OperationEvent
from ctxguard.guard.setup import make_limit
from ctxguard.kv.limit import ContextLimit, LimitSource
from ctxguard.observe.usage_counts import UsageCounts
from ctxguard.stores.keys import KeySpace
from ctxguard.stores.redis_clients import sync_client
from ctxguard.stores.redis_errors import wrap_error
from ctxguard.stores.urls import parse_store_url

SCRIPT = resources.files("ctxguard.observe").joinpath("lua/tenant_budget.lua").read_text()
# The script's numbers are Lua doubles, passed back to Redis as text of 17 digits: a
# charge past 2**53 (or a window past ~31 years, in ms) was not an integer to HINCRBY /
# PEXPIRE, and failed as a StoreError naming the script's line.
MAX_CHARGE = 2**53
MAX_WINDOW_SECONDS = 10**9
# the script reads the whole hash (HGETALL) on every charge and check, blocking Redis
# meanwhile: a budget of 10**12 buckets made one field per millisecond of the window
MAX_BUCKETS = 3600
LOG_EVERY = 60.0  # seconds between two warnings about failed charges
log = logging.getLogger("ctxguard.observe")


class TenantBudget(NotCopyable):
    """``tokens`` per ``window_seconds`` for one tenant (``buckets`` slices of the window,
    at most :data:`MAX_BUCKETS`)."""

    _holds = "a connection to its store"
    _advice = "make one per process from the same settings"

    def __init__(
        self,
        url: str,
        *,
        tokens: int,
        window_seconds: float,
        namespace: str | None = None,
        tenant: str | None = None,
        buckets: int = 60,
        min_tokens: int = 1,
    ) -> None:
        for name, value in (("tokens", tokens), ("buckets", buckets), ("min_tokens", min_tokens)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be a positive int, got {show(value)}")
        if buckets > MAX_BUCKETS:  # (each charge and check reads every bucket, in Redis)
            raise ConfigError(
                f"buckets must be at most {MAX_BUCKETS:,} (each charge and check reads every "
                f"bucket of the window inside Redis), got {show(buckets)}"
            )
        if min_tokens > tokens:  # (every request was refused: "retry in 0.0s")
            raise ConfigError(
                f"min_tokens ({min_tokens}) must be at most tokens ({tokens}): with more, "
                "every request of the tenant is refused, even with nothing spent"
            )
        if (
            isinstance(window_seconds, bool)
            or not isinstance(window_seconds, (int, float))
            or not math.isfinite(window_seconds)
            or not 0.001 <= window_seconds <= MAX_WINDOW_SECONDS
        ):
            raise ConfigError(
                f"window_seconds must be from 0.001 to {MAX_WINDOW_SECONDS:,}, "
                f"got {show(window_seconds)}"
            )
        self.store_url = parse_store_url(url, namespace, tenant)
        if self.store_url.scheme == "memory":
            raise ConfigError("a tenant budget is kept in Redis: pass a redis:// URL")
        self.tenant = self.store_url.tenant
        self.key = KeySpace(self.store_url.namespace, self.tenant).tenant_budget_key()
        self.tokens, self.window_seconds, self.min_tokens = tokens, window_seconds, min_tokens
        self.window_ms = max(1, round(window_seconds * 1000))
        self.width_ms = max(1, self.window_ms // buckets)
        self._client: Any = None
        self._script: Any = None
        self._lock = threading.Lock()
        self.charge_failures = 0  # charges the observer could not make
        self.uncharged_tokens = 0  # the tokens they were for
        self._failing = threading.Lock()  # the counts and the log's state below
        self._streak = 0  # failures since charges last worked
        self._unlogged = 0  # failures since the last warning
        self._next_log = 0.0  # (monotonic) when another warning may be written
        self._clock = time.monotonic
        self._counts = UsageCounts("TenantBudget")

    def __repr__(self) -> str:
        return (
            f"TenantBudget({self.store_url.redacted!r}, tenant={self.tenant!r}, "
            f"tokens={self.tokens}, window_seconds={self.window_seconds})"
        )

    # -- the one script ------------------------------------------------------------

    def _run(self, add: int) -> tuple[int, float]:
        with self._lock:
            if self._script is None:
                self._client = sync_client(self.store_url)
                self._script = self._client.register_script(SCRIPT)
        try:
            spent, wait_ms = self._script(
                keys=[self.key], args=[self.window_ms, self.width_ms, add]
            )
        except ResponseError as exc:
            if str(exc).startswith("CORRUPT"):
                raise StoreError(
                    f"tenant budget: key {str(exc)[8:]}; it was written by something other "
                    "than ctxguard: delete that key (the budget starts again from zero)"
                ) from None
            raise wrap_error(exc, "tenant budget", self.store_url.redacted, self.store_url) from exc
        except (RedisError, RedisClusterException) as exc:
            raise wrap_error(exc, "tenant budget", self.store_url.redacted, self.store_url) from exc
        return int(spent), int(wait_ms) / 1000

    def spent(self) -> tuple[int, float]:
        """Tokens spent in the window now, and seconds until the oldest of them leaves it."""
        return self._run(0)

    def charge(self, tokens: int) -> int:
        """Add ``tokens`` spent now; returns the window's total."""
        if isinstance(tokens, bool) or not isinstance(tokens, int) or not 0 <= tokens <= MAX_CHARGE:
            raise ConfigError(f"tokens must be an int from 0 to 2**53, got {show(tokens)}")
        return self._run(tokens)[0] if tokens else self.spent()[0]

    async def acharge(self, tokens: int) -> int:
        return await asyncio.to_thread(self.charge, tokens)

    def remaining(self) -> int:
        """Tokens left in the window; raises TenantBudgetError below ``min_tokens``."""
        spent, wait = self.spent()
        left = self.tokens - spent
        if left < self.min_tokens:
            raise TenantBudgetError(
                f"tenant {self.tenant!r} spent {spent} of its {self.tokens} tokens per "
                f"{self.window_seconds:g}s; nothing was stored: retry in {wait:.1f}s",
                spent=spent,
                budget=self.tokens,
                window_seconds=self.window_seconds,
                retry_after=wait,
            )
        return left

    # -- as a guard's limit and observer --------------------------------------------

    def limit(self, inner: int | ContextLimit | LimitSource) -> TenantLimit:
        """A limit source: ``inner``, capped at what the tenant has left."""
        return TenantLimit(make_limit(inner), self)

    def __call__(self, event: OperationEvent) -> None:
        """Charge each completed request's usage (prompt + completion tokens)."""
        if event.kind != "complete" or event.error is not None or event.usage is None:
            return
        # prompt + completion (checked non-negative ints), or the server's total when
        # larger: total_tokens is not checked, and a -1, 0 or true sent as it charged
        # nothing (or 1) for a request that spent thousands; one past 2**63-1 (10**30)
        # is no count either: left out with a WARNING (it was a failed charge of 10**30,
        # counted in uncharged_tokens)
        counts, usage = self._counts, event.usage
        total = (counts.count(usage, "prompt_tokens") or 0) + (
            counts.count(usage, "completion_tokens") or 0
        )
        reported = counts.count(usage, "total_tokens")
        if reported is not None and reported > total:
            total = reported
        if total > 0:
            try:
                self.charge(total)
            except Exception as exc:  # (a guard would drop it: the request must not fail)
                self._charge_failed(total, exc)
            else:
                if self._streak:
                    self._charges_work()

    def _charge_failed(self, tokens: int, exc: Exception) -> None:
        with self._failing:
            self.charge_failures += 1
            self.uncharged_tokens += tokens
            self._streak += 1
            self._unlogged += 1
            now = self._clock()
            if now < self._next_log:
                return
            self._next_log = now + LOG_EVERY
            unlogged, self._unlogged = self._unlogged, 0
        more = f" ({unlogged} failed since the last warning)" if unlogged > 1 else ""
        log.warning(
            "tenant budget of %r on %s could not charge %d tokens%s; the budget is not "
            "counting them (%d uncharged so far): %s",
            self.tenant,
            self.store_url.redacted,
            tokens,
            more,
            self.uncharged_tokens,
            describe(exc),
        )

    def _charges_work(self) -> None:
        with self._failing:
            streak, self._streak, self._unlogged, self._next_log = self._streak, 0, 0, 0.0
        if streak:
            log.info(
                "tenant budget of %r on %s charges again after %d failed charges",
                self.tenant,
                self.store_url.redacted,
                streak,
            )

    def close(self) -> None:
        if self._client is not None:
            self._client.close()


class TenantLimit:
    """A limit source capped at the tenant's remaining budget (see :class:`TenantBudget`)."""

    def __init__(self, inner: LimitSource, budget: TenantBudget) -> None:
        self.inner, self.budget = inner, budget

    def _cap(self, base: ContextLimit) -> ContextLimit:
        left = self.budget.remaining()
        if left >= base.tokens:
            return base
        details = {**base.details, "tenant_budget": {"left": left, "budget": self.budget.tokens}}
        source = f"{base.source}; tenant budget {base.tokens}->{left}"
        return ContextLimit(left, source, details)

    def resolve(self) -> ContextLimit:
        return self._cap(self.inner.resolve())

    async def aresolve(self) -> ContextLimit:
        base = await self.inner.aresolve()
        return await asyncio.to_thread(self._cap, base)
