"""vLLM's KV-cache arithmetic: bytes per token, pages, blocks, capacity and the startup check.

Everything here is per GPU (per rank), as vLLM computes and logs it: under tensor
parallelism every rank holds its share of the KV heads for *every* token, so the
engine's token capacity is one rank's capacity, never multiplied by TP. Sources:
``vllm/v1/kv_cache_interface.py`` (page sizes, per-request worst case),
``vllm/v1/core/kv_cache_utils.py`` (grouping, ``get_num_blocks``,
``_check_enough_kv_cache_memory``, ``estimate_max_model_len``, ``unify_hybrid_kv_cache_specs``).
Setups vLLM refuses outright (TP vs heads, max_model_len vs positions) are in ``refusals``.

Kept whole at ~400 lines on purpose: it follows vLLM's arithmetic step by step, one
function per vLLM function, easier to check against vLLM in one file.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from ctxguard._validate import MAX_INT, show
from ctxguard.errors import ConfigError
from ctxguard.kv.architecture import DTYPE_BYTES, KVArchitecture, LayerKind
from ctxguard.kv.refusals import check_tensor_parallel

GIB = 1 << 30
DEFAULT_BLOCK_SIZE = 16
MLA_BLOCK_SIZE = 64  # FlashMLA, vLLM's default MLA kernel on Hopper, forces 64
FP8_DS_MLA_TOKEN_BYTES = 656  # 512 fp8 latent values + scales + 64 bf16 rope values
KV_CACHE_DTYPES: Mapping[str, int | None] = MappingProxyType(
    {
        "auto": None,
        "float16": 2,
        "fp16": 2,
        "half": 2,
        "bfloat16": 2,
        "bf16": 2,
        "fp8": 1,
        "fp8_e4m3": 1,
        "fp8_e5m2": 1,
        "fp8_inc": 1,
        "fp8_ds_mla": None,
        "nvfp4": None,
    }
)
_CACHED_KINDS: tuple[LayerKind, ...] = ("full", "sliding", "chunked", "mamba")


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class ServingSetup:
    """The engine options that change KV sizing (vLLM flag names in the comments)."""

    tensor_parallel: int = 1  # --tensor-parallel-size
    pipeline_parallel: int = 1  # --pipeline-parallel-size
    kv_cache_dtype: str = "auto"  # --kv-cache-dtype
    block_size: int | None = None  # --block-size; None: 16, or 64 for MLA
    max_num_batched_tokens: int = 8192  # --max-num-batched-tokens (bounds SWA reservations)
    mamba_blocks_per_request: int = 1  # 1 in mamba_cache_mode "none", 2 in "align"
    # --disable-hybrid-kv-cache-manager (forced by some KV connectors): a model mixing full
    # attention with sliding-window or chunked layers is then sized as all full attention
    disable_hybrid_kv_cache_manager: bool = False

    def __post_init__(self) -> None:
        for label, value in (
            ("tensor_parallel", self.tensor_parallel),
            ("pipeline_parallel", self.pipeline_parallel),
            ("max_num_batched_tokens", self.max_num_batched_tokens),
            ("mamba_blocks_per_request", self.mamba_blocks_per_request),
            ("block_size", 1 if self.block_size is None else self.block_size),
        ):
            # (past 2**63-1, what the CLI takes: block_size=10**400 was an OverflowError
            # out of the float division of the KV sizes)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_INT:
                raise ConfigError(
                    f"{label} must be an integer from 1 to 2**63-1, got {show(value)}"
                )
        if not isinstance(self.disable_hybrid_kv_cache_manager, bool):
            raise ConfigError(
                "disable_hybrid_kv_cache_manager must be True or False, got "
                f"{self.disable_hybrid_kv_cache_manager!r}"
            )
        if type(self.kv_cache_dtype) is not str or self.kv_cache_dtype not in KV_CACHE_DTYPES:
            known = ", ".join(KV_CACHE_DTYPES)
            raise ConfigError(
                f"unknown kv_cache_dtype {show(self.kv_cache_dtype)}; use one of {known}"
            )


def kv_heads_per_rank(arch: KVArchitecture, tensor_parallel: int) -> int:
    """MLA keeps one latent on every rank; otherwise heads split, at least one per rank."""
    if arch.is_mla:
        return 1
    return max(1, arch.num_kv_heads // tensor_parallel)


def element_bytes(arch: KVArchitecture, kv_cache_dtype: str) -> int:
    """auto follows the model dtype; fp32 checkpoints are served in 16-bit by vLLM."""
    size = KV_CACHE_DTYPES.get(kv_cache_dtype)
    if size is not None:
        return size
    return min(DTYPE_BYTES[arch.dtype], 2)


def layer_token_bytes(arch: KVArchitecture, setup: ServingSetup) -> int:
    """Bytes one token costs in one attention layer on one GPU."""
    dtype = setup.kv_cache_dtype
    if arch.is_mla:
        if dtype == "fp8_ds_mla":
            return FP8_DS_MLA_TOKEN_BYTES
        if dtype == "nvfp4":
            raise ConfigError("kv_cache_dtype nvfp4 is not used with MLA models; try fp8")
        return arch.kv_head_size * element_bytes(arch, dtype)  # one latent, no K/V pair
    if dtype == "fp8_ds_mla":
        raise ConfigError(f"kv_cache_dtype fp8_ds_mla needs an MLA model; {arch.name} is not")
    heads, size = kv_heads_per_rank(arch, setup.tensor_parallel), arch.kv_head_size
    if dtype == "nvfp4":
        return 2 * heads * (size // 2 + size // 16)  # packed 4-bit values + fp8 scales
    return 2 * heads * size * element_bytes(arch, dtype)


def _stage_layers(kinds: tuple[LayerKind, ...], stages: int) -> list[tuple[LayerKind, ...]]:
    """vLLM's get_pp_indices: equal shares, the remainder going to the stages before the last."""
    if stages > len(kinds):
        raise ConfigError(f"pipeline_parallel {stages} exceeds the model's {len(kinds)} layers")
    sizes = [len(kinds) // stages] * stages
    for i in range(2, len(kinds) % stages + 2):
        sizes[-i] += 1
    out, start = [], 0
    for size in sizes:
        out.append(kinds[start : start + size])
        start += size
    return out


@dataclass(frozen=True)
class KVLayout:
    """One GPU's KV cache (one pipeline stage), paged the way vLLM pages it."""

    block_size: int
    layer_counts: Mapping[LayerKind, int]
    layer_token_bytes: int
    page_bytes: int
    group_size: int
    sliding_window: int | None
    attention_chunk_size: int | None
    max_num_batched_tokens: int
    mamba_blocks_per_request: int

    @property
    def is_uniform(self) -> bool:
        """Only full-attention layers: one group, capacity is simply blocks x block size."""
        return set(self.layer_counts) == {"full"}

    @property
    def attention_layers(self) -> int:
        return sum(n for k, n in self.layer_counts.items() if k != "mamba")

    @property
    def token_bytes(self) -> int:
        """KV bytes per token over all attention layers of this GPU (windowed ones included)."""
        return self.attention_layers * self.layer_token_bytes

    @property
    def block_bytes(self) -> int:
        """One block id addresses one page in each of group_size tensors."""
        return self.page_bytes * self.group_size

    def num_blocks(self, available_bytes: int) -> int:
        return max(0, available_bytes // self.block_bytes)

    def layer_blocks(self, kind: LayerKind, max_model_len: int) -> int:
        """Worst-case blocks one request holds in one layer (spec.max_memory_usage_bytes)."""
        b, batched = self.block_size, self.max_num_batched_tokens
        if kind == "sliding":
            assert self.sliding_window is not None
            return cdiv(min(self.sliding_window - 1 + batched, max_model_len), b) + 1
        if kind == "chunked":
            assert self.attention_chunk_size is not None
            return cdiv(min(self.attention_chunk_size + batched, max_model_len), b)
        if kind == "mamba":
            return self.mamba_blocks_per_request
        return cdiv(max_model_len, b)

    def needed_bytes(self, max_model_len: int) -> int:
        """What the startup check sums: every real layer's worst case, padding excluded."""
        return sum(
            n * self.layer_blocks(kind, max_model_len) * self.page_bytes
            for kind, n in self.layer_counts.items()
        )

    def blocks_per_request(self, max_model_len: int) -> int:
        """Block ids one request needs: each group draws on the shared pool."""
        return sum(
            cdiv(n, self.group_size) * self.layer_blocks(kind, max_model_len)
            for kind, n in self.layer_counts.items()
        )


def _group_size(counts: Mapping[LayerKind, int]) -> int:
    """vLLM groups hybrid layers by the smallest type count (largest if within 25%)."""
    smallest, largest = min(counts.values()), max(counts.values())
    return largest if largest < smallest * 1.25 else smallest


def _block_size(arch: KVArchitecture, setup: ServingSetup, token_bytes: int) -> int:
    """Hybrid Mamba models enlarge the attention block until its page holds a state."""
    size = setup.block_size or (MLA_BLOCK_SIZE if arch.is_mla else DEFAULT_BLOCK_SIZE)
    if arch.count("mamba") and token_bytes:
        state = _mamba_page(arch, setup)
        size = max(size, DEFAULT_BLOCK_SIZE * cdiv(state, DEFAULT_BLOCK_SIZE * token_bytes))
    return size


def _mamba_page(arch: KVArchitecture, setup: ServingSetup) -> int:
    """Recurrent state heads split across TP ranks like attention heads (approximately)."""
    return cdiv(arch.mamba_state_bytes, setup.tensor_parallel)


def _unify(counts: dict[LayerKind, int], setup: ServingSetup) -> dict[LayerKind, int]:
    """vLLM's unify_hybrid_kv_cache_specs, run per worker when the hybrid manager is off.

    Full attention mixed with sliding-window or chunked layers becomes all full attention
    (every layer keeps KV for every token). A single layer type is left as it is; recurrent
    layers mixed with attention cannot be unified and vLLM refuses to start.
    """
    if not setup.disable_hybrid_kv_cache_manager or len(counts) < 2:
        return counts
    if "mamba" in counts:
        raise ConfigError(
            "vLLM refuses to start this model with disable_hybrid_kv_cache_manager: its "
            "recurrent (Mamba/linear-attention) and attention layers cannot share one KV "
            "cache type; leave the hybrid KV cache manager on"
        )
    if "full" not in counts:
        return counts
    return {"full": sum(counts.values())}


def _layout(
    arch: KVArchitecture, setup: ServingSetup, kinds: tuple[LayerKind, ...], block: int
) -> KVLayout:
    counts = _unify({k: kinds.count(k) for k in _CACHED_KINDS if kinds.count(k)}, setup)
    token = layer_token_bytes(arch, setup)
    has_attention = any(kind != "mamba" for kind in counts)
    page = block * token if has_attention else 0
    if "mamba" in counts:
        page = max(page, _mamba_page(arch, setup))
    return KVLayout(
        block_size=block,
        layer_counts=MappingProxyType(counts),
        layer_token_bytes=token,
        page_bytes=page,
        group_size=_group_size(counts) if counts else 1,
        sliding_window=arch.sliding_window,
        attention_chunk_size=arch.attention_chunk_size,
        max_num_batched_tokens=setup.max_num_batched_tokens,
        mamba_blocks_per_request=setup.mamba_blocks_per_request,
    )


@dataclass(frozen=True)
class StartupCheck:
    """vLLM's _check_enough_kv_cache_memory for one max_model_len."""

    max_model_len: int
    needed_bytes: int
    available_bytes: int
    estimated_max_model_len: int | None = None

    @property
    def fits(self) -> bool:
        return self.available_bytes > 0 and self.needed_bytes <= self.available_bytes

    @property
    def error(self) -> str | None:
        """The ValueError text vLLM raises at startup, or None when it starts."""
        if self.fits:
            return None
        if self.available_bytes <= 0:
            return (
                "No available memory for the cache blocks. Try increasing "
                "`gpu_memory_utilization` when initializing the engine."
            )
        return (
            f"To serve at least one request with the model's max seq len "
            f"({self.max_model_len}), ({self.needed_bytes / GIB:.2f} GiB KV cache is needed, "
            f"which is larger than the available KV cache memory "
            f"({self.available_bytes / GIB:.2f} GiB). Based on the available memory, the "
            f"estimated maximum model length is {self.estimated_max_model_len}. Try increasing "
            "`gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine."
        )


@dataclass(frozen=True)
class KVPlan:
    """A model on a serving setup: one layout per pipeline stage; answers are per GPU."""

    architecture: KVArchitecture
    setup: ServingSetup
    stages: tuple[KVLayout, ...]

    @property
    def block_size(self) -> int:
        return self.stages[0].block_size

    @property
    def is_uniform(self) -> bool:
        """Every GPU holds full-attention layers only (always so with the hybrid manager off
        on a full + windowed model)."""
        return all(stage.is_uniform for stage in self.stages)

    @property
    def bytes_per_token(self) -> int:
        """KV bytes per token on the busiest GPU, all attention layers counted."""
        return max(stage.token_bytes for stage in self.stages)

    @property
    def full_attention_bytes_per_token(self) -> int:
        """Bytes per token of the layers whose cost grows with context (not windowed)."""
        return max(s.layer_counts.get("full", 0) * s.layer_token_bytes for s in self.stages)

    def num_blocks(self, available_bytes: int) -> int:
        """The engine takes the minimum over workers."""
        return min(stage.num_blocks(available_bytes) for stage in self.stages)

    def capacity_tokens(self, available_bytes: int, max_model_len: int | None = None) -> int:
        """blocks x block size; for hybrids vLLM reports int(concurrency x max_model_len)."""
        if self.is_uniform:
            return self.num_blocks(available_bytes) * self.block_size
        if max_model_len is None:
            raise ConfigError("a hybrid model's token capacity depends on max_model_len; pass it")
        return int(self.max_concurrency(available_bytes, max_model_len) * max_model_len)

    def max_concurrency(self, available_bytes: int, max_model_len: int) -> float:
        """How many max_model_len requests fit at once (vLLM's 'Maximum concurrency')."""
        _positive_len(max_model_len)
        return min(
            stage.num_blocks(available_bytes) / stage.blocks_per_request(max_model_len)
            for stage in self.stages
        )

    def needed_bytes(self, max_model_len: int) -> int:
        """Per-GPU KV memory one request of max_model_len needs (worst stage)."""
        _positive_len(max_model_len)
        return max(stage.needed_bytes(max_model_len) for stage in self.stages)

    def check(self, available_bytes: int, max_model_len: int) -> StartupCheck:
        """Reproduce vLLM's startup check, with its estimated maximum length on failure."""
        needed = self.needed_bytes(max_model_len)
        check = StartupCheck(max_model_len, needed, available_bytes)
        if check.fits or available_bytes <= 0:
            return check
        estimate = self.estimate_max_model_len(available_bytes, max_model_len)
        return StartupCheck(max_model_len, needed, available_bytes, estimate)

    def estimate_max_model_len(self, available_bytes: int, upper: int) -> int:
        """vLLM's binary search: the largest length whose worst case fits (0 if none)."""
        return _largest(1, upper, lambda n: self.needed_bytes(n) <= available_bytes)

    def max_model_len_for_concurrency(
        self, available_bytes: int, concurrency: float, upper: int
    ) -> int:
        """The largest max_model_len at which `concurrency` full-length requests fit at once."""
        if concurrency <= 0:
            raise ConfigError(f"concurrency must be positive, got {concurrency}")
        return _largest(
            1,
            upper,
            lambda n: (
                self.max_concurrency(available_bytes, n) >= concurrency
                and self.needed_bytes(n) <= available_bytes
            ),
        )


def _positive_len(max_model_len: int) -> None:
    if max_model_len < 1:
        raise ConfigError(f"max_model_len must be at least 1, got {max_model_len}")


def _largest(low: int, high: int, fits: Callable[[int], bool]) -> int:
    """Largest n in [low, high] with fits(n), for a monotone predicate; 0 if none."""
    if high < low or not fits(low):
        return 0
    best = low
    while low <= high:
        mid = (low + high) // 2
        if fits(mid):
            best, low = mid, mid + 1
        else:
            high = mid - 1
    return best


def plan_kv(arch: KVArchitecture, setup: ServingSetup | None = None) -> KVPlan:
    """Lay the model's KV cache out over the GPUs of a serving setup vLLM would accept."""
    setup = setup or ServingSetup()
    check_tensor_parallel(arch, setup.tensor_parallel)
    token = layer_token_bytes(arch, setup)
    block = _block_size(arch, setup, token)
    stages = tuple(
        _layout(arch, setup, kinds, block)
        for kinds in _stage_layers(arch.layer_kinds, setup.pipeline_parallel)
    )
    return KVPlan(arch, setup, stages)


def kv_bytes_per_token(arch: KVArchitecture, setup: ServingSetup | None = None) -> int:
    """KV bytes per token per GPU (busiest pipeline stage, all attention layers)."""
    return plan_kv(arch, setup).bytes_per_token
