"""A private Redis for a benchmark run: started on a free port, stopped at the end.

Benchmarks write and delete keys and, in profile_turn, change server settings; a
server the user did not name is never theirs to touch. Without ``--redis-url`` (or
``$CTXGUARD_BENCH_REDIS_URL``) a run starts ``redis-server`` here, with no
persistence, on a port the OS picked, and shuts it down when the run ends.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass

import redis


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class Server:
    url: str
    pid: int


@contextlib.contextmanager
def private_redis(
    *extra: str, wrapper: tuple[str, ...] = (), port: int | None = None
) -> Iterator[Server]:
    """A fresh ``redis-server`` (``wrapper`` runs it, e.g. under valgrind) on ``port`` (a
    free one when None): its URL and pid."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server is not on PATH: install Redis or pass --redis-url")
    port = port or _free_port()
    workdir = tempfile.mkdtemp(prefix="ctxguard-bench-redis-")
    command = [*wrapper, binary, "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
    command += ["--appendonly", "no", "--dir", workdir, *extra]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=1)
        deadline = time.monotonic() + (120 if wrapper else 15)
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"redis-server did not start on port {port}") from None
                time.sleep(0.1)
        client.close()
        yield Server(url, proc.pid)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(workdir, ignore_errors=True)


@contextlib.contextmanager
def bench_url(given: str | None) -> Iterator[str]:
    """The server a benchmark uses: the one named (flag or env), else a private one."""
    named = given or os.environ.get("CTXGUARD_BENCH_REDIS_URL")
    if named:
        yield named
        return
    with private_redis() as server:
        yield server.url
