"""Ctrl-C, a closed pipe and a stdout that cannot be written: each ends a command with
its own exit code and at most one line on stderr, never a traceback.

(click said ``Aborted!`` and exited 1 on Ctrl-C, rich exited 1 on a closed pipe: 1 is
this CLI's "audit violation found"; a full stdout was a traceback.) These run the real
``python -m ctxguard`` in a child process, as a shell runs it.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from typing import Any

import pytest

from ctxguard.cli.common import EXIT_BAD_INPUT, EXIT_INTERRUPTED, EXIT_PIPE_CLOSED
from tests.conftest import private_memory_url

# it signals its own child process only, but the suite's rule marks every module that signals
pytestmark = pytest.mark.destructive

COMMAND = [sys.executable, "-m", "ctxguard"]


def _child(args: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [*COMMAND, *args],
        stderr=subprocess.PIPE,
        # a shell's background job ignores SIGINT; this child takes it as a terminal would
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        **kwargs,
    )


def _one_error_line(stderr: bytes) -> str:
    text = stderr.decode()
    assert "Traceback" not in text and "Aborted!" not in text, text
    assert text.startswith("error: ") and text.count("\n") == 1, text
    return text


@pytest.mark.parametrize(
    "args",
    [["sessions"], ["show", "chat-1"], ["import", "-"], ["delete", "chat-1", "--yes"]],
    ids=lambda a: a[0],
)
def test_ctrl_c_while_the_store_does_not_answer_exits_130_in_one_line(args: list[str]) -> None:
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts, never answers
        silent.settimeout(60)
        url = f"redis://:pw-never-shown@127.0.0.1:{silent.getsockname()[1]}/0"
        stdin = b'{"messages": [{"role": "user", "content": "hi"}]}\n'
        child = _child([*args, "--url", url], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert child.stdin is not None
        child.stdin.write(stdin)
        child.stdin.close()
        child.stdin = None  # written and closed: nothing for communicate() to send
        conn, _ = silent.accept()  # the command is now waiting on the store
        with conn:
            child.send_signal(signal.SIGINT)
            out, err = child.communicate(timeout=60)
    assert child.returncode == EXIT_INTERRUPTED, err
    text = _one_error_line(err)
    assert "interrupted" in text and "pw-never-shown" not in text
    assert out == b""


def test_a_reader_that_closed_the_pipe_ends_the_command_quietly_with_141() -> None:
    """(``ctxguard kv --list-models | head -1`` exited 1.)"""
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the command writes anything
    try:
        child = _child(["kv", "--list-models"], stdout=write_end)
    finally:
        os.close(write_end)
    _, err = child.communicate(timeout=60)
    assert child.returncode == EXIT_PIPE_CLOSED, err
    assert err == b""


@pytest.mark.parametrize(
    "args",
    [
        ["sessions", "--json"],
        ["sessions"],
        ["export", "--all", "--out", "-"],
        ["kv", "--list-models"],
        ["show", "--help"],
        ["--help"],
    ],
    ids=" ".join,
)
def test_a_full_stdout_is_one_line_and_exit_2(args: list[str]) -> None:
    """(Each was an OSError traceback: No space left on device.)"""
    env = {**os.environ, "CTXGUARD_URL": private_memory_url()}
    with open("/dev/full", "wb") as full:
        child = _child(args, stdout=full, env=env)
        _, err = child.communicate(timeout=60)
    assert child.returncode == EXIT_BAD_INPUT, err
    text = _one_error_line(err)
    assert "cannot write to stdout (No space left on device)" in text
