"""`ctxguard serve` as a child process (uvicorn with worker processes), for tests.

Like ``faults/servers.py``: the process is this test run's own, always stopped. Each
runs in a process group of its own (uvicorn's workers included), stopped whole; if the
test process dies first, its reaper stops the group (``tests/reaper.py``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
from faults.servers import free_port
from reaper import REAPER

ROOT = Path(__file__).resolve().parents[2]


class CliGateway:
    """``ctxguard serve`` in a child process (uvicorn with worker processes)."""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
        command = [sys.executable, "-c", "from ctxguard.cli import main; main()", "serve"]
        self.proc = subprocess.Popen(
            [*command, "--port", str(self.port), *args],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        REAPER.own(self.proc, group=True)
        deadline = time.monotonic() + 60
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ctxguard serve exited: {self.proc.stderr.read()!r}")  # type: ignore[union-attr]
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("ctxguard serve did not become healthy")
            time.sleep(0.1)

    def kill(self) -> None:
        """Die at once (SIGKILL): no shutdown, no cleanup, as a crashed host would."""
        self.proc.kill()
        self.proc.wait(10)
        _end_group(self.proc)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if self.proc.stderr is not None:
            self.proc.stderr.close()
        _end_group(self.proc)


class LiteLLMProxy:
    """LiteLLM's proxy (``litellm --config``) in a child process, with this checkout's
    ctxguard importable (for the guardrail). ``env`` is added to the environment."""

    def __init__(self, config: Path, env: dict[str, str]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = config.with_suffix(".log")
        child_env = {**os.environ, **env}
        child_env["PYTHONPATH"] = os.pathsep.join([str(ROOT), child_env.get("PYTHONPATH", "")])
        cli = Path(sys.executable).with_name("litellm")
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [
                    str(cli),
                    "--config",
                    str(config),
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(self.port),
                ],
                env=child_env,
                cwd=config.parent,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        REAPER.own(self.proc, group=True)
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(self.url + "/health/liveliness", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                tail = self.log.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"the LiteLLM proxy did not start:\n{tail}")
            time.sleep(0.5)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        _end_group(self.proc)


def _end_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL what is left of the process group ``proc`` led (a worker its leader did
    not take down), and tell the reaper it is done."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    REAPER.release(proc)
