"""The suite's own ground rules: tests never run a destructive command on a server
they did not start, and ``scripts/services.sh`` never picks up a server by chance.

* every test module that sends a destructive command (SCRIPT FLUSH, FLUSHALL,
  CONFIG SET, DEBUG, SHUTDOWN, CLIENT KILL/PAUSE, FAILOVER, kill signals) is
  marked ``destructive``;
* a destructive test asking for a server the user named is refused
  (``shared_servers_refused``), and the real ones leave such a server untouched;
* ``services.sh start`` with nothing named never talks to 6379, and says which
  servers it started (``CTXGUARD_TEST_*_PRIVATE``); no test connects to this host's port
  6379 unless a ``CTXGUARD_TEST_*_URL`` names it (``refuse_port_6379``), and one that
  tries fails;
* an exception in a thread a test started, or in a ``__del__``, fails the test;
* a test opens an in-process store of its own: no plain ``"memory://"`` (one store per
  process) outside the tests of what that URL means, no fixed ``memory://<name>`` in two
  tests.
"""

from __future__ import annotations

import ast
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import (
    DESTRUCTIVE,
    FOREIGN_CONNECTS,
    FOREIGN_PORT,
    guard_connect,
    shared_servers_refused,
)
from faults.servers import RedisServer

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
SERVICES = ROOT / "scripts" / "services.sh"

# redis-py methods and raw commands that change a server's global state.
DESTRUCTIVE_METHODS = {
    "script_flush", "flushall", "flushdb", "config_set", "config_resetstat", "config_rewrite",
    "debug_sleep", "debug_object", "debug_segfault", "shutdown", "client_kill",
    "client_kill_filter", "client_pause", "client_unpause", "cluster_failover", "cluster_reset",
    "failover", "replicaof", "slaveof", "send_signal", "kill",
}  # fmt: skip
DESTRUCTIVE_COMMANDS = {
    ("SCRIPT", "FLUSH"), ("CONFIG", "SET"), ("CONFIG", "RESETSTAT"), ("CONFIG", "REWRITE"),
    ("CLIENT", "KILL"), ("CLIENT", "PAUSE"), ("CLUSTER", "FAILOVER"), ("CLUSTER", "RESET"),
    ("FLUSHALL",), ("FLUSHDB",), ("DEBUG",), ("SHUTDOWN",), ("FAILOVER",), ("REPLICAOF",),
    ("SLAVEOF",),
}  # fmt: skip
# Signals that stop or kill a process.
KILL_SIGNALS = {"SIGKILL", "SIGTERM", "SIGSTOP", "SIGINT"}


def _command_words(call: ast.Call) -> tuple[str, ...]:
    """The leading command words of execute_command("CLIENT", "KILL", ...) or ("CLIENT KILL")."""
    words: list[str] = []
    for arg in call.args:
        if not (isinstance(arg, ast.Constant) and isinstance(arg.value, str)):
            break
        words += arg.value.upper().split()
    return tuple(words)


def destructive_uses(tree: ast.AST, helpers: Collection[str] = ()) -> list[str]:
    """Every destructive command a module's code sends (docstrings and comments ignored)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in KILL_SIGNALS:
            found.append(f"line {node.lineno}: signal.{node.attr}")
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if name in DESTRUCTIVE_METHODS:
            found.append(f"line {node.lineno}: {name}()")
        elif name in helpers:
            found.append(f"line {node.lineno}: {name}() (a destructive helper)")
        elif name == "execute_command":
            words = _command_words(node)
            if any(words[: len(c)] == c for c in DESTRUCTIVE_COMMANDS):
                found.append(f"line {node.lineno}: {' '.join(words[:2])}")
    return found


def _destructive_helpers() -> set[str]:
    """Module-level functions of the tests' helper modules that send destructive commands."""
    names = set()
    for path in TESTS.rglob("*.py"):
        if path.name.startswith("test_") or path.name == "conftest.py":
            continue
        tree = ast.parse(path.read_text(), str(path))
        for node in tree.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and destructive_uses(node):
                names.add(node.name)
    return names


def _marked_destructive(tree: ast.Module) -> bool:
    return any(
        isinstance(node, ast.Attribute) and node.attr == DESTRUCTIVE for node in ast.walk(tree)
    )


