"""What the sync and async Redis stores share, apart from error mapping.

How a client is made from a store URL (standalone or cluster, credentials and
timeouts passed as arguments, redis-py's own retries off), the
:class:`RetryPolicy`, the base class both stores build on (URL, protocol,
``repr``, error mapping), and the few client calls written once for both
(``SCAN`` on every primary, ``EVAL`` queued on a pipeline).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import hiredis
import redis
import redis.asyncio as aredis
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisClusterException, RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

from ctxguard._nocopy import NotCopyable
from ctxguard._validate import type_name
from ctxguard.errors import ConfigError, StoreError
from ctxguard.stores.base import WindowFetch, WindowHit
from ctxguard.stores.keys import KeySpace
from ctxguard.stores.redis_deadline import connection_class
from ctxguard.stores.redis_errors import wrap_error
from ctxguard.stores.redis_protocol import RedisProtocol
from ctxguard.stores.url_options import CLUSTER_PARAMS
from ctxguard.stores.urls import StoreURL


@dataclass(frozen=True)
class RetryPolicy:
    """Backoff for operations that are safe to repeat: attempts, first delay, cap."""

    attempts: int = 4
    first_delay: float = 0.05
    max_delay: float = 1.0

    def delays(self) -> Iterator[float]:
        delay = self.first_delay
        for _ in range(self.attempts - 1):
            yield delay
            delay = min(delay * 2, self.max_delay)


def retry_delay(delays: Iterator[float], end: float) -> float | None:
    """The wait before the next attempt; None when the attempts are used up or the next
    one would start past the operation's deadline ``end`` (``time.monotonic()``)."""
    delay = next(delays, None)
    if delay is None or time.monotonic() + delay >= end:
        return None
    return delay


def as_fetch(result: WindowFetch | WindowHit) -> WindowFetch:
    """A plain fetch sends no state token, so the script cannot answer with a hit."""
    if isinstance(result, WindowHit):
        raise StoreError("the window script committed a fetch that expected nothing")
    return result


def _no_retry(asynchronous: bool) -> Any:
    """redis-py's own retries off (RetryPolicy retries): its asyncio clients take their
    own Retry class (a sync one there is a UserWarning, from redis-py 8.2)."""
    return (AsyncRetry if asynchronous else Retry)(NoBackoff(), 0)


# RESP2, asked for by name: redis-py 8 otherwise opens every connection with HELLO 3 and,
# where the server or a proxy knows no HELLO (Redis 5, twemproxy), pays a refused
# command and logs a warning per connection before it falls back; and the connection
# shelf's fast path holds only where nothing arrives unasked (no RESP3 push messages).
# Every reply ctxguard reads is the same in both (the scripts answer arrays and strings).
PROTOCOL = 2


def _client_kwargs(url: StoreURL, asynchronous: bool) -> dict[str, Any]:
    """Credentials and timeouts go as arguments: the URL redis-py parses holds neither."""
    kwargs = {
        "retry": _no_retry(asynchronous),
        "decode_responses": False,
        "protocol": PROTOCOL,
        **url.client_kwargs(),
    }
    if not asynchronous:  # asyncio's client waits for a whole reply under one timeout
        kwargs["connection_class"] = connection_class(url.tls)
    return kwargs


class RedisStoreBase(NotCopyable):
    _holds = "a connection pool"
    _advice = "open a store from the same URL in each process (open_store / open_async_store)"

    def __init__(self, url: StoreURL, retry: RetryPolicy | None) -> None:
        self.url = url
        self.protocol = RedisProtocol(KeySpace(url.namespace, url.tenant))
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise ConfigError(
                f"retry must be a RetryPolicy or None (the default policy), got {type_name(retry)}"
            )
        self.retry_policy = retry or RetryPolicy()
        self.where = url.redacted

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.where!r}, namespace={self.namespace!r}, "
            f"tenant={self.tenant!r})"
        )

    def _error(
        self, exc: RedisError | RedisClusterException, what: str, keys: Sequence[str]
    ) -> StoreError:
        """A damaged key (a script's CORRUPT reply, or WRONGTYPE) is a CorruptRecordError."""
        if isinstance(exc, ResponseError):
            corrupt = self.protocol.corrupt_error(str(exc), keys)
            if corrupt is not None:
                return corrupt
        return wrap_error(exc, what, self.where, self.url)

    @property
    def namespace(self) -> str:
        return self.protocol.keyspace.namespace

    @property
    def tenant(self) -> str:
        return self.protocol.keyspace.tenant


def pack(conn: Any, *args: str | int) -> Any:
    """One command as RESP bytes: hiredis directly (what redis-py's hiredis packer
    calls, without its per-argument pass), else the connection's own packer."""
    try:
        return [hiredis.pack_command(args)]  # type: ignore[arg-type]  # (its stub: a 1-tuple)
    except TypeError:  # a type hiredis refuses (bool, bytearray ...): redis-py decides
        return conn.pack_command(*args)


_HEADS: dict[tuple[str, str], tuple[list[str], bytes]] = {}  # (sha, first key) -> keys, packed


