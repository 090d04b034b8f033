"""Capacity, concurrency and the startup check against vLLM's public logs (facts section 10)."""

from __future__ import annotations

import pytest

from ctxguard.errors import ConfigError
from ctxguard.kv import (
    GIB,
    MemoryBudget,
    ServingSetup,
    from_catalogue,
    logged_gib_bounds,
    plan_kv,
    suggest_fixes,
    weights_per_gpu,
)

# (model, extra draft layers, logged "Available KV cache memory" GiB, bytes/token, logged tokens)
WORKED_EXAMPLES = [
    # vllm-project/vllm#10517: 2 * 32 * 8 * 128 * 2
    ("llama-3.1-8b", 0, 3.81, 2 * 32 * 8 * 128 * 2, 31_232),
    # LMCache/LMCache#1739: 2 * 40 * 8 * 128 * 2
    ("Qwen/Qwen3-14B", 0, 6.51, 2 * 40 * 8 * 128 * 2, 42_656),
    # vllm-project/vllm#19996: 33 attention layers (EAGLE draft): 2 * 33 * 8 * 128 * 2
    ("llama-3.1-8b", 1, 51.63, 2 * 33 * 8 * 128 * 2, 410_128),
    # vllm-project/vllm#33263: 2 * 28 * 8 * 128 * 2
    ("Qwen/Qwen3-1.7B", 0, 18.78, 2 * 28 * 8 * 128 * 2, 175_856),
]


@pytest.mark.parametrize(("model", "extra", "gib", "per_token", "logged"), WORKED_EXAMPLES)
def test_worked_examples_reproduce_within_one_block(
    model: str, extra: int, gib: float, per_token: int, logged: int
) -> None:
    plan = plan_kv(from_catalogue(model).with_extra_layers(extra))
    assert plan.bytes_per_token == per_token
    # the log rounds to 2 decimals: the true figure lies in [gib - 0.005, gib + 0.005]
    low, high = logged_gib_bounds(gib)
    lowest, highest = plan.capacity_tokens(low), plan.capacity_tokens(high)
    block = plan.block_size
    assert lowest - block <= logged <= highest + block
    # at the printed figure itself: floor(gib * 2^30 / (16 * per_token)) * 16
    assert plan.capacity_tokens(int(gib * GIB)) == int(gib * GIB) // (16 * per_token) * 16


def test_qwen3_14b_reproduces_exactly() -> None:
    plan = plan_kv(from_catalogue("qwen3-14b"))
    # floor(6.51 * 2^30 / (16 * 163,840)) = 2,666 blocks -> 42,656 tokens
    assert plan.capacity_tokens(int(6.51 * GIB)) == 42_656


def test_startup_error_qwen3_coder_480b() -> None:
    """recipes#12: 262,144 tokens need 62.0 GiB; 48.66 GiB available; estimate 205,728."""
    plan = plan_kv(from_catalogue("Qwen/Qwen3-Coder-480B-A35B-Instruct-FP8"))
    available = int(48.66 * GIB)
    check = plan.check(available, 262_144)
    # cdiv(262144, 16) * 16 * (2 * 62 * 8 * 128 * 2) bytes = 62.00 GiB
    assert check.needed_bytes == 262_144 * 253_952
    assert round(check.needed_bytes / GIB, 2) == 62.0
    assert not check.fits
    # largest L with cdiv(L, 16) * 16 * 253,952 <= 48.66 GiB: floor(.../4,063,232) * 16
    assert check.estimated_max_model_len == available // (16 * 253_952) * 16 == 205_728
    assert check.error is not None
    assert "(262144), (62.00 GiB KV cache is needed" in check.error
    assert "available KV cache memory (48.66 GiB)" in check.error
    assert "estimated maximum model length is 205728" in check.error


def test_no_available_memory_message() -> None:
    check = plan_kv(from_catalogue("llama-3.1-8b")).check(0, 4096)
    assert not check.fits
    assert check.error is not None and check.error.startswith("No available memory")


def test_concurrency_at_max_model_len() -> None:
    plan = plan_kv(from_catalogue("llama-3.1-8b"))
    available = 10 * GIB
    # 10 GiB / (16 * 131,072) = 5,120 blocks; at 8,192 tokens a request takes 512 blocks
    assert plan.num_blocks(available) == 5120
    assert plan.max_concurrency(available, 8192) == 5120 / 512
    assert plan.capacity_tokens(available) == 5120 * 16


