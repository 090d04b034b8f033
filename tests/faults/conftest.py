"""Fixtures that start private servers (never the shared ones) and always stop them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .servers import PrivateCluster, RedisServer


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A private redis-server with an append-only file synced on every write."""
    server = RedisServer(
        tmp_path / "redis",
        ["--appendonly", "yes", "--appendfsync", "always", "--enable-debug-command", "yes"],
    ).start()
    yield server
    server.stop(kill=True)


@pytest.fixture(scope="session")
def private_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateCluster]:
    """A cluster of our own that tests may fail over, kill connections on, etc."""
    cluster = PrivateCluster(tmp_path_factory.mktemp("cluster") / "state")
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
