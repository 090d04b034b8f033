"""Capacity, concurrency and the startup check against vLLM's public logs (facts section 10)."""

from __future__ import annotations

import pytest

from ctxguard.errors import ConfigError
from ctxguard.kv import (
    GIB,
    MemoryBudget,
    ServingSetup,
    architecture_from_config,
    from_catalogue,
    logged_gib_bounds,
    plan_kv,
    suggest_fixes,
    weights_per_gpu,
)
from ctxguard.kv.refusals import served_max_model_len

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


@pytest.mark.parametrize(
    "field", ["kv_cache_memory_bytes", "gpu_memory_bytes", "weights_bytes", "reserve_bytes"]
)
def test_memory_past_any_device_is_rejected(field: str) -> None:
    """(`ctxguard kv --kv-cache-memory 1e26`, in bytes, was taken: the GiB options were capped
    at a PiB, the byte one not)"""
    given = {"gpu_memory_bytes": GIB, field: 10**26}
    with pytest.raises(ConfigError, match="must be at most 1,048,576 GiB") as caught:
        MemoryBudget(**given)  # type: ignore[arg-type]
    assert "\n" not in str(caught.value)
    MemoryBudget(**{**given, field: 1 << 50})  # a PiB itself is taken


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


# --- setups vLLM refuses (issue 12, item 13) -------------------------------------------


def _vllm_accepts_tp(heads: int, kv_heads: int, tp: int) -> bool:
    """verify_with_parallel_config (heads % tp) and QKVParallelLinear's exact divisions."""
    if heads % tp:
        return False
    return (tp % kv_heads == 0) if tp >= kv_heads else (kv_heads % tp == 0)


@pytest.mark.parametrize("name", ["qwen2.5-7b", "llama-3.1-8b", "qwen3-235b", "gemma-3-27b"])
@pytest.mark.parametrize("tp", range(1, 33))
def test_tensor_parallel_is_refused_exactly_where_vllm_refuses_it(name: str, tp: int) -> None:
    arch = from_catalogue(name)
    setup = ServingSetup(tensor_parallel=tp)
    if _vllm_accepts_tp(arch.num_attention_heads, arch.num_kv_heads, tp):
        assert plan_kv(arch, setup).bytes_per_token > 0
    else:
        with pytest.raises(ConfigError, match=rf"^tensor_parallel {tp} does not fit"):
            plan_kv(arch, setup)


def test_tp3_on_28_heads_names_the_heads_and_the_sizes_that_work() -> None:
    with pytest.raises(ConfigError) as info:
        plan_kv(from_catalogue("qwen2.5-7b"), ServingSetup(tensor_parallel=3))
    message = str(info.value)
    assert "its 28 attention heads do not divide by 3" in message
    # 28 heads, 4 KV heads: 7 and 14 divide the heads but not the KV heads' replicas
    assert message.endswith("use one of 1, 2, 4, 28")


def test_mla_has_no_kv_head_condition() -> None:
    # DeepSeek-V3: 128 heads, MLA latent on every rank; TP 16 is fine, TP 3 is not
    arch = from_catalogue("deepseek-v3")
    assert plan_kv(arch, ServingSetup(tensor_parallel=16)).bytes_per_token == 61 * 576 * 2
    with pytest.raises(ConfigError, match="128 attention heads do not divide by 3"):
        plan_kv(arch, ServingSetup(tensor_parallel=3))


def test_suggestions_never_propose_a_tp_size_vllm_refuses() -> None:
    arch = from_catalogue("qwen2.5-7b")  # TP 8 and 16 are refused (28 heads)
    budget = MemoryBudget(gpu_memory_bytes=24 * GIB)
    fixes = suggest_fixes(arch, ServingSetup(), budget, 32_768 * 8)
    assert not any(
        fix.startswith(("--tensor-parallel-size 8", "--tensor-parallel-size 16")) for fix in fixes
    )


