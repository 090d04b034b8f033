"""Pressure-aware limits against a local server whose vLLM-shaped /metrics changes."""

from __future__ import annotations

import asyncio
import json
import socket
import uuid
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry

from ctxguard.errors import BudgetError, ConfigError, CtxGuardError, ServerBusyError
from ctxguard.guard import AsyncGuard, Guard
from ctxguard.observe.metrics import PrometheusObserver
from ctxguard.observe.pressure import PressureLimit, parse_metrics
from tests.conftest import private_memory_url

from .metrics_server import MetricsServer, sglang_text, vllm_text


def user(i: int) -> dict[str, str]:
    return {"role": "user", "content": f"question {i} " + "about things " * 8}


@pytest.fixture
def server(request: pytest.FixtureRequest) -> Iterator[MetricsServer]:
    bodies = request.param if hasattr(request, "param") else [(200, vllm_text(0.1, 0))]
    srv = MetricsServer(bodies)
    yield srv
    srv.close()


def unique(url: str) -> str:
    """A URL of its own per test (monitors are shared per URL by the process)."""
    return f"{url}?t={uuid.uuid4().hex}"


def test_parse_vllm_and_sglang() -> None:
    text = vllm_text(0.5, 3) + vllm_text(0.75, 4, model="other")
    assert parse_metrics(text) == (0.75, 7.0)
    assert parse_metrics(sglang_text(0.9, 2)) == (0.9, 2.0)
    assert parse_metrics("garbage\nvllm:kv_cache_usage_perc{} nan\n") == (None, None)


PHASES = [
    (200, vllm_text(0.2, 0)),  # ok
    (200, vllm_text(0.88, 1)),  # lowered
    (200, vllm_text(0.80, 1)),  # still lowered: not 0.1 below the threshold
    (200, vllm_text(0.98, 9)),  # refused: a full cache and a queue forming
    (200, vllm_text(0.92, 5)),  # still refused (hysteresis: 0.1 and 4 below)
    (200, vllm_text(0.5, 70)),  # refused by the queue
    (200, vllm_text(0.5, 10)),  # lowered (queue still past waiting_lower)
    (200, vllm_text(0.3, 0)),  # ok again
]


@pytest.mark.parametrize("server", [PHASES], indirect=True)
def test_budget_follows_pressure_with_hysteresis(server: MetricsServer, namespace: str) -> None:
    limit = PressureLimit(4000, unique(server.url), interval=0)
    registry = CollectorRegistry()
    guard = Guard(
        private_memory_url(), limit=limit, max_tokens=64, observer=PrometheusObserver(registry)
    )
    session = "p-" + namespace
    seen: list[str] = []
    for i in range(len(PHASES)):
        try:
            prepared = guard.prepare(session, [user(i)])
            seen.append(f"{prepared.limit}")
        except ServerBusyError as exc:
            assert isinstance(exc, CtxGuardError) and isinstance(exc, BudgetError)
            assert exc.kv_usage is not None and exc.waiting is not None
            seen.append("busy")
    assert seen == ["4000", "2000", "2000", "busy", "busy", "busy", "2000", "4000"]
    assert server.scrapes == len(PHASES)
    counts = {
        level: registry.get_sample_value("ctxguard_pressure_requests_total", {"level": level})
        for level in ("ok", "lowered")
    }
    assert counts == {"ok": 2, "lowered": 3}
    busy = {"outcome": "refused", "policy": "ServerBusyError"}
    assert registry.get_sample_value("ctxguard_requests_total", busy) == 3
    # the decisions are in the audit records: the limit's source, and the refusals
    records = guard.store.read_audit(session)
    sources = [r.get("limit_source", "") for r in records if r.get("kind") == "request"]
    assert "pressure lowered 4000->2000 kv=0.88 waiting=1" in sources[1]
    refused = [r for r in records if r.get("kind") == "refused"]
    assert [r["error"] for r in refused] == ["ServerBusyError"] * 3
    assert "kv=0.98 waiting=9" in refused[0]["detail"]
    assert "user" not in json.dumps(refused)  # ids and numbers, no content


