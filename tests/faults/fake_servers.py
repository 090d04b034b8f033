"""TCP servers on 127.0.0.1 that misbehave in one way each, for timeout tests.

* ``silent``: accepts connections, reads everything, never answers.
* ``closing``: accepts and closes at once.
* ``handshake_then_silent`` / ``handshake_then_close``: answer redis-py's
  connection handshake (``HELLO`` with a RESP3 map; ``CLIENT SETINFO``,
  ``AUTH``, ``SELECT``, ``PING`` with ``+OK``), then go silent / close on the first real command:
  a connection that was made and is then stalled or lost mid-operation.
* ``backlog_full``: listens but never accepts, with its accept queue filled,
  so new connections are never established (a connect timeout).
* ``dripping`` / ``handshake_then_dripping``: answer every command (from the first real
  command on) with an error line that never ends, one byte every 0.1 s: a socket timeout
  that bounds each read alone never fires.
* ``slow_handshake_then_silent``: answers each handshake command after ``delay`` s
  (under a read timeout, but several of them past it), then goes silent.
* ``scan_same_cursor`` / ``scan_new_cursor``: a broken proxy whose SCAN never ends:
  every SCAN is answered with no keys and cursor 7 / a cursor it has not answered
  before; ``DBSIZE`` with 0.
* ``echoing``: answers every command as Redis 5 answers one it does not know, quoting
  its arguments (``ERR unknown command `AUTH`, with args beginning with: `pw`, ``): a
  server or proxy that knows neither ``HELLO`` nor ``AUTH`` sends the password back.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Literal

Behaviour = Literal[
    "silent",
    "closing",
    "handshake_then_silent",
    "handshake_then_close",
    "backlog_full",
    "echoing",
    "dripping",
    "handshake_then_dripping",
    "slow_handshake_then_silent",
    "scan_same_cursor",
    "scan_new_cursor",
]
HANDSHAKE = {b"CLIENT", b"HELLO", b"AUTH", b"SELECT", b"PING"}


class FakeServer:
    def __init__(self, behaviour: Behaviour, delay: float = 0.0) -> None:
        self.behaviour = behaviour
        self.delay = delay
        self.commands: list[bytes] = []  # every command's name, as received
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = int(self.sock.getsockname()[1])
        self._stop = threading.Event()
        self._conns: list[socket.socket] = []
        self._threads: list[threading.Thread] = []

    @property
    def connections(self) -> int:
        """How many connections the server accepted."""
        return len(self._conns)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> FakeServer:
        if self.behaviour == "backlog_full":
            self.sock.listen(0)
            self._fill_backlog()
            return self
        self.sock.listen(16)
        self.sock.settimeout(0.05)
        self._spawn(self._accept)
        return self

    def _fill_backlog(self) -> None:
        """Connect (never accepted) until a connect does not complete: the queue is full."""
        for _ in range(64):
            probe = socket.socket()
            probe.settimeout(0.3)
            try:
                probe.connect(("127.0.0.1", self.port))
            except OSError:
                probe.close()
                return
            self._conns.append(probe)  # holds a slot of the accept queue
        raise RuntimeError("could not fill the accept queue")

    def _spawn(self, target: object, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)  # type: ignore[arg-type]
        thread.start()
        self._threads.append(thread)

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self._conns.append(conn)
            if self.behaviour == "closing":
                conn.close()
                continue
            self._spawn(self._serve, conn)

    def _serve(self, conn: socket.socket) -> None:
        conn.settimeout(0.05)
        buffer = b""
        while not self._stop.is_set():
            try:
                data = conn.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            if not data:
                return
            if self.behaviour == "silent":
                continue
            buffer += data
            while True:
                args, buffer = _take_args(buffer)
                if not args:
                    break
                command = args[0]
                self.commands.append(command.upper())
                real = command.upper() not in HANDSHAKE
                slow = self.behaviour == "slow_handshake_then_silent" and not real
                if slow and self._stop.wait(self.delay):
                    return  # stopped meanwhile: its connections are being closed
                if self.behaviour == "dripping" or (
                    self.behaviour == "handshake_then_dripping" and real
                ):
                    self._drip(conn)
                    return
                if self.behaviour == "echoing":  # Redis 5's words, its first 128 bytes an arg
                    quoted = "".join(f"`{a[:128].decode(errors='replace')}`, " for a in args[1:])
                    name = command.decode(errors="replace")
                    line = f"-ERR unknown command `{name}`, with args beginning with: {quoted}"
                    conn.sendall(line.replace("\r", " ").replace("\n", " ").encode() + b"\r\n")
                elif self.behaviour.startswith("scan_") and command.upper() == b"SCAN":
                    new = self.behaviour == "scan_new_cursor"
                    cursor = str(len(self.commands) if new else 7).encode()
                    conn.sendall(b"*2\r\n$%d\r\n%s\r\n*0\r\n" % (len(cursor), cursor))
                elif self.behaviour.startswith("scan_") and command.upper() == b"DBSIZE":
                    conn.sendall(b":0\r\n")
                elif command.upper() == b"HELLO":  # a RESP3 map, as a Redis 7 server answers
                    conn.sendall(b"%1\r\n$5\r\nproto\r\n:3\r\n")
                elif command.upper() in HANDSHAKE:
                    conn.sendall(b"+OK\r\n")
                elif self.behaviour == "handshake_then_close":
                    conn.close()
                    return
                # handshake_then_silent: no answer from here on

    def _drip(self, conn: socket.socket) -> None:
        with suppress(OSError):
            conn.sendall(b"-E")
            while not self._stop.wait(0.1):
                conn.sendall(b"R")

    def stop(self) -> None:
        self._stop.set()
        for conn in self._conns:
            with suppress(OSError):
                conn.close()
        self.sock.close()
        for thread in self._threads:
            thread.join(2)


def _take_args(buffer: bytes) -> tuple[list[bytes], bytes]:
    """The first command of a RESP array in ``buffer`` (its name and arguments; none
    while it is incomplete), and what follows it."""
    if not buffer.startswith(b"*"):
        end = buffer.find(b"\r\n")  # an inline command
        if end < 0:
            return [], buffer
        return [a for a in buffer[:end].split(b" ") if a], buffer[end + 2 :]
    head_end = buffer.find(b"\r\n")
    if head_end < 0:
        return [], buffer
    count = int(buffer[1:head_end])
    pos = head_end + 2
    args: list[bytes] = []
    for _ in range(count):
        len_end = buffer.find(b"\r\n", pos)
        if len_end < 0:
            return [], buffer
        length = int(buffer[pos + 1 : len_end])
        start = len_end + 2
        if len(buffer) < start + length + 2:
            return [], buffer
        args.append(buffer[start : start + length])
        pos = start + length + 2
    return args, buffer[pos:]


@contextmanager
def fake_server(behaviour: Behaviour, delay: float = 0.0) -> Iterator[FakeServer]:
    server = FakeServer(behaviour, delay).start()
    try:
        yield server
    finally:
        server.stop()
