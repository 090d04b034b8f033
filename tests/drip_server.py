"""HTTP servers on 127.0.0.1 that never finish an answer (real sockets, threads).

``mode`` is what the server does after reading the request:

* ``"headers"``: sends the status line, then one header line every ``interval`` s;
* ``"body"``: sends chunked headers, then a one-byte chunk every ``interval`` s;
* ``"flood"``: sends chunked headers, then 64 KiB chunks as fast as it can.

Each stays on a connection until the client hangs up or the server is closed, so
a client with only per-operation timeouts never returns.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

CHUNKED = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"


class DripServer:
    def __init__(self, mode: str, interval: float = 0.3) -> None:
        self.mode, self.interval = mode, interval
        self.closed = threading.Event()
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            try:
                self._read_request(conn)
                if self.mode == "headers":
                    conn.sendall(b"HTTP/1.1 200 OK\r\n")
                    while not self.closed.wait(self.interval):
                        conn.sendall(b"X-Drip: 1\r\n")
                elif self.mode == "body":
                    conn.sendall(CHUNKED)
                    while not self.closed.wait(self.interval):
                        conn.sendall(b"1\r\n \r\n")
                else:
                    conn.sendall(CHUNKED)
                    chunk = b"10000\r\n" + b" " * 0x10000 + b"\r\n"
                    while not self.closed.is_set():
                        conn.sendall(chunk)
            except OSError:
                return  # the client hung up

    @staticmethod
    def _read_request(conn: socket.socket) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            more = conn.recv(65536)
            if not more:
                raise OSError("client went away")
            data += more
        head, _, body = data.partition(b"\r\n\r\n")
        for line in head.split(b"\r\n"):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                remaining = int(value) - len(body)
                while remaining > 0:
                    more = conn.recv(min(remaining, 65536))
                    if not more:
                        raise OSError("client went away")
                    remaining -= len(more)

    def close(self) -> None:
        self.closed.set()
        self.sock.close()


@contextmanager
def drip_server(mode: str) -> Iterator[DripServer]:
    server = DripServer(mode)
    try:
        yield server
    finally:
        server.close()
