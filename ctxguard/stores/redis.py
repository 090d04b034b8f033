"""Redis and Redis Cluster stores (redis-py), sync and async.

Each mutating operation is one Lua script (``ctxguard/stores/lua/``): atomic and
one round trip. ``fetch_window`` (a read) is plain commands in one MULTI/EXEC
(``window_reads.py``), the script only when they cannot answer as it would. The
stores only move bytes: :mod:`redis_protocol` builds every call and parses every
reply. This module holds :class:`RedisStore` and re-exports
its twin :class:`AsyncRedisStore` (``redis_async.py``); ``redis_clients.py`` makes
the client from the URL and holds what both share, ``redis_errors.py`` turns
redis-py's errors into ctxguard's. Past ~400 lines on purpose: one class, one short
method per operation, its retry rule beside it (splitting the class would split the rule).

Retries. When the connection drops (or the cluster is reconfiguring), an
operation that is safe to repeat is sent again with backoff (:class:`RetryPolicy`:
4 attempts, 50 ms doubling to at most 1 s), the same on the sync and async
stores, standalone and cluster; when the attempts are used up, or the next one would
start past the operation's deadline (connect timeout plus read timeout, which also
bounds every connect and reply of it: ``redis_deadline.OPERATION`` on the sync store,
``redis_async_deadline`` on the async one), it raises
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
* not retried: ``retract`` and ``replace_tail`` (they remove the newest messages:
  a repeat would remove more; they raise :class:`~ctxguard.errors.StoreConnectionError`
  and the caller reads the session to see whether it ran).

So at the guard level ``prepare``, ``complete`` (with or without usage),
``append`` and the summary commit are all retried the same way.

Why this module is past ~400 lines: it is one class with one short method per
operation of the store contract plus this retry contract; the I/O-free parts
(calls, replies, the window reads) already live in their own modules, and splitting
the class would only scatter its twin-by-twin match with ``redis_async.py``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime
from functools import partial
from typing import Any, TypeVar

import redis
from redis.exceptions import (
    AuthenticationError,
    NoScriptError,
    RedisClusterException,
    RedisError,
    ResponseError,
)

from ctxguard._validate import check_count, check_prefix, check_store_args, check_tail_args
from ctxguard.errors import CorruptRecordError
from ctxguard.stores.base import (
    AppendResult,
    NewMessage,
    RecordWrite,
    ReplaceResult,
    SessionInfo,
    StoredMessage,
    Summary,
    WindowFetch,
    WindowHit,
    WriteOptions,
    decode_summary,
)
from ctxguard.stores.integrity import RawSession, RepairPlan
from ctxguard.stores.leases import check_lease, lease_call
from ctxguard.stores.redis_async import AsyncRedisStore
from ctxguard.stores.redis_clients import (
    NOT_BUFFERED,
    ConnectionShelf,
    RedisStoreBase,
    RetryPolicy,
    as_fetch,
    buffered_reader,
    next_buffered,
    pack,
    pack_evalsha,
    retry_delay,
    sync_client,
)
from ctxguard.stores.redis_deadline import OPERATION
from ctxguard.stores.redis_errors import (
    CLIENT_INTERNAL_ERRORS,
    RETRYABLE,
    client_failure,
    connection_phase,
    raised_in_client,
    wrap_error,
)
from ctxguard.stores.redis_protocol import SCRIPT_NAMES, Call, load_script
from ctxguard.stores.redis_scan import ScanWalk, dbsize, scan_nodes, scan_page
from ctxguard.stores.urls import StoreURL
from ctxguard.stores.window_reads import Commands, RowsHint, fetch_flow, pack_reads, run_flow

__all__ = ["CLIENT_INTERNAL_ERRORS", "RETRYABLE", "AsyncRedisStore", "RedisStore", "RetryPolicy"]

T = TypeVar("T")
_DEFAULT_OPTIONS = WriteOptions()


class SentRead:
    """A read sent on a shelved connection, its reply not taken yet."""

    __slots__ = ("conn",)

    def __init__(self, conn: Any) -> None:
        self.conn: Any = conn


class RedisStore(RedisStoreBase):
    """Synchronous store on Redis (``redis://``, ``rediss://``) or Redis Cluster."""

    def __init__(self, url: StoreURL, client: Any = None, retry: RetryPolicy | None = None) -> None:
        super().__init__(url, retry)
        self.client = client if client is not None else sync_client(url)
        self._direct = type(self.client) is redis.Redis
        self._shelf = ConnectionShelf(getattr(self.client, "connection_pool", None))
        self._scripts = {
            name: self.client.register_script(load_script(name)) for name in SCRIPT_NAMES
        }
        self._rows = RowsHint()  # how many records a window read takes first

    def _io(self, what: str, fn: Callable[[], T], idempotent: bool, keys: Sequence[str] = ()) -> T:
        delays = self.retry_policy.delays() if idempotent else iter(())
        sent: RedisError | None = None  # the last attempt that may have run, if any
        attempts = 0
        end = time.monotonic() + self.url.connect_timeout + self.url.read_timeout
        outer = OPERATION.end  # every attempt, connection and reply within one deadline
        OPERATION.end = end if outer is None or end < outer else outer
        try:
            while True:
                attempts += 1
                try:
                    return fn()
                except AuthenticationError as exc:
                    raise wrap_error(exc, what, self.where, self.url) from exc
                except RETRYABLE as exc:
                    sent = exc if connection_phase(exc) in ("write", "read", "lost") else sent
                    delay = retry_delay(delays, end)
                    if delay is None:  # report an attempt that may have run over a refusal
                        raise wrap_error(sent or exc, what, self.where, self.url, attempts) from exc
                    time.sleep(delay)
                except (RedisError, RedisClusterException) as exc:
                    raise self._error(exc, what, keys) from exc
                except CLIENT_INTERNAL_ERRORS as exc:
                    if not raised_in_client(exc):
                        raise  # our own bug: never disguised as a connection problem
                    delay = retry_delay(delays, end)
                    if delay is None:
                        raise client_failure(exc, what, self.where) from exc
                    time.sleep(delay)
        finally:
            OPERATION.end = outer

    def _run(self, call: Call, idempotent: bool = True) -> Any:
        script = self._scripts[call.script]
        attempts: list[Call] = []

        def send() -> Any:
            current = call.again() if attempts else call  # a retry says so (see Call.again)
            attempts.append(current)
            if self._direct:
                return self._evalsha(script, current)
            return script(keys=current.keys, args=current.args)

        return self._io(call.what, send, idempotent, call.keys)

    def _read(self, command: tuple[Any, ...]) -> Any:
        """One read command, on a shelved connection (the cluster client routes it)."""
        if not self._direct:
            return self.client.execute_command(*command)
        conn = self._shelf.take()
        try:
            conn.send_packed_command(pack(conn, *command))
            return conn.read_response()
        except ResponseError:
            raise  # an error reply: the connection is in step
        except BaseException:
            conn.disconnect()  # a reply may be left unread: never reuse the connection
            raise
        finally:
            self._shelf.give(conn)

    def _evalsha(self, script: Any, call: Call) -> Any:
        """EVALSHA on a shelved connection, without redis-py's per-command layers.

        Every turn pays redis-py's command dispatch (callbacks, hooks, retry
        wrapper) and its pool's (lock, hooks) on each round trip: about 25 µs of
        a 120 µs call here. Only the plain client takes this path; the cluster
        client routes by slot.
        """
        conn = self._shelf.take()
        try:
            conn.send_packed_command(pack_evalsha(conn, script.sha, call.keys, call.args))
            try:
                return conn.read_response()
            except NoScriptError:  # a restarted or flushed server: EVAL caches it again
                conn.send_packed_command(
                    pack(conn, "EVAL", script.script, len(call.keys), *call.keys, *call.args)
                )
                return conn.read_response()
        except ResponseError:
            raise  # an error reply: the connection is in step
        except BaseException:
            conn.disconnect()  # a reply may be left unread: never reuse the connection
            raise
        finally:
            self._shelf.give(conn)

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

    def read_with_token(
        self, session_id: str, start: int = 0, stop: int | None = None
    ) -> tuple[list[StoredMessage], str]:
        call = self.protocol.read_call(session_id, start, stop, with_token=True)
        return self.protocol.parse_read_with_token(session_id, self._run(call))

    def state_token(self, session_id: str) -> str:
        """The session's state token ('' = no session), as a commit would check it: one
        plain read, no script (how ``commit="with_reply"`` checks a cached window)."""
        command = self.protocol.token_read(session_id)
        keys = (command[1],)
        return self.protocol.parse_token(
            self._io("state_token", partial(self._read, command), True, keys)
        )

    def send_state_token(self, session_id: str) -> SentRead | None:
        """Send :meth:`state_token`'s read and return without its reply, which
        :meth:`state_token_reply` takes: a prepare plans meanwhile, so the round trip
        overlaps its Python. None where this client cannot (the cluster client routes
        by slot, or the send failed): the reply call then reads the whole way."""
        if not self._direct:
            return None
        conn = self._shelf.take()
        try:
            conn.send_packed_command(pack(conn, *self.protocol.token_read(session_id)))
        except Exception:
            conn.disconnect()
            self._shelf.give(conn)
            return None
        return SentRead(conn)

    def state_token_reply(self, sent: SentRead | None, session_id: str) -> str:
        """The reply of :meth:`send_state_token`'s read (or, without one, a whole read:
        retried, under the operation's deadline, as any store call)."""
        if sent is None or sent.conn is None:
            return self.state_token(session_id)
        conn, sent.conn = sent.conn, None  # (taken once)
        try:
            fields = conn.read_response()
        except ResponseError:
            self._shelf.give(conn)  # an error reply: in step; the whole read says it
            return self.state_token(session_id)
        except Exception:
            conn.disconnect()  # a reply may be left unread: never reuse the connection
            self._shelf.give(conn)
            return self.state_token(session_id)
        except BaseException:
            conn.disconnect()
            self._shelf.give(conn)
            raise
        self._shelf.give(conn)
        return self.protocol.parse_token(fields)

    def read_last(self, session_id: str, count: int) -> list[StoredMessage]:
        check_count(count, "count")
        if count == 0:
            return []
        return self.read(session_id, -count, None)

    def info(self, session_id: str) -> SessionInfo | None:
        keys = self.protocol.keys(session_id, stored=True)

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
        keys = self.protocol.keys(session_id, stored=True)
        leases = self.protocol.keyspace.lease_names_key(session_id, stored=True)
        return bool(self._run(Call("delete", [*keys, leases], [])))  # with its leases

    def list_sessions(self, prefix: str = "") -> Iterator[str]:
        check_prefix(prefix)
        pattern = self.protocol.keyspace.meta_pattern(prefix)
        seen: set[str] = set()
        for node in self._io("list", lambda: scan_nodes(self.client), True):
            walk = ScanWalk(self.where)  # each page its own operation; the walk must end
            while not walk.done:
                page = partial(scan_page, self.client, node, walk.cursor, pattern)
                cursor, keys = self._io("list", page, True)
                for key in keys:
                    session_id = self.protocol.keyspace.session_id_from_meta_key(key.decode())
                    if session_id is not None and session_id not in seen:
                        seen.add(session_id)
                        yield session_id
                if walk.take(cursor):
                    walk.allow(self._io("list", partial(dbsize, self.client, node), True))

    def fetch_window(
        self,
        session_id: str,
        budget: int,
        options: WriteOptions = _DEFAULT_OPTIONS,
        new: Sequence[NewMessage] = (),
        min_messages: int = 0,
    ) -> WindowFetch:
        # plain reads in one MULTI/EXEC; the script only when they cannot answer alike
        flow = fetch_flow(self.protocol, self._rows, session_id, budget, options, new, min_messages)
        keys = self.protocol.keys(session_id)
        fetch = run_flow(
            flow, lambda c: self._io("fetch_window", partial(self._multi, c), True, keys)
        )
        if fetch is not None:
            return fetch
        reply = self._run(self.protocol.window_call(session_id, budget, options, new, min_messages))
        return as_fetch(self.protocol.parse_window(session_id, new, reply, options))

    def _multi(self, commands: Commands) -> list[Any]:
        """Reads of one session in one MULTI/EXEC (an error, e.g. WRONGTYPE, in its place)."""
        if not self._direct:  # the cluster client routes the transaction by its one slot
            pipe = self.client.pipeline(transaction=True)
            for command in commands:
                pipe.execute_command(*command)
            return list(pipe.execute(raise_on_error=False))
        conn = self._shelf.take()
        try:
            conn.send_packed_command(pack_reads(commands))
            conn.read_response()  # MULTI's OK: the first reply, waited for under the deadline
            # then QUEUED for each command and EXEC's array, mostly in the same packet:
            # taken from the reader's buffer as they are whole, else read as the OK was
            reader = buffered_reader(self._shelf, conn)
            reply: Any = None
            for _ in range(len(commands) + 1):
                reply = next_buffered(reader)
                if reply is NOT_BUFFERED:
                    reply = conn.read_response()
            return list(reply)
        except BaseException:
            conn.disconnect()  # replies may be left unread: never reuse the connection
            raise
        finally:
            self._shelf.give(conn)

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
        key = self.protocol.keys(session_id, stored=True)[5]
        return decode_summary(
            session_id, self._io("get_summary", lambda: self.client.get(key), True, (key,))
        )

    def retract(
        self,
        session_id: str,
        count: int = 1,
        expected_count: int | None = None,
        ttl: int = 0,
        expected_state: str | None = None,
    ) -> list[StoredMessage]:
        """Remove the newest ``count`` messages (explicit deletion, audited); returns them."""
        call = self.protocol.retract_call(session_id, count, expected_count, ttl, expected_state)
        return self.protocol.parse_retract(session_id, self._run(call, idempotent=False))

    def replace_tail(
        self,
        session_id: str,
        start: int,
        messages: Sequence[NewMessage],
        expected_count: int | None = None,
        options: WriteOptions = _DEFAULT_OPTIONS,
        expected_state: str | None = None,
    ) -> ReplaceResult:
        """Messages ``start`` and later replaced by ``messages``: one script (replace.lua)."""
        check_tail_args(start, expected_count)
        check_store_args(new=messages, options=options)
        call = self.protocol.replace_call(
            session_id, start, messages, expected_count, options, expected_state
        )
        reply = self._run(call, idempotent=False)  # a repeat would remove more
        return self.protocol.parse_replace(session_id, messages, reply)

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

    def acquire_lease(self, session_id: str, name: str, holder: str, seconds: float) -> bool:
        """Take or renew the lease on ``name`` (see :mod:`.leases`); False if another holds it."""
        check_lease(holder, seconds, acquire=True)  # (None: a release in lease_call)
        call = lease_call(self.protocol.keyspace, session_id, name, holder, seconds)
        return bool(self._run(call))  # repeatable: the holder's own lease is renewed

    def release_lease(self, session_id: str, name: str, holder: str) -> bool:
        call = lease_call(self.protocol.keyspace, session_id, name, holder, None)
        return bool(self._run(call))

    def record(self, session_id: str, write: RecordWrite) -> int:
        """Write back token counts and an audit record in one script call; returns the turn."""
        call = self.protocol.record_call(session_id, write)
        if call is None:
            return 0
        reply = self._run(call)
        return int(reply) if write.audit is not None else 0

    def append_with_audit(
        self,
        session_id: str,
        messages: Sequence[NewMessage],
        options: WriteOptions,
        write: RecordWrite,
    ) -> AppendResult:
        """Append, and add an audit record (e.g. the server's usage) and recounts, in one
        script call."""
        call = self.protocol.append_with_record_call(session_id, messages, options, write)
        return self.protocol.parse_append(session_id, messages, self._run(call))

    def read_audit(
        self, session_id: str, *, damaged: list[CorruptRecordError] | None = None
    ) -> list[dict[str, Any]]:
        keys = self.protocol.keys(session_id, stored=True)

        def fetch() -> list[Any]:
            # the trail, then the contexts its records name (only ever added, so read
            # after the records, every context they name is there)
            pipe = self.client.pipeline(transaction=False)
            pipe.lrange(keys[6], 0, -1)
            pipe.hgetall(keys[8])
            out: list[Any] = pipe.execute(raise_on_error=False)
            if isinstance(out[0], Exception):
                raise out[0]
            return out

        raw, contexts = self._io("read_audit", fetch, True, (keys[6],))
        return self.protocol.parse_audit(session_id, raw, contexts, damaged)

    def inspect(self, session_id: str) -> RawSession | None:
        """Every key of the session as stored, for ``ctxguard audit`` / ``repair``."""
        return self.protocol.parse_inspect(self._run(self.protocol.inspect_call(session_id)))

    def repair(self, session_id: str, plan: RepairPlan, record: Mapping[str, Any]) -> bool:
        """Apply ``plan`` and add ``record`` if the session is as inspected; False if not."""
        call = self.protocol.repair_call(session_id, plan, record)
        return bool(self._run(call, idempotent=False))

    def close(self) -> None:
        self.client.close()
