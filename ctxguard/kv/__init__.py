"""KV-derived context limits: from a model's architecture and serving setup to a token limit.

``calculator`` reproduces vLLM's KV-cache arithmetic per GPU; ``memory`` turns GPU memory
into a KV budget; ``limit`` gives the guard its per-request limit from static numbers,
the calculator, or a running server (``server``); ``refusals`` refuses what vLLM refuses
(TP sizes, max_model_len past the positions). Nothing here imports transformers or
torch at import time.
"""

from ctxguard.kv.architecture import (
    KVArchitecture,
    LayerKind,
    architecture_from_config,
    load_config_file,
    load_model_directory,
)
from ctxguard.kv.calculator import (
    GIB,
    KV_CACHE_DTYPES,
    KVLayout,
    KVPlan,
    ServingSetup,
    StartupCheck,
    kv_bytes_per_token,
    plan_kv,
)
from ctxguard.kv.catalogue import catalogue_names, from_catalogue, resolve_model
from ctxguard.kv.limit import (
    ContextLimit,
    LimitSource,
    ModelLimit,
    ServerLimit,
    StaticLimit,
    limit_from_server,
)
from ctxguard.kv.memory import MemoryBudget, logged_gib_bounds, suggest_fixes, weights_per_gpu
from ctxguard.kv.refusals import (
    check_tensor_parallel,
    served_max_model_len,
    valid_tensor_parallel_sizes,
)
from ctxguard.kv.server import ServerInfo, afetch_server_info, fetch_server_info

__all__ = [
    "GIB",
    "KV_CACHE_DTYPES",
    "ContextLimit",
    "KVArchitecture",
    "KVLayout",
    "KVPlan",
    "LayerKind",
    "LimitSource",
    "MemoryBudget",
    "ModelLimit",
    "ServerInfo",
    "ServerLimit",
    "ServingSetup",
    "StartupCheck",
    "StaticLimit",
    "afetch_server_info",
    "architecture_from_config",
    "catalogue_names",
    "check_tensor_parallel",
    "fetch_server_info",
    "from_catalogue",
    "kv_bytes_per_token",
    "limit_from_server",
    "load_config_file",
    "load_model_directory",
    "logged_gib_bounds",
    "plan_kv",
    "resolve_model",
    "served_max_model_len",
    "suggest_fixes",
    "valid_tensor_parallel_sizes",
    "weights_per_gpu",
]
