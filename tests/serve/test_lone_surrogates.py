"""The body's text. A lone UTF-16 surrogate (``"\\ud800"`` with no pair) is valid JSON
text that no UTF-8 encoder takes: on any field of any POST route it is the client's 400
naming the field, before anything is stored or sent (it was a 500 from the upstream
call's encoding on a field the gateway forwards unread, and a 400 quoting
``UnicodeEncodeError`` on a message). A surrogate pair (an emoji from an ASCII-only
encoder) is text like any other. Bytes that are not UTF-8 (an encoded surrogate among
them, which Python's json reads into the same lone surrogate) and nesting too deep to
read are named as what they are, not as "not valid JSON"."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .conftest import Start
from .test_request_edges import CHAT, refused, speaks_http
from .upstream import FakeVLLM, serve_in_thread, stop_server

pytestmark = pytest.mark.redis

USER = '{"role":"user","content":"hello"}'
CASES = [
    (CHAT, '{"model":"\\ud800","messages":[' + USER + "]}", "model"),
    (CHAT, '{"model":"m","messages":[' + USER + '],"stop":["ok","\\udfff"]}', "stop[1]"),
    (CHAT, '{"model":"m","messages":[' + USER + '],"metadata":{"\\ud800":"x"}}', "metadata"),
    (
        CHAT,
        '{"model":"m","messages":[{"role":"user","content":"a\\udc00b"}]}',
        "messages[0].content",
    ),
    (
        CHAT,
        '{"model":"m","messages":[{"role":"user","content":"a","name":"\\ud800"}]}',
        "messages[0].name",
    ),
    ("/v1/responses", '{"model":"m","input":"hi","temperature":"\\uDBFF"}', "temperature"),
    ("/v1/responses", '{"model":"m","input":"\\ud800"}', "input"),
    ("/tokenize", '{"model":"m","prompt":"\\ud800"}', "prompt"),
]


@pytest.mark.parametrize(
    ("path", "raw", "param"),
    CASES,
    ids=["model", "stop", "metadata-key", "content", "name", "responses", "input", "tokenize"],
)
def test_a_lone_surrogate_anywhere_is_a_400_naming_the_field_and_nothing_is_stored_or_sent(
    gateway: str,
    vllm: FakeVLLM,
    snapshot: Callable[[str], Any],
    path: str,
    raw: str,
    param: str,
) -> None:
    calls = vllm.tokenize_calls
    headers = {"Content-Type": "application/json", "X-Session-Id": "ls"}
    response = httpx.post(gateway + path, content=raw, headers=headers, timeout=30)
    error = refused(response, 400, "invalid_json")
    assert error["param"] == param
    assert "lone UTF-16 surrogate" in error["message"]
    assert "Unicode" + "EncodeError" not in error["message"]
    speaks_http(error["message"])
    assert vllm.requests == [] and vllm.tokenize_calls == calls
    assert snapshot("ls") == ([], None, [])


def test_a_surrogate_pair_is_text_and_is_stored_whole(gateway: str, stored: Any) -> None:
    raw = '{"model":"m","messages":[{"role":"user","content":"smile \\ud83d\\ude00"}]}'
    headers = {"Content-Type": "application/json", "X-Session-Id": "pair"}
    response = httpx.post(gateway + CHAT, content=raw, headers=headers, timeout=30)
    assert response.status_code == 200, response.text
    assert stored("pair")[0]["content"] == "smile \U0001f600"


@pytest.mark.parametrize(
    ("raw", "said"),
    [
        (b'{"model":"m","messages":[{"role":"user","content":"a\xed\xa0\x80b"}]}', "not UTF-8"),
        (b'{"model":"m","messages":[{"role":"user","content":"a\xffb"}]}', "not UTF-8"),
        (b'{"model":"m","messages":' + b"[" * 5000 + b"]" * 5000 + b"}", "too deeply"),
    ],
    ids=["encoded-surrogate", "latin-1", "deep"],
)
def test_a_body_json_cannot_read_as_text_says_why_and_nothing_is_stored_or_sent(
    gateway: str, vllm: FakeVLLM, snapshot: Callable[[str], Any], raw: bytes, said: str
) -> None:
    headers = {"Content-Type": "application/json", "X-Session-Id": "bytes"}
    response = httpx.post(gateway + CHAT, content=raw, headers=headers, timeout=30)
    error = refused(response, 400, "invalid_json")
    assert said in error["message"]
    assert vllm.requests == []
    assert snapshot("bytes") == ([], None, [])


def test_a_body_in_utf16_is_still_read(gateway: str) -> None:
    raw = '{"model":"m","messages":[{"role":"user","content":"hi"}]}'.encode("utf-16")
    headers = {"Content-Type": "application/json"}
    response = httpx.post(gateway + CHAT, content=raw, headers=headers, timeout=30)
    assert response.status_code == 200, response.text


UPSTREAM_REPLY = '{"choices":[{"index":0,"message":{"role":"assistant","content":"a\\ud800"}}]}'
UPSTREAM_STREAM = (
    'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":"a\\ud800"}}]}\n\n'
    'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n'
)


@pytest.fixture(scope="module")
def surrogate_upstream() -> Iterator[str]:
    """A model server whose replies hold a lone surrogate (non-streaming and streaming)."""

    async def chat(request: Request) -> Response:
        body = await request.json()
        if body.get("stream"):
            return Response(UPSTREAM_STREAM, 200, media_type="text/event-stream")
        return Response(UPSTREAM_REPLY, 200, media_type="application/json")

    app = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])
    server, url = serve_in_thread(app)
    yield url
    stop_server(server)


@pytest.mark.parametrize("stream", [False, True])
def test_a_reply_holding_a_lone_surrogate_is_not_stored_and_says_so_in_words(
    start_gateway: Start,
    surrogate_upstream: str,
    redis_url: str,
    namespace: str,
    stored: Any,
    stream: bool,
) -> None:
    # the reason quoted pydantic's "Error serializing to JSON: UnicodeEncodeError: ..."
    gw = start_gateway(
        upstream=surrogate_upstream,
        url=redis_url,
        namespace=namespace,
        counter="tiktoken:cl100k_base",
        limit=4096,
    )
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    response = httpx.post(gw + CHAT, json=body, headers={"X-Session-Id": "rs"}, timeout=30)
    if stream:
        assert response.status_code == 200
        last = response.text.strip().split("\n\n")[-1]
        error = json.loads(last.removeprefix("data: "))["error"]
    else:
        assert response.status_code == 502, response.text
        error = response.json()["error"]
    assert error["code"] == "reply_not_stored"
    assert "lone UTF-16 surrogate" in error["message"] and "\n" not in error["message"]
    speaks_http(error["message"])
    assert [m["role"] for m in stored("rs")] == ["user"]  # no reply stored
