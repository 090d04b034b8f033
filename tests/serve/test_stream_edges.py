"""Streams with no whole reply in them. One the upstream never ends: the relay stops at
the streaming size cap (``forward.MAX_STREAM_BYTES``), closes the upstream, ends the
client's stream with an error event (no ``[DONE]``) and stores no reply (a
``partial_reply`` audit record says why). Before, it relayed and kept every event for as
long as the upstream went on. One that finishes (``[DONE]``) with no choice in it ends
the same way, as a non-streaming answer without a choice is a 502: before, an empty
assistant reply was stored."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from ctxguard.serve import forward
from tests.conftest import private_memory_url

from .conftest import Start
from .upstream import serve_in_thread, stop_server

pytestmark = pytest.mark.redis

CAP = 64 * 1024
CLIENT_GIVES_UP = 64 * CAP  # far past the cap: a stream this long was not cut


EMPTY = {  # streams that finish with no reply in them
    "done-only": "data: [DONE]\n\n",
    "no-choice": 'data: {"id":"x","choices":{"a":1}}\n\n: ping\n\ndata: [DONE]\n\n',
    "usage-only": 'data: {"choices":[],"usage":{"prompt_tokens":3}}\n\ndata: [DONE]\n\n',
}


KEY = "sk-upstream-0123456789abcdef"
JUNK = (  # a reply with what a proxy or a broken server put between its events
    'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":"o"}}]}\n\n'
    f"<html><body>proxy error, key {KEY}</body></html>\n\n"
    f": upstream {KEY}\n\n"
    f"data: <p>{KEY}</p>\n\n"
    f"junk {KEY}\n"
    'data: {"choices":[{"index":0,\n'
    'data: "delta":{"content":"k"}}]}\n\n'
    'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
    "data: [DONE]\n\n"
)


class Endless:
    """An upstream whose streams never end (content deltas, or only comments), or
    finish with no reply (``EMPTY``)."""

    def __init__(self) -> None:
        self.mode = "content"
        self.app = Starlette(routes=[Route("/v1/chat/completions", self.chat, methods=["POST"])])

    async def chat(self, request: Request) -> Response:
        await request.body()
        mode = self.mode
        if mode in EMPTY:
            return Response(EMPTY[mode], 200, media_type="text/event-stream")
        if mode == "junk":
            return Response(JUNK, 200, media_type="text/event-stream")

        async def events() -> AsyncIterator[bytes]:
            first = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": "x"}}]}
            yield b"data: " + json.dumps(first).encode() + b"\n\n"
            more = {"choices": [{"index": 0, "delta": {"content": "y" * 1000}}]}
            event = (
                b": keep-alive\n\n"
                if mode == "comments"
                else b"data: " + json.dumps(more).encode() + b"\n\n"
            )
            while True:
                yield event
                await asyncio.sleep(0)

        return StreamingResponse(events(), media_type="text/event-stream")


@pytest.fixture(scope="module")
def endless_server() -> Iterator[tuple[Endless, str]]:
    endless = Endless()
    server, url = serve_in_thread(endless.app)
    yield endless, url
    stop_server(server)


@pytest.mark.parametrize("mode", ["content", "comments"])
def test_a_stream_that_never_ends_is_cut_at_the_size_cap_and_not_stored(
    start_gateway: Start,
    endless_server: tuple[Endless, str],
    redis_url: str,
    namespace: str,
    snapshot: Callable[[str], Any],
    stored: Callable[..., list[dict[str, Any]]],
    monkeypatch: pytest.MonkeyPatch,
    mode: str,
) -> None:
    monkeypatch.setattr(forward, "MAX_STREAM_BYTES", CAP)
    endless, url = endless_server
    endless.mode = mode
    gw = start_gateway(
        upstream=url,
        url=redis_url,
        namespace=namespace,
        counter="tiktoken:cl100k_base",
        limit=4096,
        max_tokens=256,
    )
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    received = b""
    with httpx.stream(
        "POST", gw + "/v1/chat/completions", json=body, headers={"X-Session-Id": "e"}, timeout=30
    ) as response:
        assert response.status_code == 200
        for chunk in response.iter_bytes():
            received += chunk
            assert len(received) < CLIENT_GIVES_UP, "the stream was not cut at the cap"
    events = [e for e in received.decode().split("\n\n") if e.strip()]
    last = json.loads(events[-1].removeprefix("data: "))
    assert last["error"]["code"] == "upstream_too_large"
    assert str(CAP) in last["error"]["message"]
    assert "\n" not in last["error"]["message"]
    assert "[DONE]" not in received.decode()
    assert [(m["role"], m["content"]) for m in stored("e")] == [("user", "hi")]  # no reply
    _, _, audit = snapshot("e")
    partial = [r for r in audit if r.get("kind") == "partial_reply"]
    assert [r["reason"] for r in partial] == ["upstream_too_large"]


def _stream_once(
    start_gateway: Start,
    endless_server: tuple[Endless, str],
    mode: str,
    redis_url: str,
    namespace: str,
    session: str,
) -> httpx.Response:
    """One streamed "hi" in ``session`` through a gateway in front of ``mode``'s stream."""
    endless, url = endless_server
    endless.mode = mode
    gw = start_gateway(
        upstream=url,
        url=redis_url,
        namespace=namespace,
        counter="tiktoken:cl100k_base",
        limit=4096,
        max_tokens=256,
    )
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    headers = {"X-Session-Id": session} if session else {}
    return httpx.post(gw + "/v1/chat/completions", json=body, headers=headers, timeout=30)


