"""``ctxguard kv``: will this model and max_model_len fit, and how many requests at once?"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import click
from rich.console import Console
from rich.table import Table

from ctxguard.cli.common import OutConsole
from ctxguard.errors import ConfigError, CtxGuardError, MissingDependencyError
from ctxguard.kv.architecture import KVArchitecture
from ctxguard.kv.calculator import GIB, KV_CACHE_DTYPES, KVPlan, ServingSetup, plan_kv
from ctxguard.kv.catalogue import catalogue_names, resolve_model
from ctxguard.kv.memory import DEFAULT_RESERVE_GIB, MemoryBudget, gib_to_bytes, suggest_fixes
from ctxguard.kv.refusals import served_max_model_len

EXIT_BAD_INPUT = 2
EXIT_DOES_NOT_FIT = 3
EXIT_MISSING_DEPENDENCY = 4
_LENGTHS = (4096, 8192, 32768, 131072)
_PUBLIC_SOURCE = re.compile(r"^https://huggingface\.co/[\w.-]+/[\w.-]+/blob/main/config\.json$")

# The one place that maps the Python API's parameter names to this command's flags:
# library errors name parameters, and the CLI shows them as the flags the user typed.
_FLAGS = {
    "allow_long_max_model_len": "--allow-long-max-model-len",
    "available_kv_gib": "--available-kv",
    "block_size": "--block-size",
    "concurrency": "--concurrency",
    "disable_hybrid_kv_cache_manager": "--disable-hybrid-kv-cache-manager",
    "gpu_memory_gib": "--gpu-memory",
    "gpu_memory_utilization": "--gpu-memory-utilization",
    "kv_cache_dtype": "--kv-cache-dtype",
    "kv_cache_memory_bytes": "--kv-cache-memory",
    "max_model_len": "--max-model-len",
    "max_num_batched_tokens": "--max-num-batched-tokens",
    "pipeline_parallel": "--pp",
    "reserve_gib": "--reserve",
    "tensor_parallel": "--tp",
    "weights_gib": "--weights",
}
_PARAMETER = re.compile(
    r"(?<![\w-])(" + "|".join(sorted(_FLAGS, key=len, reverse=True)) + r")(?![\w-])"
)


def flag_message(message: str) -> str:
    """An error message with Python parameter names replaced by the CLI flags."""
    return _PARAMETER.sub(lambda m: _FLAGS[m.group(1)], message)


_EPILOG = """\b
Examples:
  ctxguard kv llama-3.1-8b --gpu-memory 80 --max-model-len 131072
  ctxguard kv Qwen/Qwen3-Coder-480B-A35B-Instruct-FP8 --available-kv 48.66 \\
      --max-model-len 262144
  ctxguard kv ./my-model/config.json --gpu-memory 24 --tp 2 --kv-cache-dtype fp8
  ctxguard kv deepseek-v3 --gpu-memory 141 --tp 8 --concurrency 16
  ctxguard kv --list-models

