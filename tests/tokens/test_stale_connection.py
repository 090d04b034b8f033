"""A kept-alive connection the server closes as the next request goes out.

uvicorn (and so vLLM) closes a connection idle for 5 s; a request sent on it in that
instant meets a closed socket and no reply, although the server is fine. The server
(``tests/hangup_server.py``) does that deterministically: on its first connection it
answers one request, then reads the next one and hangs up without a word. A count
(``/tokenize``) and a reading of ``/metrics`` are safe to ask twice, so they are sent
once more on a new connection; a call that is not (a chat completion upstream) is not.
And no call meets the race by waiting: a connection idle for
:data:`ctxguard._http.KEEPALIVE_EXPIRY` (under uvicorn's 5 s) is closed, not reused.
"""

from __future__ import annotations

import socket
import threading
import time

import httpx
import pytest
from hangup_server import HangUpOnce

from ctxguard import _http
from ctxguard.errors import ConfigError, TokenizerError
from ctxguard.tokens.vllm import VLLMRenderer


def test_a_count_is_asked_again_on_a_new_connection(hangup: HangUpOnce) -> None:
    renderer = VLLMRenderer(hangup.url, timeout=5)
    assert renderer.raw_count("hello") == 7
    assert renderer.raw_count("hello again") == 7  # the first connection hung up on this
    assert (hangup.requests, hangup.connections) == (3, 2)


def test_a_pressure_reading_is_taken_again_on_a_new_connection(hangup: HangUpOnce) -> None:
    from ctxguard.observe.pressure import PressureMonitor

    monitor = PressureMonitor(hangup.url + "/metrics", interval=0.0, timeout=5)
    first = monitor.sample()
    second = monitor.sample()  # the first connection hung up on this
    assert monitor.error is None
    assert first is not None and second is not None and second is not first
    assert second.waiting == 3
    assert (hangup.requests, hangup.connections) == (3, 2)


def _post(http: httpx.Client, hangup: HangUpOnce) -> int:
    reply = _http.request(
        http,
        "POST",
        hangup.url + "/v1/chat/completions",
        json={},
        seconds=5,
        shown="upstream",
        error=ConfigError,
    )
    return reply.status_code


def test_a_call_not_safe_to_repeat_is_sent_once(hangup: HangUpOnce) -> None:
    with _http.client(timeout=5) as http:
        assert _post(http, hangup) == 200
        with pytest.raises(httpx.RemoteProtocolError):
            _post(http, hangup)  # the first connection hangs up on it
    assert (hangup.requests, hangup.connections) == (2, 1)


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


def test_a_connection_idle_past_the_expiry_is_closed_not_reused(hangup: HangUpOnce) -> None:
    """A call not safe to repeat, after an idle spell the server would close on: it
    goes out on a new connection, so the first one's hang-up is never met."""
    with _http.client(timeout=5) as http:
        assert _post(http, hangup) == 200
        time.sleep(_http.KEEPALIVE_EXPIRY + 0.5)
        assert _post(http, hangup) == 200
    assert (hangup.requests, hangup.connections) == (2, 2)


def test_the_expiry_is_under_the_keep_alive_of_uvicorn() -> None:
    """vLLM and SGLang serve over uvicorn with its default keep-alive (vLLM pins it at 5 s)."""
    import uvicorn

    assert uvicorn.Config(app="unused:app").timeout_keep_alive == 5
    assert _http.KEEPALIVE_EXPIRY <= 5 - 2  # seconds of margin for a slow loop or network
