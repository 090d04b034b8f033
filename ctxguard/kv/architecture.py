"""What a model's KV cache is made of, normalised from any transformers config.

Configs name the same number in many ways (``num_key_value_heads``, ``n_head_kv``,
``multi_query_group_num``…), nest the language model under ``text_config`` in
multimodal checkpoints, and describe interleaved layers in half a dozen shapes
(``layer_types``, ``sliding_window_pattern``, ``hybrid_override_pattern``…).
:func:`architecture_from_config` reads them all into one :class:`KVArchitecture`
so the calculator never looks at a raw config. The rules follow vLLM's
``ModelConfig.get_total_num_kv_heads`` / ``get_head_size``.

The layer schedule (which layer caches what) is read in ``layers.py``, and every
number through ``fields.py`` (whole, finite, positive where a size or period).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ctxguard._secrets import describe
from ctxguard._validate import one_line, show
from ctxguard.errors import ConfigError, MissingDependencyError
from ctxguard.kv.fields import first, first_int, first_size, optional_int, positive
from ctxguard.kv.layers import ATTENTION_KINDS as ATTENTION_KINDS
from ctxguard.kv.layers import LayerKind as LayerKind
from ctxguard.kv.layers import layer_kinds
from ctxguard.kv.refusals import derive_max_model_len

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
    layers = positive(cfg, _LAYERS, label, "number of layers")
    if layers > MAX_LAYERS:  # one entry per layer is listed: 10**12 was a MemoryError
        raise ConfigError(
            f"model {label!r}: {layers} layers is past {MAX_LAYERS:,}; check its config.json"
        )
    heads = positive(cfg, _HEADS, label, "number of attention heads")
    kinds = layer_kinds(cfg, layers, label)
    derived, derived_from = derive_max_model_len(cfg) or (None, "")
    return KVArchitecture(
        name=label,
        layer_kinds=kinds,
        num_attention_heads=heads,
        num_kv_heads=_kv_heads(cfg, heads, label),
        head_dim=_head_dim(cfg, heads, label),
        dtype=_dtype(cfg),
        sliding_window=optional_int(cfg, "sliding_window") if "sliding" in kinds else None,
        attention_chunk_size=optional_int(cfg, "attention_chunk_size"),
        kv_lora_rank=optional_int(cfg, "kv_lora_rank"),
        qk_rope_head_dim=optional_int(cfg, "qk_rope_head_dim"),
        mamba_state_bytes=_mamba_state_bytes(cfg, label) if "mamba" in kinds else 0,
        max_position_embeddings=first_int(cfg, _MAX_POSITIONS),
        derived_max_model_len=derived,
        derived_max_model_len_from=derived_from,
        num_parameters=optional_int(cfg, "num_parameters"),
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


def _kv_heads(cfg: Mapping[str, Any], heads: int, name: str) -> int:
    """vLLM's get_total_num_kv_heads: first alias present, Falcon's multi_query, else MHA."""
    if cfg.get("multi_query") is True and first(cfg, _KV_HEADS) is None:
        return 1
    return first_size(cfg, _KV_HEADS, name, "number of KV heads") or heads


def _head_dim(cfg: Mapping[str, Any], heads: int, name: str) -> int:
    """Explicit head_dim wins (Qwen3, Gemma): hidden / heads is only the fallback."""
    explicit = first_size(cfg, ("head_dim", "hidden_size_per_head"), name, "head dim")
    if explicit is not None:
        return explicit
    if cfg.get("kv_lora_rank") is not None:  # MLA: caches the latent, not heads
        nope = optional_int(cfg, "qk_nope_head_dim")
        if nope is not None and nope < 0:
            raise ConfigError(
                f"model {name!r}: qk_nope_head_dim is {nope}; it must be >= 0: fix it in "
                "config.json"
            )
        return nope or 1
    hidden = positive(cfg, _HIDDEN, name, "hidden size (or head_dim)")
    return hidden // heads


def _dtype(cfg: Mapping[str, Any]) -> str:
    raw = cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"
    text = str(raw).removeprefix("torch.")
    return text if text in DTYPE_BYTES else "bfloat16"


def _mamba_state_bytes(cfg: Mapping[str, Any], name: str) -> int:
    """One recurrent layer's conv + SSM state for one request (vLLM's MambaSpec page).
    Every size read must be positive: a negative one gave a wrong state, or a right one
    from two negatives."""
    explicit = first_size(cfg, ("mamba_state_bytes",), name)
    if explicit:
        return explicit
    elements = _gdn_state(cfg, name) or _mamba2_state(cfg, name) or _mamba1_state(cfg, name)
    if not elements:
        raise ConfigError(
            f"model {name!r} has linear-attention/Mamba layers but the config lacks their "
            "state sizes (linear_*_head_dim, mamba_*, ssm_state_size); add mamba_state_bytes"
        )
    return elements * DTYPE_BYTES[_dtype(cfg)]


def _gdn_state(cfg: Mapping[str, Any], name: str) -> int:
    """Gated DeltaNet (Qwen3-Next/3.5): conv over q, k, v plus a dk x dv matrix per head."""
    keys = ("num_key_heads", "num_value_heads", "key_head_dim", "value_head_dim", "conv_kernel_dim")
    sizes = [first_size(cfg, (f"linear_{key}",), name) for key in keys]
    nk, nv, dk, dv, kernel = sizes
    if nk is None or nv is None or dk is None or dv is None or kernel is None:
        return 0
    conv = (kernel - 1) * (2 * nk * dk + nv * dv)
    return conv + nv * dk * dv


def _mamba2_state(cfg: Mapping[str, Any], name: str) -> int:
    heads = first_size(cfg, ("mamba_n_heads", "mamba_num_heads"), name)
    head_dim = first_size(cfg, ("mamba_head_dim", "mamba_d_head"), name)
    state = first_size(cfg, ("ssm_state_size", "mamba_d_state"), name)
    kernel = first_size(cfg, ("mamba_d_conv", "conv_kernel"), name) or 4
    groups = first_size(cfg, ("mamba_n_groups", "n_groups"), name) or 1
    if not (heads and head_dim and state):
        return 0
    inner = heads * head_dim
    return (kernel - 1) * (inner + 2 * groups * state) + inner * state


def _mamba1_state(cfg: Mapping[str, Any], name: str) -> int:
    state = first_size(cfg, ("mamba_d_state", "state_size"), name)
    expand = first_size(cfg, ("mamba_expand", "expand"), name)
    hidden = first_size(cfg, _HIDDEN, name, "hidden size")
    kernel = first_size(cfg, ("mamba_d_conv", "conv_kernel"), name) or 4
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
    try:
        return architecture_from_config(data, name=_model_name(data, file.parent), source=str(file))
    except ConfigError as exc:  # the field and the model, then the file
        raise ConfigError(one_line(f"{exc} (config file {show(str(file), 120)})")) from None


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
    return fallback.name or fallback.resolve().name or str(fallback)  # ./config.json: not '.'
