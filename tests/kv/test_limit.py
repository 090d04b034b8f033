"""ContextLimit and its sources: static numbers and the calculator."""

from __future__ import annotations

from pathlib import Path

import pytest

from ctxguard.errors import ConfigError
from ctxguard.guard import Guard
from ctxguard.kv import ContextLimit, LimitSource, ModelLimit, StaticLimit, from_catalogue


def test_prompt_budget_subtracts_output_and_margin() -> None:
    limit = ContextLimit(8192, "static")
    assert limit.prompt_budget(1024) == 8192 - 1024
    assert limit.prompt_budget(1024, safety_margin=64) == 8192 - 1024 - 64
    assert limit.prompt_budget(9000) == 8192 - 9000  # negative: nothing fits


@pytest.mark.parametrize(("max_tokens", "margin"), [(-1, 0), (0, -5)])
def test_prompt_budget_rejects_negative_inputs(max_tokens: int, margin: int) -> None:
    with pytest.raises(ConfigError, match="must be >= 0"):
        ContextLimit(8192, "static").prompt_budget(max_tokens, margin)


@pytest.mark.parametrize("tokens", [0, -1, True])
def test_context_limit_must_be_positive(tokens: int) -> None:
    with pytest.raises(ConfigError):
        ContextLimit(tokens, "static")


async def test_static_limit_sync_and_async() -> None:
    source = StaticLimit(32768)
    assert isinstance(source, LimitSource)
    assert source.resolve() == await source.aresolve()
    assert (source.resolve().tokens, source.resolve().source) == (32768, "static")


def test_model_limit_is_max_positions_by_default() -> None:
    limit = ModelLimit("qwen3-8b").resolve()
    assert limit.tokens == 40960  # Qwen3-8B max_position_embeddings
    assert limit.details["max_position_embeddings"] == 40960


def test_model_limit_is_the_max_model_len_served() -> None:
    assert ModelLimit("qwen3-8b", max_model_len=16384).resolve().tokens == 16384


def test_model_limit_refuses_a_max_model_len_past_the_positions_unless_allowed() -> None:
    """vLLM refuses it unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1; then it serves that length."""
    with pytest.raises(ConfigError, match="VLLM_ALLOW_LONG_MAX_MODEL_LEN=1"):
        ModelLimit("qwen3-8b", max_model_len=100_000).resolve()
    limit = ModelLimit("qwen3-8b", max_model_len=100_000, allow_long_max_model_len=True)
    assert limit.resolve().tokens == 100_000


def test_model_limit_refuses_a_tp_size_vllm_refuses() -> None:
    with pytest.raises(ConfigError, match="28 attention heads do not divide by 3"):
        ModelLimit("qwen2.5-7b", tensor_parallel=3).resolve()


def test_model_limit_refuses_weights_that_do_not_fit() -> None:
    with pytest.raises(ConfigError, match=r"do not fit: 14\.19 GiB per GPU.*= 7\.20 GiB"):
        ModelLimit("qwen2.5-7b", gpu_memory_gib=8).resolve()


def test_model_limit_with_the_hybrid_manager_off() -> None:
    """Gemma-3-27B, 20 GiB of KV: on, 10 full layers grow with length; off, all 62 do."""
    kwargs = {"max_model_len": 131_072, "available_kv_gib": 20.0, "concurrency": 1}
    on = ModelLimit("gemma-3-27b", **kwargs).resolve()  # type: ignore[arg-type]
    assert on.tokens == 131_072  # 10 x 80 KiB/token x 131,072 = 10 GiB + windows: fits
    with pytest.raises(ConfigError, match="vLLM would not start"):
        ModelLimit("gemma-3-27b", disable_hybrid_kv_cache_manager=True, **kwargs).resolve()  # type: ignore[arg-type]
    off = ModelLimit(
        "gemma-3-27b",
        max_model_len=32_768,
        available_kv_gib=20.0,
        disable_hybrid_kv_cache_manager=True,
    ).resolve()
    # all 62 layers: 62 x 2 x 16 x 128 x 2 = 507,904 B/token; 20 GiB / (16 x 507,904) blocks
    assert off.details["bytes_per_token"] == 507_904
    assert off.details["capacity_tokens"] == 20 * 2**30 // (16 * 507_904) * 16


