"""Redis and Redis Cluster stores (redis-py), sync and async.

Each mutating operation is one Lua script (``ctxguard/stores/lua/``): atomic and
one round trip. The classes here only move bytes: :mod:`redis_protocol` builds
every call and parses every reply.

Retries. When the connection drops (or the cluster is reconfiguring), an
operation that is safe to repeat is sent again with backoff (:class:`RetryPolicy`:
4 attempts, 50 ms doubling to at most 1 s), the same on the sync and async
stores, standalone and cluster; when the attempts are used up it raises
:class:`~ctxguard.errors.StoreConnectionError`. Safe to repeat means a repeat
after a lost reply changes nothing more and answers as the first attempt would
have:

* retried: ``append`` (idempotent by message id; a message stored by the lost
  attempt is reported as stored, not as a duplicate), ``fetch_window``,
  ``commit_if_unchanged`` (a commit whose audit record is already written
  answers as a hit with the same turn), ``read``, ``read_last``, ``info``,
  ``list_sessions``, ``get_summary``, ``read_audit``, ``set_token_counts``,
  ``add_audit``, ``record`` and ``append_with_audit`` (audit records carry an id,
  ``rid``, and a record already in the trail is not written again: the retry
  gets the turn the first attempt was given), ``commit_summary`` (the summary
  already committed by the lost attempt answers "committed"), ``restore``
  (raises the turn counter to a value, sets a summary only if there is none),
  ``delete``.
* not retried: ``retract`` (removes the newest messages: a repeat would remove
  more; it raises :class:`~ctxguard.errors.StoreConnectionError` and the caller
  reads the session to see whether it ran).

So at the guard level ``prepare``, ``complete`` (with or without usage),
``append`` and the summary commit are all retried the same way.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
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

from ctxguard._validate import check_count, check_prefix, check_store_args
from ctxguard.errors import ConfigError, ConnectionPhase, StoreConnectionError, StoreError
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
    decode_summary,
)
from ctxguard.stores.integrity import RawSession, RepairPlan
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


def _wrap(
    exc: RedisError | RedisClusterException, what: str, where: str, url: StoreURL | None = None
) -> StoreError:
    # RedisClusterException is redis-py's "no node of the cluster can be reached".
    # redis-py's texts for these errors hold host:port at most (never the URL),
    # but the messages below are ctxguard's own: they never quote the backend.
    if isinstance(exc, AuthenticationError):
        return StoreConnectionError(
            f"{what} failed: {where} refused the credentials ({type(exc).__name__}); "
            "check the user name and password in the store URL",
            phase="connect",
        )
    if isinstance(exc, (*RETRYABLE, RedisClusterException)):
        phase = _phase(exc)
        return StoreConnectionError(
            f"{what} failed: {_connection_problem(exc, phase, where, url)}", phase=phase
        )
    return StoreError(f"{what} failed on {where}: {type(exc).__name__}: {exc}")


# redis-py runs these while it opens a connection (TCP, TLS, AUTH/HELLO/SELECT):
# an error raised inside them means our command was never sent.
_CONNECT_FRAMES = frozenset({"connect_check_health", "on_connect_check_health", "_connect"})
_TLS_FRAMES = frozenset({"_wrap_socket_with_ssl", "do_handshake", "wrap_socket"})


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    item: BaseException | None = exc
    while item is not None and item not in seen:
        seen.append(item)
        item = item.__cause__ or item.__context__
    return seen


def _frames(chain: list[BaseException]) -> set[str]:
    names: set[str] = set()
    for item in chain:
        tb = item.__traceback__
        while tb is not None:
            names.add(tb.tb_frame.f_code.co_name)
            tb = tb.tb_next
    return names


def _phase(exc: RedisError | RedisClusterException) -> ConnectionPhase:
    """Where the connection failed: see :class:`~ctxguard.errors.StoreConnectionError`."""
    chain = _chain(exc)
    frames = _frames(chain)
    if any(isinstance(e, ssl.SSLError) for e in chain) or frames & _TLS_FRAMES:
        return "tls"
    if frames & _CONNECT_FRAMES:
        return "connect"
    if isinstance(exc, RedisClusterException) and not isinstance(exc, RETRYABLE):
        return "connect"  # the cluster client could reach no startup node
    if isinstance(exc, redis.TimeoutError):
        return "read"
    return "lost"


def _connection_problem(
    exc: RedisError | RedisClusterException,
    phase: ConnectionPhase,
    where: str,
    url: StoreURL | None,
) -> str:
    connect_s = f"{url.connect_timeout:g} s" if url else "the connect timeout"
    read_s = f"{url.read_timeout:g} s" if url else "the read timeout"
    chain = _chain(exc)
    timed_out = any(isinstance(e, (redis.TimeoutError, TimeoutError)) for e in chain)
    nothing = "nothing was sent, safe to retry"
    if phase == "tls":
        bad_cert = next((e for e in chain if isinstance(e, ssl.SSLCertVerificationError)), None)
        if bad_cert is not None:
            return (
                f"TLS handshake with {where} failed: the server's certificate was not accepted "
                f"({bad_cert.verify_message}); set ssl_ca_certs in the URL; {nothing}"
            )
        if timed_out:
            return (
                f"TLS handshake with {where} got no answer within {read_s}: is this a TLS port? "
                f"{nothing}"
            )
        reason = next((e.reason for e in chain if isinstance(e, ssl.SSLError) and e.reason), "")
        shown = f" ({reason})" if reason else ""
        return f"TLS handshake with {where} failed{shown}: is this a TLS port? {nothing}"
    if phase == "connect":
        tls_hint = " or finish the TLS handshake" if url is not None and url.tls else ""
        handshake = "the connection or TLS handshake" if tls_hint else "the handshake"
        if timed_out and any(str(e).startswith("Timeout connecting") for e in chain):
            return (
                f"could not connect to {where}{tls_hint} within {connect_s} (connect timeout; "
                f"raise it with ?socket_connect_timeout=...); {nothing}"
            )
        if timed_out:
            return (
                f"{where} accepted the connection but did not answer {handshake} within "
                f"{read_s} (read timeout; raise it with ?socket_timeout=...): is it a Redis "
                f"server{_tls_question(url)}? {nothing}"
            )
        oserror = next((e for e in chain if isinstance(e, OSError) and e.strerror), None)
        if oserror is not None:
            return f"could not connect to {where}{tls_hint} ({oserror.strerror}); {nothing}"
        if isinstance(exc, RedisClusterException) and not isinstance(exc, RETRYABLE):
            return f"could not reach any node of {where}; {nothing}"
        return (
            f"{where} closed the connection during {handshake} ({type(exc).__name__}): "
            f"is it a Redis server{_tls_question(url)}? {nothing}"
        )
    if phase == "read":
        return (
            f"no reply from {where} within {read_s} (read timeout; raise it with "
            "?socket_timeout=...); the operation may or may not have run"
        )
    return (
        f"lost the connection to {where} ({type(exc).__name__}); "
        "the operation may or may not have run"
    )


def _tls_question(url: StoreURL | None) -> str:
    if url is None:
        return ""
    return ", and is this a TLS port" if url.tls else " (a TLS port needs rediss://)"


def _as_fetch(result: WindowFetch | WindowHit) -> WindowFetch:
    """A plain fetch sends no state token, so the script cannot answer with a hit."""
    if isinstance(result, WindowHit):
        raise StoreError("the window script committed a fetch that expected nothing")
    return result


def _client_kwargs(url: StoreURL) -> dict[str, Any]:
    """Credentials and timeouts go as arguments: the URL redis-py parses holds neither."""
    return {"retry": Retry(NoBackoff(), 0), "decode_responses": False, **url.client_kwargs()}


class _Base:
    def __init__(self, url: StoreURL, retry: RetryPolicy | None) -> None:
        self.url = url
        self.protocol = RedisProtocol(KeySpace(url.namespace, url.tenant))
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
        return _wrap(exc, what, self.where, self.url)

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

    def _io(self, what: str, fn: Callable[[], T], idempotent: bool, keys: Sequence[str] = ()) -> T:
        delays = self.retry_policy.delays() if idempotent else iter(())
        sent: RedisError | None = None  # the last attempt that may have run, if any
        while True:
            try:
                return fn()
            except AuthenticationError as exc:
                raise _wrap(exc, what, self.where, self.url) from exc
            except RETRYABLE as exc:
                sent = exc if _phase(exc) in ("read", "lost") else sent
                delay = next(delays, None)
                if delay is None:  # report an attempt that may have run over a later refusal
                    raise _wrap(sent or exc, what, self.where, self.url) from exc
                time.sleep(delay)
            except (RedisError, RedisClusterException) as exc:
                raise self._error(exc, what, keys) from exc
            except CLIENT_INTERNAL_ERRORS as exc:
                if not _raised_in_client(exc):
                    raise  # our own bug: never disguised as a connection problem
                delay = next(delays, None)
                if delay is None:
                    raise _client_failure(exc, what, self.where) from exc
                time.sleep(delay)

    def _run(self, call: Call, idempotent: bool = True) -> Any:
        script = self._scripts[call.script]
        attempts: list[Call] = []

        def send() -> Any:
            current = call.again() if attempts else call  # a retry says so (see Call.again)
            attempts.append(current)
            if self._direct:
                return self._evalsha(script, current)
            return script(keys=current.keys, args=current.args)

        return self._io(call.script, send, idempotent, call.keys)

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
        check_store_args(new=messages, options=options)
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
        check_count(count, "count")
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

        meta, ttl, audits = self._io("info", fetch, True, (keys[0], keys[6]))
        flat = [x for kv in meta.items() for x in kv]
        return self.protocol.parse_info(session_id, flat, ttl, int(audits))

    def delete(self, session_id: str) -> bool:
        keys = self.protocol.keys(session_id)
        return bool(self._io("delete", lambda: self.client.delete(*keys), True))

    def list_sessions(self, prefix: str = "") -> Iterator[str]:
        check_prefix(prefix)
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
        return _as_fetch(self.protocol.parse_window(session_id, new, reply, options))

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
        # repeatable: a retry whose audit record is already written answers as a hit
        reply = self._run(call)
        return self.protocol.parse_window(session_id, new, reply, options)

    def set_token_counts(
        self, session_id: str, counter: str, counts: Mapping[int, int], ttl: int = 0
    ) -> None:
        self._run(self.protocol.set_counts_call(session_id, counter, counts, ttl))

    def get_summary(self, session_id: str) -> Summary | None:
        key = self.protocol.keys(session_id)[5]
        return decode_summary(
            session_id, self._io("get_summary", lambda: self.client.get(key), True, (key,))
        )

    def retract(
        self, session_id: str, count: int = 1, expected_count: int | None = None, ttl: int = 0
    ) -> list[StoredMessage]:
        """Remove the newest ``count`` messages (explicit deletion, audited); returns them."""
        call = self.protocol.retract_call(session_id, count, expected_count, ttl)
        return self.protocol.parse_retract(session_id, self._run(call, idempotent=False))

    def restore(
        self,
        session_id: str,
        turns: int,
        summary: Summary | None,
        ttl: int = 0,
        *,
        created_at: datetime | None = None,
    ) -> tuple[int, int]:
        """For import: raise the turn counter, set the summary if there is none yet,
        and move the creation time back to ``created_at`` when that is earlier."""
        call = self.protocol.restore_call(session_id, turns, summary, ttl, created_at)
        reply = self._run(call)
        return int(reply[0]), int(reply[1])

    def commit_summary(
        self, session_id: str, summary: Summary, expected_version: int, ttl: int = 0
    ) -> bool:
        call = self.protocol.commit_summary_call(session_id, summary, expected_version, ttl)
        return bool(self._run(call))  # repeatable: the same summary answers "committed"

    def add_audit(
        self, session_id: str, record: Mapping[str, Any], retention: int, ttl: int = 0
    ) -> int:
        call = self.protocol.audit_call(session_id, record, retention, ttl)
        return int(self._run(call))  # repeatable: by the record's rid

    def _pipelined(self, calls: Sequence[Call], idempotent: bool) -> list[Any]:
        """Several scripts of one session in one round trip (not one transaction).

        Sent as EVAL with the script text, not EVALSHA: redis-py would first ask
        SCRIPT EXISTS for scripts queued on a pipeline (an extra round trip on
        every call), and an EVALSHA that meets NOSCRIPT mid-pipeline would leave
        the pipeline half applied. Redis caches the script by its SHA either way.
        """

        attempts: list[int] = []

        def send() -> list[Any]:
            pipe = self.client.pipeline(transaction=False)
            for call in calls:
                current = call.again() if attempts else call  # see Call.again
                _queue_eval(pipe, self._scripts[call.script].script, current)
            attempts.append(1)
            return list(pipe.execute())

        return self._io("+".join(c.script for c in calls), send, idempotent, calls[0].keys)

    def record(self, session_id: str, write: RecordWrite) -> int:
        """Write back token counts and an audit record in one round trip; returns the turn."""
        calls = self.protocol.record_calls(session_id, write)
        if not calls:
            return 0
        if len(calls) == 1:  # one script: EVALSHA, not the whole script text (see _pipelined)
            reply = self._run(calls[0])
            return int(reply) if write.audit is not None else 0
        replies = self._pipelined(calls, idempotent=True)
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
            replies = self._pipelined(calls, idempotent=True)
            return self.protocol.parse_append(session_id, messages, replies[0])
        call = self.protocol.append_call(
            session_id, messages, options, write.audit, write.retention
        )
        return self.protocol.parse_append(session_id, messages, self._run(call))

    def read_audit(self, session_id: str) -> list[dict[str, Any]]:
        key = self.protocol.keys(session_id)[6]
        raw = self._io("read_audit", lambda: self.client.lrange(key, 0, -1), True, (key,))
        return self.protocol.parse_audit(session_id, raw)

    def inspect(self, session_id: str) -> RawSession | None:
        """Every key of the session as stored, for ``ctxguard audit`` / ``repair``."""
        return self.protocol.parse_inspect(self._run(self.protocol.inspect_call(session_id)))

    def repair(self, session_id: str, plan: RepairPlan, record: Mapping[str, Any]) -> bool:
        """Apply ``plan`` and add ``record`` if the session is as inspected; False if not."""
        call = self.protocol.repair_call(session_id, plan, record)
        return bool(self._run(call, idempotent=False))

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

    async def _io(
        self,
        what: str,
        fn: Callable[[], Awaitable[T]],
        idempotent: bool,
        keys: Sequence[str] = (),
    ) -> T:
        delays = self.retry_policy.delays() if idempotent else iter(())
        sent: RedisError | None = None  # the last attempt that may have run, if any
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
                raise _wrap(exc, what, self.where, self.url) from exc
            except RETRYABLE as exc:
                sent = exc if _phase(exc) in ("read", "lost") else sent
                delay = next(delays, None)
                if delay is None:  # report an attempt that may have run over a later refusal
                    raise _wrap(sent or exc, what, self.where, self.url) from exc
                await asyncio.sleep(delay)
            except (RedisError, RedisClusterException) as exc:
                raise self._error(exc, what, keys) from exc
            except CLIENT_INTERNAL_ERRORS as exc:
                if not _raised_in_client(exc):
                    raise  # our own bug: never disguised as a connection problem
                delay = next(delays, None)
                if delay is None:
                    raise _client_failure(exc, what, self.where) from exc
                await asyncio.sleep(delay)

    async def _run(self, call: Call, idempotent: bool = True) -> Any:
        script = self._scripts[call.script]
        attempts: list[Call] = []

        async def send() -> Any:
            current = call.again() if attempts else call  # a retry says so (see Call.again)
            attempts.append(current)
            if self._direct:
                return await self._evalsha(script, current)
            return await script(keys=current.keys, args=current.args)

        return await self._io(call.script, send, idempotent, call.keys)

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
        check_store_args(new=messages, options=options)
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
        check_count(count, "count")
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

        meta, ttl, audits = await self._io("info", fetch, True, (keys[0], keys[6]))
        flat = [x for kv in meta.items() for x in kv]
        return self.protocol.parse_info(session_id, flat, ttl, int(audits))

    async def delete(self, session_id: str) -> bool:
        keys = self.protocol.keys(session_id)
        return bool(await self._io("delete", lambda: self.client.delete(*keys), True))

    async def list_sessions(self, prefix: str = "") -> AsyncIterator[str]:
        check_prefix(prefix)
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
        return _as_fetch(self.protocol.parse_window(session_id, new, reply, options))

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
        reply = await self._run(call)  # repeatable: see RedisStore.commit_if_unchanged
        return self.protocol.parse_window(session_id, new, reply, options)

    async def set_token_counts(
        self, session_id: str, counter: str, counts: Mapping[int, int], ttl: int = 0
    ) -> None:
        await self._run(self.protocol.set_counts_call(session_id, counter, counts, ttl))

    async def get_summary(self, session_id: str) -> Summary | None:
        key = self.protocol.keys(session_id)[5]
        return decode_summary(
            session_id,
            await self._io("get_summary", lambda: self.client.get(key), True, (key,)),
        )

    async def retract(
        self, session_id: str, count: int = 1, expected_count: int | None = None, ttl: int = 0
    ) -> list[StoredMessage]:
        call = self.protocol.retract_call(session_id, count, expected_count, ttl)
        return self.protocol.parse_retract(session_id, await self._run(call, idempotent=False))

    async def restore(
        self,
        session_id: str,
        turns: int,
        summary: Summary | None,
        ttl: int = 0,
        *,
        created_at: datetime | None = None,
    ) -> tuple[int, int]:
        call = self.protocol.restore_call(session_id, turns, summary, ttl, created_at)
        reply = await self._run(call)
        return int(reply[0]), int(reply[1])

    async def commit_summary(
        self, session_id: str, summary: Summary, expected_version: int, ttl: int = 0
    ) -> bool:
        call = self.protocol.commit_summary_call(session_id, summary, expected_version, ttl)
        return bool(await self._run(call))  # repeatable: see RedisStore.commit_summary

    async def add_audit(
        self, session_id: str, record: Mapping[str, Any], retention: int, ttl: int = 0
    ) -> int:
        call = self.protocol.audit_call(session_id, record, retention, ttl)
        return int(await self._run(call))  # repeatable: by the record's rid

    async def _pipelined(self, calls: Sequence[Call], idempotent: bool) -> list[Any]:
        attempts: list[int] = []

        async def send() -> list[Any]:
            pipe = self.client.pipeline(transaction=False)
            for call in calls:
                current = call.again() if attempts else call  # see Call.again
                _queue_eval(pipe, self._scripts[call.script].script, current)
            attempts.append(1)
            return list(await pipe.execute())

        return await self._io("+".join(c.script for c in calls), send, idempotent, calls[0].keys)

    async def record(self, session_id: str, write: RecordWrite) -> int:
        calls = self.protocol.record_calls(session_id, write)
        if not calls:
            return 0
        if len(calls) == 1:  # one script: EVALSHA, not the whole script text (see _pipelined)
            reply = await self._run(calls[0])
            return int(reply) if write.audit is not None else 0
        replies = await self._pipelined(calls, idempotent=True)
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
            replies = await self._pipelined(calls, idempotent=True)
            return self.protocol.parse_append(session_id, messages, replies[0])
        call = self.protocol.append_call(
            session_id, messages, options, write.audit, write.retention
        )
        reply = await self._run(call)
        return self.protocol.parse_append(session_id, messages, reply)

    async def read_audit(self, session_id: str) -> list[dict[str, Any]]:
        key = self.protocol.keys(session_id)[6]
        raw = await self._io("read_audit", lambda: self.client.lrange(key, 0, -1), True, (key,))
        return self.protocol.parse_audit(session_id, raw)

    async def inspect(self, session_id: str) -> RawSession | None:
        reply = await self._run(self.protocol.inspect_call(session_id))
        return self.protocol.parse_inspect(reply)

    async def repair(self, session_id: str, plan: RepairPlan, record: Mapping[str, Any]) -> bool:
        call = self.protocol.repair_call(session_id, plan, record)
        return bool(await self._run(call, idempotent=False))

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
        f"({type(exc).__name__} inside redis-py)",
        phase="lost",
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
    "ssl_min_version",
    "ssl_ciphers",
    "socket_keepalive",
    "max_connections",
)


def _cluster_kwargs(url: StoreURL) -> dict[str, Any]:
    """Client settings for a cluster URL, parsed the way redis-py parses a server URL.

    ``retry`` allows no retries: redis-py's cluster client would otherwise
    re-send any command after a dropped connection, including the ones that are
    not safe to repeat (audit records, summary commits). It still refreshes
    its view of the topology before raising, and :class:`RetryPolicy` repeats
    what is safe to repeat.
    """
    unsupported = [k for k, _ in (*url.options, *url.secret_options) if k not in _CLUSTER_KWARGS]
    if unsupported:
        raise ConfigError(
            f"{', '.join(unsupported)} cannot be set on a cluster URL; it takes "
            + ", ".join(_CLUSTER_KWARGS)
        )
    try:  # the URL redis-py parses holds no credentials: its message shows no secret
        base = redis.Redis.from_url(url.redis_url())
    except ValueError as exc:  # a query parameter redis-py cannot parse
        raise ConfigError(f"bad cluster URL {url.redacted}: {exc}") from None
    given = base.connection_pool.connection_kwargs
    base.close()
    kwargs = {k: given[k] for k in _CLUSTER_KWARGS if k in given}
    kwargs.update(url.client_kwargs())
    kwargs["ssl"] = url.tls
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
            raise _wrap(exc, "connect", url.redacted, url) from exc
    return _from_url(redis.Redis, url)


def _async_client(url: StoreURL) -> Any:
    if url.hosts:
        from redis.asyncio.cluster import ClusterNode as AsyncClusterNode

        nodes = [AsyncClusterNode(h, p) for h, p in url.hosts]
        return aredis.RedisCluster(startup_nodes=nodes, **_cluster_kwargs(url))
    return _from_url(aredis.Redis, url)


def _from_url(cls: Any, url: StoreURL) -> Any:
    try:  # the URL redis-py parses holds no credentials: its message shows no secret
        return cls.from_url(url.redis_url(), **_client_kwargs(url))
    except ValueError as exc:  # a query parameter redis-py cannot parse
        raise ConfigError(f"bad store URL {url.redacted}: {exc}") from None