\b
Exit codes: 0 fits; 2 bad input, or a setup vLLM refuses (--tp the heads do not
divide by, --max-model-len past the model's positions without
--allow-long-max-model-len, weights that do not fit --gpu-memory); 3 does not fit:
the requested --max-model-len would not start (KV), no --max-model-len fits the
memory (or --concurrency) given, or --concurrency does not fit at the --max-model-len
given (one stderr line says what to lower); 4 an optional dependency is missing;
130 interrupted (Ctrl-C); 141 stdout closed by its reader (| head).
"""


@dataclass(frozen=True)
class _Request:
    max_model_len: int | None
    concurrency: int | None


@click.command("kv", epilog=_EPILOG)
@click.argument("model", required=False)
@click.option("--gpu-memory", type=float, help="Memory of one GPU in GiB (e.g. 79.2 for H100).")
@click.option(
    "--available-kv",
    type=float,
    help="KV memory per GPU in GiB, as vLLM logs 'Available KV cache memory'.",
)
@click.option("--kv-cache-memory", type=int, help="vLLM's --kv-cache-memory, in bytes per GPU.")
@click.option("--tp", "--tensor-parallel-size", "tp", type=int, default=None, help="TP size.")
@click.option("--pp", "--pipeline-parallel-size", "pp", type=int, default=1, show_default=True)
@click.option("--gpus", type=int, help="Total GPUs; TP = gpus / pp when --tp is not given.")
@click.option(
    "--kv-cache-dtype",
    type=click.Choice(list(KV_CACHE_DTYPES)),
    default="auto",
    show_default=True,
)
@click.option("--gpu-memory-utilization", type=float, default=0.9, show_default=True)
@click.option("--weights", type=float, help="Weights size in GiB (default: from the model).")
@click.option(
    "--reserve",
    type=float,
    default=DEFAULT_RESERVE_GIB,
    show_default=True,
    help="Activations + CUDA graphs per GPU, GiB.",
)
@click.option("--max-model-len", type=int, help="The --max-model-len you plan to serve.")
@click.option(
    "--allow-long-max-model-len",
    is_flag=True,
    help="Accept --max-model-len past the model's positions, as vLLM does with "
    "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 (output past the trained length is unreliable).",
)
@click.option("--concurrency", type=int, help="Requests that must fit at full length at once.")
@click.option("--block-size", type=int, help="KV block size (default 16; 64 for MLA).")
@click.option("--max-num-batched-tokens", type=int, default=8192, show_default=True)
@click.option(
    "--disable-hybrid-kv-cache-manager",
    is_flag=True,
    help="vLLM's flag (forced by some KV connectors): sliding-window and chunked layers "
    "are sized as full attention.",
)
@click.option("--list-models", is_flag=True, help="List the built-in catalogue and exit.")
@click.pass_context
def kv_command(ctx: click.Context, /, model: str | None, **options: object) -> None:
    """Size a model's KV cache the way vLLM does, per GPU.

    MODEL is a catalogue name (see --list-models), a config.json path or a local
    model directory. Give --gpu-memory (with --weights/--reserve) or the exact
    --available-kv / --kv-cache-memory to get capacity and concurrency.
    """
    console = OutConsole(highlight=False, soft_wrap=True)
    if options["list_models"]:
        for name in catalogue_names():
            console.print(name)
        return
    try:
        code = _run(console, model, options)
    except MissingDependencyError as exc:
        _fail(ctx, exc, EXIT_MISSING_DEPENDENCY)
    except ConfigError as exc:
        _fail(ctx, exc, EXIT_BAD_INPUT)
    except CtxGuardError as exc:
        _fail(ctx, exc, 1)
    ctx.exit(code)


def _fail(ctx: click.Context, exc: Exception, code: int) -> None:
    message = " ".join(flag_message(str(exc)).split())  # one line, flags not parameters
    click.echo(f"error: {message}", err=True)
    ctx.exit(code)


def _run(console: Console, model: str | None, options: dict[str, object]) -> int:
    if not model:
        raise ConfigError("give a MODEL (catalogue name, config.json or directory)")
    arch = resolve_model(model)
    setup = _setup(options)
    budget = _budget(options)
    request = _Request(_opt_int(options, "max_model_len"), _opt_int(options, "concurrency"))
    if request.concurrency is not None and request.concurrency < 1:
        raise ConfigError(f"--concurrency must be at least 1, got {request.concurrency}")
    if request.concurrency is not None and budget is None:
        raise ConfigError(
            "--concurrency needs the memory: give --gpu-memory, --available-kv or --kv-cache-memory"
        )
    plan = plan_kv(arch, setup)  # refuses a TP size vLLM refuses
    allow_long = bool(options.get("allow_long_max_model_len"))
    served = served_max_model_len(arch, request.max_model_len, allow_long=allow_long)
    if budget is not None:
        budget.check_weights_fit(arch, setup)
    _print_architecture(console, plan)
    if budget is None:
        _print_without_memory(console, plan, served)
        return 0
    return _print_capacity(console, plan, budget, request, served)


def _opt_int(options: dict[str, object], key: str) -> int | None:
    value = options.get(key)
    return value if isinstance(value, int) else None


def _opt_float(options: dict[str, object], key: str) -> float | None:
    value = options.get(key)
    return float(value) if isinstance(value, int | float) else None


def _setup(options: dict[str, object]) -> ServingSetup:
    pp = _int_or(options, "pp", 1)
    tp = _opt_int(options, "tp")
    gpus = _opt_int(options, "gpus")
    if tp is None:
        if gpus is not None and (gpus < 1 or gpus % pp):
            raise ConfigError(f"--gpus {gpus} is not a positive multiple of --pp {pp}")
        tp = gpus // pp if gpus else 1
    return ServingSetup(
        tensor_parallel=tp,
        pipeline_parallel=pp,
        kv_cache_dtype=str(options["kv_cache_dtype"]),
        block_size=_opt_int(options, "block_size"),
        max_num_batched_tokens=_int_or(options, "max_num_batched_tokens", 8192),
        disable_hybrid_kv_cache_manager=bool(options.get("disable_hybrid_kv_cache_manager")),
    )


def _int_or(options: dict[str, object], key: str, default: int) -> int:
    value = _opt_int(options, key)
    return default if value is None else value


def _budget(options: dict[str, object]) -> MemoryBudget | None:
    exact = _opt_int(options, "kv_cache_memory")
    logged = _opt_float(options, "available_kv")
    gpu = _opt_float(options, "gpu_memory")
    if exact is None and logged is not None:
        exact = gib_to_bytes(logged, "--available-kv")
    if exact is None and gpu is None:
        return None
    weights = _opt_float(options, "weights")
    return MemoryBudget(
        kv_cache_memory_bytes=exact,
        gpu_memory_bytes=None if gpu is None else gib_to_bytes(gpu, "--gpu-memory"),
        gpu_memory_utilization=float(str(options["gpu_memory_utilization"])),
        weights_bytes=None if weights is None else gib_to_bytes(weights, "--weights"),
        reserve_bytes=gib_to_bytes(_opt_float(options, "reserve") or 0.0, "--reserve"),
    )


def _kinds(arch: KVArchitecture) -> str:
    counts = {k: arch.count(k) for k in ("full", "sliding", "chunked", "mamba") if arch.count(k)}
    return ", ".join(f"{n} {kind}" for kind, n in counts.items())


def _print_architecture(console: Console, plan: KVPlan) -> None:
    arch, setup = plan.architecture, plan.setup
    table = Table(title=f"KV cache of {arch.name} (per GPU)", show_header=False)
    table.add_row("layers", _kinds(arch))
    if arch.is_mla:
        table.add_row("attention", f"MLA latent {arch.kv_head_size} (not split by TP)")
    else:
        heads = max(1, arch.num_kv_heads // setup.tensor_parallel)
        table.add_row(
            "KV heads per GPU", f"{heads} of {arch.num_kv_heads}, head size {arch.head_dim}"
        )
    table.add_row("TP x PP", f"{setup.tensor_parallel} x {setup.pipeline_parallel}")
    table.add_row("KV dtype", setup.kv_cache_dtype)
    table.add_row(
        "bytes per token", f"{plan.bytes_per_token:,} ({plan.bytes_per_token / 1024:.1f} KiB)"
    )
    if not plan.is_uniform:
        full = plan.full_attention_bytes_per_token
        table.add_row("  of which unbounded", f"{full:,} B (windowed/recurrent layers are capped)")
    if setup.disable_hybrid_kv_cache_manager and not arch.is_uniform:
        table.add_row("hybrid KV manager", _hybrid_off(plan))
    table.add_row("block size", str(plan.block_size))
    table.add_row("max positions", _num(arch.max_position_embeddings))
    if arch.derived_max_model_len not in (None, arch.max_position_embeddings):
        table.add_row("longest max_model_len", arch.derived_max_model_len_from)
    console.print(table)
    console.print(f"source: {_public_source(arch)}")  # a whole line: a URL must not wrap


def _public_source(arch: KVArchitecture) -> str:
    """Only a public config.json URL is cited; a local file is the user's own input."""
    if _PUBLIC_SOURCE.match(arch.source):
        return arch.source
    return "the config.json given (local, not a public source)"