def _qwen25(**extra: object) -> dict[str, object]:
    return {
        "model_type": "qwen2",
        "num_hidden_layers": 28,
        "hidden_size": 3584,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "max_position_embeddings": 32768,
        **extra,
    }


@pytest.mark.parametrize(
    ("config", "derived"),
    [
        (_qwen25(), 32_768),
        # Qwen2.5's documented long-context setting: yarn x4 over the original 32,768
        (
            _qwen25(
                rope_scaling={
                    "type": "yarn",
                    "factor": 4.0,
                    "original_max_position_embeddings": 32768,
                }
            ),
            131_072,
        ),
        (_qwen25(rope_scaling={"rope_type": "linear", "factor": 2.0}), 65_536),
        (_qwen25(rope_scaling={"rope_type": "dynamic", "factor": 2.0}), 65_536),
        # llama3, longrope and su already count the scaling in max_position_embeddings
        (_qwen25(rope_scaling={"rope_type": "llama3", "factor": 8.0}), 32_768),
        (_qwen25(rope_scaling={"rope_type": "longrope", "factor": 4.0}), 32_768),
        # transformers 5: rope_parameters, possibly one per layer type
        (
            _qwen25(rope_parameters={"full_attention": {"rope_type": "linear", "factor": 4.0}}),
            131_072,
        ),
        # Gemma 3's positions are already scaled: vLLM skips the factor
        (
            _qwen25(model_type="gemma3_text", rope_scaling={"rope_type": "linear", "factor": 8.0}),
            32_768,
        ),
        # the smallest position field wins; model_max_length overrides it (Command-R)
        (_qwen25(seq_length=8192), 8192),
        (_qwen25(model_max_length=131_072), 131_072),
    ],
)
def test_derived_max_model_len_follows_vllm(config: dict[str, object], derived: int) -> None:
    arch = architecture_from_config(config, name="m")
    assert arch.max_model_len_limit == derived
    assert served_max_model_len(arch, None) == derived
    assert served_max_model_len(arch, derived) == derived
    with pytest.raises(ConfigError, match="VLLM_ALLOW_LONG_MAX_MODEL_LEN=1"):
        served_max_model_len(arch, derived + 1)
    assert served_max_model_len(arch, derived + 1, allow_long=True) == derived + 1


def test_max_model_len_past_the_positions_is_refused_unless_allowed() -> None:
    arch = from_catalogue("qwen2.5-7b")
    with pytest.raises(ConfigError) as info:
        served_max_model_len(arch, 1_000_000)
    message = str(info.value)
    assert "max_model_len 1000000 is longer than the 32768 positions" in message
    assert "(max_position_embeddings 32768)" in message and "allow_long_max_model_len" in message
    assert served_max_model_len(arch, 1_000_000, allow_long=True) == 1_000_000


@pytest.mark.parametrize("bad", [0, -1, True, 2.5])
def test_max_model_len_must_be_a_positive_integer(bad: object) -> None:
    with pytest.raises(ConfigError, match="max_model_len must be a positive integer"):
        served_max_model_len(from_catalogue("qwen2.5-7b"), bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [0, -16])
def test_block_size_zero_or_negative_is_refused(bad: int) -> None:
    with pytest.raises(ConfigError, match="block_size must be"):
        ServingSetup(block_size=bad)


def test_weights_that_do_not_fit_are_an_error_with_the_numbers() -> None:
    """8 GiB for Qwen2.5-7B: 7.20 GiB usable, 14.19 GiB of weights (7.62e9 x 2 B)."""
    arch = from_catalogue("qwen2.5-7b")
    budget = MemoryBudget(gpu_memory_bytes=8 * GIB)
    with pytest.raises(ConfigError) as info:
        budget.check_weights_fit(arch, ServingSetup())
    message = str(info.value)
    assert "the weights of Qwen/Qwen2.5-7B-Instruct do not fit: 14.19 GiB per GPU" in message
    assert "gpu_memory_gib 8 x gpu_memory_utilization 0.9 = 7.20 GiB per GPU" in message
    # 4 GPUs: 3.55 GiB of weights each + 2 GiB reserve < 7.20 GiB (TP 2 is 7.10 + 2: no)
    assert "use tensor_parallel 4" in message


