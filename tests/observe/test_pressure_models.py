"""PressureLimit on a /metrics page of several models: ``model=`` picks one.

vLLM and SGLang label every sample with ``model_name``; one page can hold several
models (several engines behind one exporter, a multi-model router). The page was read
whole: the highest KV usage of any model and the sum of every model's queue, so one
model's budget was lowered or refused by another model's load. Now the reading is of
the model named with ``model=``; with none named, of the page's one model, and a page
of several is no reading (fail open, said in the decision's ``error`` and once in a
WARNING), as a page without the gauges is.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Iterator

import pytest

from ctxguard.errors import ConfigError
from ctxguard.observe.pressure import PressureLimit, describe, read_page

from .metrics_server import MetricsServer, vllm_text

HOT, COLD = "hot/model", "cold-model"
TWO_MODELS = vllm_text(0.95, 20, model=HOT) + vllm_text(0.10, 0, model=COLD)


def unique(url: str) -> str:
    return f"{url}?t={uuid.uuid4().hex}"


@pytest.fixture
def server(request: pytest.FixtureRequest) -> Iterator[MetricsServer]:
    srv = MetricsServer(request.param)
    yield srv
    srv.close()


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "ctxguard.observe" and r.levelno == logging.WARNING
    ]


@pytest.mark.parametrize("server", [[(200, TWO_MODELS)]], indirect=True)
def test_a_page_of_two_models_and_none_named_is_no_reading_said_once(
    server: MetricsServer, caplog: pytest.LogCaptureFixture
) -> None:
    """(before: the hot model's 0.95 and 20 waiting lowered the cold model's budget)"""
    caplog.set_level(logging.WARNING, logger="ctxguard.observe")
    limit = PressureLimit(4000, unique(server.url), interval=0)
    for _ in range(3):
        got = limit.resolve()
        assert got.tokens == 4000  # fail open: the wrapped limit holds
        decision = describe(got)
        assert decision is not None and decision["level"] == "ok"
        assert decision["kv_usage"] is None and decision["waiting"] is None
        error = decision["error"]
        assert "2 models" in error and "model=" in error and HOT in error and COLD in error
    said = warnings(caplog)
    assert len(said) == 1 and "model=" in said[0]


@pytest.mark.parametrize("server", [[(200, TWO_MODELS)]], indirect=True)
def test_the_named_model_is_read_alone(server: MetricsServer) -> None:
    url = unique(server.url)
    cold = PressureLimit(4000, url, interval=0, model=COLD).resolve()
    assert cold.tokens == 4000
    assert describe(cold) == {"level": "ok", "kv_usage": 0.1, "waiting": 0.0, "error": None}
    hot = PressureLimit(4000, url, interval=0, model=HOT, waiting_refuse=1000).resolve()
    assert hot.tokens == 2000
    decision = describe(hot)
    assert decision is not None and decision["level"] == "lowered"
    assert (decision["kv_usage"], decision["waiting"]) == (0.95, 20.0)


@pytest.mark.parametrize("server", [[(200, TWO_MODELS)]], indirect=True)
def test_the_named_model_is_read_alone_async(server: MetricsServer) -> None:
    limit = PressureLimit(4000, unique(server.url), interval=0, model=COLD)
    got = asyncio.run(limit.aresolve())
    assert got.tokens == 4000 and describe(got) == {
        "level": "ok",
        "kv_usage": 0.1,
        "waiting": 0.0,
        "error": None,
    }


@pytest.mark.parametrize("server", [[(200, TWO_MODELS)]], indirect=True)
def test_a_model_not_on_the_page_is_no_reading_said_once(
    server: MetricsServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="ctxguard.observe")
    limit = PressureLimit(4000, unique(server.url), interval=0, model="other")
    for _ in range(2):
        got = limit.resolve()
        decision = describe(got)
        assert got.tokens == 4000 and decision is not None and decision["level"] == "ok"
        assert "'other'" in decision["error"] and HOT in decision["error"]
    assert len(warnings(caplog)) == 1


@pytest.mark.parametrize("server", [[(200, vllm_text(0.9, 2, model=HOT))]], indirect=True)
def test_a_page_of_one_model_is_read_with_or_without_its_name(server: MetricsServer) -> None:
    url = unique(server.url)
    for model in (None, HOT):
        got = PressureLimit(4000, url, interval=0, model=model).resolve()
        assert got.tokens == 2000
        assert describe(got) == {"level": "lowered", "kv_usage": 0.9, "waiting": 2.0, "error": None}


def test_a_page_is_read_per_model_with_engines_summed() -> None:
    text = (
        'vllm:num_requests_waiting{engine="0",model_name="a"} 3\n'
        'vllm:num_requests_waiting{engine="1",model_name="a"} 4\n'
        'vllm:kv_cache_usage_perc{engine="0",model_name="a"} 0.2\n'
        'vllm:kv_cache_usage_perc{engine="1",model_name="a"} 0.4\n'
        'vllm:num_requests_waiting{model_name="b \\"x\\" \\\\ y",engine="0"} 100\n'
        'vllm:kv_cache_usage_perc{model_name="b \\"x\\" \\\\ y"} 0.99\n'
        'vllm:num_requests_running{model_name="c"} 5\n'  # not a pressure gauge
    )
    a = read_page(text, "a")
    assert (a.kv_usage, a.waiting, a.past_one) == (0.4, 7.0, None)
    assert a.models == ("a", 'b "x" \\ y')
    b = read_page(text, 'b "x" \\ y')
    assert (b.kv_usage, b.waiting) == (0.99, 100.0)
    whole = read_page(text)
    assert (whole.kv_usage, whole.waiting) == (0.99, 107.0)
    assert read_page(text, "c").kv_usage is None and read_page(text, "c").waiting is None


def test_a_model_label_inside_another_label_value_is_not_the_model() -> None:
    text = 'vllm:num_requests_waiting{note="model_name=\\"x\\"",model_name="y"} 3\n'
    assert read_page(text).models == ("y",)
    assert read_page(text, "y").waiting == 3.0 and read_page(text, "x").waiting is None


@pytest.mark.parametrize("model", ["", 5, "a\nb", "x" * 513, b"m"], ids=repr)
def test_a_bad_model_is_a_one_line_config_error(model: object) -> None:
    with pytest.raises(ConfigError) as caught:
        PressureLimit(4000, "http://127.0.0.1:1/metrics", model=model)  # type: ignore[arg-type]
    message = str(caught.value)
    assert "\n" not in message and "model" in message and len(message) < 300


ECHO_SECRET = "s3cret-metrics-pw"
ECHOED = vllm_text(0.5, 1, model=f"echo {ECHO_SECRET}") + vllm_text(0.5, 1, model="b")


@pytest.mark.parametrize("server", [[(200, ECHOED)]], indirect=True)
def test_model_names_the_page_shows_back_never_carry_the_urls_secrets(
    server: MetricsServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A page is the server's text: a model_name holding the URL's password is not
    repeated in the decision's error nor in the WARNING."""
    caplog.set_level(logging.WARNING, logger="ctxguard.observe")
    host = server.url.removeprefix("http://")
    url = f"http://user:{ECHO_SECRET}@{host}?t={uuid.uuid4().hex}"
    got = PressureLimit(4000, url, interval=0).resolve()
    decision = describe(got)
    assert decision is not None and "2 models" in decision["error"]
    assert "echo ***" in decision["error"] and ECHO_SECRET not in decision["error"]
    said = warnings(caplog)
    assert len(said) == 1 and ECHO_SECRET not in said[0]