def _hybrid_off(plan: KVPlan) -> str:
    if plan.is_uniform:
        return "off: every layer sized as full attention"
    return "off: one layer type only, sized as it is"


def _num(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def _print_without_memory(console: Console, plan: KVPlan, length: int) -> None:
    needed = plan.needed_bytes(length)
    console.print(f"one request of {length:,} tokens needs {needed / GIB:.2f} GiB of KV per GPU")
    console.print("give --gpu-memory or --available-kv for capacity and concurrency")


def _print_capacity(
    console: Console, plan: KVPlan, budget: MemoryBudget, request: _Request, served: int
) -> int:
    arch, setup = plan.architecture, plan.setup
    available = budget.available(arch, setup)
    max_pos = max(arch.max_model_len_limit or served, served)
    console.print(f"available KV memory per GPU: {available / GIB:.2f} GiB")
    if available > 0:
        _print_concurrency(console, plan, available, served, max_pos)
    recommended = _recommended(plan, available, request, max_pos)
    console.print(f"recommended --max-model-len: {recommended if recommended else 'none fits'}")
    if not recommended:
        return _nothing_fits(plan, available, request)
    check = plan.check(available, served)
    if check.fits:
        return _concurrency_check(plan, available, request, served, recommended)
    if request.max_model_len is None:
        console.print(
            f"note: without --max-model-len vLLM uses {served:,} (max positions), which would "
            "not start here; pass the recommendation above"
        )
        return 0
    console.print(f"[red]vLLM would not start:[/red] {check.error}")
    console.print("what to change:")
    for fix in suggest_fixes(arch, setup, budget, served):
        console.print(f"  - {fix}")
    return EXIT_DOES_NOT_FIT


def _does_not_fit(message: str) -> int:
    click.echo(f"error: {message}", err=True)  # one line: what to lower
    return EXIT_DOES_NOT_FIT


def _nothing_fits(plan: KVPlan, available: int, request: _Request) -> int:
    """No length starts: name what the user asked that is too much (exit 3, one line)."""
    gib = f"{available / GIB:.2f} GiB of KV per GPU"
    one = plan.needed_bytes(1) <= available
    if request.concurrency is not None and one:
        most = math.floor(plan.max_concurrency(available, 1))
        return _does_not_fit(
            f"no --max-model-len fits --concurrency {request.concurrency:,} in {gib} "
            f"(at most {most:,} requests at once, each one block of {plan.block_size} "
            "tokens); lower --concurrency or give more KV memory"
        )
    return _does_not_fit(
        f"no --max-model-len fits: {gib} holds no block of {plan.block_size:,} tokens; "
        "give more KV memory (--gpu-memory, --available-kv, --kv-cache-memory), "
        "or lower --block-size"
    )


def _concurrency_check(
    plan: KVPlan, available: int, request: _Request, served: int, recommended: int
) -> int:
    """--concurrency with --max-model-len: both must hold at once, or exit 3 in one line."""
    wanted = request.concurrency
    if wanted is None or request.max_model_len is None:
        return 0
    most = plan.max_concurrency(available, served)
    if most >= wanted:
        return 0
    return _does_not_fit(
        f"--concurrency {wanted:,} does not fit at --max-model-len {served:,} "
        f"(at most {math.floor(most):,} at once in {available / GIB:.2f} GiB of KV per GPU); "
        f"lower --concurrency to {math.floor(most):,} or --max-model-len to {recommended}"
    )


def _print_concurrency(
    console: Console, plan: KVPlan, available: int, served: int, max_pos: int
) -> None:
    console.print(
        f"KV capacity: {plan.capacity_tokens(available, served):,} tokens "
        f"({plan.num_blocks(available):,} blocks of {plan.block_size})"
    )
    table = Table(title="concurrency at max_model_len")
    table.add_column("max_model_len", justify="right")
    table.add_column("fits", justify="center")
    table.add_column("max concurrency", justify="right")
    for length in sorted({*(n for n in _LENGTHS if n <= max_pos), served, max_pos}):
        fits = plan.check(available, length).fits
        table.add_row(
            f"{length:,}",
            "yes" if fits else "no",
            f"{plan.max_concurrency(available, length):.2f}x",
        )
    console.print(table)


def _recommended(plan: KVPlan, available: int, request: _Request, max_pos: int) -> int:
    """Longest length that starts (and serves `concurrency` at once), capped at max positions."""
    if request.concurrency is not None:
        return plan.max_model_len_for_concurrency(available, request.concurrency, max_pos)
    return plan.estimate_max_model_len(available, max_pos)
