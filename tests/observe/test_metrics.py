"""Prometheus metrics read from a real registry after real guard turns."""

from __future__ import annotations

import socket
import urllib.request
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from ctxguard import Message
from ctxguard.errors import BudgetError, ConfigError
from ctxguard.guard import AsyncGuard, Guard
from ctxguard.guard.events import OperationEvent
from ctxguard.observe import fan_out
from ctxguard.observe.metrics import PrometheusObserver, start_http_server
from tests.conftest import private_memory_url

from .metrics_server import Serving

SYSTEM = {"role": "system", "content": "You are terse."}


def user(i: int) -> dict[str, str]:
    return {"role": "user", "content": f"question number {i} " + "about things " * 8}


def reply(i: int) -> dict[str, str]:
    return {"role": "assistant", "content": f"answer number {i}. " + "it depends " * 8}


def summarizer(previous: str | None, messages: Sequence[Message]) -> str:
    return f"{len(messages)} messages about things"


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    got = registry.get_sample_value(name, labels)
    return 0.0 if got is None else got


@pytest.fixture(params=["memory", "redis"])
def store_url(request: pytest.FixtureRequest, namespace: str) -> Iterator[str]:
    if request.param == "memory":
        yield private_memory_url()
    else:
        yield request.getfixturevalue("redis_url")


def run_turns(guard: Guard, session: str, turns: int) -> None:
    guard.prepare(session, [SYSTEM])
    for i in range(turns):
        prepared = guard.prepare(session, [user(i)], max_tokens=64)
        guard.complete(
            session,
            reply(i),
            prepared=prepared,
            usage={
                "prompt_tokens": prepared.tokens + 3,
                "completion_tokens": 20,
                "prompt_tokens_details": {"cached_tokens": 16},
            },
        )


def test_metrics_after_real_turns(store_url: str, namespace: str) -> None:
    registry = CollectorRegistry()
    observer = PrometheusObserver(registry)
    guard = Guard(
        store_url,
        limit=400,
        max_tokens=64,
        namespace=namespace,
        observer=observer,
        summarize_after=1000,
    )
    try:
        run_turns(guard, "s1", 12)
        with pytest.raises(BudgetError):
            guard.prepare("s1", [{"role": "user", "content": "word " * 2000}], max_tokens=64)
    finally:
        guard.close()
    sent = value(registry, "ctxguard_requests_total", outcome="sent", policy="none")
    windowed = value(registry, "ctxguard_requests_total", outcome="sent", policy="window")
    assert sent + windowed == 13
    assert windowed > 0  # a 400-token limit cannot hold twelve turns
    assert value(registry, "ctxguard_requests_total", outcome="refused", policy="BudgetError") == 1
    assert value(registry, "ctxguard_window_tokens_count") == 13
    assert value(registry, "ctxguard_limit_tokens") == 400
    assert value(registry, "ctxguard_messages_dropped_total") > 0
    # every utilisation is within 0..1, and the ratio of a full window is high
    assert value(registry, "ctxguard_limit_utilisation_ratio_bucket", le="1.0") == 13
    assert value(registry, "ctxguard_limit_utilisation_ratio_bucket", le="0.5") < 13
    # the server counted 3 more than the guard every time
    assert value(registry, "ctxguard_estimate_drift_tokens_count") == 12
    assert value(registry, "ctxguard_estimate_drift_tokens_bucket", le="1.0") == 0
    assert value(registry, "ctxguard_estimate_drift_tokens_bucket", le="4.0") == 12
    assert value(registry, "ctxguard_prefix_cached_tokens_total") == 12 * 16
    hits = value(registry, "ctxguard_window_cache_hits_total")
    misses = value(registry, "ctxguard_window_cache_misses_total", reason="miss")
    assert hits >= 10 and misses >= 1
    assert (
        value(
            registry,
            "ctxguard_store_operation_duration_seconds_count",
            operation="append_with_audit",
        )
        == 12
    )
    assert value(registry, "ctxguard_operation_duration_seconds_count", operation="prepare") == 14
    assert value(registry, "ctxguard_operation_duration_seconds_count", operation="complete") == 12
    # no session (or other high-cardinality) label anywhere
    for metric in registry.collect():
        for sample in metric.samples:
            assert "s1" not in sample.labels.values()
            assert set(sample.labels) <= {"outcome", "policy", "operation", "reason", "error", "le"}


def test_summaries_counted_with_their_duration(store_url: str, namespace: str) -> None:
    registry = CollectorRegistry()
    guard = Guard(
        store_url,
        limit=400,
        max_tokens=64,
        namespace=namespace,
        observer=PrometheusObserver(registry),
        summarizer=summarizer,
        summarize_after=2,
    )
    try:
        run_turns(guard, "s2", 10)
    finally:
        guard.close()
    committed = value(registry, "ctxguard_summaries_total", outcome="committed")
    assert committed >= 1
    assert value(registry, "ctxguard_summary_duration_seconds_count", outcome="committed") == (
        committed
    )
    assert value(registry, "ctxguard_requests_total", outcome="sent", policy="summary") >= 1


def test_failed_summary_counted(namespace: str) -> None:
    def broken(_: str | None, __: Sequence[Message]) -> str:
        raise RuntimeError("model overloaded")

    registry = CollectorRegistry()
    guard = Guard(
        private_memory_url(),
        limit=400,
        max_tokens=64,
        observer=PrometheusObserver(registry),
        summarizer=broken,
        summarize_after=2,
    )
    run_turns(guard, "s3", 8)
    assert value(registry, "ctxguard_summaries_total", outcome="failed") >= 1
    assert value(registry, "ctxguard_summaries_total", outcome="committed") == 0


class FailingStore:
    """A memory store whose ``append_with_audit`` fails once."""


