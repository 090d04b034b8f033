"""What a running server reports is read only when it can be a count: a negative,
fractional, boolean or infinite figure is taken as not reported, never sized by."""

from __future__ import annotations

import json

import pytest

from ctxguard.errors import ConfigError
from ctxguard.kv import ServerLimit, fetch_server_info

from .conftest import FakeServer, vllm_models


@pytest.mark.parametrize("count", ["Infinity", "-Infinity", "true", "-367404", "367404.5", "0"])
def test_an_sglang_count_that_cannot_be_one_is_not_reported(
    fake_vllm: FakeServer, count: str
) -> None:
    fake_vllm.json("/v1/models", vllm_models("m", 4096))
    # JSON as Python's json module writes it (Infinity), raw: json.dumps would refuse
    body = f'{{"max_total_num_tokens": {count}, "context_length": {count}}}'
    fake_vllm.routes["/get_server_info"] = (200, "application/json", body)
    info = fetch_server_info(fake_vllm.url)
    assert (info.max_total_num_tokens, info.capacity_tokens, info.max_model_len) == (
        None,
        None,
        4096,
    )
    with pytest.raises(ConfigError, match="no vllm:cache_config_info"):
        ServerLimit(fake_vllm.url, concurrency=2).resolve()


def test_an_sglang_context_length_of_infinity_is_a_config_error(fake_vllm: FakeServer) -> None:
    fake_vllm.json("/v1/models", {"object": "list", "data": [{"id": "m"}]})
    body = '{"max_total_num_tokens": 1000, "context_length": Infinity}'
    fake_vllm.routes["/get_server_info"] = (200, "application/json", body)
    with pytest.raises(ConfigError, match="did not report max_model_len"):
        ServerLimit(fake_vllm.url).resolve()


@pytest.mark.parametrize(
    "labels",
    [
        'block_size="-16",num_gpu_blocks="-100"',  # was 1,600 tokens: -100 x -16
        'block_size="16",num_gpu_blocks="100.7"',
        'block_size="16",num_gpu_blocks="1_00"',  # int() takes it; Prometheus does not
        'block_size="0",num_gpu_blocks="100"',
    ],
)
def test_a_cache_config_count_that_cannot_be_one_sizes_nothing(
    fake_vllm: FakeServer, labels: str
) -> None:
    fake_vllm.json("/v1/models", vllm_models("m", 4096))
    fake_vllm.text("/metrics", f"vllm:cache_config_info{{{labels}}} 1.0\n")
    fake_vllm.json("/get_server_info", {}, status=404)
    assert fetch_server_info(fake_vllm.url).capacity_tokens is None
    with pytest.raises(ConfigError, match="no vllm:cache_config_info"):
        ServerLimit(fake_vllm.url, concurrency=2).resolve()


def test_readings_that_are_no_numbers_are_left_out(fake_vllm: FakeServer) -> None:
    fake_vllm.json("/v1/models", vllm_models("m", 4096))
    fake_vllm.text(
        "/metrics",
        'vllm:cache_config_info{block_size="16",num_gpu_blocks="100",'
        'gpu_memory_utilization="nan",kv_cache_max_concurrency="-2"} 1.0\n',
    )
    info = fetch_server_info(fake_vllm.url)
    assert (info.capacity_tokens, info.gpu_memory_utilization) == (1600, None)
    assert info.kv_cache_max_concurrency is None
    assert json.dumps(ServerLimit(fake_vllm.url, concurrency=2).resolve().details)
