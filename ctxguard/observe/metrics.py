"""Prometheus metrics of the guard (extra ``ctxguard[metrics]``: ``prometheus_client``).

Names follow the Prometheus conventions: prefix ``ctxguard_``, base units,
``_total`` counters, ratios 0-1, and no session or user labels (every label has a
small fixed set of values: operation names, outcomes, policy names, error classes).
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from ctxguard._nocopy import NotPicklable
from ctxguard._validate import one_line, show
from ctxguard.errors import (
    BudgetError,
    ConfigError,
    InvalidMessageError,
    MissingDependencyError,
    TemplateRefusedError,
)

try:
    from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
    from prometheus_client import start_http_server as _start_http_server
    from prometheus_client.metrics import MetricWrapperBase
except ImportError:  # the extra is not installed: say which one
    raise MissingDependencyError("Prometheus metrics (observe.metrics)", "metrics") from None

from ctxguard.guard.events import OperationEvent
from ctxguard.observe.usage_counts import UsageCounts

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

    from ctxguard.observe.background import BackgroundObserver

_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
REFUSALS = (BudgetError, TemplateRefusedError, InvalidMessageError)  # MessageTooLong is a Budget
# the policy a request is counted under: the first of these its plan used
POLICIES = ("summary", "render_trim", "window", "degrade", "tool_integrity")
TOKEN_BUCKETS = tuple(float(2**n) for n in range(8, 21))  # 256 .. 1M tokens
RATIO_BUCKETS = (0.1, 0.25, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 1.0)
DRIFT_BUCKETS = (-256.0, -64.0, -16.0, -4.0, -1.0, 0.0, 1.0, 4.0, 16.0, 64.0, 256.0)
STORE_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 0.5, 2.5)
CACHED = "prompt_tokens_details.cached_tokens"  # (the server's prefix-cache hits)
SUMMARY_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class PrometheusObserver(NotPicklable):
    """Turns each guard operation into metric updates on ``registry``.

    >>> from prometheus_client import CollectorRegistry
    >>> observer = PrometheusObserver(CollectorRegistry())
    >>> # Guard(..., observer=observer)
    """

    _holds = "its Prometheus registry"
    _advice = "make one per process (prometheus_client's multiprocess mode adds them up)"

    def __init__(self, registry: CollectorRegistry | None = None, prefix: str = "ctxguard") -> None:
        if registry is not None and not isinstance(registry, CollectorRegistry):
            raise ConfigError(
                "registry must be a prometheus_client CollectorRegistry, "
                f"got {type(registry).__name__}"
            )
        if type(prefix) is not str or not _METRIC_NAME.fullmatch(prefix):
            raise ConfigError(
                f"prefix must be a metric name such as 'ctxguard' ([a-zA-Z_:][a-zA-Z0-9_:]*), "
                f"got {show(prefix)}"
            )
        self.registry = REGISTRY if registry is None else registry
        # the metrics are registered below as one collector, whose collect flushes the
        # background deliverers feeding them first: a full scrape, a scrape restricted to
        # some names (``?name[]=``, ``restricted_registry``) and ``get_sample_value`` all
        # see every event enqueued before them
        r, p = None, prefix
        self._flushes: list[Callable[[], Callable[..., bool] | None]] = []
        self.events_dropped = Counter(
            f"{p}_observer_events_dropped",
            "Events a background observer dropped, its queue full, instead of blocking a request",
            registry=r,
        )
        self.requests = Counter(
            f"{p}_requests",
            "Prepared requests by outcome (sent, refused, error) and the policy "
            "that shaped the window (none when everything fit)",
            ["outcome", "policy"],
            registry=r,
        )
        self.operations = Histogram(
            f"{p}_operation_duration_seconds",
            "Guard operations (prepare, complete, summarize, append, replace), end to end",
            ["operation"],
            buckets=STORE_BUCKETS,
            registry=r,
        )
        self.window_tokens = Histogram(
            f"{p}_window_tokens",
            "Prompt tokens of each prepared request (the guard's count)",
            buckets=TOKEN_BUCKETS,
            registry=r,
        )
        self.limit_tokens = Gauge(
            f"{p}_limit_tokens",
            "Context limit of the latest prepared request",
            registry=r,
            multiprocess_mode="mostrecent",  # across worker processes: the latest one
        )
        self.utilisation = Histogram(
            f"{p}_limit_utilisation_ratio",
            "(prompt + reserved output) / limit per request",
            buckets=RATIO_BUCKETS,
            registry=r,
        )
        self.dropped = Counter(
            f"{p}_messages_dropped", "Messages left out of prepared windows", registry=r
        )
        self.repaired = Counter(
            f"{p}_tool_groups_repaired",
            "Requests whose tool calls/results were repaired (an incomplete tool group left out)",
            registry=r,
        )
        self.summaries = Counter(
            f"{p}_summaries",
            "Summaries by outcome (committed, failed, lost_race)",
            ["outcome"],
            registry=r,
        )
        self.summary_seconds = Histogram(
            f"{p}_summary_duration_seconds",
            "Summarizer runs, including the commit",
            ["outcome"],
            buckets=SUMMARY_BUCKETS,
            registry=r,
        )
        self.drift = Histogram(
            f"{p}_estimate_drift_tokens",
            "Server prompt_tokens minus the guard's count, per "
            "completed request that carried usage",
            buckets=DRIFT_BUCKETS,
            registry=r,
        )
        self.prefix_cached = Counter(
            f"{p}_prefix_cached_tokens",
            "Prompt tokens the server reported as served from its "
            "prefix cache (usage.prompt_tokens_details.cached_tokens)",
            registry=r,
        )
        self.store_seconds = Histogram(
            f"{p}_store_operation_duration_seconds",
            "Store calls by operation",
            ["operation"],
            buckets=STORE_BUCKETS,
            registry=r,
        )
        self.store_errors = Counter(
            f"{p}_store_errors",
            "Store calls that raised, by operation and error class",
            ["operation", "error"],
            registry=r,
        )
        self.pressure = Counter(
            f"{p}_pressure_requests",
            "Prepared requests whose limit came through a PressureLimit, by its level "
            '(ok, lowered); refusals are ctxguard_requests_total{policy="ServerBusyError"}',
            ["level"],
            registry=r,
        )
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}  # labelled children
        self._counts = UsageCounts("PrometheusObserver")
        self.cache_hits = Counter(
            f"{p}_window_cache_hits",
            "Prepares planned on the cached window and taken by the store in one round trip",
            registry=r,
        )
        self.cache_misses = Counter(
            f"{p}_window_cache_misses",
            "Prepares that fetched the window (not cached, or the session had changed)",
            ["reason"],
            registry=r,
        )
        metrics = [m for m in vars(self).values() if isinstance(m, MetricWrapperBase)]
        try:
            self.registry.register(_Flushing(self._flushes, metrics))
        except ValueError:  # prometheus_client: "Duplicated timeseries in CollectorRegistry"
            raise ConfigError(
                f"metrics named {prefix}_* are already registered on this registry: share one "
                "PrometheusObserver between guards, or give this one another registry or prefix"
            ) from None

    def attach_background(self, deliverer: BackgroundObserver) -> None:
        """Called by ``background(...)``: flush ``deliverer`` before each collect of the
        registry, count its dropped events."""
        self._flushes.append(weakref.WeakMethod(deliverer.flush))
        deliverer._on_drop.append(self.events_dropped.inc)

    def _child(self, metric: Any, *values: str) -> Any:
        """``metric.labels(*values)``, looked up once (prometheus_client locks on each call)."""
        key = (id(metric), values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*values)
        return child

    def __call__(self, event: OperationEvent) -> None:
        self._child(self.operations, event.kind).observe(event.seconds)
        for call in event.store_calls:
            self._child(self.store_seconds, call.method).observe(call.seconds)
            if call.error is not None:
                self.store_errors.labels(call.method, call.error).inc()
        for summary in event.summaries:
            self.summaries.labels(summary.outcome).inc()
            self.summary_seconds.labels(summary.outcome).observe(summary.seconds)
        if event.cache == "hit":
            self.cache_hits.inc()
        elif event.cache is not None:
            self._child(self.cache_misses, event.cache).inc()
        if event.kind == "prepare":
            self._prepared(event)
        elif event.kind == "complete" and event.error is None:
            self._usage(event.usage, event.estimate)

    def _prepared(self, event: OperationEvent) -> None:
        prepared = event.prepared
        if prepared is None:
            refused = _is_refusal(event.error)
            policy = type(event.error).__name__ if event.error is not None else "none"
            self.requests.labels("refused" if refused else "error", policy).inc()
            return
        used = {str(d.get("policy")) for d in prepared.decisions}
        policy = next((p for p in POLICIES if p in used), "none")
        self._child(self.requests, "sent", policy).inc()
        self.window_tokens.observe(prepared.tokens)
        self.limit_tokens.set(prepared.limit)
        if prepared.limit > 0:
            ratio = (prepared.tokens + prepared.reserved_output) / prepared.limit
            self.utilisation.observe(min(1.0, ratio))
        dropped = sum(
            int(d.get("dropped_messages") or 0)
            for d in prepared.decisions
            if d.get("policy") in ("window", "render_trim")
        )
        if dropped:
            self.dropped.inc(dropped)
        if "tool_integrity" in used:
            self.repaired.inc()
        source = prepared.limit_source
        if "; pressure " in source:
            self.pressure.labels("lowered" if "; pressure lowered" in source else "ok").inc()

    def _usage(self, usage: Mapping[str, Any] | None, estimate: int | None) -> None:
        if usage is None:
            return
        counts = self._counts  # (a count no server reports is left out, with a WARNING)
        prompt = counts.count(usage, "prompt_tokens")
        if prompt is not None and estimate is not None:
            self.drift.observe(prompt - estimate)
        cached = counts.count(usage, CACHED)
        if cached is not None and prompt is not None and cached > prompt:
            counts.leave_out(CACHED, cached, f"more than the prompt_tokens ({prompt})")
            return
        if cached:
            self.prefix_cached.inc(cached)


class _Flushing:
    """The observer's metrics as one collector: its collect flushes the background
    deliverers feeding them, then reads them. Registered as one, the flush runs whenever
    any of them is collected, whatever the registry's order or a restriction to names."""

    FLUSH_TIMEOUT = 2.0  # a stuck observer delays a scrape this long at most

    def __init__(
        self,
        flushes: list[Callable[[], Callable[..., bool] | None]],
        metrics: list[MetricWrapperBase],
    ) -> None:
        self.flushes = flushes
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        for ref in list(self.flushes):
            flush = ref()
            if flush is not None:
                flush(self.FLUSH_TIMEOUT)
        for metric in self.metrics:
            yield from metric.collect()

    def describe(self) -> Iterator[Metric]:
        # the names, so that the registry finds duplicates and restricted scrapes find us
        for metric in self.metrics:
            yield from metric.describe()


def _is_refusal(error: BaseException | None) -> bool:
    return isinstance(error, REFUSALS)


def start_http_server(
    port: int, addr: str = "127.0.0.1", registry: CollectorRegistry | None = None
) -> Any:
    """Serve ``registry`` (the default one if None) on ``http://addr:port/metrics``.

    Binds to localhost unless told otherwise; returns prometheus_client's
    ``(server, thread)`` so tests and shutdown code can stop it.
    """
    if type(port) is not int or not 0 <= port <= 65535:
        raise ConfigError(f"port must be an int from 0 to 65535, got {show(port)}")
    if type(addr) is not str:
        raise ConfigError(f"addr must be a host name or address (str), got {show(addr)}")
    if registry is not None and not isinstance(registry, CollectorRegistry):
        raise ConfigError(
            f"registry must be a prometheus_client CollectorRegistry, got {type(registry).__name__}"
        )
    try:
        return _start_http_server(
            port, addr=addr, registry=REGISTRY if registry is None else registry
        )
    except OSError as exc:  # the port is taken, the address is not this host's, ...
        raise ConfigError(
            one_line(f"cannot serve metrics on {show(addr)} port {port}: {exc}")
        ) from exc