def test_weights_plus_reserve_leaving_no_kv_is_an_error() -> None:
    arch = from_catalogue("llama-3.1-8b")  # 16.06e9 B = 14.96 GiB of weights
    budget = MemoryBudget(gpu_memory_bytes=18 * GIB)  # 16.20 GiB usable: 1.24 GiB < 2 reserve
    with pytest.raises(ConfigError, match="plus reserve_gib 2 leave no KV memory"):
        budget.check_weights_fit(arch, ServingSetup())
    MemoryBudget(gpu_memory_bytes=18 * GIB, reserve_bytes=GIB).check_weights_fit(
        arch, ServingSetup()
    )
    MemoryBudget(kv_cache_memory_bytes=0).check_weights_fit(arch, ServingSetup())  # exact mode


# --- the hybrid KV cache manager switched off (issue 12, item 14) ----------------------

LLAMA4_MAVERICK = {  # text_config of meta-llama/Llama-4-Maverick-17B-128E-Instruct-FP8
    "model_type": "llama4_text",
    "num_hidden_layers": 48,
    "hidden_size": 5120,
    "num_attention_heads": 40,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "attention_chunk_size": 8192,
    "max_position_embeddings": 1_048_576,
}


@pytest.mark.parametrize(
    ("gib", "logged_tokens", "logged_concurrency"),
    [(16.93, 739_536, "1.72"), (16.83, 735_440, "1.71")],
)
def test_hybrid_manager_off_reproduces_a_published_llama4_log(
    gib: float, logged_tokens: int, logged_concurrency: str
) -> None:
    """Llama-4-Maverick FP8, TP 8, max_model_len 430,000, hybrid KV cache manager disabled
    (forced by the NIXL connector), vLLM 0.10/0.11 logs:

    https://github.com/ai-dynamo/dynamo/issues/3643 -- "Hybrid KV cache manager is disabled
    for this hybrid model", "GPU KV cache size: 739,536 tokens", "Maximum concurrency for
    430,000 tokens per request: 1.72x" and 735,440 / 1.71x from another rank;
    https://github.com/ai-dynamo/dynamo/issues/3644 -- the same deployment's ranks logging
    "Available KV cache memory: 16.93 GiB" and "16.83 GiB".

    Off, all 48 layers are full attention: 1 KV head per rank x 128 x 2 (K, V) x 2 bytes
    = 512 B per token per layer, 16 x 512 x 48 = 393,216 B per block.
    """
    arch = architecture_from_config(LLAMA4_MAVERICK, name="Llama-4-Maverick")
    assert (arch.count("chunked"), arch.count("full")) == (36, 12)
    off = plan_kv(arch, ServingSetup(tensor_parallel=8, disable_hybrid_kv_cache_manager=True))
    assert off.is_uniform and off.stages[0].block_bytes == 393_216
    low, high = logged_gib_bounds(gib)
    assert off.capacity_tokens(low) <= logged_tokens <= off.capacity_tokens(high)
    blocks = logged_tokens // 16
    exact = blocks * off.stages[0].block_bytes
    assert off.capacity_tokens(exact, 430_000) == logged_tokens
    # concurrency = blocks / cdiv(430,000, 16): 46,221 / 26,875 = 1.72
    assert f"{off.max_concurrency(exact, 430_000):.2f}" == logged_concurrency
    # with the manager on, the chunked layers hold at most chunk + batch tokens: far more fits
    on = plan_kv(arch, ServingSetup(tensor_parallel=8))
    assert on.max_concurrency(exact, 430_000) > 3 * off.max_concurrency(exact, 430_000)