@pytest.mark.parametrize(
    "server", [[(200, vllm_text(0.99, 9)), (200, vllm_text(0.5, 0))]], indirect=True
)
def test_hold_waits_for_pressure_to_fall(server: MetricsServer) -> None:
    limit = PressureLimit(4000, unique(server.url), interval=0, hold_seconds=30)
    guard = Guard(private_memory_url(), limit=limit, max_tokens=64)
    assert guard.prepare("h1", [user(0)]).limit == 4000  # refused, held, then ok
    assert server.scrapes == 2


KV_ONLY = '# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{engine="0"} 0.99\n'


@pytest.mark.parametrize(
    "server",
    [[(200, vllm_text(0.99, 0)), (200, vllm_text(0.99, 7)), (200, KV_ONLY)]],
    indirect=True,
)
def test_a_full_cache_refuses_only_with_a_queue(server: MetricsServer) -> None:
    """vLLM fills its KV cache by design: full with no queue is lowered, not refused."""
    guard = Guard(
        private_memory_url(),
        limit=PressureLimit(4000, unique(server.url), interval=0),
        max_tokens=64,
    )
    assert guard.prepare("f1", [user(0)]).limit == 2000  # 0.99 KV, nothing waiting
    assert guard.prepare("f1", [user(1)]).limit == 2000  # 7 waiting: under waiting_lower
    with pytest.raises(ServerBusyError):  # a server that does not say its queue
        guard.prepare("f1", [user(2)])


@pytest.mark.parametrize("server", [[(200, vllm_text(0.9, 0))]], indirect=True)
def test_one_reader_per_url_per_process(server: MetricsServer) -> None:
    url = unique(server.url)
    a = Guard(private_memory_url(), limit=PressureLimit(4000, url, interval=3600), max_tokens=64)
    b = Guard(private_memory_url(), limit=PressureLimit(8000, url, interval=3600), max_tokens=64)
    assert a.prepare("o1", [user(0)]).limit == 2000
    assert b.prepare("o2", [user(0)]).limit == 4000
    assert server.scrapes == 1


@pytest.mark.parametrize("server", [[(200, vllm_text(0.9, 0))]], indirect=True)
async def test_one_async_reading_per_interval_however_many_wait(server: MetricsServer) -> None:
    """A burst of async resolves read /metrics once (before: each coroutine that came
    while the first reading was in flight read it again: 50 resolves, ~45 scrapes)."""
    limit = PressureLimit(4000, unique(server.url), interval=3600)
    await asyncio.gather(*(limit.aresolve() for _ in range(50)))
    assert server.scrapes == 1
    assert (await limit.aresolve()).tokens == 2000


def test_negative_readings_are_ignored() -> None:
    # an engine reporting -100 waiting cancelled another's real queue of 70 (refusing)
    text = vllm_text(0.5, 70) + vllm_text(-1.0, -100, model="other")
    assert parse_metrics(text) == (0.5, 70.0)


@pytest.mark.parametrize(
    "server",
    [[(200, vllm_text(0.5, 0)), (200, vllm_text(0.99, 9)), (200, vllm_text(0.2, 0))]],
    indirect=True,
)
async def test_async_guard_alike(server: MetricsServer) -> None:
    guard = AsyncGuard(
        private_memory_url(),
        limit=PressureLimit(4000, unique(server.url), interval=0),
        max_tokens=64,
    )
    assert (await guard.prepare("a1", [user(0)])).limit == 4000
    with pytest.raises(ServerBusyError):
        await guard.prepare("a1", [user(1)])
    assert (await guard.prepare("a1", [user(2)])).limit == 4000
    await guard.aclose()


@pytest.mark.parametrize("server", [[(200, sglang_text(0.9, 0))]], indirect=True)
def test_sglang_usage(server: MetricsServer) -> None:
    guard = Guard(
        private_memory_url(),
        limit=PressureLimit(4000, unique(server.url), interval=0),
        max_tokens=64,
    )
    assert guard.prepare("g1", [user(0)]).limit == 2000


