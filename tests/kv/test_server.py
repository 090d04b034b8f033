"""Limits read over real HTTP from a vLLM-shaped server on 127.0.0.1."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from ctxguard.errors import ConfigError
from ctxguard.kv import ServerLimit, afetch_server_info, fetch_server_info
from ctxguard.kv.server import parse_prometheus_labels, redact
from tests.conftest import private_memory_url

from .conftest import FakeServer, vllm_metrics, vllm_models


def test_reads_max_model_len_and_cache_config(fake_vllm: FakeServer) -> None:
    fake_vllm.json("/v1/models", vllm_models("Qwen/Qwen3-8B", 4096))
    # v0.29 example: 661 blocks * 16 = 10,576 tokens; 661 / cdiv(4096, 16) = 2.58203125
    fake_vllm.text("/metrics", vllm_metrics(661, 16, 661 * 16, 661 / 256))
    info = fetch_server_info(fake_vllm.url)
    assert (info.model, info.max_model_len) == ("Qwen/Qwen3-8B", 4096)
    assert (info.num_gpu_blocks, info.block_size, info.kv_cache_size_tokens) == (661, 16, 10_576)
    assert info.kv_cache_max_concurrency == 661 / 256
    assert info.capacity_tokens == 10_576
    assert "/get_server_info" not in fake_vllm.hits


def test_older_vllm_without_kv_cache_size_tokens(fake_vllm: FakeServer) -> None:
    fake_vllm.json("/v1/models", vllm_models("m", 8192))
    fake_vllm.text("/metrics", vllm_metrics(52_510, 16))
    # fall back to blocks * block size: 52,510 * 16
    assert fetch_server_info(fake_vllm.url).capacity_tokens == 52_510 * 16


def test_server_limit_is_max_model_len(fake_vllm: FakeServer) -> None:
    fake_vllm.json("/v1/models", vllm_models("m", 32768))
    fake_vllm.text("/metrics", vllm_metrics(52_510, 16))
    limit = ServerLimit(fake_vllm.url).resolve()
    assert limit.tokens == 32768
    assert limit.source == f"server /v1/models at {fake_vllm.url} (max_model_len)"


def test_server_limit_kv_fair_share(fake_vllm: FakeServer) -> None:
    fake_vllm.json("/v1/models", vllm_models("m", 32768))
    fake_vllm.text("/metrics", vllm_metrics(661, 16, 661 * 16))
    # 10,576 tokens / 4 requests = 2,644, rounded down to a block: 2,640
    limit = ServerLimit(fake_vllm.url, concurrency=4).resolve()
    assert limit.tokens == 10_576 // 4 // 16 * 16 == 2640
    assert "fair share" in limit.source


def test_hybrid_server_uses_reported_tokens(fake_vllm: FakeServer) -> None:
    fake_vllm.json("/v1/models", vllm_models("qwen3-next", 8192))
    # GDN example: blocks * block size != tokens; 314,187 tokens / 8 requests = 39,273
    fake_vllm.text("/metrics", vllm_metrics(652, 544, 314_187, 38.3529))
    limit = ServerLimit(fake_vllm.url, concurrency=8).resolve()
    assert limit.details["capacity_tokens"] == 314_187
    assert limit.tokens == 8192  # the fair share (39,273 -> 38,624) is above max_model_len


def test_server_limit_caches(fake_vllm: FakeServer) -> None:
    fake_vllm.json("/v1/models", vllm_models("m", 4096))
    source = ServerLimit(fake_vllm.url, cache_seconds=60)
    source.resolve()
    source.resolve()
    assert fake_vllm.hits.count("/v1/models") == 1
    source.invalidate()
    source.resolve()
    assert fake_vllm.hits.count("/v1/models") == 2


def test_no_cache_when_ttl_is_zero(fake_vllm: FakeServer) -> None:
    fake_vllm.json("/v1/models", vllm_models("m", 4096))
    source = ServerLimit(fake_vllm.url, cache_seconds=0)
    source.resolve()
    source.resolve()
    assert fake_vllm.hits.count("/v1/models") == 2


async def test_async_matches_sync(fake_vllm: FakeServer) -> None:
    fake_vllm.json("/v1/models", vllm_models("m", 4096))
    fake_vllm.text("/metrics", vllm_metrics(661, 16, 10_576))
    assert await afetch_server_info(fake_vllm.url) == fetch_server_info(fake_vllm.url)
    limit = await ServerLimit(fake_vllm.url, concurrency=2).aresolve()
    assert limit.tokens == 4096  # 10,576 / 2 = 5,288 is above 4,096


def test_model_selection(fake_vllm: FakeServer) -> None:
    body = vllm_models("base", 4096)
    body["data"].append({**body["data"][0], "id": "other", "root": "other", "max_model_len": 2048})
    fake_vllm.json("/v1/models", body)
    assert fetch_server_info(fake_vllm.url, model="other").max_model_len == 2048
    with pytest.raises(ConfigError, match="different limits"):
        fetch_server_info(fake_vllm.url)
    with pytest.raises(ConfigError, match="does not serve 'missing'; it serves base, other"):
        fetch_server_info(fake_vllm.url, model="missing")


def test_sglang_server_info(fake_vllm: FakeServer) -> None:
    fake_vllm.json("/v1/models", vllm_models("sglang-model", 32768))
    fake_vllm.json(
        "/get_server_info", {"max_total_num_tokens": 367_404, "max_req_input_len": 32762}
    )
    info = fetch_server_info(fake_vllm.url)
    assert info.capacity_tokens == 367_404
    # no block size known: 367,404 // 4
    assert ServerLimit(fake_vllm.url, concurrency=4).resolve().details["kv_fair_share"] == 91_851


def test_concurrency_without_metrics_is_a_clear_error(fake_vllm: FakeServer) -> None:
    fake_vllm.json("/v1/models", vllm_models("m", 4096))
    with pytest.raises(ConfigError, match="vllm:cache_config_info"):
        ServerLimit(fake_vllm.url, concurrency=2).resolve()


def test_http_errors_and_bad_bodies(fake_vllm: FakeServer) -> None:
    fake_vllm.text("/v1/models", "Unauthorized", status=401)
    with pytest.raises(ConfigError, match="HTTP 401"):
        fetch_server_info(fake_vllm.url)
    fake_vllm.text("/v1/models", "<html>")
    with pytest.raises(ConfigError, match="did not return JSON"):
        fetch_server_info(fake_vllm.url)
    fake_vllm.json("/v1/models", {"data": []})
    with pytest.raises(ConfigError, match="lists no models"):
        fetch_server_info(fake_vllm.url)


DEEP = "[" * 100_000 + "]" * 100_000  # valid JSON, nested past the recursion limit


def test_a_body_nested_too_deep_is_a_config_error(fake_vllm: FakeServer) -> None:
    """(before: RecursionError out of resolve)"""
    fake_vllm.text("/v1/models", DEEP)
    with pytest.raises(ConfigError, match="nested too deeply"):
        ServerLimit(fake_vllm.url).resolve()
    fake_vllm.json("/v1/models", vllm_models("m", 4096))
    fake_vllm.text("/get_server_info", DEEP)  # SGLang's, read when /metrics says nothing
    assert ServerLimit(fake_vllm.url).resolve().tokens == 4096


async def test_a_body_nested_too_deep_is_a_config_error_async(fake_vllm: FakeServer) -> None:
    fake_vllm.text("/v1/models", DEEP)
    with pytest.raises(ConfigError, match="nested too deeply"):
        await ServerLimit(fake_vllm.url).aresolve()


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (["m"], "not JSON objects"),
        ([{"id": "a", "max_model_len": [4096]}, {"id": "b", "max_model_len": 4096}], "pass model="),
        ([{"id": "m", "max_model_len": True}], "did not report max_model_len"),
    ],
)
def test_a_model_list_of_the_wrong_shape_is_a_config_error(
    fake_vllm: FakeServer, data: list[Any], expected: str
) -> None:
    """(before: AttributeError, TypeError "unhashable type"; True read as a length)"""
    fake_vllm.json("/v1/models", {"object": "list", "data": data})
    with pytest.raises(ConfigError, match=expected):
        ServerLimit(fake_vllm.url).resolve()


def test_headers_are_sent(fake_vllm: FakeServer) -> None:
    fake_vllm.json("/v1/models", vllm_models("m", 4096))
    fetch_server_info(fake_vllm.url, headers={"Authorization": "Bearer k"})
    assert fake_vllm.auth_headers[0] == "Bearer k"


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def test_unreachable_server_names_the_url_without_credentials() -> None:
    # (a key in a query string is refused when the URL is given: test_http_credentials)
    url = f"http://admin:s3cret@127.0.0.1:{_closed_port()}/"
    with pytest.raises(ConfigError) as info:
        ServerLimit(url, timeout=2).resolve()
    message = str(info.value)
    assert "127.0.0.1" in message and "check the URL" in message
    assert "s3cret" not in message and "admin" not in message


async def test_unreachable_server_async() -> None:
    with pytest.raises(ConfigError, match="could not read the model server"):
        await ServerLimit(f"http://127.0.0.1:{_closed_port()}", timeout=2).aresolve()


def test_redact_and_label_parsing() -> None:
    assert redact("https://u:p@host:8000/v1/?key=x") == "https://host:8000/v1"
    text = 'vllm:cache_config_info{a="1",b="say \\"hi\\""} 1.0\nother{a="2"} 1.0\n'
    assert parse_prometheus_labels(text, "vllm:cache_config_info") == [{"a": "1", "b": 'say "hi"'}]


def test_server_limit_bad_arguments() -> None:
    with pytest.raises(ConfigError):
        ServerLimit("http://127.0.0.1:1", concurrency=0)
    with pytest.raises(ConfigError):
        ServerLimit("http://127.0.0.1:1", timeout=0)


BAD_HTTP_OPTIONS: list[dict[str, Any]] = [
    {"timeout": 1e300},  # (before: OverflowError at the first call)
    {"headers": {"Authorization": None}},  # (before: TypeError)
    {"headers": {"Authorization": "Bearer caf\u00e9-SEKRIT9"}},  # (UnicodeEncodeError)
    {"headers": {"X-Key": "a\nSEKRIT9"}},  # (a LocalProtocolError called unreachable)
    {"headers": {1: "SEKRIT9"}},  # (AttributeError)
    {"headers": {"X Key": "SEKRIT9"}},
]


@pytest.mark.parametrize("options", BAD_HTTP_OPTIONS)
def test_bad_http_options_are_config_errors_at_once(options: dict[str, Any]) -> None:
    url = f"http://127.0.0.1:{_closed_port()}"
    for call in (lambda: ServerLimit(url, **options), lambda: fetch_server_info(url, **options)):
        with pytest.raises(ConfigError) as info:
            call()
        message = str(info.value)
        assert "SEKRIT9" not in message and "\n" not in message
        assert ("timeout" if "timeout" in options else "header") in message


DRIPS = ["headers", "body", "flood"]


def _expect_deadline_or_cap(mode: str, message: str, where: str) -> None:
    assert where in message
    if mode == "flood":
        # a fast endless body may hit either bound first; both end the call
        assert "within 1 s (deadline)" in message or "more than 16 MiB" in message
    else:
        assert "within 1 s (deadline)" in message


@pytest.mark.timeout(30)
@pytest.mark.parametrize("mode", DRIPS)
def test_a_drip_feeding_server_cannot_hold_prepare(mode: str) -> None:
    from drip_server import drip_server

    from ctxguard import Guard

    with drip_server(mode) as server:
        url = server.url.replace("http://", "http://admin:s3cret@")
        guard = Guard(private_memory_url(), limit=ServerLimit(url, timeout=1))
        with pytest.raises(ConfigError) as info:
            guard.prepare("s", [{"role": "user", "content": "hi"}])
    message = str(info.value)
    _expect_deadline_or_cap(mode, message, f"{server.url}/v1/models")
    assert "s3cret" not in message and "\n" not in message


@pytest.mark.timeout(30)
@pytest.mark.parametrize("mode", DRIPS)
async def test_a_drip_feeding_server_cannot_hold_aresolve(mode: str) -> None:
    from drip_server import drip_server

    with drip_server(mode) as server, pytest.raises(ConfigError) as info:
        await ServerLimit(server.url, timeout=1).aresolve()
    _expect_deadline_or_cap(mode, str(info.value), f"{server.url}/v1/models")
