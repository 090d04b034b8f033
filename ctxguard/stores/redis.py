"""Redis and Redis Cluster stores (redis-py), sync and async.

Each mutating operation is one Lua script (``ctxguard/stores/lua/``): atomic and
one round trip. The classes here only move bytes: :mod:`redis_protocol` builds
every call and parses every reply. Operations that are safe to repeat (appends
are idempotent by message id; reads; count updates; deletes) are retried with
backoff when the connection drops; the rest raise
:class:`~ctxguard.errors.StoreConnectionError`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import redis
import redis.asyncio as aredis
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.exceptions import (
    AuthenticationError,
    ClusterDownError,
    NoScriptError,
    RedisClusterException,
    RedisError,
    ResponseError,
    TryAgainError,
)
from redis.retry import Retry

from ctxguard.errors import ConfigError, StoreConnectionError, StoreError
from ctxguard.stores.base import (
    AppendResult,
    NewMessage,
    RecordWrite,
    SessionInfo,
    StoredMessage,
    Summary,
    WindowFetch,
    WindowHit,
    WriteOptions,
    check_window_args,
    decode_summary,
)
from ctxguard.stores.keys import KeySpace
from ctxguard.stores.redis_protocol import SCRIPT_NAMES, Call, RedisProtocol, load_script
from ctxguard.stores.urls import StoreURL

T = TypeVar("T")
RETRYABLE = (redis.ConnectionError, redis.TimeoutError, ClusterDownError, TryAgainError)
_DEFAULT_OPTIONS = WriteOptions()


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


def _wrap(exc: RedisError | RedisClusterException, what: str, where: str) -> StoreError:
    # RedisClusterException is redis-py's "no node of the cluster can be reached".
    if isinstance(exc, AuthenticationError):
        return StoreConnectionError(
            f"{what} failed: {where} refused the credentials ({type(exc).__name__}); "
            "check the user name and password in the store URL"
        )
    if isinstance(exc, (*RETRYABLE, RedisClusterException)):
        return StoreConnectionError(
            f"{what} failed: lost the connection to {where} ({type(exc).__name__})"
        )
    return StoreError(f"{what} failed on {where}: {type(exc).__name__}: {exc}")


def _as_fetch(result: WindowFetch | WindowHit) -> WindowFetch:
    """A plain fetch sends no state token, so the script cannot answer with a hit."""
    if isinstance(result, WindowHit):
        raise StoreError("the window script committed a fetch that expected nothing")
    return result


def _client_kwargs(url: StoreURL) -> dict[str, Any]:
    return {"retry": Retry(NoBackoff(), 0), "decode_responses": False}


class _Base:
    def __init__(self, url: StoreURL, retry: RetryPolicy | None) -> None:
        self.url = url
        self.protocol = RedisProtocol(KeySpace(url.namespace, url.tenant))
        self.retry_policy = retry or RetryPolicy()
        self.where = url.redacted

    @property
    def namespace(self) -> str:
        return self.protocol.keyspace.namespace

    @property
    def tenant(self) -> str:
        return self.protocol.keyspace.tenant


class RedisStore(_Base):
    """Synchronous store on Redis (``redis://``, ``rediss://``) or Redis Cluster."""

    def __init__(self, url: StoreURL, client: Any = None, retry: RetryPolicy | None = None) -> None:
        super().__init__(url, retry)
        self.client = client if client is not None else _sync_client(url)
        self._direct = type(self.client) is redis.Redis
        self._scripts = {
            name: self.client.register_script(load_script(name)) for name in SCRIPT_NAMES
        }

    def _io(self, what: str, fn: Callable[[], T], idempotent: bool) -> T:
        delays = self.retry_policy.delays() if idempotent else iter(())
        while True:
            try:
                return fn()
            except AuthenticationError as exc:
                raise _wrap(exc, what, self.where) from exc
            except RETRYABLE as exc:
                delay = next(delays, None)
                if delay is None:
                    raise _wrap(exc, what, self.where) from exc
                time.sleep(delay)
            except (RedisError, RedisClusterException) as exc:
                raise _wrap(exc, what, self.where) from exc
            except CLIENT_INTERNAL_ERRORS as exc:
                if not _raised_in_client(exc):
                    raise  # our own bug: never disguised as a connection problem
                delay = next(delays, None)
                if delay is None:
                    raise _client_failure(exc, what, self.where) from exc
                time.sleep(delay)

    def _run(self, call: Call, idempotent: bool = True) -> Any:
        script = self._scripts[call.script]
        if self._direct:
            return self._io(call.script, lambda: self._evalsha(script, call), idempotent)
        return self._io(call.script, lambda: script(keys=call.keys, args=call.args), idempotent)

    def _evalsha(self, script: Any, call: Call) -> Any:
        """EVALSHA on a pooled connection, without redis-py's per-command layers.

        Every turn pays redis-py's command dispatch (callbacks, hooks, retry
        wrapper) on each round trip: about 25 µs of a 120 µs call here. Only
        the plain client takes this path; the cluster client routes by slot.
        """
        pool = self.client.connection_pool
        conn = pool.get_connection()
        try:
            conn.send_command("EVALSHA", script.sha, len(call.keys), *call.keys, *call.args)
            try:
                return conn.read_response()
            except NoScriptError:  # a restarted or flushed server: EVAL caches it again
                conn.send_command("EVAL", script.script, len(call.keys), *call.keys, *call.args)
                return conn.read_response()
        except ResponseError:
            raise  # an error reply: the connection is in step
        except BaseException:
            conn.disconnect()  # a reply may be left unread: never reuse the connection
            raise
        finally:
            pool.release(conn)

    def append(
        self,
        session_id: str,
        messages: Sequence[NewMessage],
        options: WriteOptions = _DEFAULT_OPTIONS,
    ) -> AppendResult:
        if not messages:
            return AppendResult((), (), self._count(session_id))
        reply = self._run(self.protocol.append_call(session_id, messages, options))
        return self.protocol.parse_append(session_id, messages, reply)

    def _count(self, session_id: str) -> int:
        info = self.info(session_id)
        return 0 if info is None else info.message_count

    def read(self, session_id: str, start: int = 0, stop: int | None = None) -> list[StoredMessage]:
        return self.protocol.parse_read(
            session_id, self._run(self.protocol.read_call(session_id, start, stop))
        )

    def read_last(self, session_id: str, count: int) -> list[StoredMessage]:
        check_window_args(0, count)
        if count == 0:
            return []
        return self.read(session_id, -count, None)

    def info(self, session_id: str) -> SessionInfo | None:
        keys = self.protocol.keys(session_id)

        def fetch() -> list[Any]:
            pipe = self.client.pipeline(transaction=False)
            pipe.hgetall(keys[0])
            pipe.ttl(keys[0])
            pipe.llen(keys[6])
            return list(pipe.execute())

        meta, ttl, audits = self._io("info", fetch, True)
        flat = [x for kv in meta.items() for x in kv]
        return self.protocol.parse_info(session_id, flat, ttl, int(audits))

    def delete(self, session_id: str) -> bool:
        keys = self.protocol.keys(session_id)
        return bool(self._io("delete", lambda: self.client.delete(*keys), True))

    def list_sessions(self, prefix: str = "") -> Iterator[str]:
        pattern = self.protocol.keyspace.meta_pattern(prefix)
        seen: set[str] = set()
        for key in self._io("list", lambda: list(_scan(self.client, pattern)), True):
            session_id = self.protocol.keyspace.session_id_from_meta_key(key.decode())
            if session_id is not None and session_id not in seen:
                seen.add(session_id)
                yield session_id

    def fetch_window(
        self,
        session_id: str,
        budget: int,
        options: WriteOptions = _DEFAULT_OPTIONS,
        new: Sequence[NewMessage] = (),
        min_messages: int = 0,
    ) -> WindowFetch:
        reply = self._run(self.protocol.window_call(session_id, budget, options, new, min_messages))
        return _as_fetch(self.protocol.parse_window(session_id, new, reply))

    def commit_if_unchanged(
        self,
        session_id: str,
        token: str,
        budget: int,
        options: WriteOptions,
        new: Sequence[NewMessage],
        min_messages: int,
        write: RecordWrite | None,
    ) -> WindowHit | WindowFetch:
        call = self.protocol.window_call(
            session_id, budget, options, new, min_messages, token, write
        )
        # not repeatable: a lost reply may hide a written audit record
        reply = self._run(call, idempotent=write is None or write.audit is None)
        return self.protocol.parse_window(session_id, new, reply)

    def set_token_counts(
        self, session_id: str, counter: str, counts: Mapping[int, int], ttl: int = 0
    ) -> None:
        self._run(self.protocol.set_counts_call(session_id, counter, counts, ttl))

    def get_summary(self, session_id: str) -> Summary | None:
        key = self.protocol.keys(session_id)[5]
        return decode_summary(
            session_id, self._io("get_summary", lambda: self.client.get(key), True)
        )

    def retract(
        self, session_id: str, count: int = 1, expected_count: int | None = None, ttl: int = 0
    ) -> list[StoredMessage]:
        """Remove the newest ``count`` messages (explicit deletion, audited); returns them."""
        call = self.protocol.retract_call(session_id, count, expected_count, ttl)
        return self.protocol.parse_retract(session_id, self._run(call, idempotent=False))

    def restore(
        self, session_id: str, turns: int, summary: Summary | None, ttl: int = 0
    ) -> tuple[int, int]:
        """For import: raise the turn counter, set the summary if there is none yet."""
        reply = self._run(self.protocol.restore_call(session_id, turns, summary, ttl))
        return int(reply[0]), int(reply[1])

    def commit_summary(
        self, session_id: str, summary: Summary, expected_version: int, ttl: int = 0
    ) -> bool:
        call = self.protocol.commit_summary_call(session_id, summary, expected_version, ttl)
        return bool(self._run(call, idempotent=False))

    def add_audit(
        self, session_id: str, record: Mapping[str, Any], retention: int, ttl: int = 0
    ) -> int:
        call = self.protocol.audit_call(session_id, record, retention, ttl)
        return int(self._run(call, idempotent=False))

    def _pipelined(self, calls: Sequence[Call], idempotent: bool) -> list[Any]:
        """Several scripts of one session in one round trip (not one transaction).

        Sent as EVAL with the script text, not EVALSHA: redis-py would first ask
        SCRIPT EXISTS for scripts queued on a pipeline (an extra round trip on
        every call), and an EVALSHA that meets NOSCRIPT mid-pipeline would leave
        the pipeline half applied. Redis caches the script by its SHA either way.
        """

        def send() -> list[Any]:
            pipe = self.client.pipeline(transaction=False)
            for call in calls:
                _queue_eval(pipe, self._scripts[call.script].script, call)
            return list(pipe.execute())

        return self._io("+".join(c.script for c in calls), send, idempotent)

    def record(self, session_id: str, write: RecordWrite) -> int:
        """Write back token counts and an audit record in one round trip; returns the turn."""
        calls = self.protocol.record_calls(session_id, write)
        if not calls:
            return 0
        if len(calls) == 1:  # one script: EVALSHA, not the whole script text (see _pipelined)
            reply = self._run(calls[0], idempotent=write.audit is None)
            return int(reply) if write.audit is not None else 0
        replies = self._pipelined(calls, idempotent=write.audit is None)
        return int(replies[-1]) if write.audit is not None else 0

    def append_with_audit(
        self,
        session_id: str,
        messages: Sequence[NewMessage],
        options: WriteOptions,
        write: RecordWrite,
    ) -> AppendResult:
        """Append and add an audit record (e.g. the server's usage) in one round trip."""
        if write.counts:
            calls = [self.protocol.append_call(session_id, messages, options)]
            calls += self.protocol.record_calls(session_id, write)
            replies = self._pipelined(calls, idempotent=False)
            return self.protocol.parse_append(session_id, messages, replies[0])
        call = self.protocol.append_call(
            session_id, messages, options, write.audit, write.retention
        )
        return self.protocol.parse_append(session_id, messages, self._run(call, idempotent=False))

    def read_audit(self, session_id: str) -> list[dict[str, Any]]:
        key = self.protocol.keys(session_id)[6]
        raw = self._io("read_audit", lambda: self.client.lrange(key, 0, -1), True)
        return self.protocol.parse_audit(session_id, raw)

    def close(self) -> None:
        self.client.close()


class AsyncRedisStore(_Base):
    """Asynchronous twin of :class:`RedisStore` (``redis.asyncio``)."""

    def __init__(self, url: StoreURL, client: Any = None, retry: RetryPolicy | None = None) -> None:
        super().__init__(url, retry)
        self.client = client if client is not None else _async_client(url)
        self._direct = type(self.client) is aredis.Redis
        self._cluster = isinstance(self.client, aredis.RedisCluster)
        self._scripts = {
            name: self.client.register_script(load_script(name)) for name in SCRIPT_NAMES
        }

    async def _io(self, what: str, fn: Callable[[], Awaitable[T]], idempotent: bool) -> T:
        delays = self.retry_policy.delays() if idempotent else iter(())
        while True:
            try:
                if self._cluster:
                    # Learn the slot map before sending: redis-py routes a keyed
                    # command sent while it knows no node (first use, or after it
                    # reset itself) to a random node; concurrent tasks then meet
                    # MOVED, and every 5th MOVED makes redis-py close all its
                    # connections, including those other tasks are writing on.
                    # A no-op once the client knows the cluster.
                    await self.client.initialize()
                return await fn()
            except AuthenticationError as exc:
                raise _wrap(exc, what, self.where) from exc
            except RETRYABLE as exc:
                delay = next(delays, None)
                if delay is None:
                    raise _wrap(exc, what, self.where) from exc
                await asyncio.sleep(delay)
            except (RedisError, RedisClusterException) as exc:
                raise _wrap(exc, what, self.where) from exc
            except CLIENT_INTERNAL_ERRORS as exc:
                if not _raised_in_client(exc):
                    raise  # our own bug: never disguised as a connection problem
                delay = next(delays, None)
                if delay is None:
                    raise _client_failure(exc, what, self.where) from exc
                await asyncio.sleep(delay)

    async def _run(self, call: Call, idempotent: bool = True) -> Any:
        script = self._scripts[call.script]
        if self._direct:
            return await self._io(call.script, lambda: self._evalsha(script, call), idempotent)
        return await self._io(
            call.script, lambda: script(keys=call.keys, args=call.args), idempotent
        )

    async def _evalsha(self, script: Any, call: Call) -> Any:
        """EVALSHA on a pooled connection (see :meth:`RedisStore._evalsha`)."""
        pool = self.client.connection_pool
        conn = await pool.get_connection()
        try:
            await conn.send_command("EVALSHA", script.sha, len(call.keys), *call.keys, *call.args)
            try:
                return await conn.read_response()
            except NoScriptError:
                await conn.send_command(
                    "EVAL", script.script, len(call.keys), *call.keys, *call.args
                )
                return await conn.read_response()
        except ResponseError:
            raise
        except BaseException:
            await conn.disconnect()
            raise
        finally:
            await pool.release(conn)

    async def append(
        self,
        session_id: str,
        messages: Sequence[NewMessage],
        options: WriteOptions = _DEFAULT_OPTIONS,
    ) -> AppendResult:
        if not messages:
            info = await self.info(session_id)
            return AppendResult((), (), 0 if info is None else info.message_count)
        reply = await self._run(self.protocol.append_call(session_id, messages, options))
        return self.protocol.parse_append(session_id, messages, reply)

    async def read(
        self, session_id: str, start: int = 0, stop: int | None = None
    ) -> list[StoredMessage]:
        reply = await self._run(self.protocol.read_call(session_id, start, stop))
        return self.protocol.parse_read(session_id, reply)

    async def read_last(self, session_id: str, count: int) -> list[StoredMessage]:
        check_window_args(0, count)
        if count == 0:
            return []
        return await self.read(session_id, -count, None)

    async def info(self, session_id: str) -> SessionInfo | None:
        keys = self.protocol.keys(session_id)

        async def fetch() -> list[Any]:
            pipe = self.client.pipeline(transaction=False)
            pipe.hgetall(keys[0])
            pipe.ttl(keys[0])
            pipe.llen(keys[6])
            return list(await pipe.execute())

        meta, ttl, audits = await self._io("info", fetch, True)
        flat = [x for kv in meta.items() for x in kv]
        return self.protocol.parse_info(session_id, flat, ttl, int(audits))

    async def delete(self, session_id: str) -> bool:
        keys = self.protocol.keys(session_id)
        return bool(await self._io("delete", lambda: self.client.delete(*keys), True))

    async def list_sessions(self, prefix: str = "") -> AsyncIterator[str]:
        pattern = self.protocol.keyspace.meta_pattern(prefix)

        async def collect() -> list[bytes]:
            return [k async for k in _ascan(self.client, pattern)]

        seen: set[str] = set()
        for key in await self._io("list", collect, True):
            session_id = self.protocol.keyspace.session_id_from_meta_key(key.decode())
            if session_id is not None and session_id not in seen:
                seen.add(session_id)
                yield session_id

    async def fetch_window(
        self,
        session_id: str,
        budget: int,
        options: WriteOptions = _DEFAULT_OPTIONS,
        new: Sequence[NewMessage] = (),
        min_messages: int = 0,
    ) -> WindowFetch:
        reply = await self._run(
            self.protocol.window_call(session_id, budget, options, new, min_messages)
        )
        return _as_fetch(self.protocol.parse_window(session_id, new, reply))

    async def commit_if_unchanged(
        self,
        session_id: str,
        token: str,
        budget: int,
        options: WriteOptions,
        new: Sequence[NewMessage],
        min_messages: int,
        write: RecordWrite | None,
    ) -> WindowHit | WindowFetch:
        call = self.protocol.window_call(
            session_id, budget, options, new, min_messages, token, write
        )
        reply = await self._run(call, idempotent=write is None or write.audit is None)
        return self.protocol.parse_window(session_id, new, reply)

    async def set_token_counts(
        self, session_id: str, counter: str, counts: Mapping[int, int], ttl: int = 0
    ) -> None:
        await self._run(self.protocol.set_counts_call(session_id, counter, counts, ttl))

    async def get_summary(self, session_id: str) -> Summary | None:
        key = self.protocol.keys(session_id)[5]
        return decode_summary(
            session_id, await self._io("get_summary", lambda: self.client.get(key), True)
        )

    async def retract(
        self, session_id: str, count: int = 1, expected_count: int | None = None, ttl: int = 0
    ) -> list[StoredMessage]:
        call = self.protocol.retract_call(session_id, count, expected_count, ttl)
        return self.protocol.parse_retract(session_id, await self._run(call, idempotent=False))

    async def restore(
        self, session_id: str, turns: int, summary: Summary | None, ttl: int = 0
    ) -> tuple[int, int]:
        reply = await self._run(self.protocol.restore_call(session_id, turns, summary, ttl))
        return int(reply[0]), int(reply[1])

    async def commit_summary(
        self, session_id: str, summary: Summary, expected_version: int, ttl: int = 0
    ) -> bool:
        call = self.protocol.commit_summary_call(session_id, summary, expected_version, ttl)
        return bool(await self._run(call, idempotent=False))

    async def add_audit(
        self, session_id: str, record: Mapping[str, Any], retention: int, ttl: int = 0
    ) -> int:
        call = self.protocol.audit_call(session_id, record, retention, ttl)
        return int(await self._run(call, idempotent=False))

    async def _pipelined(self, calls: Sequence[Call], idempotent: bool) -> list[Any]:
        async def send() -> list[Any]:
            pipe = self.client.pipeline(transaction=False)
            for call in calls:
                _queue_eval(pipe, self._scripts[call.script].script, call)
            return list(await pipe.execute())

        return await self._io("+".join(c.script for c in calls), send, idempotent)

    async def record(self, session_id: str, write: RecordWrite) -> int:
        calls = self.protocol.record_calls(session_id, write)
        if not calls:
            return 0
        if len(calls) == 1:  # one script: EVALSHA, not the whole script text (see _pipelined)
            reply = await self._run(calls[0], idempotent=write.audit is None)
            return int(reply) if write.audit is not None else 0
        replies = await self._pipelined(calls, idempotent=write.audit is None)
        return int(replies[-1]) if write.audit is not None else 0

    async def append_with_audit(
        self,
        session_id: str,
        messages: Sequence[NewMessage],
        options: WriteOptions,
        write: RecordWrite,
    ) -> AppendResult:
        if write.counts:
            calls = [self.protocol.append_call(session_id, messages, options)]
            calls += self.protocol.record_calls(session_id, write)
            replies = await self._pipelined(calls, idempotent=False)
            return self.protocol.parse_append(session_id, messages, replies[0])
        call = self.protocol.append_call(
            session_id, messages, options, write.audit, write.retention
        )
        reply = await self._run(call, idempotent=False)
        return self.protocol.parse_append(session_id, messages, reply)

    async def read_audit(self, session_id: str) -> list[dict[str, Any]]:
        key = self.protocol.keys(session_id)[6]
        raw = await self._io("read_audit", lambda: self.client.lrange(key, 0, -1), True)
        return self.protocol.parse_audit(session_id, raw)

    async def close(self) -> None:
        await self.client.aclose()


def _queue_eval(pipe: Any, script: str, call: Call) -> None:
    # Not ``pipe.eval``: redis-py's sync ClusterPipeline refuses eval() outright,
    # while a plain EVAL command is routed by its keys like any other.
    pipe.execute_command("EVAL", script, len(call.keys), *call.keys, *call.args)


# What redis-py (and the asyncio streams under it) raise from its own internals
# when a connection is torn down under a call, instead of a ConnectionError: for
# example AttributeError "'NoneType' object has no attribute 'writelines'" when
# a connection is closed while a command is being written on it.
CLIENT_INTERNAL_ERRORS = (
    AttributeError,
    TypeError,
    KeyError,
    IndexError,
    ValueError,
    RuntimeError,
    EOFError,
    OSError,
)


def _raised_in_client(exc: BaseException) -> bool:
    """True when ``exc`` was raised inside redis-py, not in ctxguard's own code."""
    tb = exc.__traceback__
    while tb is not None:
        module = str(tb.tb_frame.f_globals.get("__name__", ""))
        if module == "redis" or module.startswith("redis."):
            return True
        tb = tb.tb_next
    return False


def _client_failure(exc: BaseException, what: str, where: str) -> StoreConnectionError:
    # The connection was dropped under the call: whether it was applied is unknown.
    return StoreConnectionError(
        f"{what} failed: the Redis client lost its connection to {where} mid-call "
        f"({type(exc).__name__} inside redis-py)"
    )


def _scan(client: Any, pattern: str) -> Iterator[bytes]:
    if isinstance(client, RedisCluster):
        yield from client.scan_iter(match=pattern, count=1000, target_nodes=RedisCluster.PRIMARIES)
    else:
        yield from client.scan_iter(match=pattern, count=1000)


async def _ascan(client: Any, pattern: str) -> AsyncIterator[bytes]:
    if isinstance(client, aredis.RedisCluster):
        async for key in client.scan_iter(
            match=pattern, count=1000, target_nodes=aredis.RedisCluster.PRIMARIES
        ):
            yield key
    else:
        async for key in client.scan_iter(match=pattern, count=1000):
            yield key


# Connection settings a redis+cluster:// URL may carry (credentials, timeouts, TLS);
# the same query parameters redis.Redis.from_url accepts for one server.
_CLUSTER_KWARGS = (
    "username",
    "password",
    "client_name",
    "socket_timeout",
    "socket_connect_timeout",
    "health_check_interval",
    "ssl_ca_certs",
    "ssl_cert_reqs",
    "ssl_certfile",
    "ssl_keyfile",
    "ssl_check_hostname",
)


def _cluster_url(url: StoreURL) -> str:
    host, port = url.hosts[0]
    scheme = "rediss" if url.scheme.startswith("rediss") else "redis"
    rest = url.backend_url.split("://", 1)[1]
    auth = rest.split("?", 1)[0].rsplit("@", 1)
    creds = auth[0] + "@" if len(auth) == 2 else ""
    query = "?" + rest.split("?", 1)[1] if "?" in rest else ""
    return f"{scheme}://{creds}{host}:{port}{query}"


def _cluster_kwargs(url: StoreURL) -> dict[str, Any]:
    """Client settings for a cluster URL, parsed the way redis-py parses a server URL.

    ``retry`` allows no retries: redis-py's cluster client would otherwise
    re-send any command after a dropped connection, including the ones that are
    not safe to repeat (audit records, summary commits). It still refreshes
    its view of the topology before raising, and :class:`RetryPolicy` repeats
    what is safe to repeat.
    """
    try:
        base = redis.Redis.from_url(_cluster_url(url))
    except ValueError as exc:  # a query parameter redis-py cannot parse
        raise ConfigError(f"bad cluster URL {url.redacted}: {exc}") from None
    given = base.connection_pool.connection_kwargs
    base.close()
    kwargs = {k: given[k] for k in _CLUSTER_KWARGS if k in given}
    kwargs["ssl"] = url.scheme.startswith("rediss")
    kwargs["retry"] = Retry(NoBackoff(), 0)
    return kwargs


def _sync_client(url: StoreURL) -> Any:
    if url.hosts:
        from redis.cluster import ClusterNode

        nodes = [ClusterNode(h, p) for h, p in url.hosts]  # type: ignore[no-untyped-call]
        kwargs = _cluster_kwargs(url)
        try:  # the sync cluster client connects here, to learn the topology
            return RedisCluster(startup_nodes=nodes, **kwargs)
        except (RedisError, RedisClusterException) as exc:
            raise _wrap(exc, "connect", url.redacted) from exc
    return _from_url(redis.Redis, url)


def _async_client(url: StoreURL) -> Any:
    if url.hosts:
        from redis.asyncio.cluster import ClusterNode as AsyncClusterNode

        nodes = [AsyncClusterNode(h, p) for h, p in url.hosts]
        return aredis.RedisCluster(startup_nodes=nodes, **_cluster_kwargs(url))
    return _from_url(aredis.Redis, url)


def _from_url(cls: Any, url: StoreURL) -> Any:
    try:
        return cls.from_url(url.backend_url, **_client_kwargs(url))
    except ValueError as exc:  # a query parameter redis-py cannot parse
        raise ConfigError(f"bad store URL {url.redacted}: {exc}") from None