def test_the_scan_sees_every_form_of_a_destructive_command() -> None:
    source = """
client.script_flush()
admin.execute_command("CLIENT", "KILL", "ID", 3)
admin.execute_command("CONFIG SET", "maxmemory", 1)
admin.execute_command("DEBUG", "SLEEP", 1)
proc.send_signal(signal.SIGKILL)
client.execute_command("GET", "k")
"""
    uses = destructive_uses(ast.parse(source))
    assert {u.split(": ", 1)[1] for u in uses} == {
        "script_flush()",
        "CLIENT KILL",
        "CONFIG SET",
        "DEBUG SLEEP",
        "send_signal()",
        "signal.SIGKILL",
    }


def test_every_module_sending_destructive_commands_is_marked_destructive() -> None:
    helpers = _destructive_helpers()
    assert {"kill_blocked", "run_killed"} <= helpers  # the scan finds the fault helpers
    unmarked = {}
    for path in sorted(TESTS.rglob("test_*.py")):
        if path == Path(__file__).resolve():
            continue  # this module only names the commands
        tree = ast.parse(path.read_text(), str(path))
        uses = destructive_uses(tree, helpers)
        if uses and not _marked_destructive(tree):
            unmarked[str(path.relative_to(ROOT))] = uses
    assert not unmarked, f"mark these with pytest.mark.{DESTRUCTIVE}: {unmarked}"


@pytest.mark.parametrize(
    ("markers", "fixtures", "env", "refused"),
    [
        ({"redis"}, {"redis_url", "cluster_url"}, {}, []),
        ({DESTRUCTIVE}, {"scratch_redis_url"}, {}, []),
        ({DESTRUCTIVE}, {"redis_url"}, {}, ["redis_url"]),
        ({DESTRUCTIVE}, {"redis_url"}, {"CTXGUARD_TEST_REDIS_PRIVATE": "0"}, ["redis_url"]),
        ({DESTRUCTIVE}, {"redis_url"}, {"CTXGUARD_TEST_REDIS_PRIVATE": "1"}, []),
        (
            {DESTRUCTIVE},
            {"redis_url", "cluster_url"},
            {"CTXGUARD_TEST_REDIS_PRIVATE": "1"},
            ["cluster_url"],
        ),
        ({DESTRUCTIVE}, {"cluster_url"}, {"CTXGUARD_TEST_CLUSTER_PRIVATE": "1"}, []),
    ],
)
def test_destructive_tests_get_only_servers_this_run_started(
    markers: set[str], fixtures: set[str], env: dict[str, str], refused: list[str]
) -> None:
    assert shared_servers_refused(markers, fixtures, env) == refused


def _test_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CTXGUARD_TEST_")}
    env.update(extra)
    return env


