"""The asynchronous Redis store (``redis.asyncio``), twin of :mod:`ctxguard.stores.redis`.

Each method mirrors :class:`~ctxguard.stores.redis.RedisStore` line for line
(the retry rules in that module's docstring hold here unchanged); keep the two
in step. Imported as ``from ctxguard.stores.redis import AsyncRedisStore``. Past ~400
lines for the reason its twin gives: one class, one short method per operation.

The operation's deadline (connect timeout plus read timeout) bounds all of it: retries,
the attempt under way, its connection's handshake and replies; past it the task is
cancelled where it waits (:mod:`.redis_async_deadline`, ``asyncio.timeout``'s way at a
fraction of its cost). What it cuts, redis-py cleans up as it does any cancelled call: a
connection whose command or handshake was cancelled is disconnected (``read_response``,
``send_packed_command`` and the connect drop it on any BaseException: redis-py's fix of
its issues 2624/2665, merged May 2023, before 5.0, ctxguard's floor; ``_evalsha`` and
``_multi`` here do too), so no pooled connection keeps a reply that a later command
would read as its own (tests/faults/test_operation_deadline.py).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from datetime import datetime
from functools import partial
from typing import Any, TypeVar

import redis.asyncio as aredis
from redis.exceptions import (
    AuthenticationError,
    NoScriptError,
    RedisClusterException,
    RedisError,
    ResponseError,
)
from redis.exceptions import TimeoutError as RedisTimeoutError

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
from ctxguard.stores.redis_async_deadline import OperationDeadlines
from ctxguard.stores.redis_clients import (
    NOT_BUFFERED,
    AsyncConnectionShelf,
    RedisStoreBase,
    RetryPolicy,
    as_fetch,
    asend,
    async_client,
    buffered_reader,
    next_buffered,
    pack,
    pack_evalsha,
    retry_delay,
)
from ctxguard.stores.redis_errors import (
    CLIENT_INTERNAL_ERRORS,
    RETRYABLE,
    client_failure,
    connection_phase,
    deadline_error,
    raised_in_client,
    wrap_error,
)
from ctxguard.stores.redis_loops import LoopBinding, abandon
from ctxguard.stores.redis_protocol import SCRIPT_NAMES, Call, load_script
from ctxguard.stores.redis_scan import ScanWalk, adbsize, ascan_page, scan_nodes
from ctxguard.stores.urls import StoreURL
from ctxguard.stores.window_reads import Commands, RowsHint, fetch_flow, pack_reads

T = TypeVar("T")
_DEFAULT_OPTIONS = WriteOptions()


class AsyncRedisStore(RedisStoreBase):
    """Asynchronous twin of :class:`~ctxguard.stores.redis.RedisStore` (``redis.asyncio``)."""

    def __init__(self, url: StoreURL, client: Any = None, retry: RetryPolicy | None = None) -> None:
        super().__init__(url, retry)
        self._owns_client = client is None  # a client passed in is the caller's to replace
        self._use(client if client is not None else async_client(url))
        self._rows = RowsHint()  # how many records a window read takes first
        self._binding = LoopBinding()  # the event loop its connections belong to
        self._limit = url.connect_timeout + url.read_timeout  # an operation's deadline
        self._deadlines = OperationDeadlines(None)  # (its loop's, once claimed)

    def _use(self, client: Any) -> None:
        self.client = client
        self._direct = type(client) is aredis.Redis
        self._cluster = isinstance(client, aredis.RedisCluster)
        self._shelf = AsyncConnectionShelf(getattr(client, "connection_pool", None))
        self._scripts = {name: client.register_script(load_script(name)) for name in SCRIPT_NAMES}

    def _claim_loop(self) -> None:
        """The running loop takes the store (see :mod:`.redis_loops`): a ConfigError while
        the loop that used it runs in another thread; once that loop stopped, a new client."""
        if self._binding.claim(self.where):  # took over from a loop that closed or stopped
            old = self.client
            if self._owns_client:
                self._use(async_client(self.url))
            abandon(old)  # (a caller's client reconnects on this loop as it is used)
        self._deadlines = OperationDeadlines(self._binding.loop)

    async def _io(
        self,
        what: str,
        fn: Callable[[], Awaitable[T]],
        idempotent: bool,
        keys: Sequence[str] = (),
    ) -> T:
        if asyncio.get_running_loop() is not self._binding.loop:
            self._claim_loop()  # (first use, or another loop: before any connection is touched)
        delays = self.retry_policy.delays() if idempotent else iter(())
        sent: RedisError | None = None  # the last attempt that may have run, if any
        attempts = 0
        end = time.monotonic() + self._limit  # no retry starts past it
        deadlines = self._deadlines  # nor runs the attempt under way, handshake and all
        entry = deadlines.start(end)
        try:
            while True:
                attempts += 1
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
                    raise wrap_error(exc, what, self.where, self.url) from exc
                except RETRYABLE as exc:
                    sent = exc if connection_phase(exc) in ("write", "read", "lost") else sent
                    delay = retry_delay(delays, end)
                    if delay is None:  # report an attempt that may have run over a refusal
                        raise wrap_error(sent or exc, what, self.where, self.url, attempts) from exc
                    await asyncio.sleep(delay)
                except (RedisError, RedisClusterException) as exc:
                    raise self._error(exc, what, keys) from exc
                except CLIENT_INTERNAL_ERRORS as exc:
                    if not raised_in_client(exc):
                        raise  # our own bug: never disguised as a connection problem
                    delay = retry_delay(delays, end)
                    if delay is None:
                        raise client_failure(exc, what, self.where) from exc
                    await asyncio.sleep(delay)
        except asyncio.CancelledError as exc:
            if not deadlines.cut(entry):
                raise  # the caller's cancellation
            cut = deadline_error(exc, self.where)  # (redis-py dropped the connection it cut)
            sent = cut if connection_phase(cut) in ("write", "read", "lost") else sent
            raise wrap_error(sent or cut, what, self.where, self.url, attempts) from cut
        finally:
            deadlines.end(entry)

    async def _run(self, call: Call, idempotent: bool = True) -> Any:
        attempts: list[Call] = []

        async def send() -> Any:
            current = call.again() if attempts else call  # a retry says so (see Call.again)
            attempts.append(current)
            script = self._scripts[call.script]  # (the client's: _io may have replaced it)
            if self._direct:
                return await self._evalsha(script, current)
            return await script(keys=current.keys, args=current.args)

        return await self._io(call.what, send, idempotent, call.keys)

    async def _read(self, command: tuple[Any, ...]) -> Any:
        """One read command, on a shelved connection (see :meth:`RedisStore._read`)."""
        if not self._direct:
            return await self.client.execute_command(*command)
        conn = await self._shelf.take()
        try:
            await asend(conn, pack(conn, *command))
            return await conn.read_response()
        except ResponseError:
            raise
        except BaseException:
            await conn.disconnect()
            raise
        finally:
            await self._shelf.give(conn)

    async def _evalsha(self, script: Any, call: Call) -> Any:
        """EVALSHA on a shelved connection (see :meth:`RedisStore._evalsha`)."""
        conn = await self._shelf.take()
        try:
            await asend(conn, pack_evalsha(conn, script.sha, call.keys, call.args))
            try:
                return await conn.read_response()
            except NoScriptError:
                await asend(
                    conn, pack(conn, "EVAL", script.script, len(call.keys), *call.keys, *call.args)
                )
                return await conn.read_response()
        except ResponseError:
            raise
        except BaseException:
            await conn.disconnect()
            raise
        finally:
            await self._shelf.give(conn)

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

    async def read_with_token(
        self, session_id: str, start: int = 0, stop: int | None = None
    ) -> tuple[list[StoredMessage], str]:
        call = self.protocol.read_call(session_id, start, stop, with_token=True)
        return self.protocol.parse_read_with_token(session_id, await self._run(call))

    async def state_token(self, session_id: str) -> str:
        """The session's state token ('' = no session): see :meth:`RedisStore.state_token`."""
        command = self.protocol.token_read(session_id)
        keys = (command[1],)
        return self.protocol.parse_token(
            await self._io("state_token", partial(self._read, command), True, keys)
        )

    async def send_state_token(self, session_id: str) -> None:
        """:meth:`RedisStore.send_state_token`'s twin: on asyncio the read is not sent
        ahead (a task and a loop turn would cost what the round trip saves), so None:
        :meth:`state_token_reply` then reads the whole way."""
        return None

    async def state_token_reply(self, sent: None, session_id: str) -> str:
        """The session's state token, read the whole way (see :meth:`send_state_token`)."""
        return await self.state_token(session_id)

    async def read_last(self, session_id: str, count: int) -> list[StoredMessage]:
        check_count(count, "count")
        if count == 0:
            return []
        return await self.read(session_id, -count, None)

    async def info(self, session_id: str) -> SessionInfo | None:
        keys = self.protocol.keys(session_id, stored=True)

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
        keys = self.protocol.keys(session_id, stored=True)
        leases = self.protocol.keyspace.lease_names_key(session_id, stored=True)
        return bool(await self._run(Call("delete", [*keys, leases], [])))  # with its leases

    async def list_sessions(self, prefix: str = "") -> AsyncIterator[str]:
        check_prefix(prefix)
        pattern = self.protocol.keyspace.meta_pattern(prefix)

        async def nodes() -> list[Any]:
            return scan_nodes(self.client)  # (a cluster's, once _io has initialized it)

        seen: set[str] = set()
        for node in await self._io("list", nodes, True):
            walk = ScanWalk(self.where)  # each page its own operation; the walk must end
            while not walk.done:
                page = partial(ascan_page, self.client, node, walk.cursor, pattern)
                cursor, keys = await self._io("list", page, True)
                for key in keys:
                    session_id = self.protocol.keyspace.session_id_from_meta_key(key.decode())
                    if session_id is not None and session_id not in seen:
                        seen.add(session_id)
                        yield session_id
                if walk.take(cursor):
                    size = await self._io("list", partial(adbsize, self.client, node), True)
                    walk.allow(size)

    async def fetch_window(
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
        try:
            commands = next(flow)
            while True:
                replies = await self._io("fetch_window", partial(self._multi, commands), True, keys)
                commands = flow.send(replies)
        except StopIteration as done:
            if done.value is not None:
                return done.value  # type: ignore[no-any-return]
        reply = await self._run(
            self.protocol.window_call(session_id, budget, options, new, min_messages)
        )
        return as_fetch(self.protocol.parse_window(session_id, new, reply, options))

    async def _multi(self, commands: Commands) -> list[Any]:
        """Read commands in one MULTI/EXEC (see :meth:`RedisStore._multi`)."""
        if not self._direct:
            pipe = self.client.pipeline(transaction=True)
            for command in commands:
                pipe.execute_command(*command)
            return list(await pipe.execute(raise_on_error=False))
        conn = await self._shelf.take()
        try:
            await asend(conn, pack_reads(commands))
            # one deadline for every reply (the socket timeout), not a timer per reply
            async with asyncio.timeout(conn.socket_timeout):
                await conn.read_response(timeout=math.inf)  # MULTI's OK
                # QUEUED for each command, then EXEC's array: from the buffer when whole
                reader = buffered_reader(self._shelf, conn)
                reply: Any = None
                for _ in range(len(commands) + 1):
                    reply = next_buffered(reader)
                    if reply is NOT_BUFFERED:
                        reply = await conn.read_response(timeout=math.inf)
                return list(reply)
        except TimeoutError as exc:
            await conn.disconnect()
            raise RedisTimeoutError(f"Timeout reading from {self.where}") from exc
        except BaseException:
            await conn.disconnect()  # replies may be left unread: never reuse the connection
            raise
        finally:
            await self._shelf.give(conn)

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
        key = self.protocol.keys(session_id, stored=True)[5]
        return decode_summary(
            session_id,
            await self._io("get_summary", lambda: self.client.get(key), True, (key,)),
        )

    async def retract(
        self,
        session_id: str,
        count: int = 1,
        expected_count: int | None = None,
        ttl: int = 0,
        expected_state: str | None = None,
    ) -> list[StoredMessage]:
        call = self.protocol.retract_call(session_id, count, expected_count, ttl, expected_state)
        return self.protocol.parse_retract(session_id, await self._run(call, idempotent=False))

    async def replace_tail(
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
        reply = await self._run(call, idempotent=False)  # a repeat would remove more
        return self.protocol.parse_replace(session_id, messages, reply)

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

    async def acquire_lease(self, session_id: str, name: str, holder: str, seconds: float) -> bool:
        check_lease(holder, seconds, acquire=True)  # (None: a release in lease_call)
        call = lease_call(self.protocol.keyspace, session_id, name, holder, seconds)
        return bool(await self._run(call))  # repeatable: see RedisStore.acquire_lease

    async def release_lease(self, session_id: str, name: str, holder: str) -> bool:
        call = lease_call(self.protocol.keyspace, session_id, name, holder, None)
        return bool(await self._run(call))

    async def record(self, session_id: str, write: RecordWrite) -> int:
        call = self.protocol.record_call(session_id, write)
        if call is None:
            return 0
        reply = await self._run(call)
        return int(reply) if write.audit is not None else 0

    async def append_with_audit(
        self,
        session_id: str,
        messages: Sequence[NewMessage],
        options: WriteOptions,
        write: RecordWrite,
    ) -> AppendResult:
        call = self.protocol.append_with_record_call(session_id, messages, options, write)
        reply = await self._run(call)
        return self.protocol.parse_append(session_id, messages, reply)

    async def read_audit(
        self, session_id: str, *, damaged: list[CorruptRecordError] | None = None
    ) -> list[dict[str, Any]]:
        keys = self.protocol.keys(session_id, stored=True)

        async def fetch() -> list[Any]:
            # the trail, then the contexts its records name (only ever added, so read
            # after the records, every context they name is there)
            pipe = self.client.pipeline(transaction=False)
            pipe.lrange(keys[6], 0, -1)
            pipe.hgetall(keys[8])
            out: list[Any] = await pipe.execute(raise_on_error=False)
            if isinstance(out[0], Exception):
                raise out[0]
            return out

        raw, contexts = await self._io("read_audit", fetch, True, (keys[6],))
        return self.protocol.parse_audit(session_id, raw, contexts, damaged)

    async def inspect(self, session_id: str) -> RawSession | None:
        reply = await self._run(self.protocol.inspect_call(session_id))
        return self.protocol.parse_inspect(reply)

    async def repair(self, session_id: str, plan: RepairPlan, record: Mapping[str, Any]) -> bool:
        call = self.protocol.repair_call(session_id, plan, record)
        return bool(await self._run(call, idempotent=False))

    async def close(self) -> None:
        """Close the connections; those of a loop that has closed or stopped since are
        dropped without it (nothing can be awaited there). While that loop runs in
        another thread: a ConfigError (close it on its own loop)."""
        if asyncio.get_running_loop() is not self._binding.loop:
            self._claim_loop()
        await self.client.aclose()