def test_unreachable_metrics_fail_open_within_the_timeout() -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    limit = PressureLimit(4000, f"http://user:pw@127.0.0.1:{port}/metrics", interval=0, timeout=0.5)
    got = Guard(private_memory_url(), limit=limit, max_tokens=64).prepare("u1", [user(0)])
    assert got.limit == 4000
    assert "pw" not in got.limit_source and "pressure ok" in got.limit_source


@pytest.mark.parametrize("server", [[(500, "oops")]], indirect=True)
def test_server_error_fails_open(server: MetricsServer) -> None:
    limit = PressureLimit(4000, unique(server.url), interval=0)
    assert (
        Guard(private_memory_url(), limit=limit, max_tokens=64).prepare("e1", [user(0)]).limit
        == 4000
    )


@pytest.mark.parametrize(
    "kwargs",
    [
        {"lower_at": 0.9, "refuse_at": 0.5},
        {"lowered_fraction": 0},
        {"interval": -1},
        {"timeout": float("nan")},
        {"timeout": 1e300},  # (before: OverflowError out of every resolve)
        {"waiting_lower": True},
        # (before: accepted, the KV check never reached / a lowered budget never back)
        {"lower_at": 85, "refuse_at": 97},
        {"lower_at": 1.5, "refuse_at": 2},
        {"kv_margin": 0.85},
        {"waiting_margin": 8},
    ],
)
def test_bad_settings_are_config_errors(kwargs: dict[str, float]) -> None:
    with pytest.raises(ConfigError):
        PressureLimit(4000, "http://127.0.0.1:1/metrics", **kwargs)


def test_bad_url_is_a_config_error_without_the_password() -> None:
    with pytest.raises(ConfigError) as err:
        PressureLimit(4000, "redis://u:secretpw@h/0")
    assert "secretpw" not in str(err.value)


@pytest.mark.parametrize(
    "query", ["api_key=SEKRIT9", "a=1&token=SEKRIT9", "key=SEKRIT9", "sig=SEKRIT9"]
)
def test_a_secret_in_the_metrics_urls_query_is_refused_without_showing_it(query: str) -> None:
    # httpx logs every request's URL at INFO: a key in the query would be in each line
    with pytest.raises(ConfigError) as err:
        PressureLimit(4000, f"http://127.0.0.1:1/metrics?{query}")
    message = str(err.value)
    assert "SEKRIT9" not in message and "\n" not in message
    assert "query string" in message and "Basic auth" in message


def test_a_metrics_url_keeps_a_query_with_no_secret() -> None:
    limit = PressureLimit(4000, "http://127.0.0.1:1/metrics?name=vllm&tokens=5")
    assert limit.monitor.url.endswith("?name=vllm&tokens=5")


@pytest.mark.parametrize("server", [[(200, vllm_text(0.99, 90))]], indirect=True)
def test_a_hold_whose_deadline_passes_mid_loop_does_not_sleep_a_negative_time(
    server: MetricsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The deadline passing between the hold loop's check and its sleep made
    time.sleep(negative): ValueError out of resolve (before)."""
    import ctxguard.observe.pressure as pressure

    # each reading of the clock: +0.7 s, so the loop finds 0.7 s gone of its 1 s hold,
    # and the next reading is 0.4 s past the deadline
    ticks = iter(n * 0.7 for n in range(1_000_000))
    clock = SimpleNamespace(monotonic=lambda: next(ticks), sleep=_sleep)  # a fake `time`
    monkeypatch.setattr(pressure, "time", clock)
    limit = PressureLimit(4000, unique(server.url), interval=0, hold_seconds=1)
    with pytest.raises(ServerBusyError):
        limit.resolve()


def _sleep(seconds: float) -> None:
    if seconds < 0:  # what time.sleep says
        raise ValueError("sleep length must be non-negative")


def test_a_refuse_at_past_1_turns_kv_refusals_off() -> None:
    """(the benchmark's "lower-only" setting: refuse_at=2 is accepted)"""
    assert PressureLimit(4000, "http://127.0.0.1:1/metrics", refuse_at=2.0).refuse_at == 2.0