@pytest.fixture
def named_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A server "the user named": the tests must leave its global state alone."""
    server = RedisServer(tmp_path / "named").start()
    yield server
    server.stop()


@pytest.mark.redis
@pytest.mark.timeout(180)
def test_destructive_tests_leave_a_server_the_user_named_untouched(
    named_server: RedisServer, tmp_path: Path
) -> None:
    client = named_server.client()
    try:
        sha = client.script_load("return 'a script of the user'")
        client.config_set("maxmemory-policy", "allkeys-lru")
        inner = subprocess.run(
            [
                sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                "tests/stores/test_direct_evalsha.py",
            ],
            cwd=ROOT,
            env=_test_env(CTXGUARD_TEST_REDIS_URL=named_server.url),
            capture_output=True,
            text=True,
            timeout=150,
            check=False,
        )  # fmt: skip
        assert inner.returncode == 0, inner.stdout[-3000:] + inner.stderr[-2000:]
        assert "passed" in inner.stdout  # they ran, on a server of their own
        assert client.script_exists(sha) == [True], "a test flushed the user's script cache"
        assert client.config_get("maxmemory-policy") == {"maxmemory-policy": "allkeys-lru"}
    finally:
        client.close()


def _fake_redis_cli(bin_dir: Path, calls: Path) -> None:
    """A redis-cli that logs its arguments, then runs the real one."""
    real = shutil.which("redis-cli")
    if real is None:
        pytest.skip("redis-cli is not installed")
    bin_dir.mkdir()
    fake = bin_dir / "redis-cli"
    fake.write_text(f'#!/bin/sh\necho "$*" >> {shlex.quote(str(calls))}\nexec {real} "$@"\n')
    fake.chmod(0o755)


def _services(args: list[str], env: dict[str, str]) -> dict[str, str]:
    out = subprocess.run(
        ["bash", str(SERVICES), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    exports = {}
    for line in out.splitlines():
        name, _, value = line.removeprefix("export ").partition("=")
        exports[name] = shlex.split(value)[0]
    return exports


@pytest.mark.redis
@pytest.mark.timeout(120)
def test_services_start_private_servers_and_never_probe_6379(
    named_server: RedisServer, tmp_path: Path
) -> None:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    calls = tmp_path / "calls.log"
    _fake_redis_cli(tmp_path / "bin", calls)
    env = _test_env(PATH=f"{tmp_path / 'bin'}:{os.environ['PATH']}", PYTHON=sys.executable)
    state = tmp_path / "state"

    started = _services(["start", str(state), "standalone"], env)
    try:
        assert "6379" not in calls.read_text(), "services.sh talked to 127.0.0.1:6379"
        port = int(started["CTXGUARD_TEST_REDIS_URL"].rsplit(":", 1)[1].split("/")[0])
        assert port != 6379
        assert started["CTXGUARD_TEST_REDIS_PRIVATE"] == "1"
        assert "CTXGUARD_TEST_CLUSTER_URL" not in started  # only what was asked for
    finally:
        subprocess.run(["bash", str(SERVICES), "stop", str(state)], env=env, timeout=60)

    # A server the user names is reused, said to be shared, and never stopped.
    env["CTXGUARD_TEST_REDIS_URL"] = named_server.url
    reused = _services(["start", str(state), "standalone"], env)
    subprocess.run(["bash", str(SERVICES), "stop", str(state)], env=env, timeout=60)
    assert reused == {
        "CTXGUARD_TEST_REDIS_URL": named_server.url,
        "CTXGUARD_TEST_REDIS_PRIVATE": "0",
    }
    client = named_server.client()
    try:
        assert client.ping()
    finally:
        client.close()


class _Sock:
    family = socket.AF_INET


@pytest.mark.parametrize(
    "address", [("127.0.0.1", 6379), ("localhost", 6379), ("::1", 6379), ("0.0.0.0", 6379)]
)
def test_a_connection_to_this_hosts_port_6379_is_refused(address: tuple[str, int]) -> None:
    reached: list[Any] = []
    guarded = guard_connect(lambda sock, addr: reached.append(addr))
    seen = len(FOREIGN_CONNECTS)
    try:
        with pytest.raises(ConnectionRefusedError, match="tests never connect to"):
            guarded(_Sock(), address)
        assert FOREIGN_CONNECTS[seen:] == [(address[0], FOREIGN_PORT)]
    finally:
        del FOREIGN_CONNECTS[seen:]  # refused on purpose: not this test's failure
    assert reached == []
    guarded(_Sock(), ("127.0.0.1", 6380))  # any other port, or another host's 6379
    guarded(_Sock(), ("10.1.2.3", 6379))
    assert reached == [("127.0.0.1", 6380), ("10.1.2.3", 6379)]


def test_this_test_process_refuses_port_6379() -> None:
    named = any(
        k.startswith("CTXGUARD_TEST_") and k.endswith("_URL") and f":{FOREIGN_PORT}" in v
        for k, v in os.environ.items()
    )
    if named:
        pytest.skip("a CTXGUARD_TEST_*_URL names port 6379: the user's server")
    assert getattr(socket.socket.connect, "refuses_6379", False)


INNER_6379 = """
import socket
import pytest
import redis

def test_default_client():
    # without the guard this test would reach port 6379: it stops here instead
    assert getattr(socket.socket.connect, "refuses_6379", False), "no guard: not connecting"
    with pytest.raises(redis.ConnectionError):
        redis.Redis(socket_connect_timeout=1).ping()  # localhost:6379, redis-py's default
