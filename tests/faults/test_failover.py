"""A cluster primary fails over to its replica during traffic (CLUSTER FAILOVER).

Runs on a private cluster (the shared one keeps its topology for other tests).
Acknowledged messages survive, and the same store object follows the new
topology: later writes land on the promoted replica.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import defaultdict
from typing import Any

import pytest

from ctxguard.stores import WriteOptions, open_async_store, open_store

from .helpers import aappend_until_stored, append_until_stored, assert_once_in_order, new
from .servers import PrivateCluster

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.slow,
    pytest.mark.timeout(150),
    pytest.mark.destructive,
]
OPTS = WriteOptions(counter="c1")
PER_WRITER = 300


def _offset(cluster: PrivateCluster, port: int, field: str) -> int:
    client = cluster.node(port)
    try:
        return int(client.info("replication")[field])
    finally:
        client.close()


def fail_over(cluster: PrivateCluster, key: str) -> tuple[int, int]:
    """Promote the replica of ``key``'s primary once it has caught up; (old, new) ports."""
    primary, replicas = cluster.owners(key)
    replica = replicas[0]
    target = _offset(cluster, primary, "master_repl_offset")
    deadline = time.monotonic() + 10
    while _offset(cluster, replica, "slave_repl_offset") < target:
        assert time.monotonic() < deadline, "replica never caught up"
        time.sleep(0.01)
    client = cluster.node(replica)
    try:
        for _ in range(4):  # a manual failover that times out (5 s) may be asked again
            client.execute_command("CLUSTER", "FAILOVER")
            deadline = time.monotonic() + 8
            while client.info("replication")["role"] != "master":
                if time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            else:
                break
        assert client.info("replication")["role"] == "master", "failover did not complete"
    finally:
        client.close()
    cluster.wait_healthy()
    return primary, replica


def _llen_on(cluster: PrivateCluster, port: int, key: str) -> int:
    client = cluster.node(port)
    try:
        return int(client.llen(key))
    finally:
        client.close()


def test_sync_writers_survive_a_failover(private_cluster: PrivateCluster) -> None:
    store = open_store(private_cluster.url, namespace="fo-sync")
    session = "failover-sync"
    key = store.protocol.keys(session)[1]
    sent: dict[str, list[str]] = defaultdict(list)
    acked = threading.Semaphore(0)

    def writer(name: str) -> None:
        for i in range(PER_WRITER):
            message = new(f"{name} {i}", id=f"{name}-{i:04d}")
            append_until_stored(store, session, message)
            sent[name].append(message.message.id)
            acked.release()

    threads = [threading.Thread(target=writer, args=(f"w{n}",)) for n in range(3)]
    for t in threads:
        t.start()
    for _ in range(200):
        assert acked.acquire(timeout=30)
    old, promoted = fail_over(private_cluster, key)
    for t in threads:
        t.join(60)

    assert private_cluster.owners(key)[0] == promoted != old
    assert_once_in_order([m.message.id for m in store.read(session)], sent)
    assert _llen_on(private_cluster, promoted, key) == 3 * PER_WRITER
    store.close()


async def test_async_writers_survive_a_failover(private_cluster: PrivateCluster) -> None:
    store: Any = open_async_store(private_cluster.url, namespace="fo-async")
    session = "failover-async"
    key = store.protocol.keys(session)[1]
    sent: dict[str, list[str]] = defaultdict(list)
    acked = asyncio.Event()
    done = 0

    async def writer(name: str) -> None:
        nonlocal done
        for i in range(PER_WRITER):
            message = new(f"{name} {i}", id=f"{name}-{i:04d}")
            await aappend_until_stored(store, session, message)
            sent[name].append(message.message.id)
            done += 1
            if done >= 200:
                acked.set()

    tasks = [asyncio.create_task(writer(f"t{n}")) for n in range(3)]
    await asyncio.wait_for(acked.wait(), 30)
    old, promoted = await asyncio.to_thread(fail_over, private_cluster, key)
    await asyncio.wait_for(asyncio.gather(*tasks), 60)

    assert private_cluster.owners(key)[0] == promoted != old
    assert_once_in_order([m.message.id for m in await store.read(session)], sent)
    assert _llen_on(private_cluster, promoted, key) == 3 * PER_WRITER
    await store.close()
