"""A window read's MULTI/EXEC replies taken from the hiredis reader's buffer.

``RedisStore._multi`` (and the async twin) wait for MULTI's ``OK`` through redis-py,
then take each ``QUEUED`` and EXEC's array from the reader's buffer when it is already
whole there (``redis_clients.next_buffered``), else read it through redis-py. The
replies must be the same however the bytes arrive: all in one packet, or cut anywhere
(a proxy here passes the server's bytes on a few at a time); an error reply must be
raised as redis-py raises it, and a partial one left for redis-py to finish.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import hiredis
import pytest
from redis.exceptions import ResponseError

from ctxguard.stores import WriteOptions, open_async_store, open_store
from ctxguard.stores.redis_clients import NOT_BUFFERED, buffered_reader, next_buffered
from tests.stores.test_window_reads import by_script, history, said, whole

pytestmark = pytest.mark.redis


class ChunkingProxy:
    """Passes a client's bytes to the server whole, and the server's back ``size`` bytes
    at a time with a pause between, so a transaction's replies arrive cut up."""

    def __init__(self, target_port: int, size: int) -> None:
        self.target_port, self.size = target_port, size
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.port = int(self._listener.getsockname()[1])
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._sockets: list[socket.socket] = []
        self.chunks = 0

    def __enter__(self) -> ChunkingProxy:
        thread = threading.Thread(target=self._accept, daemon=True)
        thread.start()
        self._threads.append(thread)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for sock in [self._listener, *self._sockets]:
            sock.close()
        for thread in self._threads:
            thread.join(timeout=5)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except (TimeoutError, OSError):
                continue
            server = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._sockets += [client, server]
            for src, dst, cut in ((client, server, False), (server, client, True)):
                thread = threading.Thread(target=self._pipe, args=(src, dst, cut), daemon=True)
                thread.start()
                self._threads.append(thread)

    def _pipe(self, src: socket.socket, dst: socket.socket, cut: bool) -> None:
        src.settimeout(0.1)  # (a closed peer or the stop flag is seen within 0.1 s)
        try:
            while not self._stop.is_set():
                try:
                    data = src.recv(65536)
                except TimeoutError:
                    continue
                if not data:
                    break
                if not cut:
                    dst.sendall(data)
                    continue
                for at in range(0, len(data), self.size):
                    dst.sendall(data[at : at + self.size])
                    self.chunks += 1
                    if self.chunks % 16 == 0:  # (NODELAY: each send leaves as it is)
                        time.sleep(0.0002)
        except OSError:
            pass
        finally:
            src.close()
            dst.close()


@pytest.fixture(params=[1, 7, 4096], ids=["byte-by-byte", "7-bytes", "4k"])
def proxy(request: pytest.FixtureRequest, redis_url: str) -> Iterator[ChunkingProxy]:
    port = urlsplit(redis_url).port
    assert port is not None
    with ChunkingProxy(port, request.param) as running:
        yield running


def test_a_window_read_cut_anywhere_is_the_scripts_answer(
    proxy: ChunkingProxy, redis_url: str, namespace: str
) -> None:
    direct = open_store(redis_url, namespace=namespace)
    cut = open_store(proxy.url, namespace=namespace)
    opts = WriteOptions(counter="c1")
    try:
        direct.append("s", history(300, pinned_at=(0, 150)), opts)
        new = [said("user", 3, 999, 4)]
        expected = whole(by_script(direct, "s", 2000, opts, new, 1))
        before = proxy.chunks
        for _ in range(3):  # the connection reused: every reply of each was read
            assert whole(cut.fetch_window("s", 2000, opts, new, 1)) == expected
        assert proxy.chunks > before  # the replies did cross the proxy
    finally:
        direct.close()
        cut.close()


async def test_the_async_window_read_cut_anywhere_is_the_same(
    proxy: ChunkingProxy, redis_url: str, namespace: str
) -> None:
    direct = open_store(redis_url, namespace=namespace)
    cut = open_async_store(proxy.url, namespace=namespace)
    opts = WriteOptions(counter="c1")
    try:
        direct.append("s", history(300, pinned_at=(0, 150)), opts)
        new = [said("user", 3, 999, 4)]
        expected = whole(by_script(direct, "s", 2000, opts, new, 1))
        for _ in range(3):
            assert whole(await cut.fetch_window("s", 2000, opts, new, 1)) == expected
    finally:
        direct.close()
        await cut.close()


def _reader() -> Any:
    from redis._parsers.hiredis import NOT_ENOUGH_DATA

    return hiredis.Reader(replyError=ResponseError, notEnoughData=NOT_ENOUGH_DATA)


def test_a_whole_reply_is_taken_and_a_partial_one_left() -> None:
    reader = _reader()
    reader.feed(b"+QUEUED\r\n*2\r\n$1\r\na\r\n$2\r\nb")
    assert next_buffered(reader) == b"QUEUED"
    assert next_buffered(reader) is NOT_BUFFERED  # EXEC's array not whole yet
    reader.feed(b"c\r\n")
    assert next_buffered(reader) == [b"a", b"bc"]  # nothing was lost by the first look
    assert next_buffered(reader) is NOT_BUFFERED
    assert next_buffered(None) is NOT_BUFFERED


def test_an_error_reply_is_raised_as_redis_py_raises_it() -> None:
    reader = _reader()
    reader.feed(b"-EXECABORT Transaction discarded\r\n")
    with pytest.raises(ResponseError, match="EXECABORT"):
        next_buffered(reader)
    # an error inside EXEC's array is a value of the array, as read_response gives it
    reader.feed(b"*2\r\n-WRONGTYPE Operation\r\n:1\r\n")
    got = next_buffered(reader)
    assert isinstance(got[0], ResponseError) and got[1] == 1


def test_only_a_fast_shelf_gives_its_reader(redis_url: str, namespace: str) -> None:
    store = open_store(redis_url, namespace=namespace)
    try:
        conn = store._shelf.take()
        try:
            conn.connect()
            assert buffered_reader(store._shelf, conn) is conn._parser._reader
            store._shelf._fast = False  # a pool of another kind: redis-py reads every reply
            assert buffered_reader(store._shelf, conn) is None
        finally:
            store._shelf._fast = True
            store._shelf.give(conn)
    finally:
        store.close()