"""


@pytest.mark.timeout(120)
def test_a_test_that_tries_port_6379_fails(tmp_path: Path) -> None:
    inner = tmp_path / "test_inner.py"
    inner.write_text(INNER_6379)
    run = subprocess.run(
        [
            sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", os.devnull,
            "--rootdir", str(tmp_path), "-p", "conftest", str(inner),
        ],
        cwd=tmp_path,
        env=_test_env(PYTHONPATH=os.pathsep.join([str(ROOT), str(TESTS)])),
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )  # fmt: skip
    assert "1 passed, 1 error" in run.stdout, run.stdout[-3000:] + run.stderr[-2000:]
    assert f":{FOREIGN_PORT}, a server it did not start" in run.stdout


def test_the_hypothesis_scale_scales_a_parametrized_test_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``CTXGUARD_HYPOTHESIS_SCALE=3`` gives a property test 3x its examples, also
    when it is parametrized: its items share one function, which must be scaled once,
    not once per item (that multiplied a 40-example test with 50 parameters past any
    budget, and ran the larger-budget run out of time)."""
    import conftest
    from hypothesis import given, settings
    from hypothesis import strategies as st

    @settings(max_examples=40)
    @given(st.integers())
    def prop(x: int) -> None:
        pass

    class Item:  # what the hook reads of a pytest item: the test function
        def __init__(self) -> None:
            self.obj = prop

    monkeypatch.setattr(conftest, "HYPOTHESIS_SCALE", 3.0)
    items: list[Any] = [Item() for _ in range(5)]  # five parameters of one test
    conftest.pytest_collection_modifyitems(None, items)  # type: ignore[arg-type]
    got = prop._hypothesis_internal_use_settings  # type: ignore[attr-defined]
    assert got.max_examples == 120
    assert got.deadline is None


PLANTED = """
import threading


def test_a_thread_it_started_dies() -> None:
    worker = threading.Thread(target=lambda: 1 / 0)
    worker.start()
    worker.join()


class Dying:
    def __del__(self) -> None:
        raise RuntimeError("raised where nothing can catch it")


def test_an_exception_nothing_can_catch() -> None:
    Dying()


def test_a_quiet_thread() -> None:
    worker = threading.Thread(target=lambda: None)
    worker.start()
    worker.join()
"""