def test_store_errors_by_operation(redis_url: str, namespace: str) -> None:
    from ctxguard.errors import StoreConnectionError
    from ctxguard.stores import open_store

    store = open_store(private_memory_url())
    calls = {"n": 0}
    real = store.append_with_audit

    def flaky(*args: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 1:
            raise StoreConnectionError("lost the connection (test)")
        return real(*args)

    store.append_with_audit = flaky  # type: ignore[method-assign]
    registry = CollectorRegistry()
    guard = Guard(store, limit=400, max_tokens=64, observer=PrometheusObserver(registry))
    prepared = guard.prepare("s4", [user(0)])
    usage = {"prompt_tokens": prepared.tokens}
    with pytest.raises(StoreConnectionError):
        guard.complete("s4", reply(0), prepared=prepared, usage=usage)
    guard.complete("s4", reply(0), prepared=prepared, usage=usage)
    labels = {"operation": "append_with_audit", "error": "StoreConnectionError"}
    assert value(registry, "ctxguard_store_errors_total", **labels) == 1
    assert value(registry, "ctxguard_estimate_drift_tokens_count") == 1  # the failed one: none


async def test_async_guard_reports_alike(redis_url: str, namespace: str) -> None:
    registry = CollectorRegistry()
    guard = AsyncGuard(
        redis_url,
        limit=400,
        max_tokens=64,
        namespace=namespace,
        observer=PrometheusObserver(registry),
    )
    try:
        for i in range(6):
            prepared = await guard.prepare("a1", [user(i)], max_tokens=64)
            await guard.complete(
                "a1", reply(i), prepared=prepared, usage={"prompt_tokens": prepared.tokens}
            )
    finally:
        await guard.aclose()
    assert value(registry, "ctxguard_window_tokens_count") == 6
    assert value(registry, "ctxguard_estimate_drift_tokens_bucket", le="0.0") == 6
    assert value(registry, "ctxguard_window_cache_hits_total") >= 4
    assert (
        value(
            registry,
            "ctxguard_store_operation_duration_seconds_count",
            operation="append_with_audit",
        )
        == 6
    )


def test_observer_errors_never_change_the_answer() -> None:
    seen: list[OperationEvent] = []

    def broken(event: OperationEvent) -> None:
        raise RuntimeError("observer bug")

    guard = Guard(
        private_memory_url(), limit=400, max_tokens=64, observer=fan_out(broken, seen.append)
    )
    prepared = guard.prepare("s5", [user(0)])
    assert prepared.tokens > 0
    assert [e.kind for e in seen] == ["prepare"]
    guard2 = Guard(private_memory_url(), limit=400, max_tokens=64, observer=broken)
    assert guard2.prepare("s5b", [user(0)]).tokens == prepared.tokens


def test_bad_observer_and_registry_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="observer must be a callable"):
        Guard(private_memory_url(), limit=400, max_tokens=64, observer=42)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="CollectorRegistry"):
        PrometheusObserver({})  # type: ignore[arg-type]


@pytest.mark.parametrize("prefix", [None, 123, "", "bad-name", "ctx\nguard", "a b"])
def test_a_prefix_that_is_no_metric_name_is_a_config_error(prefix: object) -> None:
    # (before: None made "None_requests_total", "ctx\nguard" a name with a line break)
    with pytest.raises(ConfigError, match="prefix must be a metric name"):
        PrometheusObserver(CollectorRegistry(), prefix=prefix)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"port": "9464"}, "port must be an int"),  # (before: socket.gaierror)
        ({"port": 70000}, "port must be an int"),  # (before: OverflowError)
        ({"port": None}, "port must be an int"),  # (before: TypeError)
        ({"port": 0, "addr": None}, "addr must be"),
        ({"port": 0, "registry": "default"}, "CollectorRegistry"),  # (before: served, broken)
        ({"port": 0, "addr": "192.0.2.1"}, "cannot serve metrics"),  # not ours: OSError
    ],
)
def test_start_http_server_bad_arguments_are_config_errors(
    kwargs: dict[str, Any], expected: str
) -> None:
    with pytest.raises(ConfigError, match=expected):
        start_http_server(**kwargs)


def test_start_http_server_on_a_taken_port_is_a_config_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match=f"cannot serve metrics on '127.0.0.1' port {port}"):
            start_http_server(port, registry=CollectorRegistry())  # (before: OSError)


def test_start_http_server_serves_the_registry() -> None:
    registry = CollectorRegistry()
    guard = Guard(
        private_memory_url(), limit=400, max_tokens=64, observer=PrometheusObserver(registry)
    )
    guard.prepare("s6", [user(0)])
    serving = Serving(start_http_server(0, registry=registry))
    try:
        url = f"http://127.0.0.1:{serving.port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            text = response.read().decode()
    finally:
        serving.close()
    assert 'ctxguard_requests_total{outcome="sent",policy="none"} 1.0' in text


def test_cache_stale_when_another_writer_moved_the_session(redis_url: str, namespace: str) -> None:
    registry = CollectorRegistry()
    a = Guard(
        redis_url,
        limit=400,
        max_tokens=64,
        namespace=namespace,
        observer=PrometheusObserver(registry),
    )
    b = Guard(redis_url, limit=400, max_tokens=64, namespace=namespace)
    try:
        a.prepare("w1", [user(0)])
        a.append("w1", [reply(0)])
        b.append("w1", [user(1)])  # another process writes: a's cached window is stale
        a.prepare("w1", [user(2)])
    finally:
        a.close()
        b.close()
    assert value(registry, "ctxguard_window_cache_misses_total", reason="miss") == 1
    assert value(registry, "ctxguard_window_cache_misses_total", reason="stale") == 1
    assert value(registry, "ctxguard_operation_duration_seconds_count", operation="append") == 1
