"""Sync Redis connections whose read timeout bounds a whole reply, not each ``recv``.

redis-py's sync ``socket_timeout`` applies to every socket read on its own, so a server
or proxy that sends a reply a few bytes at a time (``-E``, then ``R``, ... every half
second) kept a call waiting forever. redis-py's asyncio client already waits for a
reply under one timeout; here the sync one does too: while a reply is read, every
socket read may wait only for the time left until ``socket_timeout`` after the read
began, and past it the read fails as a timeout (the connection is then dropped, as
redis-py drops it on any timeout).

An operation of the store (every attempt of it, each connection's handshake and every
reply it reads) also has one deadline (:data:`OPERATION`, set by ``RedisStore._io``):
connecting and reading never wait past it. So a server that accepts connections and
never answers fails an operation once, within the connect timeout plus the read timeout,
not once per handshake reply and per retry (4 attempts of a 10 s read timeout were 42 s).

The connection classes are redis-py's own (plain and TLS), with ``_connect`` returning
the socket wrapped and ``read_response`` setting the deadline; everything else about
the socket is the socket's.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from redis.connection import Connection, SSLConnection


class _Operation(threading.local):
    """Per thread: ``end``, the deadline (``time.monotonic()``) of the store operation the
    thread runs, None outside one. ``RedisStore._io`` sets it and puts the enclosing
    value back in a ``finally`` (keeping an enclosing operation's earlier deadline):
    two attribute stores a call, where a ``@contextmanager`` cost a generator and its
    two steps on every store operation (the warm turn's hot path)."""

    end: float | None = None


OPERATION = _Operation()


def operation_end() -> float | None:
    """The deadline of the store operation this thread runs, if any."""
    return OPERATION.end


class _DeadlineSocket:
    """A connected socket whose reads stop at the owning connection's deadline."""

    __slots__ = ("_owner", "_sock", "capped")

    def __init__(self, sock: Any, owner: _Deadline) -> None:
        self._sock = sock
        self._owner = owner
        self.capped = False  # the timeout was lowered for the reply being read

    def _cap(self) -> None:
        end = self._owner.reply_deadline
        if end is None:
            return
        left = end - time.monotonic()
        if left <= 0:
            raise TimeoutError("no whole reply within the read timeout")
        current = self._sock.gettimeout()
        # lowered only when it matters (10 ms): a settimeout is a system call, and the
        # first read of a reply, at almost the whole timeout left, is most reads
        if current is None or left < current - 0.01:
            self._sock.settimeout(left)
            self.capped = True

    def recv_into(self, buffer: Any, nbytes: int = 0, flags: int = 0) -> int:
        self._cap()
        return int(self._sock.recv_into(buffer, nbytes, flags))

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        self._cap()
        return bytes(self._sock.recv(bufsize, flags))

    # what redis-py calls on every command, here rather than through __getattr__ (a
    # failed lookup first: about 1 us each)
    def sendall(self, data: Any, flags: int = 0) -> None:
        self._sock.sendall(data, flags)

    def settimeout(self, value: float | None) -> None:
        self._sock.settimeout(value)

    def gettimeout(self) -> float | None:
        timeout: float | None = self._sock.gettimeout()
        return timeout

    def fileno(self) -> int:
        return int(self._sock.fileno())

    def getsockname(self) -> Any:
        return self._sock.getsockname()

    def shutdown(self, how: int) -> None:
        self._sock.shutdown(how)

    def close(self) -> None:
        self._sock.close()

    # (no __getattr__: redis-py's ``hasattr(sock, "pending")`` on every idle check must
    # fail as fast as on a plain socket; what redis-py 5-8 calls after connecting is above)


class _DeadlineTLSSocket(_DeadlineSocket):
    """A TLS socket: redis-py asks it for bytes decrypted but not read yet."""

    __slots__ = ()

    def pending(self) -> int:
        return int(self._sock.pending())

    def __getattr__(self, name: str) -> Any:  # the rest of SSLSocket (getpeercert, ...)
        return getattr(self._sock, name)


class _Deadline:
    """Mixin for a redis-py sync connection class (see the module docstring)."""

    reply_deadline: float | None = None
    socket_timeout: float | None
    socket_connect_timeout: float | None
    _sock: Any

    def _connect(self) -> Any:
        end = operation_end()
        sock = super()._connect() if end is None else self._connect_by(end)  # type: ignore[misc]
        # a plain socket has no ``pending``: redis-py's hasattr test then fails fast
        return (_DeadlineTLSSocket if hasattr(sock, "pending") else _DeadlineSocket)(sock, self)

    def _connect_by(self, end: float) -> Any:
        """Connect (TCP, and TLS's handshake) with both timeouts cut to the time left."""
        left = end - time.monotonic()
        if left <= 0:
            raise TimeoutError("the operation's deadline passed before connecting")
        connect, read = self.socket_connect_timeout, self.socket_timeout
        self.socket_connect_timeout = left if connect is None else min(connect, left)
        self.socket_timeout = left if read is None else min(read, left)
        try:
            sock = super()._connect()  # type: ignore[misc]
        finally:
            self.socket_connect_timeout, self.socket_timeout = connect, read
        sock.settimeout(read)
        return sock

    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        limit = self.socket_timeout
        if limit is None or "timeout" in kwargs:
            return super().read_response(*args, **kwargs)  # type: ignore[misc]
        end = time.monotonic() + limit
        op_end = OPERATION.end
        self.reply_deadline = end if op_end is None or op_end > end else op_end
        try:
            return super().read_response(*args, **kwargs)  # type: ignore[misc]
        finally:
            self.reply_deadline = None
            sock = self._sock
            if isinstance(sock, _DeadlineSocket) and sock.capped:
                sock.capped = False
                sock.settimeout(limit)


class DeadlineConnection(_Deadline, Connection):
    """redis-py's ``Connection``, a reply read under one deadline."""


class DeadlineSSLConnection(_Deadline, SSLConnection):
    """redis-py's ``SSLConnection``, a reply read under one deadline."""


def connection_class(tls: bool) -> type[Connection]:
    return DeadlineSSLConnection if tls else DeadlineConnection
