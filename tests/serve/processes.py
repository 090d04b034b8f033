"""`ctxguard serve` as a child process (uvicorn with worker processes), for tests.

Like ``faults/servers.py``: the process is this test run's own, always stopped.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
from faults.servers import free_port

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
        )
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

    def stop(self) -> None:
        if self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        if self.proc.stderr is not None:
            self.proc.stderr.close()
