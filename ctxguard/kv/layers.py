"""A model's decoder-layer schedule: which layers cache what, read from its config.

Configs describe interleaved layers in half a dozen shapes: a list (``layer_types``,
``layers_block_type``), a pattern string (``hybrid_override_pattern``) or, in older
configs, a period (``full_attention_interval``, ``attn_layer_period`` with
``attn_layer_offset``, ``sliding_window_pattern``, ``nope_layer_interval``), expanded
the way the models' own config classes do. A period of zero or less is refused (the
models divide by it; Python's ``%`` with a negative one silently matched every n-th
layer), and so is an offset outside the period (no layer matched it: no attention at all).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from ctxguard._validate import one_line, show
from ctxguard.errors import ConfigError
from ctxguard.kv.fields import first_size, optional_int

LayerKind = Literal["full", "sliding", "chunked", "mamba", "none"]
"""full: KV for every token; sliding/chunked: KV bounded by a window; mamba: a fixed
state per request (Mamba, GDN, linear attention); none: no cache (MLP-only layers)."""

ATTENTION_KINDS: frozenset[str] = frozenset({"full", "sliding", "chunked"})

_LAYER_TYPE_NAMES: dict[str, LayerKind] = {
    "full_attention": "full",
    "attention": "full",
    "global": "full",
    "full": "full",
    "sliding_attention": "sliding",
    "sliding_window": "sliding",
    "sliding": "sliding",
    "local": "sliding",
    "chunked_attention": "chunked",
    "linear_attention": "mamba",
    "mamba": "mamba",
    "mamba2": "mamba",
    "mlp": "none",
    "moe": "none",
}
_PATTERN_CHARS: dict[str, LayerKind] = {"M": "mamba", "*": "full", "-": "none", "E": "none"}


def layer_kinds(cfg: Mapping[str, Any], layers: int, name: str) -> tuple[LayerKind, ...]:
    """Read the per-layer schedule from whichever field this architecture uses."""
    listed = cfg.get("layer_types") or cfg.get("layers_block_type")
    if isinstance(listed, list) and listed:
        return _from_type_names(listed, layers, name)
    pattern = cfg.get("hybrid_override_pattern")
    if isinstance(pattern, str) and pattern:
        return _from_pattern(pattern, layers, name)
    return _from_periods(cfg, layers, name)


def _from_type_names(names: list[Any], layers: int, name: str) -> tuple[LayerKind, ...]:
    kinds: list[LayerKind] = []
    for item in names:
        kind = _LAYER_TYPE_NAMES.get(str(item))
        if kind is None:
            known = ", ".join(sorted(_LAYER_TYPE_NAMES))
            raise ConfigError(
                one_line(f"model {name!r}: unknown layer type {show(item, 40)} (known: {known})")
            )
        kinds.append(kind)
    if len(kinds) != layers:
        raise ConfigError(f"model {name!r}: layer_types lists {len(kinds)} layers, not {layers}")
    return tuple(kinds)


def _from_pattern(pattern: str, layers: int, name: str) -> tuple[LayerKind, ...]:
    """Nemotron-H style: one character per layer, M = Mamba, * = attention, - = MLP."""
    if len(pattern) != layers or any(c not in _PATTERN_CHARS for c in pattern):
        raise ConfigError(
            f"model {name!r}: hybrid_override_pattern must have {layers} characters from "
            f"{''.join(_PATTERN_CHARS)}, got {show(pattern, 80)}"
        )
    return tuple(_PATTERN_CHARS[c] for c in pattern)


def _period(cfg: Mapping[str, Any], key: str, name: str) -> int | None:
    return first_size(cfg, (key,), name)


def _from_periods(cfg: Mapping[str, Any], layers: int, name: str) -> tuple[LayerKind, ...]:
    """Older configs give a period instead of a list; expand it the way the models do."""
    indices = range(layers)
    if interval := _period(cfg, "full_attention_interval", name):  # Qwen3-Next
        return tuple("full" if (i + 1) % interval == 0 else "mamba" for i in indices)
    if period := _period(cfg, "attn_layer_period", name):  # Jamba
        offset = optional_int(cfg, "attn_layer_offset") or 0
        if not 0 <= offset < period:
            raise ConfigError(
                f"model {name!r}: attn_layer_offset is {offset}; it must be from 0 to "
                f"attn_layer_period - 1 ({period - 1}): fix it in config.json"
            )
        return tuple("full" if i % period == offset else "mamba" for i in indices)
    if str(cfg.get("model_type", "")).startswith("gemma2"):
        return tuple("sliding" if i % 2 == 0 else "full" for i in indices)
    if pattern := _period(cfg, "sliding_window_pattern", name):  # Gemma 3
        return tuple("sliding" if (i + 1) % pattern else "full" for i in indices)
    if cfg.get("attention_chunk_size"):  # Llama 4: RoPE layers are chunked, NoPE are global
        return _llama4_kinds(cfg, layers, name)
    windowed = cfg.get("sliding_window") and cfg.get("use_sliding_window") is not False
    kind: LayerKind = "sliding" if windowed else "full"  # Mistral-7B-v0.1: every layer windowed
    return (kind,) * layers


def _llama4_kinds(cfg: Mapping[str, Any], layers: int, name: str) -> tuple[LayerKind, ...]:
    flags = cfg.get("no_rope_layers")
    if not isinstance(flags, list) or len(flags) != layers:
        interval = _period(cfg, "nope_layer_interval", name) or 4
        flags = [int((i + 1) % interval != 0) for i in range(layers)]
    chunked: LayerKind = "chunked"
    full: LayerKind = "full"
    return tuple(chunked if flag else full for flag in flags)
