"""`ctxguard kv` through click's CliRunner."""

from __future__ import annotations

import subprocess
import sys

import pytest
from click.testing import CliRunner

from ctxguard.cli import cli


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
        (("llama-3.1-8b", "--tp", "0"), "tensor_parallel"),
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