def test_hybrid_manager_on_and_off_for_gemma3_4b() -> None:
    """Gemma-3-4b-it (34 layers: 5 full, 29 sliding-1024; 4 KV heads x 256), max_model_len
    3,072, hybrid manager on, from https://github.com/ovg-project/kvcached/issues/215:
    "Add 1 padding layers, may waste at most 3.45% KV cache memory", "GPU KV cache size:
    317,136 tokens", "Maximum concurrency for 3,072 tokens per request: 102.78x".

    On: group size 5, 1 full + 6 sliding groups (29 padded to 30: the 1 padding layer);
    that era logged tokens = blocks // 7 groups x 16, so 138,747..138,753 blocks; a request
    takes 192 full + 6 x (cdiv(min(1023 + 8192, 3072), 16) + 1) = 1,350 blocks -> 102.78x.

    Off: no published log found, so derived by hand from the config: all 34 layers full,
    block = 34 x 16 x 2 x 4 x 256 x 2 B = 2,228,224 B; the same memory (138,750 blocks x
    5 x 65,536 B = 45,465,600,000 B) holds 20,404 blocks = 326,464 tokens, 20,404 / 192 =
    106.27x at 3,072 tokens (a short max_model_len: the window saves nothing here).
    """
    config = {
        "model_type": "gemma3_text",
        "num_hidden_layers": 34,
        "hidden_size": 2560,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "sliding_window": 1024,
        "sliding_window_pattern": 6,
        "max_position_embeddings": 131_072,
    }
    arch = architecture_from_config(config, name="gemma-3-4b-it")
    on = plan_kv(arch)
    stage = on.stages[0]
    assert (stage.group_size, stage.blocks_per_request(3072)) == (5, 1350)
    for blocks in range(138_747, 138_754):
        assert blocks // 7 * 16 == 317_136
        assert f"{on.max_concurrency(blocks * stage.block_bytes, 3072):.2f}" == "102.78"
    memory = 138_750 * stage.block_bytes
    off = plan_kv(arch, ServingSetup(disable_hybrid_kv_cache_manager=True))
    assert off.stages[0].block_bytes == 2_228_224 and off.stages[0].layer_counts == {"full": 34}
    assert off.capacity_tokens(memory) == 326_464
    assert f"{off.max_concurrency(memory, 3072):.2f}" == "106.27"
    # at a long max_model_len the window matters: off needs every layer at full length
    assert off.needed_bytes(131_072) == 34 * 8192 * 16 * 2 * 4 * 256 * 2
    assert on.needed_bytes(131_072) < off.needed_bytes(131_072) / 4


def test_hybrid_manager_off_keeps_a_single_layer_type_as_it_is() -> None:
    """unify_hybrid_kv_cache_specs returns early for uniform specs: all-sliding stays windowed."""
    config = {
        "model_type": "mistral",
        "num_hidden_layers": 32,
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "sliding_window": 4096,
        "max_position_embeddings": 32768,
    }
    arch = architecture_from_config(config, name="Mistral-7B-v0.1")
    on = plan_kv(arch)
    off = plan_kv(arch, ServingSetup(disable_hybrid_kv_cache_manager=True))
    assert on.stages == off.stages
    # a full-attention-only model is the same either way
    llama = from_catalogue("llama-3.1-8b")
    assert (
        plan_kv(llama).stages
        == plan_kv(llama, ServingSetup(disable_hybrid_kv_cache_manager=True)).stages
    )


def test_hybrid_manager_off_is_refused_for_mamba_hybrids() -> None:
    """vLLM: "Hybrid KV cache manager is disabled but failed to convert the KV cache specs
    to one unified type." (recurrent + attention layers)."""
    arch = from_catalogue("qwen3-next")
    with pytest.raises(ConfigError, match="disable_hybrid_kv_cache_manager"):
        plan_kv(arch, ServingSetup(disable_hybrid_kv_cache_manager=True))
