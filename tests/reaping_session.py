"""A test session for ``tests/test_reaping.py`` to terminate (not collected by the suite:
its name is not ``test_*``; that test runs it by name).

Its session fixture starts one of each server the suite starts in a process of its
own: a ``redis-server``, a private Redis Cluster by ``scripts/services.sh`` (six
daemons), and ``ctxguard serve`` with two uvicorn workers. The test writes every pid
they run as (with its start time) to ``$CTXGUARD_REAPING_OUT/pids``, then waits to be
killed; the fixture's teardown, if it runs, writes ``torn-down``.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from faults.servers import PrivateCluster, RedisServer
from reaper import start_time
from serve.processes import CliGateway

OUT = os.environ.get("CTXGUARD_REAPING_OUT", "")

Servers = tuple[RedisServer, PrivateCluster, CliGateway]


@pytest.fixture(scope="session")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    if not OUT:
        pytest.skip("run by tests/test_reaping.py")
    server = RedisServer(tmp_path_factory.mktemp("standalone")).start()
    cluster = PrivateCluster(tmp_path_factory.mktemp("cluster") / "state")
    gateway: CliGateway | None = None
    try:
        cluster.start()
        gateway = CliGateway(
            "--upstream", "http://127.0.0.1:9", "--url", "memory://reaping", "--workers", "2"
        )
        yield server, cluster, gateway
    finally:
        if gateway is not None:
            gateway.stop()
        cluster.stop()
        server.stop()
        (Path(OUT) / "torn-down").write_text("the fixture's teardown ran\n")


def _group(pgid: int) -> list[int]:
    out = subprocess.run(
        ["pgrep", "-g", str(pgid)], capture_output=True, text=True, timeout=10, check=False
    ).stdout
    return [int(pid) for pid in out.split()]


def test_wait_to_be_terminated(servers: Servers) -> None:
    server, cluster, gateway = servers
    assert server.proc is not None
    pids = [server.proc.pid]
    pids += [int(f.read_text()) for f in cluster.state.rglob("redis-*.pid")]
    pids += _group(gateway.proc.pid)  # the uvicorn supervisor and its workers
    lines = [f"{pid} {start_time(pid)}" for pid in pids]
    ready = Path(OUT) / "pids"
    ready.with_suffix(".tmp").write_text("\n".join(lines) + "\n")
    ready.with_suffix(".tmp").rename(ready)
    time.sleep(280)  # until terminated (pytest-timeout ends it at 300 s otherwise)
