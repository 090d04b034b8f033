"""serve: an address it cannot listen on, and a --config file it cannot use, are one
line and exit 2 before anything starts.

(uvicorn logged ``ERROR: [Errno 98] error while attempting to bind ...`` among its INFO
lines, ran the app's startup and shutdown, and exited 3: this CLI's "store failed".)
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from click.testing import CliRunner

from ctxguard.cli import cli
from tests.conftest import private_memory_url

pytest.importorskip("uvicorn")


def _serve(*args: str) -> tuple[int, str, str]:
    base = ["serve", "--upstream", "http://127.0.0.1:1", "--limit", "100"]
    result = CliRunner().invoke(cli, [*base, "--url", private_memory_url(), *args])
    return result.exit_code, result.stdout, result.stderr


def _one_line(stderr: str, *parts: str) -> None:
    assert stderr.startswith("error: cannot listen on ") and stderr.count("\n") == 1, stderr
    assert "--port" in stderr and "--host" in stderr
    for part in parts:
        assert part in stderr, stderr


def test_a_port_something_else_listens_on_is_exit_2_in_one_line() -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        code, out, err = _serve("--host", "127.0.0.1", "--port", str(port))
    assert code == 2, err
    assert out == ""
    _one_line(err, f"127.0.0.1:{port}", "Address already in use")


@pytest.mark.parametrize("host", ["192.0.2.1", "fe80::dead:1"])  # documentation addresses
def test_a_host_that_is_no_address_of_this_machine_is_exit_2_in_one_line(host: str) -> None:
    code, out, err = _serve("--host", host, "--port", "1")
    assert code == 2, err
    assert out == ""
    _one_line(err, host)


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("x = " + "[" * 5000 + "]" * 5000 + "\n", "nested too deeply to read"),
        ("x = " + "{a=" * 3000 + "1" + "}" * 3000 + "\n", "nested too deeply to read"),
        ("# " + "x" * (1 << 20) + "\n", "is over 1 MiB"),
    ],
    ids=["arrays", "inline tables", "2 MiB"],
)
def test_a_config_file_it_cannot_use_is_exit_2_in_one_line(
    tmp_path: Path, text: str, said: str
) -> None:
    """(Deep nesting was a RecursionError traceback; --config /dev/zero was read until
    memory ran out.)"""
    path = tmp_path / "gateway.toml"
    path.write_text(text)
    # (an address it cannot listen on: were the file taken, serve would stop there)
    code, out, err = _serve("--config", str(path), "--host", "192.0.2.1")
    assert code == 2, err
    assert out == ""
    assert err.startswith("error: ConfigError: config file ") and err.count("\n") == 1, err
    assert said in err