def pack_evalsha(conn: Any, sha: str, keys: list[str], args: list[str | int]) -> Any:
    """``pack(conn, "EVALSHA", sha, len(keys), *keys, *args)``, the same bytes, with the
    part before ``args`` (the script and the session's nine keys: the same on every call
    of that script on that session) packed once per script and keys, not per call
    (hiredis pays ~1.5k instructions an argument). Kept for up to 4,096 (script, keys)."""
    if not keys or not args:
        return pack(conn, "EVALSHA", sha, len(keys), *keys, *args)
    try:
        body = hiredis.pack_command(tuple(args))  # type: ignore[arg-type]
    except TypeError:  # a type hiredis refuses: as pack() decides
        return pack(conn, "EVALSHA", sha, len(keys), *keys, *args)
    found = _HEADS.get((sha, keys[0]))
    if found is None or found[0] != keys:
        head = hiredis.pack_command(("EVALSHA", sha, len(keys), *keys))  # type: ignore[arg-type]
        if len(_HEADS) >= 4096:
            _HEADS.clear()
        found = _HEADS[(sha, keys[0])] = (list(keys), head[head.index(b"\n") + 1 :])
    count = b"*%d\r\n" % (len(keys) + 3 + len(args))
    return [b"".join((count, found[1], memoryview(body)[body.index(b"\n") + 1 :]))]


async def asend(conn: Any, packed: Any) -> None:
    """``conn.send_packed_command(packed)`` without its task per call.

    redis-py runs every send under ``asyncio.wait_for`` (a new task, ~7 µs) for
    the socket timeout, although a command that fits the transport's buffer is
    written at once. Written here, it is waited for (drained, under redis-py's
    timeout and error mapping) only when something is left to wait for: data
    still buffered, or a transport closing (the error a drain raises).
    """
    await conn.check_health()
    writer = getattr(conn, "_writer", None)
    if writer is None or writer.transport.is_closing():
        await conn.send_packed_command(packed, check_health=False)
        return
    # one write, not writelines: from Python 3.12 a transport's writelines never pauses
    # the protocol, so the drain below would not wait for a server that stops reading
    writer.write(packed[0] if len(packed) == 1 else b"".join(packed))
    transport = writer.transport
    if transport.get_write_buffer_size() or transport.is_closing():
        await conn.send_packed_command([], check_health=False)


def _resp2(pool: Any) -> bool:
    """RESP2 (what ctxguard asks for: :data:`PROTOCOL`): no push messages, so nothing
    arrives unasked. No protocol named is RESP2 only before redis-py 8."""
    protocol = pool.connection_kwargs.get("protocol")
    return protocol in (2, "2") or (protocol is None and _REDIS_MAJOR < 8)


def _has_internals(pool: Any) -> bool:
    """The pool holds what a shelf reaches into, as redis-py 5-8 lay it out: a list of
    idle connections, a set of those in use, and a connection class that can tell
    whether the server closed it. Any other layout (a redis-py to come) is used
    through ``get_connection`` / ``release``, as redis-py uses it."""
    conn = getattr(pool, "connection_class", None)
    return (
        isinstance(getattr(pool, "_available_connections", None), list)
        and isinstance(getattr(pool, "_in_use_connections", None), set)
        and all(callable(getattr(conn, name, None)) for name in ("can_read", "should_reconnect"))
    )


_REDIS_MAJOR = int(redis.__version__.split(".", 1)[0])

try:  # the hiredis reader's "no whole reply yet" (redis-py 5-8 name it so)
    from redis._parsers.hiredis import NOT_ENOUGH_DATA as _NOT_ENOUGH
except ImportError:  # pragma: no cover - another redis-py: every reply read its own way
    _NOT_ENOUGH = None


def buffered_reader(shelf: ConnectionShelf | AsyncConnectionShelf, conn: Any) -> Any:
    """The hiredis reader of a connection a fast shelf gave out (RESP2: nothing arrives
    unasked), from which replies already received whole can be taken without redis-py's
    read layers; None when there is none to use (see :func:`next_buffered`)."""
    if not shelf._fast or _NOT_ENOUGH is None:
        return None
    return getattr(getattr(conn, "_parser", None), "_reader", None)


def next_buffered(reader: Any) -> Any:
    """The next reply when ``reader`` (:func:`buffered_reader`) holds it whole, an error
    reply raised as ``read_response`` raises it; else :data:`NOT_BUFFERED` (nothing taken:
    the caller reads it through ``read_response``, under its deadline)."""
    if reader is None:
        return NOT_BUFFERED
    reply = reader.gets()
    if reply is _NOT_ENOUGH:
        return NOT_BUFFERED
    if isinstance(reply, Exception):
        raise reply
    return reply


NOT_BUFFERED: Any = object()


