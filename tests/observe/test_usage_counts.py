"""Observers take a usage count as ``Guard.complete`` takes one: an int from 0 to
2**63-1, no bool. Past that (10**30, True, -1, "12", 1.5) it is left out with a
WARNING, never exported, charged or raised.

(The counts ``Guard.complete`` does not check reached the observers as sent:
``cached_tokens`` 10**30 made a prefix-cache counter of 1e30, ``True`` counted one
token, 10**400 raised OverflowError inside prometheus_client; a ``total_tokens`` of
10**30 was a failed charge of 10**30 tokens, counted in ``uncharged_tokens``.)
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from ctxguard.guard import Guard
from ctxguard.guard.events import OperationEvent
from ctxguard.observe import fan_out
from ctxguard.observe.metrics import PrometheusObserver
from ctxguard.observe.tenant_budget import TenantBudget
from ctxguard.observe.tracing import TracingObserver
from tests.conftest import private_memory_url

UNREPORTABLE = [10**30, 2**63, 10**400, True, False, -1, "12", 1.5, [3]]
CACHED = "ctxguard_prefix_cached_tokens_total"


def cached_total(registry: CollectorRegistry) -> float:
    return registry.get_sample_value(CACHED) or 0.0


def complete(usage: dict[str, Any], estimate: int | None = None) -> OperationEvent:
    return OperationEvent("complete", "s", 0, 0, usage=usage, estimate=estimate)


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "ctxguard.observe" and r.levelno == logging.WARNING
    ]


@pytest.fixture
def spans() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    provider = TracerProvider()
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    yield provider, memory


@pytest.mark.parametrize("cached", UNREPORTABLE, ids=repr)
def test_an_unreportable_cached_count_is_left_out_with_a_warning(
    cached: object, caplog: pytest.LogCaptureFixture
) -> None:
    registry = CollectorRegistry()
    observer = PrometheusObserver(registry)
    usage = {"prompt_tokens": 100, "prompt_tokens_details": {"cached_tokens": cached}}
    with caplog.at_level(logging.WARNING, "ctxguard.observe"):
        observer(complete(usage, estimate=98))  # raises nothing
    assert cached_total(registry) == 0
    said = warnings(caplog)
    assert len(said) == 1 and "cached_tokens" in said[0] and "PrometheusObserver" in said[0]
    assert len(said[0]) < 300  # (10**400 is not printed whole)
    # the rest of the usage still counts
    assert registry.get_sample_value("ctxguard_estimate_drift_tokens_count") == 1


def test_a_cached_count_past_the_prompt_is_left_out(caplog: pytest.LogCaptureFixture) -> None:
    registry = CollectorRegistry()
    observer = PrometheusObserver(registry)
    usage = {"prompt_tokens": 100, "prompt_tokens_details": {"cached_tokens": 10**18}}
    with caplog.at_level(logging.WARNING, "ctxguard.observe"):
        observer(complete(usage))
    assert cached_total(registry) == 0
    assert any("more than the prompt_tokens" in m for m in warnings(caplog))


def test_reportable_cached_counts_add_up_and_warnings_are_throttled(
    caplog: pytest.LogCaptureFixture,
) -> None:
    registry = CollectorRegistry()
    observer = PrometheusObserver(registry)
    with caplog.at_level(logging.WARNING, "ctxguard.observe"):
        for cached in (64, 0, None, 10**30, True, 32):
            details = {} if cached is None else {"cached_tokens": cached}
            observer(complete({"prompt_tokens": 100, "prompt_tokens_details": details}))
    assert cached_total(registry) == 96
    assert len(warnings(caplog)) == 1  # two bad counts, one line (at most one a minute)


def test_a_guard_turn_with_a_huge_cached_count_exports_none(
    caplog: pytest.LogCaptureFixture,
) -> None:
    registry = CollectorRegistry()
    guard = Guard(private_memory_url(), limit=4096, observer=PrometheusObserver(registry))
    try:
        req = guard.prepare("s", [{"role": "user", "content": "question"}])
        usage = {
            "prompt_tokens": req.tokens,
            "completion_tokens": 3,
            "prompt_tokens_details": {"cached_tokens": 10**30},
        }
        with caplog.at_level(logging.WARNING, "ctxguard.observe"):
            guard.complete("s", {"role": "assistant", "content": "ok"}, prepared=req, usage=usage)
        assert cached_total(registry) == 0
        assert any("cached_tokens" in m for m in warnings(caplog))
    finally:
        guard.close()


@pytest.mark.parametrize("count", [True, 10**30, -1], ids=repr)
def test_spans_carry_only_reportable_usage_counts(
    spans: tuple[TracerProvider, InMemorySpanExporter],
    count: object,
    caplog: pytest.LogCaptureFixture,
) -> None:
    provider, memory = spans
    observer = TracingObserver(provider)
    with caplog.at_level(logging.WARNING, "ctxguard.observe"):
        observer(complete({"prompt_tokens": count, "completion_tokens": 7}))
    (span,) = memory.get_finished_spans()
    attrs = span.attributes or {}
    assert "gen_ai.usage.input_tokens" not in attrs
    assert attrs["gen_ai.usage.output_tokens"] == 7
    assert any("prompt_tokens" in m and "TracingObserver" in m for m in warnings(caplog))


class Charged:
    def __init__(self) -> None:
        self.tokens: list[int] = []

    def __call__(self, tokens: int) -> int:
        self.tokens.append(tokens)
        return sum(self.tokens)


@pytest.mark.parametrize("total", [10**30, 2**63, True, -1], ids=repr)
def test_a_budget_charges_prompt_and_completion_past_an_unreportable_total(
    total: object, caplog: pytest.LogCaptureFixture
) -> None:
    budget = TenantBudget("redis://127.0.0.1:1/0", tokens=10_000, window_seconds=60)
    charged = Charged()
    budget.charge = charged  # type: ignore[method-assign]  # (no Redis: what it is asked)
    usage = {"prompt_tokens": 1000, "completion_tokens": 50, "total_tokens": total}
    with caplog.at_level(logging.WARNING, "ctxguard.observe"):
        budget(complete(usage))
    assert charged.tokens == [1050]
    assert budget.charge_failures == 0 and budget.uncharged_tokens == 0
    said = warnings(caplog)
    assert len(said) == 1 and "total_tokens" in said[0] and "TenantBudget" in said[0]
    budget.close()


def test_one_bad_count_blinds_no_other_observer() -> None:
    registry = CollectorRegistry()
    budget = TenantBudget("redis://127.0.0.1:1/0", tokens=10_000, window_seconds=60)
    charged = Charged()
    budget.charge = charged  # type: ignore[method-assign]
    observer = fan_out(PrometheusObserver(registry), budget)
    usage = {
        "prompt_tokens": 10,
        "completion_tokens": 5,
        "total_tokens": 10**400,
        "prompt_tokens_details": {"cached_tokens": 10**400},
    }
    observer(complete(usage))
    assert charged.tokens == [15] and cached_total(registry) == 0
    budget.close()
