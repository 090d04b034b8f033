"""What a model's KV cache is made of, normalised from any transformers config.

Configs name the same number in many ways (``num_key_value_heads``, ``n_head_kv``,
``multi_query_group_num``…), nest the language model under ``text_config`` in
multimodal checkpoints, and describe interleaved layers in half a dozen shapes
(``layer_types``, ``sliding_window_pattern``, ``hybrid_override_pattern``…).
:func:`architecture_from_config` reads them all into one :class:`KVArchitecture`
so the calculator never looks at a raw config. The rules follow vLLM's
``ModelConfig.get_total_num_kv_heads`` / ``get_head_size``.

Kept whole past ~400 lines on purpose: it is one normalisation whose rules read each
other's results, in vLLM's order.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from ctxguard._secrets import describe
from ctxguard._validate import one_line, show
from ctxguard.errors import ConfigError, MissingDependencyError
from ctxguard.kv.refusals import check_finite, derive_max_model_len

LayerKind = Literal["full", "sliding", "chunked", "mamba", "none"]
"""full: KV for every token; sliding/chunked: KV bounded by a window; mamba: a fixed
state per request (Mamba, GDN, linear attention); none: no cache (MLP-only layers)."""

ATTENTION_KINDS: frozenset[str] = frozenset({"full", "sliding", "chunked"})
MAX_LAYERS = 100_000  # the deepest released decoders have a few hundred

_LAYERS = ("num_hidden_layers", "n_layer", "n_layers", "num_layers")
_HEADS = ("num_attention_heads", "n_head", "n_heads", "num_heads")
_KV_HEADS = (
    "n_head_kv",
    "num_kv_heads",
    "num_key_value_heads",
    "multi_query_group_num",
    "num_attention_groups",
)
_HIDDEN = ("hidden_size", "n_embd", "d_model")
_MAX_POSITIONS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "max_sequence_length",
    "seq_length",
)
_NESTED = ("text_config", "llm_config", "language_config")
_INHERITED = ("torch_dtype", "dtype", "quantization_config", "num_parameters")

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

DTYPE_BYTES: dict[str, int] = {
    "float32": 4,
    "float": 4,
    "float16": 2,
    "half": 2,
    "fp16": 2,
    "bfloat16": 2,
    "bf16": 2,
}


@dataclass(frozen=True)
class KVArchitecture:
    """The numbers that size a model's KV cache, whole model (before any parallelism).

    ``layer_kinds`` lists every decoder layer in order, so pipeline stages can be cut
    exactly where vLLM cuts them. ``mamba_state_bytes`` is one recurrent layer's state
    for one request, in the model dtype.
    """

    name: str
    layer_kinds: tuple[LayerKind, ...]
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    dtype: str = "bfloat16"
    sliding_window: int | None = None
    attention_chunk_size: int | None = None
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    mamba_state_bytes: int = 0
    max_position_embeddings: int | None = None
    derived_max_model_len: int | None = None
    derived_max_model_len_from: str = ""
    num_parameters: int | None = None
    weight_bytes_per_param: float = 2.0
    weights_bytes: int | None = None
    source: str = ""
    notes: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        _require(bool(self.layer_kinds), self.name, "has no layers")
        for label, value in (
            ("num_attention_heads", self.num_attention_heads),
            ("num_kv_heads", self.num_kv_heads),
            ("head_dim", self.head_dim),
        ):
            _require(value > 0, self.name, f"has {label} = {value}; it must be positive")
        for label, size in (
            ("sliding_window", self.sliding_window),
            ("attention_chunk_size", self.attention_chunk_size),
            ("kv_lora_rank", self.kv_lora_rank),
        ):
            _require(
                size is None or size > 0, self.name, f"has {label} = {size}; it must be positive"
            )
        rope = self.qk_rope_head_dim
        _require(
            rope is None or rope >= 0, self.name, f"has qk_rope_head_dim = {rope}; it must be >= 0"
        )
        _require(self.dtype in DTYPE_BYTES, self.name, f"has unknown dtype {self.dtype!r}")
        if "sliding" in self.layer_kinds:
            _require(bool(self.sliding_window), self.name, "has sliding layers but no window")
        if "chunked" in self.layer_kinds:
            _require(bool(self.attention_chunk_size), self.name, "has chunked layers but no size")
        if "mamba" in self.layer_kinds:
            _require(self.mamba_state_bytes > 0, self.name, "has recurrent layers but no state")

    @property
    def is_mla(self) -> bool:
        """Multi-head latent attention: one shared latent per token, not K and V heads."""
        return self.kv_lora_rank is not None

    @property
    def kv_head_size(self) -> int:
        """Elements per cached head: the latent for MLA, ``head_dim`` otherwise."""
        if self.kv_lora_rank is not None:
            return self.kv_lora_rank + (self.qk_rope_head_dim or 0)
        return self.head_dim

    @property
    def max_model_len_limit(self) -> int | None:
        """The longest max_model_len vLLM accepts without VLLM_ALLOW_LONG_MAX_MODEL_LEN."""
        return self.derived_max_model_len or self.max_position_embeddings

    @property
    def num_layers(self) -> int:
        return len(self.layer_kinds)

    def count(self, kind: LayerKind) -> int:
        return self.layer_kinds.count(kind)

    @property
    def is_uniform(self) -> bool:
        """Only full-attention layers cache anything: capacity is simply blocks x block size."""
        cached = {k for k in self.layer_kinds if k != "none"}
        return cached == {"full"}

    def with_extra_layers(self, count: int, kind: LayerKind = "full") -> KVArchitecture:
        """Add draft-model layers (EAGLE/MTP drafters cache KV like the target's layers)."""
        if count < 0:
            raise ConfigError(f"extra layer count must be >= 0, got {count}")
        return replace(self, layer_kinds=self.layer_kinds + (kind,) * count)


def _require(ok: bool, name: str, problem: str) -> None:
    if not ok:
        raise ConfigError(f"model {name!r} {problem}; check its config.json")


def architecture_from_config(
    config: Mapping[str, Any], *, name: str | None = None, source: str = ""
) -> KVArchitecture:
    """Normalise a transformers config dict (plain or multimodal) into a KVArchitecture."""
    cfg = _language_model(config)
    label = name or str(cfg.get("_name_or_path") or cfg.get("model_type") or "config")
    layers = _positive(cfg, _LAYERS, label, "number of layers")
    if layers > MAX_LAYERS:  # one entry per layer is listed: 10**12 was a MemoryError
        raise ConfigError(
            f"model {label!r}: {layers} layers is past {MAX_LAYERS:,}; check its config.json"
        )
    heads = _positive(cfg, _HEADS, label, "number of attention heads")
    kinds = _layer_kinds(cfg, layers, label)
    derived, derived_from = derive_max_model_len(cfg) or (None, "")
    return KVArchitecture(
        name=label,
        layer_kinds=kinds,
        num_attention_heads=heads,
        num_kv_heads=_kv_heads(cfg, heads, label),
        head_dim=_head_dim(cfg, heads, label),
        dtype=_dtype(cfg),
        sliding_window=_optional_int(cfg, "sliding_window") if "sliding" in kinds else None,
        attention_chunk_size=_optional_int(cfg, "attention_chunk_size"),
        kv_lora_rank=_optional_int(cfg, "kv_lora_rank"),
        qk_rope_head_dim=_optional_int(cfg, "qk_rope_head_dim"),
        mamba_state_bytes=_mamba_state_bytes(cfg, label) if "mamba" in kinds else 0,
        max_position_embeddings=_first_int(cfg, _MAX_POSITIONS),
        derived_max_model_len=derived,
        derived_max_model_len_from=derived_from,
        num_parameters=_optional_int(cfg, "num_parameters"),
        weight_bytes_per_param=_weight_bytes_per_param(cfg),
        source=source,
    )


def _language_model(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """Multimodal checkpoints keep the decoder under text_config; dtype often stays on top."""
    if not isinstance(config, Mapping):
        raise ConfigError(f"a model config must be a JSON object, got {type(config).__name__}")
    for key in _NESTED:
        nested = config.get(key)
        if isinstance(nested, Mapping) and any(k in nested for k in _LAYERS):
            inherited = {k: config[k] for k in _INHERITED if k in config}
            return {**inherited, **{k: v for k, v in nested.items() if v is not None}}
    return config


def _first(cfg: Mapping[str, Any], keys: tuple[str, ...]) -> Any:
    for key in keys:
        if cfg.get(key) is not None:
            return cfg[key]
    return None


def _first_int(cfg: Mapping[str, Any], keys: tuple[str, ...]) -> int | None:
    for key in keys:  # (an error names the field that is there)
        if cfg.get(key) is not None:
            return _as_int(cfg[key], key)
    return None


def _optional_int(cfg: Mapping[str, Any], key: str) -> int | None:
    value = cfg.get(key)
    return None if value is None else _as_int(value, key)


def _as_int(value: Any, key: str) -> int:
    check_finite(value, key)
    if isinstance(value, bool) or not isinstance(value, int | float) or int(value) != value:
        raise ConfigError(f"config field {key!r} must be a whole number, got {show(value)}")
    return int(value)


def _positive(cfg: Mapping[str, Any], keys: tuple[str, ...], name: str, what: str) -> int:
    value = _first_int(cfg, keys)
    if value is None:
        raise ConfigError(
            f"model {name!r}: config has no {what} (looked for {', '.join(keys)}); "
            "pass the model's full config.json"
        )
    if value <= 0:
        raise ConfigError(f"model {name!r}: {what} is {value}; it must be positive")
    return value


def _kv_heads(cfg: Mapping[str, Any], heads: int, name: str) -> int:
    """vLLM's get_total_num_kv_heads: first alias present, Falcon's multi_query, else MHA."""
    if cfg.get("multi_query") is True and _first(cfg, _KV_HEADS) is None:
        return 1
    value = _first_int(cfg, _KV_HEADS)
    if value is None:
        return heads
    if value <= 0:
        raise ConfigError(f"model {name!r}: {value} KV heads; it must be positive")
    return value


def _head_dim(cfg: Mapping[str, Any], heads: int, name: str) -> int:
    """Explicit head_dim wins (Qwen3, Gemma): hidden / heads is only the fallback."""
    explicit = _first_int(cfg, ("head_dim", "hidden_size_per_head"))
    if explicit is not None and explicit > 0:
        return explicit
    if cfg.get("kv_lora_rank") is not None:
        return _first_int(cfg, ("qk_nope_head_dim",)) or 1
    hidden = _positive(cfg, _HIDDEN, name, "hidden size (or head_dim)")
    return hidden // heads


def _dtype(cfg: Mapping[str, Any]) -> str:
    raw = cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"
    text = str(raw).removeprefix("torch.")
    return text if text in DTYPE_BYTES else "bfloat16"


def _layer_kinds(cfg: Mapping[str, Any], layers: int, name: str) -> tuple[LayerKind, ...]:
    """Read the per-layer schedule from whichever field this architecture uses."""
    listed = cfg.get("layer_types") or cfg.get("layers_block_type")
    if isinstance(listed, list) and listed:
        return _from_type_names(listed, layers, name)
    pattern = cfg.get("hybrid_override_pattern")
    if isinstance(pattern, str) and pattern:
        return _from_pattern(pattern, layers, name)
    return _from_periods(cfg, layers)


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


def _from_periods(cfg: Mapping[str, Any], layers: int) -> tuple[LayerKind, ...]:
    """Older configs give a period instead of a list; expand it the way the models do."""
    indices = range(layers)
    if interval := _optional_int(cfg, "full_attention_interval"):  # Qwen3-Next
        return tuple("full" if (i + 1) % interval == 0 else "mamba" for i in indices)
    if period := _optional_int(cfg, "attn_layer_period"):  # Jamba
        offset = _optional_int(cfg, "attn_layer_offset") or 0
        return tuple("full" if i % period == offset else "mamba" for i in indices)
    if str(cfg.get("model_type", "")).startswith("gemma2"):
        return tuple("sliding" if i % 2 == 0 else "full" for i in indices)
    if pattern := _optional_int(cfg, "sliding_window_pattern"):  # Gemma 3
        return tuple("sliding" if (i + 1) % pattern else "full" for i in indices)
    if cfg.get("attention_chunk_size"):  # Llama 4: RoPE layers are chunked, NoPE are global
        return _llama4_kinds(cfg, layers)
    windowed = cfg.get("sliding_window") and cfg.get("use_sliding_window") is not False
    kind: LayerKind = "sliding" if windowed else "full"  # Mistral-7B-v0.1: every layer windowed
    return (kind,) * layers


def _llama4_kinds(cfg: Mapping[str, Any], layers: int) -> tuple[LayerKind, ...]:
    flags = cfg.get("no_rope_layers")
    if not isinstance(flags, list) or len(flags) != layers:
        interval = _optional_int(cfg, "nope_layer_interval") or 4
        flags = [int((i + 1) % interval != 0) for i in range(layers)]
    chunked: LayerKind = "chunked"
    full: LayerKind = "full"
    return tuple(chunked if flag else full for flag in flags)


def _mamba_state_bytes(cfg: Mapping[str, Any], name: str) -> int:
    """One recurrent layer's conv + SSM state for one request (vLLM's MambaSpec page)."""
    explicit = _optional_int(cfg, "mamba_state_bytes")
    if explicit:
        return explicit
    elements = _gdn_state(cfg) or _mamba2_state(cfg) or _mamba1_state(cfg)
    if not elements:
        raise ConfigError(
            f"model {name!r} has linear-attention/Mamba layers but the config lacks their "
            "state sizes (linear_*_head_dim, mamba_*, ssm_state_size); add mamba_state_bytes"
        )
    return elements * DTYPE_BYTES[_dtype(cfg)]


def _gdn_state(cfg: Mapping[str, Any]) -> int:
    """Gated DeltaNet (Qwen3-Next/3.5): conv over q, k, v plus a dk x dv matrix per head."""
    nk, nv = cfg.get("linear_num_key_heads"), cfg.get("linear_num_value_heads")
    dk, dv = cfg.get("linear_key_head_dim"), cfg.get("linear_value_head_dim")
    kernel = cfg.get("linear_conv_kernel_dim")
    if not all(isinstance(v, int) and v > 0 for v in (nk, nv, dk, dv, kernel)):
        return 0
    assert isinstance(nk, int) and isinstance(nv, int) and isinstance(dk, int)
    assert isinstance(dv, int) and isinstance(kernel, int)
    conv = (kernel - 1) * (2 * nk * dk + nv * dv)
    return conv + nv * dk * dv


def _mamba2_state(cfg: Mapping[str, Any]) -> int:
    heads = _first_int(cfg, ("mamba_n_heads", "mamba_num_heads"))
    head_dim = _first_int(cfg, ("mamba_head_dim", "mamba_d_head"))
    state = _first_int(cfg, ("ssm_state_size", "mamba_d_state"))
    kernel = _first_int(cfg, ("mamba_d_conv", "conv_kernel")) or 4
    groups = _first_int(cfg, ("mamba_n_groups", "n_groups")) or 1
    if not (heads and head_dim and state):
        return 0
    inner = heads * head_dim
    return (kernel - 1) * (inner + 2 * groups * state) + inner * state


def _mamba1_state(cfg: Mapping[str, Any]) -> int:
    state = _first_int(cfg, ("mamba_d_state", "state_size"))
    expand = _first_int(cfg, ("mamba_expand", "expand"))
    hidden = _first_int(cfg, _HIDDEN)
    kernel = _first_int(cfg, ("mamba_d_conv", "conv_kernel")) or 4
    if not (state and expand and hidden):
        return 0
    inner = expand * hidden
    return (kernel - 1) * inner + inner * state


def _weight_bytes_per_param(cfg: Mapping[str, Any]) -> float:
    """Weight quantisation changes the weights' size only, never the KV cache's."""
    quant = cfg.get("quantization_config")
    if isinstance(quant, Mapping):
        method = str(quant.get("quant_method", "")).lower()
        bits = quant.get("bits") or quant.get("w_bit")
        if method == "fp8":
            return 1.0
        if method == "mxfp4":
            return 4.25 / 8  # 4-bit values plus one shared 8-bit scale per 32
        if isinstance(bits, int) and bits > 0:
            return bits / 8
    return float(min(DTYPE_BYTES[_dtype(cfg)], 2))


def load_config_file(path: str | Path) -> KVArchitecture:
    """Read a config.json without transformers."""
    file = Path(path)
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"config file {str(file)!r} does not exist") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"config file {str(file)!r} is not readable JSON: {exc}") from exc
    except RecursionError:  # valid JSON nested too deep to decode
        raise ConfigError(f"config file {str(file)!r} is JSON nested too deeply to read") from None
    return architecture_from_config(data, name=_model_name(data, file.parent), source=str(file))


def load_model_directory(path: str | Path) -> KVArchitecture:
    """Load a local checkpoint through AutoConfig, offline; weights size from its files."""
    try:
        from transformers import AutoConfig
    except ImportError as exc:
        raise MissingDependencyError("loading a model directory", "hf") from exc
    directory = Path(path)
    try:
        data = AutoConfig.from_pretrained(str(directory), local_files_only=True).to_dict()
    except Exception as exc:  # transformers' own validation errors, or its bugs, on bad values
        if (directory / "config.json").is_file():
            load_config_file(directory / "config.json")  # names the bad field when it can
        raise ConfigError(
            one_line(
                f"transformers could not load the model directory {show(str(directory), 120)} "
                f"offline: check its config.json and the values in it ({describe(exc, 120)})"
            )
        ) from exc
    arch = architecture_from_config(
        data, name=_model_name(data, directory), source=f"{directory} (AutoConfig)"
    )
    weights = sum(f.stat().st_size for f in directory.glob("*.safetensors"))
    return replace(arch, weights_bytes=weights) if weights else arch


def _model_name(data: Any, fallback: Path) -> str:
    if isinstance(data, Mapping) and data.get("_name_or_path"):
        return str(data["_name_or_path"])
    return fallback.name or str(fallback)
