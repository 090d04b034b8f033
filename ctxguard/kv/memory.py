"""How much memory one GPU gives the KV cache, and what to change when it is too little.

vLLM either takes ``--kv-cache-memory`` bytes per GPU verbatim (deterministic) or
profiles: ``total * gpu_memory_utilization - (weights + activations + non-torch +
CUDA graphs)``. Without a GPU we cannot profile, so the activation/graph share is a
``reserve`` the caller states; a figure read from vLLM's log is exact to 0.01 GiB.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ctxguard.errors import ConfigError
from ctxguard.kv.architecture import KVArchitecture
from ctxguard.kv.calculator import GIB, KVPlan, ServingSetup, plan_kv
from ctxguard.kv.refusals import tensor_parallel_problem, valid_tensor_parallel_sizes

DEFAULT_RESERVE_GIB = 2.0
_TP_CHOICES = (2, 4, 8, 16)
_MAX_UTILIZATION = 0.98


MAX_GIB = 1 << 20  # a PiB: past any device (and past it, GiB to bytes overflows a float)


def gib_to_bytes(value: float, what: str) -> int:
    """Validate a non-negative GiB figure from the caller and convert it."""
    if not math.isfinite(value) or not 0 <= value <= MAX_GIB:
        raise ConfigError(
            f"{what} must be a non-negative number of GiB, at most {MAX_GIB:,}, got {value}"
        )
    return int(value * GIB)


def check_utilization(value: float) -> float:
    if not (0 < value <= 1):
        raise ConfigError(f"gpu_memory_utilization must be in (0, 1], got {value}")
    return value


def logged_gib_bounds(value: float, decimals: int = 2) -> tuple[int, int]:
    """Byte range a GiB figure rounded to `decimals` places can stand for."""
    half = 0.5 * 10**-decimals
    return int((value - half) * GIB), int((value + half) * GIB)


@dataclass(frozen=True)
class MemoryBudget:
    """Either an exact KV figure per GPU, or GPU memory minus weights and a reserve."""

    kv_cache_memory_bytes: int | None = None
    gpu_memory_bytes: int | None = None
    gpu_memory_utilization: float = 0.9
    weights_bytes: int | None = None  # whole model; split over tp x pp
    reserve_bytes: int = int(DEFAULT_RESERVE_GIB * GIB)

    def __post_init__(self) -> None:
        check_utilization(self.gpu_memory_utilization)
        if self.kv_cache_memory_bytes is None and self.gpu_memory_bytes is None:
            raise ConfigError("give either the available KV memory or the GPU memory size")
        for label, value in (
            ("available KV memory", self.kv_cache_memory_bytes),
            ("GPU memory", self.gpu_memory_bytes),
            ("weights size", self.weights_bytes),
            ("reserve", self.reserve_bytes),
        ):
            if value is not None and value < 0:
                raise ConfigError(f"{label} must not be negative, got {value} bytes")
            if value is not None and value > MAX_GIB * GIB:  # (1e26 printed "1.8e17x" concurrency)
                raise ConfigError(
                    f"{label} must be at most {MAX_GIB:,} GiB ({MAX_GIB * GIB:,} bytes) per GPU, "
                    f"got {value:,} bytes; give it in bytes per GPU"
                )
        if self.gpu_memory_bytes == 0:
            raise ConfigError("GPU memory must be positive")

    @property
    def is_exact(self) -> bool:
        return self.kv_cache_memory_bytes is not None

    def check_weights_fit(self, arch: KVArchitecture, setup: ServingSetup) -> None:
        """Raise ConfigError when the weights (and reserve) leave no KV memory at all.

        vLLM would fail at load time (out of memory) or report no memory for the cache
        blocks; a negative KV figure is never an answer.
        """
        if self.gpu_memory_bytes is None or self.kv_cache_memory_bytes is not None:
            return
        requested = int(self.gpu_memory_bytes * self.gpu_memory_utilization)
        weights = weights_per_gpu(arch, setup, self.weights_bytes)
        if requested - weights - self.reserve_bytes > 0:
            return
        usable = (
            f"gpu_memory_gib {self.gpu_memory_bytes / GIB:g} x gpu_memory_utilization "
            f"{self.gpu_memory_utilization:g} = {requested / GIB:.2f} GiB per GPU"
        )
        if weights >= requested:
            what = f"the weights of {arch.name} do not fit: {weights / GIB:.2f} GiB per GPU"
        else:
            what = (
                f"the weights of {arch.name} ({weights / GIB:.2f} GiB per GPU) plus "
                f"reserve_gib {self.reserve_bytes / GIB:g} leave no KV memory"
            )
        raise ConfigError(f"{what}, but {usable}; {self._weights_hint(arch, setup)}")

    def _weights_hint(self, arch: KVArchitecture, setup: ServingSetup) -> str:
        for tp in valid_tensor_parallel_sizes(arch):
            if tp <= setup.tensor_parallel or tp > max(_TP_CHOICES):
                continue
            wider = replace(setup, tensor_parallel=tp)
            if self.available(arch, wider) > 0:
                return f"use tensor_parallel {tp}, a larger GPU, or smaller (quantised) weights"
        return "use a larger GPU or smaller (quantised) weights (give their size as weights_gib)"

    def available(self, arch: KVArchitecture, setup: ServingSetup) -> int:
        """KV bytes per GPU; may be <= 0, which vLLM reports as 'No available memory'."""
        if self.kv_cache_memory_bytes is not None:
            return self.kv_cache_memory_bytes
        assert self.gpu_memory_bytes is not None
        requested = int(self.gpu_memory_bytes * self.gpu_memory_utilization)
        return requested - weights_per_gpu(arch, setup, self.weights_bytes) - self.reserve_bytes


def weights_per_gpu(arch: KVArchitecture, setup: ServingSetup, given: int | None = None) -> int:
    """Given size, else files on disk, else parameters x bytes per parameter; split evenly."""
    total = given if given is not None else arch.weights_bytes
    if total is None:
        if arch.num_parameters is None:
            raise ConfigError(
                f"the weights size of {arch.name!r} is unknown; pass weights_gib "
                "(or the available KV memory vLLM logged)"
            )
        total = int(arch.num_parameters * arch.weight_bytes_per_param)
    return cdiv_int(total, setup.tensor_parallel * setup.pipeline_parallel)


def cdiv_int(a: int, b: int) -> int:
    return -(-a // b)


def suggest_fixes(
    arch: KVArchitecture, setup: ServingSetup, budget: MemoryBudget, max_model_len: int
) -> list[str]:
    """What would make max_model_len start: shorter length, utilization, fp8 KV, more TP."""
    plan = plan_kv(arch, setup)
    available = budget.available(arch, setup)
    fixes = [_shorter(plan, available, max_model_len)]
    fixes += _utilization(plan, budget, max_model_len)
    fixes += _fp8(arch, setup, budget, max_model_len)
    fixes += _more_tp(arch, setup, budget, max_model_len)
    return [fix for fix in fixes if fix]


def _shorter(plan: KVPlan, available: int, max_model_len: int) -> str:
    longest = plan.estimate_max_model_len(available, max_model_len)
    if longest <= 0:
        return "no length fits: free GPU memory first (weights leave no room for KV)"
    return f"--max-model-len {longest} (the longest that fits)"


def _utilization(plan: KVPlan, budget: MemoryBudget, max_model_len: int) -> list[str]:
    if budget.is_exact or budget.gpu_memory_bytes is None:
        return []
    arch, setup = plan.architecture, plan.setup
    other = weights_per_gpu(arch, setup, budget.weights_bytes) + budget.reserve_bytes
    needed = (plan.needed_bytes(max_model_len) + other) / budget.gpu_memory_bytes
    if needed <= _MAX_UTILIZATION:
        return [f"--gpu-memory-utilization {math.ceil(needed * 100) / 100:.2f}"]
    return [f"utilization alone cannot do it (it would need {needed:.2f} of the GPU)"]


def _fits(arch: KVArchitecture, setup: ServingSetup, budget: MemoryBudget, length: int) -> bool:
    return plan_kv(arch, setup).check(budget.available(arch, setup), length).fits


def _fp8(
    arch: KVArchitecture, setup: ServingSetup, budget: MemoryBudget, max_model_len: int
) -> list[str]:
    if setup.kv_cache_dtype.startswith("fp8") or setup.kv_cache_dtype == "nvfp4":
        return []
    fp8 = replace(setup, kv_cache_dtype="fp8")
    if _fits(arch, fp8, budget, max_model_len):
        return ["--kv-cache-dtype fp8 (halves KV memory; small accuracy cost)"]
    return []


def _more_tp(
    arch: KVArchitecture, setup: ServingSetup, budget: MemoryBudget, max_model_len: int
) -> list[str]:
    for tp in _TP_CHOICES:
        if tp <= setup.tensor_parallel or tensor_parallel_problem(arch, tp):
            continue
        wider = replace(setup, tensor_parallel=tp)
        if _fits(arch, wider, budget, max_model_len):
            return [f"--tensor-parallel-size {tp} (KV heads and weights split over {tp} GPUs)"]
    return []