class ConnectionShelf:
    """How the plain client's script calls take a connection and give it back.

    Taking one through the pool's ``get_connection`` and ``release`` costs more
    than packing the call (a lock, eight observability hooks, an event dispatch):
    here a connection is popped from the pool's own list of idle ones and put
    back with an append, both atomic, so threads sharing the store each get their
    own, and the pool's other users (pipelines, ``info``, ``delete``) share the
    same connections under the same ``max_connections``. What the pool checks
    before handing one out is checked too (data or EOF waiting: the server closed
    it, so it is reconnected first). A pool of another kind (blocking, client-side
    cache, RESP3: push and maintenance notifications) or a pool after a fork is
    used as redis-py uses it.
    """

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self._fast = (
            type(pool) is redis.ConnectionPool
            and getattr(pool, "cache", None) is None
            and _resp2(pool)
            and _has_internals(pool)
        )

    def take(self) -> Any:
        pool = self.pool
        if not self._fast or pool.pid != os.getpid():
            return pool.get_connection()
        try:
            conn = pool._available_connections.pop()
        except IndexError:
            return pool.get_connection()  # a new one, made and counted by the pool
        pool._in_use_connections.add(conn)
        try:
            try:
                if conn._sock is None or conn.can_read():  # closed, or data/EOF waiting
                    raise RedisConnectionError
            except (RedisConnectionError, RedisTimeoutError, OSError):
                conn.disconnect()
                conn.connect()
        except BaseException:
            self.give(conn)  # disconnected: the next user connects it again
            raise
        return conn

    def give(self, conn: Any) -> None:
        pool = self.pool
        if not self._fast or pool.pid != os.getpid() or conn.pid != pool.pid:
            pool.release(conn)
            return
        if conn.should_reconnect():
            conn.disconnect()
        pool._in_use_connections.discard(conn)
        pool._available_connections.append(conn)


class AsyncConnectionShelf:
    """:class:`ConnectionShelf` for ``redis.asyncio`` (one event loop: no lock needed
    between the pool's list and this; its lock is only held across awaits)."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self._fast = type(pool) is aredis.ConnectionPool and _resp2(pool) and _has_internals(pool)

    async def take(self) -> Any:
        pool = self.pool
        if not self._fast:
            return await pool.get_connection()
        try:
            conn = pool._available_connections.pop()
        except IndexError:
            return await pool.get_connection()
        pool._in_use_connections.add(conn)
        try:
            try:
                if not conn.is_connected or await conn.can_read():
                    raise RedisConnectionError
            except (RedisConnectionError, RedisTimeoutError, OSError):
                await conn.disconnect()
                await conn.connect()
        except BaseException:
            await self.give(conn)
            raise
        return conn

    async def give(self, conn: Any) -> None:
        pool = self.pool
        if not self._fast:
            await pool.release(conn)
            return
        if conn.should_reconnect():
            await conn.disconnect()
        pool._in_use_connections.discard(conn)
        pool._available_connections.append(conn)


def _cluster_kwargs(url: StoreURL, asynchronous: bool) -> dict[str, Any]:
    """Client settings for a cluster URL, parsed the way redis-py parses a server URL.

    ``retry`` allows no retries: redis-py's cluster client would otherwise
    re-send any command after a dropped connection, including the ones that are
    not safe to repeat (audit records, summary commits). It still refreshes
    its view of the topology before raising, and :class:`RetryPolicy` repeats
    what is safe to repeat.
    """
    try:  # the URL redis-py parses holds no credentials: its message shows no secret
        base = redis.Redis.from_url(url.redis_url())
    except ValueError as exc:  # a query parameter redis-py cannot parse
        raise ConfigError(f"bad cluster URL {url.redacted}: {exc}") from None
    given = base.connection_pool.connection_kwargs
    base.close()
    kwargs = {k: given[k] for k in CLUSTER_PARAMS if k in given}
    kwargs.update(url.client_kwargs())
    kwargs["ssl"] = url.tls
    kwargs["retry"] = _no_retry(asynchronous)
    kwargs["protocol"] = PROTOCOL
    if not asynchronous:
        kwargs["connection_class"] = connection_class(url.tls)
    return kwargs


def sync_client(url: StoreURL) -> Any:
    if url.hosts:
        from redis.cluster import ClusterNode

        nodes = [ClusterNode(h, p) for h, p in url.hosts]  # type: ignore[no-untyped-call]
        kwargs = _cluster_kwargs(url, False)
        try:  # the sync cluster client connects here, to learn the topology
            return RedisCluster(startup_nodes=nodes, **kwargs)
        except (RedisError, RedisClusterException) as exc:
            raise wrap_error(exc, "connect", url.redacted, url) from exc
    return _from_url(redis.Redis, url, False)


def async_client(url: StoreURL) -> Any:
    if url.hosts:
        from redis.asyncio.cluster import ClusterNode as AsyncClusterNode

        nodes = [AsyncClusterNode(h, p) for h, p in url.hosts]
        return aredis.RedisCluster(startup_nodes=nodes, **_cluster_kwargs(url, True))
    return _from_url(aredis.Redis, url, True)


def _from_url(cls: Any, url: StoreURL, asynchronous: bool) -> Any:
    try:  # the URL redis-py parses holds no credentials: its message shows no secret
        return cls.from_url(url.redis_url(), **_client_kwargs(url, asynchronous))
    except ValueError as exc:  # a query parameter redis-py cannot parse
        raise ConfigError(f"bad store URL {url.redacted}: {exc}") from None
