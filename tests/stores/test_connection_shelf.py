"""The plain-Redis stores keep their script connections on a shelf, not in redis-py's pool
(``redis_clients.ConnectionShelf``): a connection the server closed meanwhile is
reconnected before it is used (so even a call that is never retried goes through),
threads sharing a store each get their own, and the script calls share the pool's
connections (and its ``max_connections``) with the store's other calls.

CLIENT KILL closes connections of the whole server: these run only on a server this
test run started (``scratch_redis_url``)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import pytest

from ctxguard.messages import Message
from ctxguard.stores import NewMessage, WriteOptions, open_async_store, open_store
from tests.conftest import raw_client

pytestmark = [pytest.mark.redis, pytest.mark.destructive]
OPTIONS = WriteOptions(counter="c")


def new(text: str) -> NewMessage:
    return NewMessage(Message(role="user", content=text), 2)


def test_a_connection_the_server_closed_is_reconnected_before_a_call_not_retried(
    scratch_redis_url: str, namespace: str, purge_after: Callable[[str], None]
) -> None:
    purge_after(scratch_redis_url)
    store = open_store(scratch_redis_url, namespace=namespace)
    client = raw_client(scratch_redis_url)
    try:
        store.append("s", [new("a"), new("b")], OPTIONS)
        assert client.client_kill_filter(_type="normal", skipme=True) >= 1
        # retract is never retried: a send on the dead socket would raise
        removed = store.retract("s", 1)
        assert [m.message.text for m in removed] == ["b"]
        assert [m.message.text for m in store.read("s")] == ["a"]
    finally:
        client.close()
        store.close()


def test_threads_sharing_a_store_each_use_their_own_connection(
    scratch_redis_url: str, namespace: str, purge_after: Callable[[str], None]
) -> None:
    purge_after(scratch_redis_url)
    store = open_store(scratch_redis_url, namespace=namespace)
    errors: list[BaseException] = []

    def writer(n: int) -> None:
        try:
            for i in range(30):
                result = store.append(f"t{n}", [new(f"{n}-{i}")], OPTIONS)
                assert result.message_count == i + 1
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(8)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        for n in range(8):
            assert [m.message.text for m in store.read(f"t{n}")] == [f"{n}-{i}" for i in range(30)]
        pool = store.client.connection_pool  # type: ignore[attr-defined]
        assert not pool._in_use_connections  # every one given back, to the pool's idle list
        assert 1 <= len(pool._available_connections) <= 8
    finally:
        store.close()


async def test_async_connection_the_server_closed_is_reconnected(
    scratch_redis_url: str, namespace: str, purge_after: Callable[[str], None]
) -> None:
    purge_after(scratch_redis_url)
    store = open_async_store(scratch_redis_url, namespace=namespace)
    client = raw_client(scratch_redis_url)
    try:
        await store.append("s", [new("a"), new("b")], OPTIONS)
        assert client.client_kill_filter(_type="normal", skipme=True) >= 1
        await asyncio.sleep(0.05)  # the loop sees the server's close while the connection idles
        removed = await store.retract("s", 1)
        assert [m.message.text for m in removed] == ["b"]
    finally:
        client.close()
        await store.close()


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_script_calls_share_the_pools_connections_with_the_other_calls(
    scratch_redis_url: str, namespace: str, purge_after: Callable[[str], None], kind: str
) -> None:
    purge_after(scratch_redis_url)
    url = scratch_redis_url + "?max_connections=1"  # one connection for everything
    if kind == "sync":
        store = open_store(url, namespace=namespace)
        for i in range(3):
            store.append("s", [new(f"m{i}")], OPTIONS)  # a script call
            info = store.info("s")  # a pipeline, through the pool
            assert info is not None and info.message_count == i + 1
        assert store.get_summary("s") is None
        store.close()
        return

    async def run() -> None:
        astore = open_async_store(url, namespace=namespace)
        for i in range(3):
            await astore.append("s", [new(f"m{i}")], OPTIONS)
            info = await astore.info("s")
            assert info is not None and info.message_count == i + 1
        await astore.close()

    asyncio.run(run())


def test_a_pool_laid_out_otherwise_is_used_through_redis_pys_own_calls() -> None:
    """The shelf reaches into redis-py's pool; a layout it does not know (another
    redis-py) takes the pool's get_connection / release, never an AttributeError."""
    import redis

    from ctxguard.stores.redis_clients import ConnectionShelf

    class Other(redis.ConnectionPool):  # a pool type of its own: not the plain one
        pass

    plain = redis.ConnectionPool(protocol=2)  # as the stores make it
    assert ConnectionShelf(plain)._fast is True
    assert ConnectionShelf(Other(protocol=2))._fast is False
    # RESP3 (push messages may arrive unasked): asked for, or redis-py 8's default
    assert ConnectionShelf(redis.ConnectionPool(protocol=3))._fast is False
    default_is_resp3 = int(redis.__version__.split(".")[0]) >= 8
    assert ConnectionShelf(redis.ConnectionPool())._fast is not default_is_resp3
    calls: list[str] = []

    class Moved(redis.ConnectionPool):
        def get_connection(self, *args: object, **kwargs: object) -> Any:
            calls.append("get")
            return "conn"

        def release(self, connection: Any) -> None:
            calls.append(f"release {connection}")

    moved = Moved()
    moved._available_connections = ()  # type: ignore[assignment]  # another layout
    shelf = ConnectionShelf(moved)
    assert shelf._fast is False
    shelf.give(shelf.take())
    assert calls == ["get", "release conn"]
    relaid = redis.ConnectionPool(protocol=2)  # the plain type, its idle list not a list
    relaid._available_connections = ()  # type: ignore[assignment]
    assert ConnectionShelf(relaid)._fast is False


def _resp(info: Any) -> set[bytes]:
    """The ``resp=`` field of CLIENT INFO, of every node that answered."""
    texts = info.values() if isinstance(info, dict) else [info]
    return {t.split(b" resp=")[1][:1] for t in texts}


def _resp_of_both_stores(url: str) -> set[bytes]:
    """What the sync and the async store of ``url`` speak (after one read each)."""
    store = open_store(url)
    try:
        store.info("s")
        seen = _resp(store.client.execute_command("CLIENT", "INFO"))  # type: ignore[attr-defined]
        if "cluster" not in url:
            assert store._shelf._fast  # type: ignore[attr-defined]
    finally:
        store.close()

    async def run() -> set[bytes]:
        astore = open_async_store(url)
        try:
            await astore.info("s")
            return _resp(await astore.client.execute_command("CLIENT", "INFO"))  # type: ignore[attr-defined]
        finally:
            await astore.close()

    return seen | asyncio.run(run())


@pytest.mark.cluster
def test_the_cluster_stores_speak_resp2(cluster_url: str) -> None:
    assert _resp_of_both_stores(cluster_url) == {b"2"}


@pytest.mark.redis
def test_the_stores_speak_resp2_and_send_no_hello(redis_url: str) -> None:
    """Asked for by name (redis-py 8 would open with HELLO 3 and, where a server or a
    proxy knows no HELLO, pay a refused command and a warning per connection)."""
    assert _resp_of_both_stores(redis_url) == {b"2"}
