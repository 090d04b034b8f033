"""The per-request context limit the guard enforces, and where it comes from.

A request is admitted by vLLM when prompt + max_tokens <= max_model_len, so the hard
limit is the smallest of the model's max positions and the served max_model_len.
KV capacity only bounds *concurrency*; a deployment that wants every one of N
concurrent requests to be able to reach its limit can also cap at the KV fair share.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from ctxguard._validate import (
    MAX_INT,
    check_arg_types,
    check_http_options,
    check_http_url,
    show,
)
from ctxguard.errors import ConfigError
from ctxguard.kv.architecture import KVArchitecture
from ctxguard.kv.calculator import ServingSetup, plan_kv
from ctxguard.kv.catalogue import resolve_model
from ctxguard.kv.memory import DEFAULT_RESERVE_GIB, MemoryBudget, gib_to_bytes, suggest_fixes
from ctxguard.kv.refusals import check_tensor_parallel, served_max_model_len
from ctxguard.kv.server import ServerInfo, afetch_server_info, fetch_server_info, redact


@dataclass(frozen=True)
class ContextLimit:
    """A per-request hard limit on prompt + completion tokens, with its provenance."""

    tokens: int
    source: str
    details: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        tokens = self.tokens
        if isinstance(tokens, bool) or not isinstance(tokens, int) or not 1 <= tokens <= MAX_INT:
            raise ConfigError(
                f"a context limit must be a positive integer up to 2**63-1, got {show(tokens)}"
            )
        check_arg_types("ContextLimit", source=(self.source, "str"), details=(self.details, "map"))

    def prompt_budget(self, max_tokens: int, safety_margin: int = 0) -> int:
        """Tokens left for the prompt; negative means even an empty prompt is over."""
        if max_tokens < 0 or safety_margin < 0:
            raise ConfigError(
                f"max_tokens ({max_tokens}) and safety_margin ({safety_margin}) must be >= 0"
            )
        return self.tokens - max_tokens - safety_margin


@runtime_checkable
class LimitSource(Protocol):
    """Anything that can say what the current context limit is."""

    def resolve(self) -> ContextLimit: ...

    async def aresolve(self) -> ContextLimit: ...


class StaticLimit:
    """A number the operator knows (e.g. the --max-model-len they deployed with)."""

    def __init__(self, tokens: int, source: str = "static") -> None:
        self._limit = ContextLimit(tokens, source, {"tokens": tokens})

    def resolve(self) -> ContextLimit:
        return self._limit

    async def aresolve(self) -> ContextLimit:
        return self._limit


class ModelLimit:
    """min(max positions, max_model_len, KV fair share), computed from the architecture.

    Without memory figures this is max_model_len (default: the model's derived max
    positions). A setup vLLM refuses raises ConfigError: a TP size the heads do not
    divide by, a max_model_len past the positions without ``allow_long_max_model_len``
    (vLLM's ``VLLM_ALLOW_LONG_MAX_MODEL_LEN=1``), weights that do not fit the GPU, or a
    max_model_len whose KV does not fit (with vLLM's own message and what to change).
    ``disable_hybrid_kv_cache_manager`` sizes sliding-window/chunked layers as full
    attention, as vLLM does with ``--disable-hybrid-kv-cache-manager``.
    """

    def __init__(
        self,
        model: str | Path | KVArchitecture,
        *,
        max_model_len: int | None = None,
        gpu_memory_gib: float | None = None,
        available_kv_gib: float | None = None,
        tensor_parallel: int = 1,
        pipeline_parallel: int = 1,
        kv_cache_dtype: str = "auto",
        gpu_memory_utilization: float = 0.9,
        concurrency: int | None = None,
        weights_gib: float | None = None,
        reserve_gib: float = DEFAULT_RESERVE_GIB,
        block_size: int | None = None,
        max_num_batched_tokens: int = 8192,
        allow_long_max_model_len: bool = False,
        disable_hybrid_kv_cache_manager: bool = False,
    ) -> None:
        if not isinstance(model, str | Path | KVArchitecture):
            raise ConfigError(
                "ModelLimit: model must be a catalogue name, a model directory or config.json "
                f"path, or a KVArchitecture, got {type(model).__name__}"
            )
        check_arg_types(
            "ModelLimit",
            max_model_len=(max_model_len, "int?"),
            gpu_memory_gib=(gpu_memory_gib, "number?"),
            available_kv_gib=(available_kv_gib, "number?"),
            tensor_parallel=(tensor_parallel, "int"),
            pipeline_parallel=(pipeline_parallel, "int"),
            gpu_memory_utilization=(gpu_memory_utilization, "number"),
            concurrency=(concurrency, "int?"),
            weights_gib=(weights_gib, "number?"),
            reserve_gib=(reserve_gib, "number"),
            block_size=(block_size, "int?"),
            max_num_batched_tokens=(max_num_batched_tokens, "int"),
        )
        if not isinstance(allow_long_max_model_len, bool):
            raise ConfigError(
                f"allow_long_max_model_len must be True or False, got {allow_long_max_model_len!r}"
            )
        self._model = model
        self._max_model_len = max_model_len
        self._allow_long = allow_long_max_model_len
        self._concurrency = concurrency
        self._setup = ServingSetup(
            tensor_parallel=tensor_parallel,
            pipeline_parallel=pipeline_parallel,
            kv_cache_dtype=kv_cache_dtype,
            block_size=block_size,
            max_num_batched_tokens=max_num_batched_tokens,
            disable_hybrid_kv_cache_manager=disable_hybrid_kv_cache_manager,
        )
        self._budget = _budget(
            gpu_memory_gib, available_kv_gib, gpu_memory_utilization, weights_gib, reserve_gib
        )
        for name, count in (("max_model_len", max_model_len), ("concurrency", concurrency)):
            if count is not None and count > MAX_INT:  # (it was printed whole: 400 digits)
                raise ConfigError(f"{name} must be at most 2**63-1, got {show(count)}")
        if concurrency is not None and (concurrency < 1 or self._budget is None):
            raise ConfigError(
                "concurrency needs a positive value and gpu_memory_gib or available_kv_gib"
            )
        self._resolved: ContextLimit | None = None

    def resolve(self) -> ContextLimit:
        if self._resolved is None:
            self._resolved = self._compute()
        return self._resolved

    async def aresolve(self) -> ContextLimit:
        """Reading a model directory touches the disk, so it runs off the event loop."""
        return await asyncio.to_thread(self.resolve)

    def _compute(self) -> ContextLimit:
        arch = resolve_model(self._model)
        check_tensor_parallel(arch, self._setup.tensor_parallel)
        served = served_max_model_len(arch, self._max_model_len, allow_long=self._allow_long)
        details: dict[str, Any] = {
            "model": arch.name,
            "max_position_embeddings": arch.max_position_embeddings,
            "max_model_len": served,
        }
        candidates = [served]
        if self._budget is not None:
            candidates += self._kv_share(arch, served, details)
        tokens = min(candidates)
        return ContextLimit(tokens, f"model {arch.name} (calculator)", details)

    def _kv_share(self, arch: KVArchitecture, served: int, details: dict[str, Any]) -> list[int]:
        assert self._budget is not None
        plan = plan_kv(arch, self._setup)
        self._budget.check_weights_fit(arch, self._setup)
        available = self._budget.available(arch, self._setup)
        check = plan.check(available, served)
        details |= {"bytes_per_token": plan.bytes_per_token, "available_kv_bytes": available}
        if not check.fits:
            fixes = "; ".join(suggest_fixes(arch, self._setup, self._budget, served))
            raise ConfigError(f"vLLM would not start: {check.error} Options: {fixes}")
        details["capacity_tokens"] = plan.capacity_tokens(available, served)
        if self._concurrency is None:
            return []
        share = plan.max_model_len_for_concurrency(available, self._concurrency, served)
        details |= {"concurrency": self._concurrency, "kv_fair_share": share}
        if share < 1:
            raise ConfigError(f"{self._concurrency} concurrent requests do not fit at any length")
        return [share]


def _budget(
    gpu_memory_gib: float | None,
    available_kv_gib: float | None,
    utilization: float,
    weights_gib: float | None,
    reserve_gib: float,
) -> MemoryBudget | None:
    if gpu_memory_gib is None and available_kv_gib is None:
        return None
    return MemoryBudget(
        kv_cache_memory_bytes=_maybe_bytes(available_kv_gib, "available_kv_gib"),
        gpu_memory_bytes=_maybe_bytes(gpu_memory_gib, "gpu_memory_gib"),
        gpu_memory_utilization=utilization,
        weights_bytes=_maybe_bytes(weights_gib, "weights_gib"),
        reserve_bytes=gib_to_bytes(reserve_gib, "reserve_gib"),
    )


def _maybe_bytes(value: float | None, what: str) -> int | None:
    return None if value is None else gib_to_bytes(value, what)


class ServerLimit:
    """The limit a running server enforces, re-read at most every `cache_seconds`."""

    def __init__(
        self,
        base_url: str,
        *,
        model: str | None = None,
        timeout: float = 5.0,
        concurrency: int | None = None,
        cache_seconds: float = 60.0,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        check_arg_types(
            "ServerLimit",
            base_url=(base_url, "str"),
            model=(model, "str?"),
            timeout=(timeout, "number"),
            concurrency=(concurrency, "int?"),
            cache_seconds=(cache_seconds, "number"),
        )
        check_http_url(base_url, "ServerLimit base_url")
        check_http_options("ServerLimit", timeout, headers)
        if concurrency is not None and not 1 <= concurrency <= MAX_INT:
            raise ConfigError(f"concurrency must be from 1 to 2**63-1, got {show(concurrency)}")
        if cache_seconds < 0:
            raise ConfigError("cache_seconds must be non-negative")
        self._url, self._model, self._timeout = base_url, model, timeout
        self._concurrency, self._ttl, self._headers = concurrency, cache_seconds, headers
        self._cached: tuple[float, ContextLimit] | None = None

    def resolve(self) -> ContextLimit:
        if (hit := self._fresh()) is not None:
            return hit
        info = fetch_server_info(
            self._url, model=self._model, timeout=self._timeout, headers=self._headers
        )
        return self._store(info)

    async def aresolve(self) -> ContextLimit:
        if (hit := self._fresh()) is not None:
            return hit
        info = await afetch_server_info(
            self._url, model=self._model, timeout=self._timeout, headers=self._headers
        )
        return self._store(info)

    def invalidate(self) -> None:
        """Forget the cached limit (e.g. after the server was restarted)."""
        self._cached = None

    def _fresh(self) -> ContextLimit | None:
        if self._cached and time.monotonic() - self._cached[0] < self._ttl:
            return self._cached[1]
        return None

    def _store(self, info: ServerInfo) -> ContextLimit:
        limit = limit_from_server(info, self._concurrency)
        self._cached = (time.monotonic(), limit)
        return limit


def limit_from_server(info: ServerInfo, concurrency: int | None = None) -> ContextLimit:
    """max_model_len as served, capped at the KV fair share when a concurrency is given."""
    if info.max_model_len is None:
        raise ConfigError(
            f"{info.base_url} did not report max_model_len for {info.model!r}; "
            "use StaticLimit with the --max-model-len the server was started with"
        )
    details: dict[str, Any] = {
        "model": info.model,
        "max_model_len": info.max_model_len,
        "capacity_tokens": info.capacity_tokens,
        "num_gpu_blocks": info.num_gpu_blocks,
        "block_size": info.block_size,
    }
    source = f"server /v1/models at {redact(info.base_url)} (max_model_len)"
    tokens = info.max_model_len
    if concurrency is not None:
        share = info.fair_share(concurrency)
        if share is None:
            raise ConfigError(
                f"{info.base_url}/metrics has no vllm:cache_config_info (nor SGLang's "
                "max_total_num_tokens); enable metrics or drop concurrency"
            )
        if share < 1:
            raise ConfigError(
                f"{info.base_url} holds {info.capacity_tokens} KV tokens: too few to give "
                f"{concurrency} requests a share; lower concurrency"
            )
        details |= {"concurrency": concurrency, "kv_fair_share": share}
        if share < tokens:
            tokens, source = share, f"{source}, KV fair share for {concurrency} requests"
    return ContextLimit(tokens, source, details)
