"""A kept-alive connection the server closes as the next request goes out.

uvicorn (and so vLLM) closes a connection idle for 5 s; a request sent on it in that
instant meets a closed socket and no reply, although the server is fine. The server
below does that deterministically: on its first connection it answers one request,
then reads the next one and hangs up without a word. A count (``/tokenize``) and a
reading of ``/metrics`` are safe to ask twice, so they are sent once more on a new
connection; a call that is not (a chat completion upstream) is not.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator

import httpx
import pytest

from ctxguard import _http
from ctxguard.errors import ConfigError, TokenizerError
from ctxguard.tokens.vllm import VLLMRenderer

METRICS = (
    "# TYPE vllm:num_requests_waiting gauge\n"
    'vllm:num_requests_waiting{model_name="m"} 3.0\n'
    "# TYPE vllm:kv_cache_usage_perc gauge\n"
    'vllm:kv_cache_usage_perc{model_name="m"} 0.5\n'
)


class HangUpOnce:
    """Answers every request; on its first connection, hangs up on the second one."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.requests = 0
        self.connections = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn, self.connections), daemon=True).start()

    @staticmethod
    def _read_request(conn: socket.socket, buffer: bytes) -> tuple[bytes, bytes] | None:
        while b"\r\n\r\n" not in buffer:
            chunk = conn.recv(65536)
            if not chunk:
                return None
            buffer += chunk
        head, rest = buffer.split(b"\r\n\r\n", 1)
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        while len(rest) < length:
            rest += conn.recv(65536)
        return head, rest[length:]

    def _serve(self, conn: socket.socket, number: int) -> None:
        with conn:
            buffer, answered = b"", 0
            while True:
                got = self._read_request(conn, buffer)
                if got is None:
                    return
                head, buffer = got
                self.requests += 1
                if number == 1 and answered == 1:
                    return  # read the request, then hang up: the idle-close race
                path = head.split(b" ")[1]
                if path.endswith(b"/metrics"):
                    body, kind = METRICS.encode(), b"text/plain"
                else:
                    body, kind = json.dumps({"count": 7}).encode(), b"application/json"
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Type: "
                    + kind
                    + b"\r\nContent-Length: "
                    + str(len(body)).encode()
                    + b"\r\n\r\n"
                    + body
                )
                answered += 1

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def server() -> Iterator[HangUpOnce]:
    s = HangUpOnce()
    yield s
    s.close()


def test_a_count_is_asked_again_on_a_new_connection(server: HangUpOnce) -> None:
    renderer = VLLMRenderer(server.url, timeout=5)
    assert renderer.raw_count("hello") == 7
    assert renderer.raw_count("hello again") == 7  # the first connection hung up on this
    assert (server.requests, server.connections) == (3, 2)


def test_a_pressure_reading_is_taken_again_on_a_new_connection(server: HangUpOnce) -> None:
    from ctxguard.observe.pressure import PressureMonitor

    monitor = PressureMonitor(server.url + "/metrics", interval=0.0, timeout=5)
    first = monitor.sample()
    second = monitor.sample()  # the first connection hung up on this
    assert monitor.error is None
    assert first is not None and second is not None and second is not first
    assert second.waiting == 3
    assert (server.requests, server.connections) == (3, 2)


def test_a_call_not_safe_to_repeat_is_sent_once(server: HangUpOnce) -> None:
    with _http.client(timeout=5) as http:
        for expect_ok in (True, False):
            call = lambda: _http.request(  # noqa: E731
                http,
                "POST",
                server.url + "/v1/chat/completions",
                json={},
                seconds=5,
                shown="upstream",
                error=ConfigError,
            )
            if expect_ok:
                assert call().status_code == 200
            else:
                with pytest.raises(httpx.RemoteProtocolError):
                    call()
    assert (server.requests, server.connections) == (2, 1)


def test_a_server_that_hangs_up_every_time_is_still_a_typed_error() -> None:
    sock = socket.create_server(("127.0.0.1", 0))
    seen: list[int] = []

    def hang_up() -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            seen.append(1)
            conn.recv(65536)
            conn.close()

    threading.Thread(target=hang_up, daemon=True).start()
    try:
        renderer = VLLMRenderer(f"http://127.0.0.1:{sock.getsockname()[1]}", timeout=5)
        with pytest.raises(TokenizerError, match="cannot reach"):
            renderer.raw_count("hello")
        assert len(seen) == 2  # asked twice, no more
    finally:
        sock.close()
