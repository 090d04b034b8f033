"""A client that sends its request body a byte now and then (slowloris) gets a 408.

uvicorn puts no time limit on reading a request body, and the gateway read it with
none: a client sending one byte a second held its request (a connection, a task) for
ever. The body must now all come within ``--upstream-timeout``; past it the answer is an
OpenAI-shaped 408 in one line, and nothing is stored or sent upstream.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable
from typing import Any

import pytest

from .conftest import Start
from .test_request_edges import ROUTES
from .upstream import FakeVLLM

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]


def _answer_to_a_trickled_body(base_url: str, path: str, body: bytes) -> bytes:
    """Send the headers and then the body one byte every 0.2 s; the first bytes the
    gateway answers with (b"" if it said nothing while the body lasted, at most 30 s)."""
    port = int(base_url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        head = (
            f"POST {path} HTTP/1.1\r\nHost: gateway\r\nX-Session-Id: slow\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        sock.sendall(head.encode())
        sock.settimeout(0.2)
        stop = time.monotonic() + 30  # a generous bound: the gateway's deadline is 1 s
        for byte in body:
            if time.monotonic() > stop:
                return b""
            try:
                sock.sendall(bytes([byte]))
            except OSError:
                break  # the gateway answered and closed: read what it said
            try:
                answer = sock.recv(65536)
            except TimeoutError:
                continue
            return _whole(sock, answer)
        sock.settimeout(5)
        try:
            return _whole(sock, sock.recv(65536))
        except (TimeoutError, OSError):
            return b""


def _whole(sock: socket.socket, answer: bytes) -> bytes:
    """``answer`` read on until its headers and Content-Length bytes of body are in."""
    sock.settimeout(5)
    while answer:
        head, found, rest = answer.partition(b"\r\n\r\n")
        if found:
            lengths = [
                int(line.split(b":", 1)[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            ]
            if lengths and len(rest) >= lengths[0]:
                return answer
        more = sock.recv(65536)
        if not more:
            return answer
        answer += more
    return answer


@pytest.mark.parametrize(("path", "body"), ROUTES, ids=["chat", "responses", "tokenize"])
def test_a_body_trickled_past_the_deadline_is_a_408_and_nothing_is_stored_or_sent(
    start_gateway: Start,
    vllm: FakeVLLM,
    snapshot: Callable[[str], Any],
    redis_url: str,
    namespace: str,
    path: str,
    body: dict[str, Any],
) -> None:
    gateway = start_gateway(url=redis_url, namespace=namespace, max_tokens=16, upstream_timeout=1.0)
    raw = json.dumps({**body, "padding": " " * 400}).encode()  # 80+ s at 5 bytes a second
    calls = vllm.tokenize_calls
    answer = _answer_to_a_trickled_body(gateway, path, raw)
    assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
    error = json.loads(answer.partition(b"\r\n\r\n")[2])["error"]
    assert error["code"] == "request_timeout" and "\n" not in error["message"]
    assert error["message"] == "the request body did not arrive within 1 s; send it whole at once"
    assert vllm.requests == [] and vllm.tokenize_calls == calls
    assert snapshot("slow") == ([], None, [])
