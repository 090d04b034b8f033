"""How /metrics lines are read: blanks and tabs as the text format allows, KV past 1.

The KV gauges are fractions (vLLM: "1 means 100 percent usage"; SGLang's token_usage
is used/total). A reading past 1 was taken as a cache fuller than full (87: every
request refused with any queue, 1.5: every budget halved); now it is left out, said
once per server, and the queue still counts.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator

import pytest

from ctxguard.errors import ServerBusyError
from ctxguard.observe.pressure import PressureLimit, describe, parse_metrics, read_metrics

from .metrics_server import MetricsServer, sglang_text, vllm_text


@pytest.mark.parametrize(
    "text",
    [
        "vllm:kv_cache_usage_perc\t0.6\nvllm:num_requests_waiting\t\t5\n",
        'vllm:kv_cache_usage_perc{engine="0"}\t0.6\t1712345678000\n'
        'vllm:num_requests_waiting{engine="0"}    5.0\n',
        '  vllm:kv_cache_usage_perc {engine="0", model_name="a b}c"}  0.6  \n'
        '\tvllm:num_requests_waiting\t{\tengine="0"\t}\t5\n'
        "\t# TYPE vllm:kv_cache_usage_perc gauge\n",
    ],
)
def test_lines_apart_by_tabs_or_several_blanks_are_read(text: str) -> None:
    """(the text format lets any number of blanks or tabs part a line's tokens and
    ignores leading ones: such a line was skipped, the server read as idle)"""
    assert parse_metrics(text) == (0.6, 5.0)


def test_a_kv_reading_past_1_is_left_out_and_answered_apart() -> None:
    assert read_metrics(vllm_text(87, 3)) == (None, 3.0, 87.0)
    assert read_metrics(vllm_text(0.5, 1) + vllm_text(1.5, 2, model="x")) == (0.5, 3.0, 1.5)
    assert read_metrics(sglang_text(42.0, 0)) == (None, 0.0, 42.0)
    assert read_metrics(vllm_text(1.0, 0)) == (1.0, 0.0, None)  # full is a reading


@pytest.fixture
def server(request: pytest.FixtureRequest) -> Iterator[MetricsServer]:
    srv = MetricsServer(request.param)
    yield srv
    srv.close()


@pytest.mark.parametrize("server", [[(200, vllm_text(87, 9))]], indirect=True)
def test_a_percent_reading_does_not_refuse_and_is_said_once(
    server: MetricsServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="ctxguard.observe")
    limit = PressureLimit(4000, f"{server.url}?t={uuid.uuid4().hex}", interval=0)
    for _ in range(3):
        got = limit.resolve()  # 87 taken as a fraction with 9 waiting: refused
        assert got.tokens == 2000  # lowered by the queue alone (9 >= waiting_lower)
        decision = describe(got)
        assert decision is not None and decision["kv_usage"] is None
        assert "KV usage 87 is past 1" in str(decision["error"])
    said = [r.getMessage() for r in caplog.records if r.name == "ctxguard.observe"]
    assert len(said) == 1 and "KV cache usage of 87, past 1" in said[0]


@pytest.mark.parametrize("server", [[(200, vllm_text(150, 70))]], indirect=True)
def test_the_queue_still_refuses_beside_a_kv_reading_past_1(server: MetricsServer) -> None:
    limit = PressureLimit(4000, f"{server.url}?t={uuid.uuid4().hex}", interval=0)
    with pytest.raises(ServerBusyError):
        limit.resolve()


@pytest.mark.parametrize("value", ["1_000", "1_0", "\u0661\u0660\u0660", "\uff11\uff10\uff10"])
def test_a_value_only_python_reads_as_a_number_is_left_out(value: str) -> None:
    """(float() reads "1_000" and non-ASCII digits as 1000, 10 and 100: garbage in a
    /metrics reply was a queue of 1000, and every request was refused)"""
    text = f"vllm:kv_cache_usage_perc {value}\nvllm:num_requests_waiting {value}\n"
    assert parse_metrics(text) == (None, None)


@pytest.mark.parametrize(
    ("value", "read"), [("5", 5.0), ("5.", 5.0), (".5", 0.5), ("+5e0", 5.0), ("1E+1", 10.0)]
)
def test_every_form_of_a_text_format_number_is_read(value: str, read: float) -> None:
    assert parse_metrics(f"vllm:num_requests_waiting {value}\n") == (None, read)


@pytest.mark.parametrize(
    "server",
    [[(200, "<html><body>vLLM</body></html>")], [(200, "process_cpu_seconds_total 3.0\n")]],
    indirect=True,
)
def test_a_reply_without_any_gauge_fails_open_and_says_so(
    server: MetricsServer, caplog: pytest.LogCaptureFixture
) -> None:
    """(a 200 from another page, or a server exporting neither gauge, was an error-free
    "pressure ok" on every request: nothing said the budget could not follow anything)"""
    caplog.set_level(logging.WARNING, logger="ctxguard.observe")
    limit = PressureLimit(4000, f"{server.url}?t={uuid.uuid4().hex}", interval=0)
    for _ in range(3):
        got = limit.resolve()
        decision = describe(got)
        assert got.tokens == 4000 and decision is not None and decision["level"] == "ok"
        assert decision["error"] == "no KV usage or queue gauge in the reply"
    said = [r.getMessage() for r in caplog.records if r.name == "ctxguard.observe"]
    assert len(said) == 1 and "has no KV usage gauge" in said[0] and "\n" not in said[0]