@pytest.mark.parametrize("mode", sorted(EMPTY))
def test_a_stream_that_finishes_with_no_reply_in_it_is_not_stored(
    start_gateway: Start,
    endless_server: tuple[Endless, str],
    redis_url: str,
    namespace: str,
    snapshot: Callable[[str], Any],
    stored: Callable[..., list[dict[str, Any]]],
    mode: str,
) -> None:
    response = _stream_once(start_gateway, endless_server, mode, redis_url, namespace, "n")
    assert response.status_code == 200
    last = json.loads(response.text.strip().split("\n\n")[-1].removeprefix("data: "))
    assert last["error"]["code"] == "upstream_bad_reply"
    assert "no reply" in last["error"]["message"]
    assert "[DONE]" not in response.text
    assert [m["role"] for m in stored("n")] == ["user"]  # no empty reply stored
    _, _, audit = snapshot("n")
    assert [r["reason"] for r in audit if r.get("kind") == "partial_reply"] == [
        "upstream_bad_reply"
    ]


@pytest.mark.parametrize("mode", sorted(EMPTY))
def test_a_stateless_stream_with_no_reply_in_it_ends_with_an_error_too(
    start_gateway: Start,
    endless_server: tuple[Endless, str],
    redis_url: str,
    namespace: str,
    mode: str,
) -> None:
    """(without a session the stream ended with ``[DONE]``: a client took the empty stream
    for a whole, empty reply, where the same answer not streamed is a 502, and streamed
    with a session an error event)"""
    response = _stream_once(start_gateway, endless_server, mode, redis_url, namespace, "")
    assert response.status_code == 200
    last = json.loads(response.text.strip().split("\n\n")[-1].removeprefix("data: "))
    assert last["error"]["code"] == "upstream_bad_reply"
    assert "no reply" in last["error"]["message"]
    assert "[DONE]" not in response.text


def _stream_from_drip(start_gateway: Start, mode: str) -> httpx.Response:
    """A streamed 'hi' through a gateway (``--upstream-timeout`` 1 s) whose upstream
    drips its ``mode`` ("headers" or "body") for ever."""
    from drip_server import drip_server

    with drip_server(mode) as server:
        gw = start_gateway(
            upstream=server.url,
            url=private_memory_url(),
            counter="tiktoken:cl100k_base",
            limit=4096,
            upstream_timeout=1.0,
        )
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
        return httpx.post(gw + "/v1/chat/completions", json=body, timeout=60)


def test_a_stream_whose_headers_never_end_is_a_504_at_the_upstream_timeout(
    start_gateway: Start,
) -> None:
    # the headers of a streaming call had each read's timeout only: a server sending a
    # header line now and then held the client until it gave up (here 30 s per read)
    response = _stream_from_drip(start_gateway, "headers")
    assert response.status_code == 504, response.text
    error = response.json()["error"]
    assert error["code"] == "upstream_timeout" and "\n" not in error["message"]


def test_a_stream_that_trickles_bytes_but_no_event_ends_at_the_upstream_timeout(
    start_gateway: Start,
) -> None:
    # each read of a stream had --upstream-timeout, so an upstream sending a byte every
    # 0.3 s that never made an event held the stream (and the client, sent nothing) for ever
    started = time.monotonic()
    response = _stream_from_drip(start_gateway, "body")
    took = time.monotonic() - started
    assert response.status_code == 200, response.text
    events = [e for e in response.text.split("\n\n") if e]
    assert len(events) == 1 and "[DONE]" not in response.text, response.text
    error = json.loads(events[0].removeprefix("data: "))["error"]
    assert error["code"] == "upstream_timeout" and "\n" not in error["message"]
    assert took < 30, took  # a generous bound: the deadline is 1 s, the drip endless


def test_text_between_events_that_is_not_sse_is_not_relayed(
    start_gateway: Start,
    endless_server: tuple[Endless, str],
    stored: Callable[..., list[dict[str, Any]]],
    redis_url: str,
    namespace: str,
) -> None:
    """(an HTML page, a comment or a non-JSON data line in the stream reached the client
    as it came, unscrubbed: a line quoting a credential too; SSE clients ignore such
    lines, so they are left out, a comment kept as a bare ":" keep-alive)"""
    response = _stream_once(start_gateway, endless_server, "junk", redis_url, namespace, "j")
    assert response.status_code == 200
    assert KEY not in response.text and "<" not in response.text
    events = [e for e in response.text.split("\n\n") if e]
    assert ":" in events and events[-1] == "data: [DONE]"
    text = ""
    for event in events:
        if event.startswith("data: {"):
            data = json.loads("".join(line[5:] for line in event.split("\n")))
            text += data["choices"][0]["delta"].get("content") or ""
    assert text == "ok"
    assert [(m["role"], m["content"]) for m in stored("j")] == [("user", "hi"), ("assistant", "ok")]
