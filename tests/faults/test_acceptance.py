"""Acceptance: 16 writers x 1,000 messages on ONE session, a connection killed every 100 ops.

Writers are threads sharing one sync store (one connection pool); a separate
raw client kills one of their connections (CLIENT KILL ID) after every 100
acknowledged appends. Readers poll the session meanwhile. Afterwards: 0 lost,
0 duplicated, each writer's order kept, and every reader saw a prefix of the
one final order.
"""

from __future__ import annotations

import random
import threading
from collections import defaultdict
from typing import Any

import pytest
import redis

from ctxguard.stores import WriteOptions, open_store

from .helpers import RecordingPolicy, append_until_stored, assert_once_in_order, new
from .servers import PrivateCluster, RedisServer

pytestmark = [
    pytest.mark.redis,
    pytest.mark.slow,
    pytest.mark.timeout(240),
    pytest.mark.destructive,
]
WRITERS = 16
PER_WRITER = 1000
KILL_EVERY = 100
SESSION = "acceptance"
OPTS = WriteOptions(counter="c1")


class Killer:
    """Kills one random store connection (never its own) each time it is poked."""

    def __init__(self, admin: redis.Redis) -> None:
        self.admin = admin
        self.my_id = int(admin.client_id())
        self.kills = 0
        self.lock = threading.Lock()

    def kill_one(self) -> None:
        with self.lock:
            victims = [
                int(c["id"])
                for c in self.admin.client_list(_type="normal")
                if int(c["id"]) != self.my_id and c.get("name") == "ctxg-writer"
            ]
            if victims:
                self.admin.execute_command("CLIENT", "KILL", "ID", random.choice(victims))
                self.kills += 1


def _run(url: str, admin: redis.Redis) -> None:
    policy = RecordingPolicy()
    named = url + ("&" if "?" in url else "?") + "client_name=ctxg-writer"
    store: Any = open_store(named, namespace="accept", retry=policy)
    reader_store: Any = open_store(url, namespace="accept")
    killer = Killer(admin)
    sent: dict[str, list[str]] = defaultdict(list)
    acked = 0
    acked_lock = threading.Lock()
    done = threading.Event()
    snapshots: list[list[str]] = []
    errors: list[BaseException] = []

    def writer(name: str) -> None:
        nonlocal acked
        try:
            for i in range(PER_WRITER):
                message = new(f"{name} says {i}", id=f"{name}-{i:05d}")
                append_until_stored(store, SESSION, message)
                sent[name].append(message.message.id)
                with acked_lock:
                    acked += 1
                    kill = acked % KILL_EVERY == 0
                if kill:
                    killer.kill_one()
        except BaseException as exc:
            errors.append(exc)

    def reader() -> None:
        while not done.wait(0.3):
            snapshots.append([m.message.id for m in reader_store.read(SESSION)])

    threads = [threading.Thread(target=writer, args=(f"w{n:02d}",)) for n in range(WRITERS)]
    watcher = threading.Thread(target=reader)
    watcher.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join(200)
    done.set()
    watcher.join(30)

    assert not errors, errors[:3]
    final = [m.message.id for m in store.read(SESSION)]
    assert len(final) == WRITERS * PER_WRITER
    assert_once_in_order(final, sent)  # 0 lost, 0 duplicated, each writer's order
    for snapshot in snapshots:  # one order for every reader
        assert snapshot == final[: len(snapshot)]
    other = [m.message.id for m in reader_store.read(SESSION)]
    assert other == final
    assert killer.kills >= WRITERS * PER_WRITER // KILL_EVERY - 1
    assert policy.used, "no append ever had to be retried: the kills did not bite"
    store.close()
    reader_store.close()


def test_sixteen_writers_one_session_with_kills(private_redis: RedisServer) -> None:
    admin = private_redis.client()
    try:
        _run(private_redis.url, admin)
    finally:
        admin.close()


@pytest.mark.cluster
def test_sixteen_writers_one_session_with_kills_on_cluster(
    private_cluster: PrivateCluster,
) -> None:
    from ctxguard.stores.keys import KeySpace

    key = KeySpace("accept").session_keys(SESSION)[1]
    primary, _ = private_cluster.owners(key)
    admin = private_cluster.node(primary)
    try:
        _run(private_cluster.url, admin)
    finally:
        admin.close()