def test_model_limit_kv_fair_share() -> None:
    # Llama-3.1-8B with exactly 10 GiB of KV: 10 * 2^30 / (16 * 131,072) = 5,120 blocks;
    # 8 concurrent requests: 640 blocks each = 10,240 tokens
    limit = ModelLimit(
        "llama-3.1-8b", max_model_len=65536, available_kv_gib=10, concurrency=8
    ).resolve()
    assert limit.tokens == 640 * 16
    assert limit.details["kv_fair_share"] == 640 * 16
    assert limit.details["capacity_tokens"] == 5120 * 16
    assert limit.details["bytes_per_token"] == 131_072


def test_model_limit_from_gpu_memory() -> None:
    # 80 GiB * 0.9 = 72 - 16.06 GiB weights (8.03e9 * 2 B) - 2 reserve = ~53.9 GiB: 128k fits
    limit = ModelLimit("llama-3.1-8b", gpu_memory_gib=80).resolve()
    assert limit.tokens == 131_072
    assert (
        limit.details["available_kv_bytes"] == int(80 * 2**30 * 0.9) - 8_030_000_000 * 2 - 2 * 2**30
    )


def test_model_limit_that_vllm_would_refuse_names_the_fixes() -> None:
    with pytest.raises(ConfigError) as info:
        ModelLimit("qwen3-coder-480b", max_model_len=262_144, available_kv_gib=48.66).resolve()
    message = str(info.value)
    assert "estimated maximum model length is 205728" in message
    assert "--max-model-len 205728" in message


async def test_model_limit_async_matches_sync() -> None:
    source = ModelLimit("gemma-3-27b", max_model_len=8192)
    assert await source.aresolve() == source.resolve()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"concurrency": 4}, "concurrency needs"),
        ({"available_kv_gib": -1}, "non-negative"),
        ({"gpu_memory_gib": 80, "gpu_memory_utilization": 1.5}, r"\(0, 1\]"),
        ({"tensor_parallel": 0}, "tensor_parallel"),
        ({"tensor_parallel": 3}, "tensor_parallel 3 does not fit"),
        ({"max_model_len": 0}, "max_model_len must be a positive integer"),
        ({"allow_long_max_model_len": "yes"}, "allow_long_max_model_len must be True or False"),
        ({"disable_hybrid_kv_cache_manager": 1}, "must be True or False"),
        ({"block_size": 0}, "block_size must be"),
    ],
)
def test_model_limit_bad_input(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ModelLimit("llama-3.1-8b", **kwargs).resolve()  # type: ignore[arg-type]


@pytest.mark.parametrize("model", ["", "  "])
def test_an_empty_model_name_is_refused_as_empty(
    model: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """(before: read as the current directory: "directory '.' has no config.json", or the
    config.json of whatever directory the process ran in)"""
    (tmp_path / "config.json").write_text('{"num_hidden_layers": 2}')
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="model is empty"):
        ModelLimit(model).resolve()


def test_model_limit_accepts_an_architecture_object() -> None:
    arch = from_catalogue("deepseek-v2-lite")
    assert ModelLimit(arch, max_model_len=32768).resolve().tokens == 32768


@pytest.mark.parametrize("tokens", [0, -1, 2**63, 10**23, True, 4096.0, "4096"])
def test_a_limit_outside_one_to_2_63_is_refused(tokens: object) -> None:
    with pytest.raises(ConfigError) as info:
        Guard("memory://limit-bounds", counter="approx", limit=tokens)  # type: ignore[arg-type]
    assert "limit" in str(info.value)
    with pytest.raises(ConfigError, match=r"positive integer up to 2\*\*63-1"):
        ContextLimit(tokens, "test")  # type: ignore[arg-type]


@pytest.mark.parametrize("dtype", [[], {}, None, 3, "x" * 10_000])
def test_a_bad_kv_cache_dtype_is_a_short_config_error(dtype: object) -> None:
    """(Before: [] was a bare TypeError, unhashable; a 10,000-character string was echoed
    whole, a 10,132-character message.)"""
    with pytest.raises(ConfigError, match="unknown kv_cache_dtype") as info:
        ModelLimit("llama-3.1-8b", kv_cache_dtype=dtype)  # type: ignore[arg-type]
    assert len(str(info.value)) <= 300 and "\n" not in str(info.value)