def test_an_exception_in_a_thread_or_a_del_fails_the_test(tmp_path: Path) -> None:
    """The suite's settings (pyproject's ``filterwarnings``) make an exception in a
    thread a test started, or one raised in a ``__del__``, fail that test: pytest
    would only warn, and a background worker dying mid-test would pass unseen."""
    planted = tmp_path / "test_planted.py"
    planted.write_text(PLANTED)
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    command += ["-p", "no:randomly", "-c", str(ROOT / "pyproject.toml"), str(planted)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    out = done.stdout
    assert done.returncode == 1, out
    assert "FAILED" in out and "test_a_thread_it_started_dies" in out, out
    assert "test_an_exception_nothing_can_catch" in out, out
    assert "2 failed, 1 passed" in out, out


# -- memory:// is one store per process ------------------------------------------------

# ``memory://`` with no name is ONE store per process: tests that opened it with fixed
# session ids ("s", "s1") saw each other's sessions in some orders (a CI run read 3 audit
# records where 2 were written). A test opens ``conftest.private_memory_url()``
# (``memory://<uuid4 hex>``) or ``f"memory://{namespace}"``. Allowed, by module and test
# function, only where the plain URL itself is what is tested:
SHARED_MEMORY_ALLOWED = {
    # what open_store makes of the URL with no name; names refused before a store is made
    "tests/stores/test_urls.py": {
        "test_bad_namespace_or_tenant_is_refused",
        "test_scheme_table_and_query_options",
    },
    # the CLI's default store, on a fresh map of in-process stores (monkeypatched)
    "tests/cli/test_findings.py": {
        "test_without_url_the_cli_says_it_looks_at_an_empty_in_process_store"
    },
    # the gateway on the process's shared store, whose stateless requests it must not see
    "tests/serve/test_stateless_store.py": {
        "test_a_stateless_session_is_in_no_store_a_client_can_open"
    },
}
_PLAIN_MEMORY = re.compile(r"memory://(\?.*)?", re.IGNORECASE | re.DOTALL)  # no name
_NAMED_MEMORY = re.compile(r"memory://([^?{}]+)(\?.*)?", re.IGNORECASE | re.DOTALL)
_TEXT_TESTS = {"startswith", "endswith", "removeprefix", "removesuffix"}


def _parents(tree: ast.AST) -> dict[ast.AST, ast.AST]:
    return {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}


def _test_of(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> str:
    """The outermost function holding ``node`` (its decorators too), or "<module>"."""
    name = "<module>"
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            name = node.name
    return name


def _only_compared(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    """``url.startswith("memory://")``, ``"memory://" in text``: text looked at, no store."""
    parent = parents.get(node)
    if isinstance(parent, ast.Call) and node in parent.args:
        return isinstance(parent.func, ast.Attribute) and parent.func.attr in _TEXT_TESTS
    return (
        isinstance(parent, ast.Compare)
        and parent.left is node
        and all(isinstance(op, ast.In | ast.NotIn) for op in parent.ops)
    )


def memory_urls(tree: ast.AST) -> tuple[list[tuple[int, str]], list[tuple[int, str, str]]]:
    """A module's plain memory:// URLs as (line, test), and its fixed memory://<name> URLs
    as (line, test, name); f"memory://{...}" is named, f"memory://?{...}" is plain."""
    parents = _parents(tree)
    plain: list[tuple[int, str]] = []
    named: list[tuple[int, str, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            first = node.values[0] if node.values else None
            text = first.value if isinstance(first, ast.Constant) else ""
            if isinstance(text, str) and text.lower().startswith("memory://?"):
                plain.append((node.lineno, _test_of(node, parents)))
            continue
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
            continue
        if isinstance(parents.get(node), ast.JoinedStr) or _only_compared(node, parents):
            continue
        if _PLAIN_MEMORY.fullmatch(node.value):
            plain.append((node.lineno, _test_of(node, parents)))
        elif match := _NAMED_MEMORY.fullmatch(node.value):
            named.append((node.lineno, _test_of(node, parents), match[1]))
    return plain, named


def test_the_scan_sees_every_form_of_a_plain_memory_url() -> None:
    source = """
STORE = "memory://"
def test_a():
    Guard("memory://", limit=1)
    open_store(f"memory://?namespace={ns}")
    open_store("memory://?tenant=t")
    Guard(f"memory://{uuid.uuid4().hex}")  # named
    Guard(f"memory://{namespace}")  # named
    Guard("memory://fixed")
    assert url.startswith("memory://") and "memory://" in text  # no store opened
@pytest.mark.parametrize("url", ["memory://", "redis://h:1/0"])
def test_b(url):
    Guard("memory://fixed")
"""
    plain, named = memory_urls(ast.parse(source))
    assert plain == [(2, "<module>"), (4, "test_a"), (5, "test_a"), (6, "test_a"), (11, "test_b")]
    assert named == [(9, "test_a", "fixed"), (13, "test_b", "fixed")]


def test_every_test_opens_an_in_process_store_of_its_own() -> None:
    plain = []
    by_name: dict[str, dict[str, list[int]]] = {}  # name -> "module (test)" -> lines
    for path in sorted(TESTS.rglob("*.py")):
        if path == Path(__file__).resolve():
            continue  # this module only names the URLs
        module = str(path.relative_to(ROOT))
        found, named = memory_urls(ast.parse(path.read_text(), str(path)))
        allowed = SHARED_MEMORY_ALLOWED.get(module, set())
        plain += [f"{module}:{line} ({test})" for line, test in found if test not in allowed]
        for line, test, name in named:
            by_name.setdefault(name, {}).setdefault(f"{module} ({test})", []).append(line)
    assert not plain, (
        "memory:// with no name is one store per process, seen by every test: use "
        f"conftest.private_memory_url() (or add the test to SHARED_MEMORY_ALLOWED): {plain}"
    )
    shared = {name: tests for name, tests in by_name.items() if len(tests) > 1}
    assert not shared, f"one memory://<name> in several tests is one store: {shared}"
