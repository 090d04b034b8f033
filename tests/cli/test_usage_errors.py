"""A bad option, a missing argument or an unknown command is exit 2 with ONE line on
stderr (the README: "a bad argument or file is exit 2 with one line"), naming what was
wrong and the --help to read; click's own answer was four lines (usage, hint, blank,
error)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from ctxguard.cli import cli

CASES = [
    (["replay", "s1", "--limit", "abc"], "'--limit'", "replay --help"),
    (["show"], "Missing argument 'SESSION'", "show --help"),
    (["sessions", "--bogus"], "No such option '--bogus'", "sessions --help"),
    (["audit", "--max-drift", "x"], "'--max-drift'", "audit --help"),
    (["kv", "Qwen/Qwen3-8B", "--tp", "two"], "'--tp'", "kv --help"),
    (["nosuchcmd"], "No such command 'nosuchcmd'", "ctxguard --help"),
    (["--bogus"], "No such option '--bogus'", "ctxguard --help"),
]


@pytest.mark.parametrize(("args", "cause", "hint"), CASES, ids=[" ".join(c[0]) for c in CASES])
def test_a_usage_error_is_exit_2_in_one_line(args: list[str], cause: str, hint: str) -> None:
    result = CliRunner().invoke(
        cli, args, prog_name="ctxguard", env={"CTXGUARD_URL": "memory://usage"}
    )
    assert result.exit_code == 2, (result.exit_code, result.output)
    err = result.stderr
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert cause in err and hint in err, err
    assert result.stdout == ""


def test_no_command_still_shows_the_help() -> None:
    result = CliRunner().invoke(cli, [], prog_name="ctxguard")
    assert "Commands:" in result.output and "sessions" in result.output
