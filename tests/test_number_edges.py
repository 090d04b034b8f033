"""Numbers and URL parts every door takes: NaN, infinity and sizes past what time or
float arithmetic holds are refused where they are given, with a ConfigError that says
the bound, not a running thing that fails later with an untyped error."""

from __future__ import annotations

import math
from typing import Any

import pytest
from click.testing import CliRunner

from ctxguard import Guard, GuardConfig, open_store
from ctxguard._validate import MAX_SECONDS
from ctxguard.cli import cli
from ctxguard.errors import ConfigError
from ctxguard.kv import ModelLimit
from ctxguard.stores.urls import parse_store_url, redact_url
from tests.conftest import private_memory_url

PAST = [math.nan, math.inf, -math.inf, 1e12, 2**64, MAX_SECONDS * 1.5, 0, -1]


@pytest.mark.parametrize("value", PAST)
@pytest.mark.parametrize("name", ["connect_timeout", "read_timeout"])
def test_guard_timeouts_past_any_wait_are_refused(name: str, value: float) -> None:
    with pytest.raises(ConfigError, match=name):
        GuardConfig(**{name: value})
    with pytest.raises(ConfigError, match=name):
        Guard(private_memory_url(), counter="approx", limit=4096, **{name: value})


@pytest.mark.parametrize("value", PAST)
@pytest.mark.parametrize("name", ["connect_timeout", "read_timeout"])
def test_store_timeouts_past_any_wait_are_refused(name: str, value: float) -> None:
    with pytest.raises(ConfigError, match=name):
        open_store("redis://127.0.0.1:1/0", **{name: value})
    param = "socket_connect_timeout" if name == "connect_timeout" else "socket_timeout"
    with pytest.raises(ConfigError, match=param):
        parse_store_url(f"redis://127.0.0.1:1/0?{param}={value}")


def test_the_longest_wait_taken_is_the_bound() -> None:
    assert GuardConfig(read_timeout=MAX_SECONDS).read_timeout == MAX_SECONDS
    assert parse_store_url("redis://h/0", read_timeout=MAX_SECONDS).read_timeout == MAX_SECONDS


@pytest.mark.parametrize("db", ["²", "١", "𝟙", "0x1", "-1", " 1"])
def test_a_db_that_is_no_ascii_number_is_a_config_error_and_redacts(db: str) -> None:
    url = f"redis://:s3cretPW@127.0.0.1:1/0?db={db}"
    with pytest.raises(ConfigError, match="db parameter") as caught:
        parse_store_url(url)
    assert "s3cretPW" not in str(caught.value)
    shown = redact_url(url)  # (raised an untyped ValueError for "²")
    assert "s3cretPW" not in shown


@pytest.mark.parametrize("option", ["ssl_cert_reqs=required", "ssl_password=Pw9", "ssl_ca_path=/"])
@pytest.mark.parametrize("base", ["redis://127.0.0.1:1/0", "redis+cluster://127.0.0.1:1"])
def test_ssl_options_without_tls_are_a_config_error(base: str, option: str) -> None:
    """(they reached redis-py's plain connection: a TypeError on every call, reported as
    a lost connection that may have run)"""
    with pytest.raises(ConfigError, match="rediss://") as caught:
        parse_store_url(f"{base}?{option}")
    assert "Pw9" not in str(caught.value)
    assert parse_store_url(f"rediss://127.0.0.1:1/0?{option}").tls


@pytest.mark.parametrize("value", [1e300, math.inf, math.nan, -1.0, float(2**21)])
def test_gpu_memory_past_any_device_is_a_config_error(value: float) -> None:
    with pytest.raises(ConfigError, match="gpu_memory_gib"):
        ModelLimit("meta-llama/Llama-3.1-8B-Instruct", gpu_memory_gib=value, concurrency=1)


def test_the_kv_command_refuses_it_with_exit_2() -> None:
    result = CliRunner().invoke(
        cli, ["kv", "meta-llama/Llama-3.1-8B-Instruct", "--gpu-memory", "1e300"]
    )
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert "GiB" in result.output


def serve_config(**settings: Any) -> Any:
    from ctxguard.serve.config import ServeConfig

    return ServeConfig(upstream="http://127.0.0.1:1", **settings)


@pytest.mark.parametrize("value", PAST)
@pytest.mark.parametrize("name", ["connect_timeout", "upstream_timeout", "idempotency_lease"])
def test_serve_timeouts_past_any_wait_are_refused(name: str, value: float) -> None:
    pytest.importorskip("starlette")
    with pytest.raises(ConfigError, match=name):
        serve_config(**{name: value})


@pytest.mark.parametrize(
    ("url", "what"),
    [
        ("redis://127.0.0.1:99999/0", "port"),
        ("redis://:pw@127.0.0.1:1/0?db=²", "db"),
        ("redis://127.0.0.1:1/0?ssl_cert_reqs=none", "rediss"),
        ("nosuch://x", "scheme|store URL"),
    ],
)
def test_serve_refuses_a_bad_store_url_before_it_starts(url: str, what: str) -> None:
    """(it started, and every request failed with the URL's error)"""
    pytest.importorskip("starlette")
    with pytest.raises(ConfigError, match=what) as caught:
        serve_config(url=url)
    assert "pw@" not in str(caught.value)