def test_largest_max_model_len_for_target_concurrency() -> None:
    plan = plan_kv(from_catalogue("llama-3.1-8b"))
    # 5,120 blocks shared by 8 requests: 640 blocks each = 10,240 tokens
    assert plan.max_model_len_for_concurrency(10 * GIB, 8, 131_072) == 640 * 16
    # never above the upper bound given (the model's max positions)
    assert plan.max_model_len_for_concurrency(10 * GIB, 1, 4096) == 4096
    with pytest.raises(ConfigError, match="concurrency"):
        plan.max_model_len_for_concurrency(10 * GIB, 0, 4096)


def test_estimate_returns_zero_when_nothing_fits() -> None:
    plan = plan_kv(from_catalogue("llama-3.1-8b"))
    assert plan.estimate_max_model_len(1000, 4096) == 0


def test_hybrid_capacity_needs_a_length() -> None:
    plan = plan_kv(from_catalogue("gemma-3-27b"))
    with pytest.raises(ConfigError, match="max_model_len"):
        plan.capacity_tokens(10 * GIB)


def test_memory_budget_from_gpu_memory() -> None:
    arch = from_catalogue("llama-3.1-8b")
    setup = ServingSetup()
    budget = MemoryBudget(gpu_memory_bytes=80 * GIB, weights_bytes=15 * GIB, reserve_bytes=2 * GIB)
    # 80 * 0.9 = 72 GiB requested - 15 weights - 2 reserve = 55 GiB
    assert budget.available(arch, setup) == 55 * GIB
    # weights from parameters: 8.03e9 * 2 bytes, split over TP2
    assert weights_per_gpu(arch, ServingSetup(tensor_parallel=2)) == 8_030_000_000


def test_weights_of_fp8_checkpoint_use_one_byte_per_parameter() -> None:
    arch = from_catalogue("deepseek-v3")
    # 671e9 parameters * 1 byte, over 8 GPUs
    assert weights_per_gpu(arch, ServingSetup(tensor_parallel=8)) == 671_000_000_000 // 8


@pytest.mark.parametrize("utilization", [0.0, -0.1, 1.01, 2.0])
def test_utilization_outside_0_1_is_rejected(utilization: float) -> None:
    with pytest.raises(ConfigError, match=r"gpu_memory_utilization must be in \(0, 1\]"):
        MemoryBudget(gpu_memory_bytes=GIB, gpu_memory_utilization=utilization)


def test_negative_or_missing_memory_is_rejected() -> None:
    with pytest.raises(ConfigError, match="must not be negative"):
        MemoryBudget(kv_cache_memory_bytes=-1)
    with pytest.raises(ConfigError, match="either"):
        MemoryBudget()


def test_suggestions_when_the_length_does_not_fit() -> None:
    arch = from_catalogue("llama-3.1-8b")
    setup = ServingSetup()
    # 24 GiB card: 24 * 0.9 = 21.6 - 16.06 weights (8.03e9 * 2 B) - 2 reserve ~ 3.5 GiB of KV;
    # 131,072 tokens need 16 GiB
    budget = MemoryBudget(gpu_memory_bytes=24 * GIB)
    fixes = suggest_fixes(arch, setup, budget, 131_072)
    assert fixes[0].startswith("--max-model-len ")
    assert any("utilization alone cannot" in fix for fix in fixes)
    assert any(fix.startswith("--tensor-parallel-size") for fix in fixes)


def test_suggestions_include_fp8_and_utilization_when_they_help() -> None:
    arch = from_catalogue("llama-3.1-8b")
    # 80 GiB * 0.5 = 40 - 16.06 - 2 = ~21.9 GiB; 131,072 tokens need 16 GiB -> fits;
    # at 200k tokens (24.4 GiB) it does not, but 0.55 utilization or fp8 would
    budget = MemoryBudget(gpu_memory_bytes=80 * GIB, gpu_memory_utilization=0.5)
    fixes = suggest_fixes(arch, ServingSetup(), budget, 200_000)
    assert any(fix.startswith("--gpu-memory-utilization 0.") for fix in fixes)
    assert any(fix.startswith("--kv-cache-dtype fp8") for fix in fixes)
