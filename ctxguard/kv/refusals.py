"""What vLLM refuses before it sizes any KV cache, so the calculator refuses it too.

* Tensor parallelism (``ModelConfig.verify_with_parallel_config`` in ``vllm/config/model.py``):
  the attention heads must divide by the TP size. KV heads are split when there are more
  of them than ranks and replicated otherwise, and ``QKVParallelLinear``
  (``vllm/model_executor/layers/linear.py``) divides exactly either way: ``kv % tp == 0``
  when ``tp < kv``, ``tp % kv == 0`` when ``tp >= kv``. MLA keeps one latent per rank and
  has no KV-head condition.
* ``max_model_len`` (``_get_and_verify_max_len`` in ``vllm/config/model.py``): the derived
  limit is the smallest position field of the config (``model_max_length`` wins when set),
  times the RoPE scaling factor for every rope type except ``su``, ``longrope`` and
  ``llama3`` (yarn scales ``original_max_position_embeddings``); Gemma 3 is already scaled.
  A longer ``--max-model-len`` is refused unless ``VLLM_ALLOW_LONG_MAX_MODEL_LEN=1``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from ctxguard._validate import show
from ctxguard.errors import ConfigError

if TYPE_CHECKING:
    from ctxguard.kv.architecture import KVArchitecture

_POSITION_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "model_max_length",
    "max_target_positions",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)
_UNSCALED_ROPE_TYPES = frozenset({"su", "longrope", "llama3"})
_TP_CANDIDATES = (1, 2, 4, 8, 16, 32, 64)


def check_finite(value: Any, key: str) -> None:
    """A config number that is NaN or infinite (JSON's ``NaN``/``Infinity``) is a ConfigError."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(
            f"config field {key!r} is {show(value)}, not a finite number; fix it in config.json"
        )


def derive_max_model_len(cfg: Mapping[str, Any]) -> tuple[int, str] | None:
    """vLLM's derived max_model_len for a (language-model) config, with how it was derived."""
    found = [
        (value, key)
        for key in _POSITION_KEYS
        if isinstance(value := cfg.get(key), int | float) and not isinstance(value, bool)
    ]
    if not found:
        return None
    for value, key in found:
        check_finite(value, key)
    derived, key = min(found)
    if isinstance(cfg.get("model_max_length"), int | float) and cfg["model_max_length"]:
        derived, key = cfg["model_max_length"], "model_max_length"
    how = f"{key} {int(derived)}"
    if "gemma3" in str(cfg.get("model_type", "")):
        return int(derived), how  # Gemma 3's positions are already scaled
    factor = 1.0
    for params in _rope_parameters(cfg):
        rope_type = str(params.get("rope_type") or params.get("type") or "default")
        if rope_type in _UNSCALED_ROPE_TYPES:
            continue
        factor = _number(params.get("factor"), factor)
        original = params.get("original_max_position_embeddings")
        if rope_type == "yarn" and isinstance(original, int) and original > 0:
            derived, how = original, f"original_max_position_embeddings {original}"
    if factor != 1.0:
        how = f"{how} x rope factor {factor:g}"
    scaled = derived * factor
    if not math.isfinite(scaled):  # 1e308 x 8192: int(inf) was an OverflowError
        raise ConfigError(f"{how} is not a finite number of positions; fix it in config.json")
    return int(scaled), how


def _rope_parameters(cfg: Mapping[str, Any]) -> Iterable[Mapping[str, Any]]:
    """rope_scaling (transformers 4) or rope_parameters (5; maybe one per layer type)."""
    raw = cfg.get("rope_parameters") or cfg.get("rope_scaling")
    if not isinstance(raw, Mapping):
        return ()
    nested = [v for v in raw.values() if isinstance(v, Mapping)]
    if nested and len(nested) == len(raw):
        return nested
    return (raw,)


def _number(value: Any, default: float) -> float:
    check_finite(value, "rope factor")
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        return float(value)
    return default


def served_max_model_len(
    arch: KVArchitecture, max_model_len: int | None, *, allow_long: bool = False
) -> int:
    """The max_model_len vLLM would serve: the derived limit by default; longer is refused."""
    limit = arch.max_model_len_limit
    if max_model_len is None:
        if limit is None:
            raise ConfigError(
                f"model {arch.name!r} gives no max_position_embeddings; pass max_model_len"
            )
        return limit
    if isinstance(max_model_len, bool) or not isinstance(max_model_len, int) or max_model_len < 1:
        raise ConfigError(f"max_model_len must be a positive integer, got {max_model_len!r}")
    if limit is not None and max_model_len > limit and not allow_long:
        raise ConfigError(
            f"max_model_len {max_model_len} is longer than the {limit} positions "
            f"{arch.name} supports ({arch.derived_max_model_len_from or 'its config.json'}); "
            "vLLM refuses this unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1, and positions past "
            f"the trained length give wrong output: use max_model_len {limit} or less, or "
            "set allow_long_max_model_len to follow a server started with that variable"
        )
    return max_model_len


def tensor_parallel_problem(arch: KVArchitecture, tensor_parallel: int) -> str | None:
    """Why vLLM would refuse this TP size for the model, or None if it accepts it."""
    heads, kv = arch.num_attention_heads, arch.num_kv_heads
    if heads % tensor_parallel:
        return f"its {heads} attention heads do not divide by {tensor_parallel}"
    if arch.is_mla:
        return None
    if tensor_parallel < kv and kv % tensor_parallel:
        return f"its {kv} KV heads do not divide by {tensor_parallel}"
    if tensor_parallel >= kv and tensor_parallel % kv:
        return f"{tensor_parallel} GPUs cannot each hold a whole replica of its {kv} KV heads"
    return None


def valid_tensor_parallel_sizes(arch: KVArchitecture) -> list[int]:
    """The usual TP sizes (powers of two up to 64, and any divisor of the heads) vLLM accepts."""
    heads = arch.num_attention_heads
    divisors = {n for n in range(1, min(heads, 64) + 1) if heads % n == 0}
    candidates = sorted(divisors | set(_TP_CANDIDATES))
    return [tp for tp in candidates if tensor_parallel_problem(arch, tp) is None]


def check_tensor_parallel(arch: KVArchitecture, tensor_parallel: int) -> None:
    """Raise ConfigError for a TP size vLLM refuses, naming the sizes it accepts."""
    problem = tensor_parallel_problem(arch, tensor_parallel)
    if problem is None:
        return
    accepted = ", ".join(str(tp) for tp in valid_tensor_parallel_sizes(arch))
    raise ConfigError(
        f"tensor_parallel {tensor_parallel} does not fit {arch.name}: {problem}, so vLLM "
        f"refuses it; use one of {accepted}"
    )
