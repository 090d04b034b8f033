"""The README's checkable claims stay true: every CLI flag it names exists on the command
it names, every default number it states is the code's, every file it names exists,
every environment variable it names is read somewhere, and docs/modules.md names no
module that is not there (tests/test_docs_map.py checks the other direction)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import click
import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _section(title: str) -> str:
    start = README.index(f"\n## {title}")
    end = README.find("\n## ", start + 1)
    return README[start : end if end != -1 else len(README)]


def _options(command: click.Command) -> set[str]:
    named = {opt for param in command.params for opt in (*param.opts, *param.secondary_opts)}
    return named | {"-h", "--help"}  # the group's help option, on every command


def _commands() -> dict[str, set[str]]:
    from ctxguard.cli import cli

    return {name: _options(command) for name, command in cli.commands.items()}


# -- CLI flags ---------------------------------------------------------------------------

FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
# flags of other programs the README quotes (a benchmark script, vLLM's own option)
NOT_CTXGUARD = {"--quick"}


def _command_lines() -> list[tuple[str, str]]:
    """(command, rest of the line) for every `ctxguard CMD ...` the README shows, in code
    blocks and inline code alike."""
    found = re.findall(r"(?:^|`)ctxguard ([a-z]+)([^`\n]*)", README, flags=re.M)
    return [(cmd, rest.split("#", 1)[0]) for cmd, rest in found]


def test_every_command_the_readme_runs_exists_with_every_flag_it_gives() -> None:
    commands = _commands()
    lines = _command_lines()
    assert len(lines) >= 10, lines  # the regex still finds the README's commands
    wrong = [
        f"ctxguard {cmd}{rest}: " + ("no such command" if cmd not in commands else flag)
        for cmd, rest in lines
        for flag in (FLAG.findall(rest) if cmd in commands else ["?"])
        if cmd not in commands or flag not in commands[cmd]
    ]
    assert not wrong, f"the README runs commands or flags the CLI does not have: {wrong}"


@pytest.mark.parametrize(
    ("section", "command"),
    [("KV-derived limits", "kv"), ("Gateway", "serve"), ("Inspect, replay, audit", None)],
)
def test_every_flag_a_cli_section_names_belongs_to_its_command(
    section: str, command: str | None
) -> None:
    """The prose too: a `--flag` named in the gateway's section is a `ctxguard serve`
    flag, in the KV section a `ctxguard kv` flag (vLLM's own flags named there are ones
    `ctxguard kv` takes under the same name), in the CLI section a flag of some command."""
    commands = _commands()
    known = commands[command] if command else set().union(*commands.values())
    named = set(FLAG.findall(_section(section))) - NOT_CTXGUARD
    assert named
    missing = sorted(named - known)
    assert not missing, (
        f"README section {section!r} names flags {command or 'the CLI'} lacks: {missing}"
    )


def test_every_flag_the_readme_names_is_some_commands_flag() -> None:
    known = set().union(*_commands().values())
    named = set(FLAG.findall(README)) - NOT_CTXGUARD
    missing = sorted(named - known)
    assert not missing, f"the README names flags no ctxguard command has: {missing}"


# -- default numbers ---------------------------------------------------------------------


def _guard_default(name: str) -> object:
    from ctxguard.guard.config import GuardConfig

    return GuardConfig.__dataclass_fields__[name].default


def _serve_default(name: str) -> object:
    from ctxguard.serve.config import ServeConfig

    return ServeConfig.__dataclass_fields__[name].default


def _retry(name: str) -> object:
    from ctxguard.stores.redis_clients import RetryPolicy

    return getattr(RetryPolicy(), name)


def _pressure(name: str) -> object:
    import inspect

    from ctxguard.observe.pressure import PressureLimit

    return inspect.signature(PressureLimit.__init__).parameters[name].default


def _background_interval() -> object:
    import inspect

    from ctxguard.observe.background import background

    return inspect.signature(background).parameters["interval"].default


def _http_pool(name: str) -> object:
    import inspect

    from ctxguard import _http

    source = inspect.getsource(_http)
    found = re.search(rf"{name}=(\d+)", source)
    assert found, name
    return int(found.group(1))


def _lua_lib() -> str:
    return (ROOT / "ctxguard" / "stores" / "lua" / "_lib.lua").read_text(encoding="utf-8")


def _mib(value: object) -> float:
    assert isinstance(value, int)
    return value / 2**20


# (a pattern of the README whose one group is the number it states, the code's value;
# a number stated as ms, MiB or a fraction is compared in those units)
DEFAULTS: list[tuple[str, Callable[[], object]]] = [
    (r"up to `window_cache_size=(\d+)` sessions", lambda: _guard_default("window_cache_size")),
    (r"`window_cache_bytes`, (\d+) MiB", lambda: _mib(_guard_default("window_cache_bytes"))),
    (
        r"low_water` \(a fraction of the prompt budget, default ([\d.]+)",
        lambda: _guard_default("low_water"),
    ),
    (r"`audit_mode=\"(\w+)\"` \(default\)", lambda: _guard_default("audit_mode")),
    (r"at most (\d+) levels", lambda: _max_depth()),
    (r"backing off, up to (\d+) times, then raises", lambda: _flows("MAX_COMMITS")),
    (r"\((\d+) attempts, backoff", lambda: _retry("attempts")),
    (r"backoff (\d+) ms doubling", lambda: round(float(_retry("first_delay")) * 1000)),  # type: ignore[arg-type]
    (r"ms doubling to (\d+) s", lambda: _retry("max_delay")),
    (r"connect timeout \((\d+) s", lambda: _urls("DEFAULT_CONNECT_TIMEOUT")),
    (r"a read timeout \((\d+) s\)", lambda: _urls("DEFAULT_READ_TIMEOUT")),
    (r"bodies are capped at (\d+) MiB", lambda: _mib(_http("MAX_BODY"))),
    (r"closed after (\d+) s idle", lambda: _http("KEEPALIVE_EXPIRY")),
    (r"One client holds up to (\d+)\s+connections", lambda: _http_pool("max_connections")),
    (r"connections \((\d+) kept idle\)", lambda: _http_pool("max_keepalive_connections")),
    (
        r"within `--upstream-timeout`[^.]*? and at most\s+(\d+) MiB",
        lambda: _mib(_forward("MAX_REPLY_BYTES")),
    ),
    (r"before it is cut to (\d+)\s+characters", lambda: _forward("UPSTREAM_TEXT_CHARS")),
    (r"\(`--idempotency-lease`, (\d+) s\)", lambda: _serve_default("idempotency_lease")),
    (r"among\s+the session's newest (\d+) messages", lambda: _serve_default("idempotency_window")),
    (r"`--workers` is at most (\d+)", lambda: _serve_config("MAX_WORKERS")),
    (r"`--idempotency-window` at most (\d+)", lambda: _serve_config("MAX_IDEMPOTENCY_WINDOW")),
    (r"each check\s+answers within (\d+) s", lambda: _app("HEALTH_SECONDS")),
    (r"delivers them every (\d+) ms", lambda: round(float(_background_interval()) * 1000)),  # type: ignore[arg-type]
    (r"halves the limit at ([\d.]+)", lambda: _pressure("lower_at")),
    (r"halves the limit at [\d.]+ or (\d+) waiting", lambda: _pressure("waiting_lower")),
    (
        r"refuses \(`ServerBusyError`, audited\)\s+at (\d+) waiting",
        lambda: _pressure("waiting_refuse"),
    ),
    (r"or at ([\d.]+) with \d+ waiting", lambda: _pressure("refuse_at")),
    (r"or at [\d.]+ with (\d+) waiting", lambda: _pressure("waiting_lower")),
    (r"at most one line a (minute)", lambda: _budget_log_every()),
    # the statuses of the gateway's Faults line (a reply not stored: 503 when the store
    # failed, a retry may pass; 502 when the reply is refused, it would be again)
    (r"Upstream down or failing: (\d+)", lambda: _upstream_status("down")),
    (r"Upstream down or failing: \d+, timing out: (\d+)", lambda: _upstream_status("slow")),
    (r"Redis down: (\d+), nothing forwarded", lambda: _store_down_status()),
    (r"transient\s+4xx \(([\d, ]+)\)", lambda: _transient_4xx()),
    (r"`upstream_auth`[^;]*at most one line a (minute) per route", lambda: _gateway_log_every()),
    (r"after the model answered is a (\d+) when the store failed", lambda: _not_stored("store")),
    (r"and a (\d+) when the gateway refuses the reply itself", lambda: _not_stored("refused")),
    (
        r"answers a model reply like that with a (\d+)\s+`reply_not_stored`",
        lambda: _not_stored("refused"),
    ),
]


def _gateway_log_every() -> object:
    pytest.importorskip("httpx")
    from ctxguard.serve.outcomes import LOG_EVERY

    return "minute" if LOG_EVERY == 60 else LOG_EVERY


def _transient_4xx() -> object:
    """The upstream 4xx statuses after which the request stays stored (a retry may pass)."""
    pytest.importorskip("httpx")
    from ctxguard.serve.outcomes import TRANSIENT_4XX

    return ", ".join(str(status) for status in sorted(TRANSIENT_4XX))


def _not_stored(why: str) -> object:
    """The status of a reply the model gave that was not stored: the store failed, or
    the reply was refused (two tool calls with one id)."""
    pytest.importorskip("httpx")
    from ctxguard.errors import InvalidMessageError, StoreConnectionError
    from ctxguard.serve.outcomes import reply_not_stored

    cause = StoreConnectionError("down") if why == "store" else InvalidMessageError("one id")
    return reply_not_stored(cause, keyed=False).status


def _upstream_status(how: str) -> object:
    httpx = pytest.importorskip("httpx")
    from ctxguard.serve.outcomes import upstream_failure

    cause = httpx.ConnectError("refused") if how == "down" else httpx.ReadTimeout("slow")
    return upstream_failure(cause, "http://vllm:8000")[0]


def _store_down_status() -> object:
    pytest.importorskip("httpx")
    from ctxguard.errors import StoreConnectionError
    from ctxguard.serve.openai_errors import from_ctxguard

    return from_ctxguard(StoreConnectionError("down")).status


def _max_depth() -> object:
    from ctxguard._validate import MAX_JSON_DEPTH

    return MAX_JSON_DEPTH


def _flows(name: str) -> object:
    from ctxguard.guard import flows

    return getattr(flows, name)


def _urls(name: str) -> object:
    from ctxguard.stores import urls

    return getattr(urls, name)


def _http(name: str) -> object:
    from ctxguard import _http as http

    return getattr(http, name)


def _serve_config(name: str) -> object:
    from ctxguard.serve import config

    return getattr(config, name)


def _forward(name: str) -> object:
    pytest.importorskip("httpx")
    from ctxguard.serve import forward

    return getattr(forward, name)


def _app(name: str) -> object:
    pytest.importorskip("starlette")
    from ctxguard.serve import app

    return getattr(app, name)


def _budget_log_every() -> object:
    from ctxguard.observe.tenant_budget import LOG_EVERY

    return "minute" if LOG_EVERY == 60 else LOG_EVERY


def _same(stated: str, actual: object) -> bool:
    if isinstance(actual, bool | str):
        return stated == str(actual)
    assert isinstance(actual, int | float), actual
    return float(stated) == float(actual)


@pytest.mark.parametrize(("pattern", "actual"), DEFAULTS, ids=[p for p, _ in DEFAULTS])
def test_a_default_the_readme_states_is_the_codes(
    pattern: str, actual: Callable[[], object]
) -> None:
    found = re.findall(pattern, README)
    assert found, f"the README no longer says {pattern!r}: update this table"
    value = actual()
    wrong = [stated for stated in found if not _same(stated, value)]
    assert not wrong, f"README states {wrong} for {pattern!r}; the code has {value!r}"


def test_the_ttl_slack_the_readme_states_is_the_scripts() -> None:
    """ "ttl/20, at most 60 s" (twice: the Use snippet and Performance)."""
    stated = set(re.findall(r"ttl ?/ ?(\d+), at most (\d+) s", README))
    stated |= set(re.findall(r"min\(ttl/(\d+), (\d+) s\)", README))
    assert len(stated) == 1, stated
    ((divisor, cap),) = stated
    assert f"math.min(full / {divisor}, {int(cap) * 1000})" in _lua_lib()


def test_the_meta_digits_the_readme_states_are_the_scripts() -> None:
    (digits,) = re.findall(r"an integer of at most (\d+) digits", README)
    assert f"#digits <= {digits}" in _lua_lib()


def test_the_quickstart_limit_the_readme_implies_matches_start_on_user_default() -> None:
    assert "`start_on_user=False` turns it off" in README
    assert _guard_default("start_on_user") is True


# -- files and environment variables --------------------------------------------------


def test_every_file_the_readme_names_exists() -> None:
    named = set(
        re.findall(r"`((?:ctxguard|tests|benchmarks|examples|scripts|docs|\.ci)/[\w/.-]+)`", README)
    )
    named |= set(re.findall(r"\]\(((?:examples|docs|benchmarks)/[\w/.-]+)\)", README))
    named |= {f"benchmarks/{name}" for name in re.findall(r"`(bench_\w+\.py)", README)}
    assert len(named) > 15
    missing = sorted(name for name in named if not (ROOT / name).exists())
    assert not missing, f"the README names files that do not exist: {missing}"


def test_every_environment_variable_the_readme_names_is_read() -> None:
    from ctxguard.serve.config import ENV_PREFIX, NAMES

    named = set(re.findall(r"\b(CTXGUARD_[A-Z_]+)\b", README))
    serve = {f"{ENV_PREFIX}{name.upper()}" for name in NAMES}
    sources = "\n".join(
        p.read_text(encoding="utf-8")
        for folder in ("ctxguard", "tests", "scripts")
        for p in (ROOT / folder).rglob("*")
        if p.is_file() and p.suffix in {".py", ".sh", ""} and "__pycache__" not in p.parts
    )
    unread = sorted(v for v in named if v not in serve and v not in sources)
    assert not unread, f"the README names environment variables nothing reads: {unread}"


# -- docs/modules.md, the other direction ------------------------------------------------


def test_docs_modules_names_no_module_that_is_not_there() -> None:
    text = (ROOT / "docs" / "modules.md").read_text(encoding="utf-8")
    package = ROOT / "ctxguard"
    files = [*package.rglob("*"), *(ROOT / "examples").rglob("*"), *(ROOT / "tests").rglob("*")]
    stems = {p.stem for p in files if p.is_file()}
    named = set(re.findall(r"\b([\w]+)\.(?:py|lua|json|html)\b", text))
    missing = sorted(n for n in named if n not in stems)
    assert not missing, f"docs/modules.md names files ctxguard does not have: {missing}"
    folders = set(re.findall(r"`(\w+)/`", text))
    dirs = {d.name for d in package.rglob("*") if d.is_dir()}
    absent = sorted(f for f in folders if f not in dirs)
    assert not absent, f"docs/modules.md names folders ctxguard does not have: {absent}"


# -- the exception tree ------------------------------------------------------------------


def test_every_error_the_readme_names_is_public_and_a_ctxguard_error() -> None:
    import ctxguard

    named = set(re.findall(r"`(\w+Error)`", README))
    assert len(named) > 10
    missing = sorted(n for n in named if not isinstance(getattr(ctxguard, n, None), type))
    assert not missing, f"the README names errors `import ctxguard` does not have: {missing}"
    outside = sorted(
        n for n in named if not issubclass(getattr(ctxguard, n), ctxguard.CtxGuardError)
    )
    assert not outside, f"errors the README names outside the CtxGuardError tree: {outside}"


# "X (a Y)", "(both are Ys)", "an `InvalidInputError` (`A`, `B`, `C`)" as the README says them
FAMILIES = [
    (r"`(\w+Error)` \(a `(\w+Error)`", 1),
    (r"raises\s+`(\w+Error)` at `prepare`.*?raises `(\w+Error)`\s+\(both are `(\w+Error)`s", 2),
    (r"is an `(InvalidInputError)`\s+\(`(\w+Error)`, `(\w+Error)`, `(\w+Error)`\)", 3),
]


@pytest.mark.parametrize(("pattern", "members"), FAMILIES, ids=[p for p, _ in FAMILIES])
def test_an_error_family_the_readme_states_is_the_trees(pattern: str, members: int) -> None:
    import ctxguard

    found = re.findall(pattern, README, flags=re.S)
    assert found, f"the README no longer says {pattern!r}: update this table"
    for groups in found:
        if members == 3:  # the family first, then its members
            parent, children = groups[0], groups[1:]
        else:
            *children, parent = groups
        for child in children:
            assert issubclass(getattr(ctxguard, child), getattr(ctxguard, parent)), (child, parent)


def test_every_command_states_its_exit_codes_in_its_help() -> None:
    """The README: "Exit codes are in each command's `--help`"."""
    from click.testing import CliRunner

    from ctxguard.cli import cli

    assert "Exit codes are in each command's `--help`" in README
    silent = [
        name
        for name in cli.commands
        if "Exit codes:" not in CliRunner().invoke(cli, [name, "--help"], terminal_width=200).output
    ]
    assert not silent, f"commands whose --help gives no exit codes: {silent}"


def test_every_hf_counter_the_readme_shows_is_a_local_path() -> None:
    """hf: loads a local tokenizer directory and never downloads: a hub name there
    (`hf:Qwen/...`) is refused, so the README shows paths only."""
    specs = re.findall(r"\bhf:([^\s`\"',)]+)", README)
    assert specs
    hub_names = [s for s in specs if not s.startswith(("/", "./", "~"))]
    assert not hub_names, f"the README shows hf: counters that are not local paths: {hub_names}"
