"""`ctxguard kv` through click's CliRunner."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from ctxguard.cli import cli
from ctxguard.cli import kv as kv_cli


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, ["kv", *args])
    return result.exit_code, result.stdout, result.stderr


def test_help_has_examples() -> None:
    code, out, _ = run("--help")
    assert code == 0
    assert "Examples:" in out and "ctxguard kv llama-3.1-8b" in out and "Exit codes" in out


def test_list_models() -> None:
    code, out, _ = run("--list-models")
    assert code == 0
    assert "meta-llama/Llama-3.1-8B-Instruct" in out and "deepseek-ai/DeepSeek-V3" in out


def test_bytes_per_token_without_memory() -> None:
    code, out, _ = run("llama-3.1-8b")
    assert code == 0
    assert "131,072" in out  # 2 * 32 * 8 * 128 * 2
    # one request of 131,072 tokens: 131,072 * 131,072 bytes = 16.00 GiB
    assert "needs 16.00 GiB" in out


def test_capacity_table_when_it_fits() -> None:
    code, out, _ = run("llama-3.1-8b", "--available-kv", "10", "--max-model-len", "8192")
    assert code == 0
    # 10 GiB / (16 * 131,072) = 5,120 blocks = 81,920 tokens; 5,120 / 512 = 10.00x at 8,192
    assert "81,920 tokens" in out and "5,120 blocks" in out
    assert "10.00x" in out
    assert "recommended --max-model-len: 81920" in out


def test_concurrency_target_sets_the_recommendation() -> None:
    code, out, _ = run("llama-3.1-8b", "--kv-cache-memory", str(10 * 2**30), "--concurrency", "8")
    assert code == 0
    # 5,120 blocks / 8 = 640 blocks = 10,240 tokens
    assert "recommended --max-model-len: 10240" in out


def test_startup_error_and_what_to_change() -> None:
    code, out, _ = run("qwen3-coder-480b", "--available-kv", "48.66", "--max-model-len", "262144")
    assert code == 3
    assert "62.00 GiB KV cache is needed" in out
    assert "estimated maximum model length is 205728" in out
    assert "--max-model-len 205728" in out and "--kv-cache-dtype fp8" in out


def test_gpu_memory_mode_suggests_utilization_and_tp() -> None:
    code, out, _ = run("llama-3.1-8b", "--gpu-memory", "24", "--max-model-len", "131072")
    assert code == 3
    assert "--tensor-parallel-size" in out


def test_tp_and_gpus_and_mla() -> None:
    code, out, _ = run("deepseek-v3", "--gpus", "8")
    assert code == 0
    assert "MLA latent 576" in out and "70,272" in out and "8 x 1" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("llama-3.1-8b", "--gpu-memory", "80", "--gpu-memory-utilization", "1.5"), "(0, 1]"),
        (("llama-3.1-8b", "--gpu-memory", "-80"), "non-negative"),
        (("llama-3.1-8b", "--available-kv", "-1"), "non-negative"),
        (("qwen3-8", "--gpu-memory", "80"), "did you mean"),
        (("llama-3.1-8b", "--tp", "0"), "--tp must be an integer from 1"),
        (("llama-3.1-8b", "--block-size", "0"), "--block-size must be"),
        (("llama-3.1-8b", "--max-num-batched-tokens", "0"), "--max-num-batched-tokens must be"),
        (("llama-3.1-8b", "--max-model-len", "0"), "--max-model-len must be a positive integer"),
        (("llama-3.1-8b", "--available-kv", "10", "--concurrency", "0"), "--concurrency"),
        ((), "give a MODEL"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args: tuple[str, ...], message: str) -> None:
    code, _, err = run(*args)
    assert code == 2
    assert message in err
    assert err.startswith("error: ") and err.count("\n") == 1


def test_import_stays_light() -> None:
    """Importing the kv subpackage and the CLI must not pull in transformers or torch."""
    code = (
        "import sys, ctxguard.kv, ctxguard.cli; "
        "print(any(m in sys.modules for m in ('transformers', 'torch')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_tp_that_does_not_divide_the_heads_is_refused() -> None:
    code, out, err = run("qwen2.5-7b", "--tp", "3", "--gpu-memory", "80")
    assert code == 2 and out == ""
    assert err == (
        "error: --tp 3 does not fit Qwen/Qwen2.5-7B-Instruct: its 28 attention heads do not "
        "divide by 3, so vLLM refuses it; use one of 1, 2, 4, 28\n"
    )


def test_gpus_that_give_a_refused_tp_are_refused() -> None:
    code, _, err = run("qwen2.5-7b", "--gpus", "6", "--pp", "2")
    assert code == 2 and "--tp 3 does not fit" in err


def test_max_model_len_past_the_positions_needs_the_opt_in() -> None:
    code, out, err = run("qwen2.5-7b", "--max-model-len", "1000000", "--available-kv", "40")
    assert code == 2 and out == ""
    assert "--max-model-len 1000000 is longer than the 32768 positions" in err
    assert "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1" in err and "--allow-long-max-model-len" in err
    code, out, _ = run(
        "qwen2.5-7b",
        "--max-model-len",
        "1000000",
        "--available-kv",
        "40",
        "--allow-long-max-model-len",
    )
    # 1,000,000 x 56 KiB = 53.4 GiB of KV: allowed, but it does not fit 40 GiB
    assert code == 3 and "vLLM would not start" in out


def test_weights_that_do_not_fit_are_an_error_not_negative_memory() -> None:
    code, out, err = run("qwen2.5-7b", "--gpu-memory", "8")
    assert code == 2 and out == ""
    assert err.startswith(
        "error: the weights of Qwen/Qwen2.5-7B-Instruct do not fit: 14.19 GiB per GPU, but "
        "--gpu-memory 8 x --gpu-memory-utilization 0.9 = 7.20 GiB per GPU; use --tp 4"
    )
    assert "-8.99" not in err and err.count("\n") == 1


def test_an_unknown_model_gets_a_suggestion_not_a_substitute() -> None:
    code, out, err = run("llama-3-8b")
    assert code == 2 and out == ""
    assert err.startswith("error: unknown model 'llama-3-8b'; did you mean 'llama-3.1-8b'?")


# Every error path of the command with a wrong value for each option: none may name a Python
# parameter instead of the flag (the CLI maps them in one place).
_BAD_RUNS = [
    ("qwen2.5-7b", "--tp", "3"),
    ("qwen2.5-7b", "--tp", "0"),
    ("qwen2.5-7b", "--pp", "0"),
    ("qwen2.5-7b", "--pp", "1000"),
    ("qwen2.5-7b", "--gpu-memory", "8"),
    ("qwen2.5-7b", "--gpu-memory", "0"),
    ("qwen2.5-7b", "--gpu-memory", "80", "--weights", "-1"),
    ("qwen2.5-7b", "--gpu-memory", "80", "--reserve", "-1"),
    ("qwen2.5-7b", "--gpu-memory", "80", "--gpu-memory-utilization", "0"),
    ("qwen2.5-7b", "--max-model-len", "40000"),
    ("qwen2.5-7b", "--max-model-len", "-5"),
    ("qwen2.5-7b", "--block-size", "-1"),
    ("qwen2.5-7b", "--max-num-batched-tokens", "-1"),
    ("qwen2.5-7b", "--available-kv", "10", "--concurrency", "-1"),
    ("qwen2.5-7b", "--concurrency", "2"),
    ("qwen2.5-7b", "--kv-cache-dtype", "fp8_ds_mla"),
    ("deepseek-v3", "--kv-cache-dtype", "nvfp4"),
    ("qwen3-next", "--disable-hybrid-kv-cache-manager"),
    ("llama-3-8b",),
]


@pytest.mark.parametrize("args", _BAD_RUNS)
def test_errors_name_flags_not_python_parameters(args: tuple[str, ...]) -> None:
    code, _, err = run(*args)
    assert code == 2, err
    assert err.startswith("error: ") and err.count("\n") == 1
    for parameter in kv_cli._FLAGS:
        assert re.search(rf"(?<![\w-]){parameter}(?![\w-])", err) is None, (parameter, err)


def test_flag_mapping_leaves_other_words_alone() -> None:
    message = "set VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 or allow_long_max_model_len; max_model_len 5"
    assert kv_cli.flag_message(message) == (
        "set VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 or --allow-long-max-model-len; --max-model-len 5"
    )


def test_source_is_the_public_config_url_and_never_a_local_path(tmp_path: Path) -> None:
    code, out, _ = run("qwen2.5-7b")
    assert code == 0
    assert "https://huggingface.co/Qwen/Qwen2.5-7B-Instruct/blob/main/config.json" in out
    config = tmp_path / "secret-dir" / "config.json"
    config.parent.mkdir()
    config.write_text(
        json.dumps({"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4})
    )
    code, out, _ = run(str(config), "--max-model-len", "1024")
    assert code == 0
    assert str(tmp_path) not in out and "not a public source" in out


def test_disable_hybrid_kv_cache_manager_sizes_every_layer_as_full() -> None:
    # Gemma-3-27B at 32,768 tokens, exactly 20 GiB of KV per GPU
    common = ("gemma-3-27b", "--available-kv", "20", "--max-model-len", "32768")
    code, on, _ = run(*common)
    assert code == 0 and "hybrid KV manager" not in on
    code, off, _ = run(*common, "--disable-hybrid-kv-cache-manager")
    assert code == 0
    assert "off: every layer sized as full attention" in off
    # 62 x 2 x 16 x 128 x 2 = 507,904 B per token; 20 GiB / (16 x 507,904) = 2,642 blocks
    assert "507,904" in off and "2,642 blocks" in off and "42,272 tokens" in off


@pytest.mark.parametrize(
    ("args", "lower"),
    [
        # 28,181 blocks hold at most 28,181 one-block requests: no length serves 100,000
        (("--gpu-memory", "80", "--concurrency", "100000"), "lower --concurrency"),
        (("--gpu-memory", "80", "--concurrency", "100000", "--max-model-len", "4096"), "lower"),
        (("--gpu-memory", "80", "--concurrency", str(10**23)), "lower --concurrency"),
        # nothing at all fits: no block of KV
        (("--available-kv", "0"), "give more KV memory"),
        (("--kv-cache-memory", "0", "--max-model-len", "4096"), "give more KV memory"),
        (("--available-kv", "1e-9", "--concurrency", "2"), "give more KV memory"),
        (("--gpu-memory", "80", "--block-size", "99999999999"), "lower --block-size"),
        # one request fits at 131,072 but 50 at once do not (at most 3; 9,008 serves 50)
        (
            ("--gpu-memory", "80", "--concurrency", "50", "--max-model-len", "131072"),
            "lower --concurrency to 3 or --max-model-len to 9008",
        ),
    ],
)
def test_nothing_fits_is_exit_3_and_one_line_saying_what_to_lower(
    args: tuple[str, ...], lower: str
) -> None:
    code, out, err = run("llama-3.1-8b", *args)
    assert code == kv_cli.EXIT_DOES_NOT_FIT == 3
    assert err.startswith("error: ") and err.count("\n") == 1
    assert lower in err
    assert "pass the recommendation above" not in out  # there is none to pass


def test_concurrency_that_fits_at_the_length_given_is_exit_0() -> None:
    code, out, err = run(
        "llama-3.1-8b", "--gpu-memory", "80", "--concurrency", "50", "--max-model-len", "9008"
    )
    assert (code, err) == (0, "")
    assert "recommended --max-model-len: 9008" in out
