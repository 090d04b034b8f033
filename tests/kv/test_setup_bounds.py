"""Whole-number options of the KV sizing past 2**63-1 are a one-line ConfigError.

(``ModelLimit(..., block_size=10**400)`` raised OverflowError out of the float division
of the KV sizes, an untyped crash of a public entry point; ``concurrency`` and
``max_model_len`` of 10**400 were ConfigErrors that printed all 401 digits.)
"""

from __future__ import annotations

import pytest

from ctxguard.errors import ConfigError
from ctxguard.kv.calculator import ServingSetup
from ctxguard.kv.limit import ModelLimit, ServerLimit

from .test_cli import run

MODEL = "Qwen/Qwen2.5-7B-Instruct"
HUGE = [2**63, 10**400]


def _one_short_line(message: str, name: str) -> None:
    assert "\n" not in message.strip() and name in message and len(message) < 200


@pytest.mark.parametrize("value", HUGE, ids=["2**63", "1e400"])
@pytest.mark.parametrize(
    "name",
    ["block_size", "max_num_batched_tokens", "tensor_parallel", "pipeline_parallel"],
)
def test_serving_setup_numbers_past_2_63_are_refused(name: str, value: int) -> None:
    with pytest.raises(ConfigError) as caught:
        ServingSetup(**{name: value})  # type: ignore[arg-type]
    _one_short_line(str(caught.value), name)
    with pytest.raises(ConfigError) as caught:
        ModelLimit(MODEL, gpu_memory_gib=80, **{name: value}).resolve()  # type: ignore[arg-type]
    _one_short_line(str(caught.value), name)


@pytest.mark.parametrize("value", HUGE, ids=["2**63", "1e400"])
@pytest.mark.parametrize("name", ["concurrency", "max_model_len"])
def test_model_limit_counts_past_2_63_are_refused_in_one_short_line(name: str, value: int) -> None:
    with pytest.raises(ConfigError) as caught:
        ModelLimit(MODEL, gpu_memory_gib=80, **{name: value}).resolve()  # type: ignore[arg-type]
    _one_short_line(str(caught.value), name)


@pytest.mark.parametrize("value", HUGE, ids=["2**63", "1e400"])
def test_server_limit_concurrency_past_2_63_is_refused(value: int) -> None:
    with pytest.raises(ConfigError) as caught:
        ServerLimit("http://127.0.0.1:1", concurrency=value)
    _one_short_line(str(caught.value), "concurrency")


def test_the_largest_values_are_still_sized() -> None:
    """2**63-1 is taken (and then said not to fit, as vLLM would)."""
    setup = ServingSetup(block_size=2**63 - 1, max_num_batched_tokens=2**63 - 1)
    assert setup.block_size == 2**63 - 1
    with pytest.raises(ConfigError, match="vLLM would not start"):
        ModelLimit(MODEL, gpu_memory_gib=80, block_size=2**63 - 1).resolve()


@pytest.mark.parametrize("flag", ["--block-size", "--tp", "--max-num-batched-tokens"])
def test_the_cli_says_so_in_one_line(flag: str) -> None:
    code, _, err = run(MODEL, "--gpu-memory", "80", flag, str(10**400))
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1, err
    assert flag in err and len(err) < 300
