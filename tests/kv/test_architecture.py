"""Bytes per token per GPU for every architecture kind, computed by hand in comments."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from ctxguard.errors import ConfigError, MissingDependencyError
from ctxguard.kv import (
    ModelLimit,
    ServingSetup,
    architecture_from_config,
    from_catalogue,
    kv_bytes_per_token,
    load_config_file,
    load_model_directory,
    plan_kv,
)

LLAMA_8B: dict[str, Any] = {
    "model_type": "llama",
    "num_hidden_layers": 32,
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "max_position_embeddings": 131072,
    "torch_dtype": "bfloat16",
}


def bytes_per_token(config: dict[str, Any], **setup: Any) -> int:
    return kv_bytes_per_token(architecture_from_config(config), ServingSetup(**setup))


# --- grouped-query, multi-query, aliases, head_dim ---------------------------------


def test_gqa_llama_8b_and_the_naive_formula_overstates_by_4x() -> None:
    # 2 (K and V) * 32 layers * 8 KV heads * 128 head dim * 2 bytes (bf16)
    expected = 2 * 32 * 8 * 128 * 2
    assert expected == 131_072
    assert bytes_per_token(LLAMA_8B) == expected
    naive = 2 * 32 * 4096 * 2  # 2 x layers x hidden_size x bytes ignores GQA
    assert naive == 4 * expected


def test_mha_fallback_when_no_kv_head_field() -> None:
    config = {k: v for k, v in LLAMA_8B.items() if k != "num_key_value_heads"}
    # every one of the 32 heads is a KV head: 2 * 32 layers * 32 heads * 128 * 2
    assert bytes_per_token(config) == 2 * 32 * 32 * 128 * 2


def test_multi_query_falcon_style_flag() -> None:
    falcon = {"n_layer": 32, "hidden_size": 4544, "n_head": 71, "multi_query": True}
    # one KV head of 4544 / 71 = 64: 2 * 32 layers * 1 head * 64 * 2 bytes
    assert bytes_per_token(falcon) == 2 * 32 * 1 * 64 * 2


@pytest.mark.parametrize(
    "alias", ["n_head_kv", "num_kv_heads", "multi_query_group_num", "num_attention_groups"]
)
def test_kv_head_aliases(alias: str) -> None:
    chatglm = {"num_layers": 28, "hidden_size": 4096, "num_attention_heads": 32, alias: 2}
    # 2 groups of 4096 / 32 = 128: 2 * 28 layers * 2 heads * 128 * 2 bytes
    assert bytes_per_token(chatglm) == 2 * 28 * 2 * 128 * 2


def test_explicit_head_dim_beats_hidden_over_heads() -> None:
    qwen3_4b = from_catalogue("Qwen/Qwen3-4B")
    # head_dim 128 (not 2560 / 32 = 80): 2 * 36 layers * 8 heads * 128 * 2 = 144 KiB
    assert kv_bytes_per_token(qwen3_4b) == 2 * 36 * 8 * 128 * 2 == 144 * 1024


# --- tensor and pipeline parallelism ---------------------------------------------


@pytest.mark.parametrize(
    ("tp", "heads_per_gpu"),
    [(1, 8), (2, 4), (4, 2), (8, 1), (16, 1)],  # TP16 > 8 heads: one replicated head per GPU
)
def test_tensor_parallel_splits_heads_then_replicates(tp: int, heads_per_gpu: int) -> None:
    llama_70b = from_catalogue("llama-3.3-70b")
    # 2 * 80 layers * heads_per_gpu * 128 * 2 bytes
    assert kv_bytes_per_token(llama_70b, ServingSetup(tensor_parallel=tp)) == (
        2 * 80 * heads_per_gpu * 128 * 2
    )


def test_qwen3_235b_stops_shrinking_at_tp4() -> None:
    arch = from_catalogue("Qwen/Qwen3-235B-A22B")
    # 4 KV heads: TP4 and TP8 both keep 1 head: 2 * 94 * 1 * 128 * 2 = 47 KiB
    for tp in (4, 8):
        assert kv_bytes_per_token(arch, ServingSetup(tensor_parallel=tp)) == 2 * 94 * 128 * 2
    assert 2 * 94 * 128 * 2 == 47 * 1024


def test_pipeline_stages_split_layers_like_vllm() -> None:
    # PP2: 16 layers per GPU -> 2 * 16 * 8 * 128 * 2
    assert bytes_per_token(LLAMA_8B, pipeline_parallel=2) == 2 * 16 * 8 * 128 * 2
    # PP3: 32 // 3 = 10 each, the remainder 2 goes to the two stages before the last:
    # [11, 11, 10]; the busiest GPU holds 11 layers -> 2 * 11 * 8 * 128 * 2
    plan = plan_kv(architecture_from_config(LLAMA_8B), ServingSetup(pipeline_parallel=3))
    assert [s.attention_layers for s in plan.stages] == [11, 11, 10]
    assert plan.bytes_per_token == 2 * 11 * 8 * 128 * 2


# --- KV dtype and weight quantisation --------------------------------------------


@pytest.mark.parametrize(
    ("dtype", "element"),
    [("auto", 2), ("bfloat16", 2), ("fp16", 2), ("fp8", 1), ("fp8_e4m3", 1), ("fp8_e5m2", 1)],
)
def test_kv_cache_dtype(dtype: str, element: int) -> None:
    # 2 * 32 * 8 * 128 * element bytes
    assert bytes_per_token(LLAMA_8B, kv_cache_dtype=dtype) == 2 * 32 * 8 * 128 * element


def test_nvfp4_packs_a_head_into_72_bytes() -> None:
    # d = 128: 128/2 + 128/16 = 72 bytes per head; 2 * 32 layers * 8 heads * 72
    assert bytes_per_token(LLAMA_8B, kv_cache_dtype="nvfp4") == 2 * 32 * 8 * 72


@pytest.mark.parametrize(
    "quant",
    [{"quant_method": "fp8"}, {"quant_method": "awq", "bits": 4}, {"quant_method": "gptq"}],
)
def test_weight_quantisation_does_not_change_kv(quant: dict[str, Any]) -> None:
    quantised = {**LLAMA_8B, "quantization_config": quant}
    assert bytes_per_token(quantised) == bytes_per_token(LLAMA_8B) == 131_072


def test_weight_quantisation_changes_weight_size() -> None:
    fp8 = architecture_from_config({**LLAMA_8B, "quantization_config": {"quant_method": "fp8"}})
    awq = architecture_from_config(
        {**LLAMA_8B, "quantization_config": {"quant_method": "awq", "bits": 4}}
    )
    assert (fp8.weight_bytes_per_param, awq.weight_bytes_per_param) == (1.0, 0.5)


def test_fp32_checkpoint_is_served_in_16_bit() -> None:
    assert bytes_per_token({**LLAMA_8B, "torch_dtype": "float32"}) == 131_072


# --- multi-head latent attention -------------------------------------------------


def test_mla_is_one_latent_not_split_by_tp() -> None:
    v3 = from_catalogue("deepseek-v3")
    # (kv_lora_rank 512 + qk_rope_head_dim 64) * 61 layers * 2 bytes, no K/V factor 2
    expected = (512 + 64) * 61 * 2
    assert expected == 70_272
    for tp in (1, 8, 16):
        assert kv_bytes_per_token(v3, ServingSetup(tensor_parallel=tp)) == expected


def test_mla_fp8_variants() -> None:
    v3 = from_catalogue("deepseek-r1")
    # fp8: 576 * 61 * 1 byte; fp8_ds_mla: 656 bytes per token per layer * 61
    assert kv_bytes_per_token(v3, ServingSetup(kv_cache_dtype="fp8")) == 576 * 61
    assert kv_bytes_per_token(v3, ServingSetup(kv_cache_dtype="fp8_ds_mla")) == 656 * 61


def test_mla_block_size_defaults_to_64_and_can_be_set() -> None:
    lite = from_catalogue("deepseek-v2-lite")
    assert plan_kv(lite).block_size == 64
    assert plan_kv(lite, ServingSetup(block_size=128)).block_size == 128
    assert plan_kv(from_catalogue("llama-3.1-8b")).block_size == 16
    # facts: 32768 tokens of DeepSeek-V2-Lite = 576 * 27 * 2 * 32768 bytes = 0.95 GiB
    assert round(plan_kv(lite).needed_bytes(32768) / 2**30, 2) == 0.95


def test_fp8_ds_mla_needs_an_mla_model() -> None:
    with pytest.raises(ConfigError, match="MLA"):
        bytes_per_token(LLAMA_8B, kv_cache_dtype="fp8_ds_mla")


# --- sliding window, interleaved and chunked layers ------------------------------


def test_gemma3_nested_text_config_and_5_to_1_sliding() -> None:
    gemma = from_catalogue("google/gemma-3-27b-it")
    # 62 layers; every 6th is global: 62 // 6 = 10 full, 52 sliding (window 1024)
    assert (gemma.count("full"), gemma.count("sliding"), gemma.sliding_window) == (10, 52, 1024)
    plan = plan_kv(gemma)
    # unbounded part: 2 * 10 layers * 16 heads * 128 * 2 bytes = 80 KiB
    assert plan.full_attention_bytes_per_token == 2 * 10 * 16 * 128 * 2 == 80 * 1024


def test_sliding_window_cost_is_bounded_by_the_window() -> None:
    plan = plan_kv(from_catalogue("gemma-3-27b"), ServingSetup(max_num_batched_tokens=4096))
    stage = plan.stages[0]
    # full layer: cdiv(131072, 16) = 8192 blocks; sliding: cdiv(min(1023 + 4096, L), 16) + 1
    assert stage.layer_blocks("full", 131_072) == 8192
    assert stage.layer_blocks("sliding", 131_072) == -(-(1023 + 4096) // 16) + 1 == 321
    assert stage.layer_blocks("sliding", 1_000_000) == 321  # independent of context length


def test_gemma3_consistency_check_from_the_facts() -> None:
    """fp8, L=131072, 4096 batched tokens: 68,151 blocks -> 882,851 tokens, 6.74x."""
    plan = plan_kv(
        from_catalogue("gemma-3-27b"),
        ServingSetup(kv_cache_dtype="fp8", max_num_batched_tokens=4096),
    )
    stage = plan.stages[0]
    # page: 16 tokens * 2 * 16 heads * 128 * 1 byte = 65,536; group size 10 -> 655,360 / block
    assert (stage.page_bytes, stage.group_size, stage.block_bytes) == (65_536, 10, 655_360)
    # blocks per request: 1 full group * 8192 + 6 sliding groups * 321 = 10,118
    assert stage.blocks_per_request(131_072) == 8192 + 6 * 321 == 10_118
    available = 68_151 * 655_360 + 1000  # a little slack below one more block
    assert plan.num_blocks(available) == 68_151
    assert plan.capacity_tokens(available, 131_072) == int(68_151 / 10_118 * 131_072) == 882_851
    assert round(plan.max_concurrency(available, 131_072), 2) == 6.74


def test_gpt_oss_alternates_sliding_128_and_full() -> None:
    arch = from_catalogue("openai/gpt-oss-20b")
    assert arch.layer_kinds[:4] == ("sliding", "full", "sliding", "full")
    plan = plan_kv(arch)
    # full half: 2 * 12 layers * 8 heads * 64 * 2 = 24 KiB per token
    assert plan.full_attention_bytes_per_token == 2 * 12 * 8 * 64 * 2 == 24 * 1024
    # sliding layer with 8192 batched tokens: cdiv(127 + 8192, 16) + 1 = 521 blocks at most
    assert plan.stages[0].layer_blocks("sliding", 131_072) == -(-(127 + 8192) // 16) + 1
    # 12 + 12: group size 12, two groups
    assert plan.stages[0].group_size == 12
    assert from_catalogue("gpt-oss-120b").count("full") == 18


def test_gemma2_alternates_starting_with_sliding() -> None:
    gemma2 = {
        "model_type": "gemma2",
        "num_hidden_layers": 4,
        "hidden_size": 2304,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "sliding_window": 4096,
    }
    assert architecture_from_config(gemma2).layer_kinds == ("sliding", "full") * 2


def test_llama4_chunked_attention_on_three_of_four_layers() -> None:
    scout = from_catalogue("llama-4-scout")
    # layers 4, 8, ... (every 4th) use no RoPE and global attention: 48 / 4 = 12
    assert (scout.count("chunked"), scout.count("full")) == (36, 12)
    stage = plan_kv(scout).stages[0]
    # chunked layer: cdiv(min(8192 + 8192 batched, L), 16) blocks, bounded by the chunk
    assert stage.layer_blocks("chunked", 1_000_000) == (8192 + 8192) // 16
    assert stage.layer_blocks("chunked", 4096) == 4096 // 16


def test_mistral_v01_window_applies_to_every_layer_but_qwen2_flag_disables_it() -> None:
    mistral = {**LLAMA_8B, "model_type": "mistral", "sliding_window": 4096}
    assert set(architecture_from_config(mistral).layer_kinds) == {"sliding"}
    qwen2 = {**mistral, "use_sliding_window": False}
    assert set(architecture_from_config(qwen2).layer_kinds) == {"full"}


# --- hybrids with recurrent state --------------------------------------------------


def test_qwen3_next_gdn_state_and_enlarged_block() -> None:
    arch = from_catalogue("qwen3-next")
    assert (arch.count("full"), arch.count("mamba")) == (12, 36)
    # conv: (4 - 1) * (2 * 16 * 128 + 32 * 128) + recurrent: 32 * 128 * 128, in bf16
    state = ((4 - 1) * (2 * 16 * 128 + 32 * 128) + 32 * 128 * 128) * 2
    assert arch.mamba_state_bytes == state == 1_097_728
    plan = plan_kv(arch)
    token = 2 * 2 * 256 * 2  # one attention layer: 2 * 2 KV heads * 256 * 2 bytes
    # block grows to 16 * cdiv(state, 16 * token) so one attention page holds a state
    block = 16 * -(-state // (16 * token))
    assert plan.block_size == block == 544
    stage = plan.stages[0]
    assert (stage.page_bytes, stage.group_size) == (block * token, 12)
    # per token only the 12 attention layers grow: 12 * 2048
    assert plan.bytes_per_token == 12 * token
    # one request at 8192: cdiv(8192, 544) full blocks + 3 mamba groups x 1 state
    assert stage.blocks_per_request(8192) == -(-8192 // 544) + 3


def test_nemotron_h_pattern_and_mamba2_state() -> None:
    config = {
        "model_type": "nemotron_h",
        "num_hidden_layers": 6,
        "hidden_size": 1024,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 128,
        "hybrid_override_pattern": "M-M*-M",
        "mamba_num_heads": 16,
        "mamba_head_dim": 64,
        "ssm_state_size": 128,
        "n_groups": 8,
        "conv_kernel": 4,
    }
    arch = architecture_from_config(config)
    assert arch.layer_kinds == ("mamba", "none", "mamba", "full", "none", "mamba")
    # conv: 3 * (16*64 + 2*8*128) + ssm: 16 * 64 * 128, times 2 bytes
    assert arch.mamba_state_bytes == (3 * (16 * 64 + 2 * 8 * 128) + 16 * 64 * 128) * 2
    # per token: only the one attention layer: 2 * 2 heads * 128 * 2
    assert kv_bytes_per_token(arch) == 2 * 2 * 128 * 2


def test_jamba_period_and_mamba1_state() -> None:
    config = {
        "model_type": "jamba",
        "num_hidden_layers": 8,
        "hidden_size": 512,
        "num_attention_heads": 8,
        "num_key_value_heads": 8,
        "attn_layer_period": 8,
        "attn_layer_offset": 4,
        "mamba_d_state": 16,
        "mamba_d_conv": 4,
        "mamba_expand": 2,
    }
    arch = architecture_from_config(config)
    assert arch.layer_kinds.index("full") == 4 and arch.count("mamba") == 7
    # inner = 2 * 512: conv 3 * 1024 + ssm 1024 * 16, times 2 bytes
    assert arch.mamba_state_bytes == (3 * 1024 + 1024 * 16) * 2


def test_hybrid_without_state_sizes_is_rejected() -> None:
    config = {**LLAMA_8B, "layer_types": ["linear_attention", "full_attention"] * 16}
    with pytest.raises(ConfigError, match="state sizes"):
        architecture_from_config(config)


# --- multimodal nesting ------------------------------------------------------------


def test_text_config_nesting_inherits_top_level_dtype() -> None:
    config = {"model_type": "llava", "torch_dtype": "float16", "text_config": LLAMA_8B}
    arch = architecture_from_config({**config, "text_config": {**LLAMA_8B, "torch_dtype": None}})
    assert arch.dtype == "float16"
    assert kv_bytes_per_token(arch) == 131_072


# --- bad input ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"num_hidden_layers": None}, "number of layers"),
        ({"num_attention_heads": 0}, "must be positive"),
        ({"num_key_value_heads": 0}, "KV heads"),
        ({"num_hidden_layers": 2.5}, "whole number"),
        ({"layer_types": ["full_attention"] * 3}, "lists 3 layers"),
        ({"layer_types": ["warp_attention"] * 32}, "unknown layer type"),
    ],
)
def test_bad_configs_raise_config_error(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        architecture_from_config({**LLAMA_8B, **change})


def test_bad_setup_values() -> None:
    with pytest.raises(ConfigError, match="tensor_parallel"):
        ServingSetup(tensor_parallel=0)
    with pytest.raises(ConfigError, match="kv_cache_dtype"):
        ServingSetup(kv_cache_dtype="int3")
    with pytest.raises(ConfigError, match="pipeline_parallel"):
        plan_kv(architecture_from_config(LLAMA_8B), ServingSetup(pipeline_parallel=64))


# --- loading files and directories ------------------------------------------------


def test_load_config_file(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA_8B))
    assert kv_bytes_per_token(load_config_file(path)) == 131_072
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not readable JSON"):
        load_config_file(tmp_path / "broken.json")


def test_a_config_nested_too_deep_is_a_config_error(tmp_path: Path) -> None:
    """Valid JSON nested past the recursion limit (before: RecursionError)."""
    (tmp_path / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ConfigError, match="nested too deeply"):
        ModelLimit(tmp_path / "config.json").resolve()


def test_load_model_directory_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("transformers")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_8B))
    (tmp_path / "model.safetensors").write_bytes(b"\0" * 4096)
    arch = load_model_directory(tmp_path)
    assert kv_bytes_per_token(arch) == 131_072
    assert arch.weights_bytes == 4096  # the checkpoint files' size, not a guess


def test_model_directory_without_transformers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(MissingDependencyError, match=r"ctxguard\[hf\]"):
        load_model_directory(tmp_path)


_BAD_VALUES = [
    ({"max_position_embeddings": float("nan")}, "max_position_embeddings"),
    ({"max_position_embeddings": float("inf")}, "max_position_embeddings"),
    ({"model_max_length": float("nan")}, "model_max_length"),
    ({"rope_scaling": {"rope_type": "dynamic", "factor": float("inf")}}, "rope factor"),
    ({"num_key_value_heads": float("-inf")}, "num_key_value_heads"),
    ({"hidden_size": "4096"}, "hidden_size"),
    ({"hidden_size": float("nan")}, "hidden_size"),
    ({"num_hidden_layers": True}, "num_hidden_layers"),
    ({"num_attention_heads": 0}, "attention heads is 0"),
    ({"kv_lora_rank": 0}, "kv_lora_rank"),
    ({"num_hidden_layers": 10**12}, "layers"),  # (before: MemoryError)
    ({"rope_scaling": {"rope_type": "dynamic", "factor": 1e305}}, "rope factor"),  # Overflow
    ({"layer_types": ["x" * 5000] * 32}, "unknown layer type"),  # (before: 5,000 x's shown)
]


@pytest.mark.parametrize("where", ["config.json", "directory"])
@pytest.mark.parametrize(("change", "named"), _BAD_VALUES)
def test_bad_config_values_are_one_line_config_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str, change: dict[str, Any], named: str
) -> None:
    """NaN/Infinity, a string or bool number, zero heads or a zero MLA rank in config.json
    is a ConfigError naming the field, for a config.json and a model directory (before:
    ValueError, OverflowError, ZeroDivisionError or transformers' validation error)."""
    if where == "directory":
        pytest.importorskip("transformers")
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    (tmp_path / "config.json").write_text(json.dumps({**LLAMA_8B, **change}))
    model = tmp_path / "config.json" if where == "config.json" else tmp_path
    with pytest.raises(ConfigError) as info:
        ModelLimit(model, available_kv_gib=20, max_model_len=4096).resolve()
    text = str(info.value)
    assert named in text and "\n" not in text and len(text) <= 300


def test_a_config_transformers_refuses_is_a_one_line_config_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model directory whose config.json transformers cannot load is a bounded one-line
    ConfigError naming the directory (before: IndexError from config.to_dict(), or a
    multi-line StrictDataclassFieldValidationError)."""
    pytest.importorskip("transformers")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for change in ({"torch_dtype": ["x"]}, {"max_position_embeddings": 1e300}):
        (tmp_path / "config.json").write_text(json.dumps({**LLAMA_8B, **change}))
        with pytest.raises(ConfigError) as info:
            load_model_directory(tmp_path)
        text = str(info.value)
        assert "config.json" in text and str(tmp_path) in text
        assert "\n" not in text and len(text) <= 300


_HYBRID = {**LLAMA_8B, "num_hidden_layers": 8, "head_dim": 128}
_QWEN_NEXT = {
    **_HYBRID,
    "full_attention_interval": 4,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4,
}
_JAMBA = {
    **_HYBRID,
    "attn_layer_period": 8,
    "attn_layer_offset": 4,
    "mamba_d_state": 16,
    "mamba_d_conv": 4,
    "mamba_expand": 2,
}
_MAMBA2 = {
    **_HYBRID,
    "layer_types": ["mamba", "attention"] * 4,
    "mamba_n_heads": 16,
    "mamba_head_dim": 64,
    "ssm_state_size": 128,
    "n_groups": 8,
}
_GEMMA3 = {**_HYBRID, "sliding_window": 1024, "sliding_window_pattern": 6}
_LLAMA4 = {**_HYBRID, "attention_chunk_size": 8192, "nope_layer_interval": 4}

_BAD_LAYOUT = [
    pytest.param(_QWEN_NEXT, "full_attention_interval", value, id=f"interval={value}")
    for value in (-4, 0)
] + [
    pytest.param(base, field, value, id=f"{field}={value}")
    for base, field, values in [
        (_JAMBA, "attn_layer_period", (-8, 0)),
        (_JAMBA, "attn_layer_offset", (-1, 8)),
        (_GEMMA3, "sliding_window_pattern", (-6, 0)),
        (_LLAMA4, "nope_layer_interval", (-4, 0)),
        (LLAMA_8B, "num_hidden_layers", (-32,)),
        (LLAMA_8B, "num_attention_heads", (-32,)),
        (LLAMA_8B, "num_key_value_heads", (-8, 0)),
        (LLAMA_8B, "hidden_size", (-4096,)),
        (LLAMA_8B, "head_dim", (-128, 0)),
        ({**LLAMA_8B, "kv_lora_rank": 512}, "qk_nope_head_dim", (-128,)),
        ({**LLAMA_8B, "kv_lora_rank": 512}, "qk_rope_head_dim", (-64,)),
        ({**LLAMA_8B, "sliding_window": 4096}, "sliding_window", (-4096,)),
        (_QWEN_NEXT, "linear_num_value_heads", (-32, 0)),
        (_QWEN_NEXT, "linear_conv_kernel_dim", (-4,)),
        (_JAMBA, "mamba_d_state", (-16,)),
        (_JAMBA, "mamba_expand", (-2,)),
        (_JAMBA, "mamba_d_conv", (-4,)),
        (_MAMBA2, "mamba_n_heads", (-16,)),
        (_MAMBA2, "n_groups", (-8,)),
        (_MAMBA2, "mamba_state_bytes", (-5,)),
    ]
    for value in values
]


@pytest.mark.parametrize(("base", "field", "value"), _BAD_LAYOUT)
def test_layout_numbers_out_of_range_are_one_line_config_errors(
    tmp_path: Path, base: dict[str, Any], field: str, value: int
) -> None:
    """A layer period, offset, count, head or state size that is negative (or zero where
    it means nothing) is a ConfigError naming the field and the config file (before, some
    gave a wrong layer layout or cache size without an error: Python's ``%`` with a
    negative period, a zero period read as "none", two negative Mamba sizes)."""
    architecture_from_config(base)  # the base is fine
    file = tmp_path / "config.json"
    file.write_text(json.dumps({**base, field: value}))
    with pytest.raises(ConfigError) as info:
        load_config_file(file)
    text = str(info.value)
    assert field in text and str(value) in text and str(file) in text
    assert "\n" not in text and len(text) <= 300
