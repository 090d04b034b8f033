"""``GET /metrics``: the guards' and the gateway's own metrics after real turns, with one
worker and with several (every worker's values added up), and a 404 without the extra."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import private_memory_url

from .processes import ROOT, CliGateway
from .test_chat import chat
from .upstream import FakeVLLM

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(url: str) -> Samples:
    response = httpx.get(url + "/metrics", timeout=10)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    }


def sent(samples: Samples) -> float:
    return samples[("ctxguard_requests_total", (("outcome", "sent"), ("policy", "none")))]


def upstream(samples: Samples, outcome: str) -> float:
    name = "ctxguard_gateway_upstream_request_duration_seconds_count"
    return samples.get((name, (("outcome", outcome),)), 0.0)


@pytest.mark.redis
def test_metrics_count_the_turns(gateway: str, vllm: FakeVLLM) -> None:
    for turn in range(3):
        assert chat(gateway, f"turn {turn}").status_code == 200
    assert chat(gateway, "no session", session=None).status_code == 200
    assert chat(gateway, "streamed", stream=True).status_code == 200
    assert chat(gateway, "FAIL500 now").status_code == 502
    samples = scrape(gateway)
    assert sent(samples) == 6  # every prepared request, stateless too
    assert upstream(samples, "ok") == 5
    assert upstream(samples, "error") == 1
    assert samples[("ctxguard_limit_tokens", ())] == 4096
    assert samples[("ctxguard_operation_duration_seconds_count", (("operation", "complete"),))] == 4
    assert not [k for k in samples if "session" in dict(k[1]) or "user" in dict(k[1])]


def test_metrics_can_be_turned_off(start_gateway: Callable[..., str]) -> None:
    url = start_gateway(url=private_memory_url(), limit=4096, counter="approx", metrics=False)
    response = httpx.get(url + "/metrics", timeout=10)
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"
    assert "metrics = false" in response.json()["error"]["message"]


WITHOUT_EXTRA = """
import json, sys
sys.modules["prometheus_client"] = None  # as if ctxguard[metrics] were not installed
from starlette.testclient import TestClient
from ctxguard.serve import create_app
from ctxguard.serve.config import ServeConfig
config = ServeConfig(upstream="http://127.0.0.1:9", url="memory://", limit=4096, counter="approx")
with TestClient(create_app(config)) as client:
    response = client.get("/metrics")
loaded = [m for m, v in sys.modules.items() if m.startswith("prometheus_client") and v]
print(json.dumps([response.status_code, response.json(), loaded]))
"""


def test_without_the_extra_metrics_is_a_404_and_nothing_is_imported() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", WITHOUT_EXTRA], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr[-2000:]
    import json

    status, body, loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert status == 404
    assert body["error"]["code"] == "not_found"
    assert "install ctxguard[metrics]" in body["error"]["message"]
    assert loaded == []


@pytest.mark.redis
def test_several_workers_are_added_up(
    redis_url: str, namespace: str, vllm: FakeVLLM, tmp_path: Path
) -> None:
    metrics_dir = tmp_path / "prom"
    gateway = CliGateway(
        *("--upstream", vllm.url, "--url", redis_url, "--namespace", namespace),
        *("--workers", "2", "--max-tokens", "64"),
        env={"PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)},
    )
    try:
        turns = 0

        def workers_counted() -> set[str]:
            return {f.name.split("_")[-1] for f in metrics_dir.glob("counter_*.db")}

        # new connections until both workers have served turns (the kernel picks)
        while turns < 8 or (len(workers_counted()) < 2 and turns < 400):
            response = chat(gateway.url, f"turn {turns}", session=f"s{turns % 4}")
            assert response.status_code == 200
            turns += 1
        assert len(workers_counted()) == 2
        for _ in range(6):  # whichever worker answers the scrape adds up both
            samples = scrape(gateway.url)
            assert sent(samples) == turns
            assert upstream(samples, "ok") == turns
            assert samples[("ctxguard_limit_tokens", ())] == 4096
    finally:
        gateway.stop()


def test_a_scrape_flushes_the_background_delivery(monkeypatch: pytest.MonkeyPatch) -> None:
    from ctxguard.guard.events import OperationEvent
    from ctxguard.serve.metrics import GatewayMetrics

    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    metrics = GatewayMetrics()
    try:
        assert metrics.background is not None and metrics.observer is metrics.background
        metrics.background.interval = 60.0  # no delivery of its own before the scrape
        for i in range(3):
            metrics.observer(OperationEvent("complete", f"s{i}", 0, 0, end_ns=1000))
        body, _ = metrics.render()
    finally:
        metrics.close()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
    }
    name = "ctxguard_operation_duration_seconds_count"
    assert samples[(name, (("operation", "complete"),))] == 3


def test_several_workers_deliver_inline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from ctxguard.serve.metrics import GatewayMetrics

    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    metrics = GatewayMetrics()
    try:  # another worker's scrape cannot flush this one's queue: no queue at all
        assert metrics.background is None and metrics.observer is metrics.prometheus
    finally:
        metrics.close()
