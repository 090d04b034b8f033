"""What a misbehaving upstream, or a body Python reads but JSON has not, can do to the
gateway: never a credential in an answer, never a 500 or a traceback, never a call
without an end, never an unbounded buffer, never a compressed stream passed on as
events, never a stored message for a request that is refused."""

from __future__ import annotations

import asyncio
import base64
import gzip
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ctxguard.serve import forward
from tests.conftest import private_memory_url

from .conftest import Start
from .upstream import serve_in_thread, stop_server

KEY = "sk-UPSTREAM-SECRET-0123456789"


class Hostile:
    """An upstream whose every answer is scripted by ``mode`` (see :meth:`chat`)."""

    def __init__(self) -> None:
        self.mode = "ok"
        self.accept_encoding: list[str] = []
        self.app = Starlette(
            routes=[
                Route("/v1/chat/completions", self.chat, methods=["POST"]),
                Route("/v1/models", self.models, methods=["GET"]),
                Route("/tokenize", self.tokenize, methods=["POST"]),
            ]
        )

    def echo(self, request: Request, status: int) -> Response:
        """An error body that quotes the credential, past a 300-character cut too."""
        auth = request.headers.get("authorization", "")
        padding = "x" * 240  # the second quote straddles the cut at 300 characters
        text = f"denied: {auth} {padding} (key {KEY}) json {json.dumps(KEY)}"
        return JSONResponse({"error": {"message": text}}, status)

    def echo_basic(self, request: Request) -> Response | None:
        """Mode ``basic:<status>``: an error quoting the Basic credential decoded (the
        user and password of the upstream URL), raw and JSON-escaped, on every route."""
        if not self.mode.startswith("basic:"):
            return None
        auth = request.headers.get("authorization", "").split()[-1]
        pair = base64.b64decode(auth).decode()
        text = f"bad credentials {pair} (password {pair.partition(':')[2]}) {json.dumps(pair)}"
        return JSONResponse({"error": {"message": text}}, int(self.mode[6:]))

    async def chat(self, request: Request) -> Response:
        body = await request.json()
        self.accept_encoding.append(request.headers.get("accept-encoding", ""))
        mode = self.mode
        if (echoed := self.echo_basic(request)) is not None:
            return echoed
        if mode in ("echo500", "echo401"):
            return self.echo(request, 500 if mode == "echo500" else 401)
        if mode in ("auth401", "auth403"):
            return self.echo(request, int(mode[4:]))
        if mode == "echo_html":
            auth = request.headers.get("authorization", "")
            return Response(f"<h1>bad gateway</h1><p>{auth}</p>", 502, media_type="text/html")
        if mode.startswith("shape:"):
            return Response(mode[6:], 200, media_type="application/json")
        if mode.startswith("sse:"):  # sse:<a JSON array of chunks>, then [DONE]
            chunks = json.loads(mode[4:])
            text = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
            return Response(text.encode(), 200, media_type="text/event-stream")
        if mode.startswith("busy:"):  # busy:<status>|<Retry-After>|<retry-after-ms>
            status, seconds, millis = mode[5:].split("|")
            headers = {"Retry-After": seconds, "retry-after-ms": millis}
            return JSONResponse({"error": {"message": "busy"}}, int(status), headers=headers)
        if mode == "cut":  # the reply's first bytes, then the connection closes

            async def cut() -> AsyncIterator[bytes]:
                yield b'{"choices": [{"index": 0, "message": {"role": "assis'
                raise ConnectionResetError("cut")  # (uvicorn closes the connection)

            return StreamingResponse(cut(), media_type="application/json")
        if mode == "redirect":
            return Response(b"", 307, headers={"Location": "http://u:redirect-pw@elsewhere/"})
        if mode in ("empty502", "empty404"):
            return Response(b"", int(mode[5:]))
        if mode == "drip500":  # an error whose body never ends

            async def forever() -> AsyncIterator[bytes]:
                yield b'{"error": {"message": "engine '
                while True:
                    yield b"."
                    await asyncio.sleep(0.2)

            return StreamingResponse(forever(), 500, media_type="application/json")
        if mode == "drip":

            async def drip() -> AsyncIterator[bytes]:
                for _ in range(40):
                    yield b" "
                    await asyncio.sleep(0.25)

            return StreamingResponse(drip(), media_type="application/json")
        if mode == "flood":

            async def flood() -> AsyncIterator[bytes]:
                yield b'{"choices":[{"message":{"role":"assistant","content":"'
                for _ in range(64):
                    yield b"a" * 4096
                yield b'"}}]}'

            return StreamingResponse(flood(), media_type="application/json")
        if mode == "cutcall":  # a tool call cut by the output limit
            call = {"id": "c1", "type": "function"}
            call["function"] = {"name": "get_weather", "arguments": '{"city": "Par'}
            if not body.get("stream"):
                message = {"role": "assistant", "content": None, "tool_calls": [call]}
                choice = {"index": 0, "message": message, "finish_reason": "length"}
                return JSONResponse({"choices": [choice], "usage": {}})
            head = {**call, "index": 0, "function": {"name": "get_weather", "arguments": ""}}
            rest = {"index": 0, "function": {"arguments": '{"city": "Par'}}
            events = [
                {"choices": [{"index": 0, "delta": {"role": "assistant", "tool_calls": [head]}}]},
                {"choices": [{"index": 0, "delta": {"tool_calls": [rest]}}]},
                {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]},
            ]
            text = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
            return Response(text.encode(), 200, media_type="text/event-stream")
        if body.get("stream"):
            events = [
                {"choices": [{"index": 0, "delta": {"role": "assistant", "content": "hello"}}]},
                {"choices": [{"index": 0, "delta": {"content": " there"}}]},
                {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
            ]
            text = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
            raw = text.encode()
            if mode == "gzip":  # whatever the request asked for
                return Response(
                    gzip.compress(raw),
                    200,
                    headers={"Content-Encoding": "gzip"},
                    media_type="text/event-stream",
                )
            return Response(raw, 200, media_type="text/event-stream")
        reply = {"role": "assistant", "content": "fine"}
        return JSONResponse({"choices": [{"index": 0, "message": reply}], "usage": {}})

    async def models(self, request: Request) -> Response:
        if (echoed := self.echo_basic(request)) is not None:
            return echoed
        if self.mode == "echo401":
            return self.echo(request, 401)
        if self.mode in ("auth401", "auth403"):
            return self.echo(request, int(self.mode[4:]))
        if self.mode.startswith("shape:"):
            return Response(self.mode[6:], 200, media_type="application/json")
        return JSONResponse({"data": [{"id": "m", "max_model_len": 4096}]})

    async def tokenize(self, request: Request) -> Response:
        if (echoed := self.echo_basic(request)) is not None:
            return echoed
        if self.mode == "echo401":
            return self.echo(request, 401)
        if self.mode in ("auth401", "auth403"):
            return self.echo(request, int(self.mode[4:]))
        return JSONResponse({"tokens": [1, 2], "count": 2})


@pytest.fixture(scope="module")
def hostile_server() -> Iterator[tuple[Hostile, str]]:
    hostile = Hostile()
    server, url = serve_in_thread(hostile.app)
    yield hostile, url
    stop_server(server)


@pytest.fixture
def hostile(hostile_server: tuple[Hostile, str]) -> Hostile:
    hostile_server[0].mode = "ok"
    hostile_server[0].accept_encoding.clear()
    return hostile_server[0]


@pytest.fixture
def start(start_gateway: Start, hostile_server: tuple[Hostile, str]) -> Callable[..., str]:
    def go(**settings: Any) -> str:
        settings.setdefault("url", private_memory_url())
        return start_gateway(
            upstream=hostile_server[1],
            upstream_api_key=KEY,
            counter="tiktoken:cl100k_base",
            limit=4096,
            max_tokens=256,
            **settings,
        )

    return go


def chat(gw: str, content: Any = "hi", **extra: Any) -> httpx.Response:
    body = {"model": "m", "messages": [{"role": "user", "content": content}], **extra}
    return httpx.post(gw + "/v1/chat/completions", json=body, timeout=30)


def secret_free(text: str) -> None:
    for fragment in (KEY[:4], "SECRET"):
        assert fragment not in text


def api_error(response: httpx.Response, status: int, code: str | None) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error: dict[str, Any] = response.json()["error"]
    assert error["code"] == code, error
    assert set(error) == {"message", "type", "param", "code"}
    assert "\n" not in error["message"]
    return error


@pytest.mark.parametrize(
    ("mode", "route", "status", "code"),
    [
        ("echo500", "chat", 502, "upstream_error"),
        ("echo401", "chat", 502, "upstream_auth"),
        ("echo_html", "chat", 502, "upstream_error"),
        ("echo500", "stream", 502, "upstream_error"),
        ("echo401", "stream", 502, "upstream_auth"),
        ("echo500", "responses", 502, "upstream_error"),
        ("echo401", "tokenize", 502, "upstream_auth"),
        ("echo401", "models", 502, "upstream_auth"),
    ],
)
def test_an_upstream_that_echoes_the_credential_never_shows_it_to_the_client(
    start: Callable[..., str], hostile: Hostile, mode: str, route: str, status: int, code: str
) -> None:
    gw = start()
    hostile.mode = mode
    if route in ("chat", "stream"):
        response = chat(gw, stream=route == "stream")
    elif route == "responses":
        response = httpx.post(gw + "/v1/responses", json={"model": "m", "input": "hi"}, timeout=30)
    elif route == "tokenize":
        response = httpx.post(gw + "/tokenize", json={"prompt": "hi"}, timeout=30)
    else:
        response = httpx.get(gw + "/v1/models", timeout=30)
    api_error(response, status, code)  # (a rejected model list was a 200 before)
    secret_free(response.text)
    secret_free(str(response.headers))


@pytest.mark.parametrize("status", [401, 403])
def test_the_upstream_refusing_the_gateways_credentials_is_a_502_for_the_operator(
    start: Callable[..., str],
    hostile: Hostile,
    caplog: pytest.LogCaptureFixture,
    status: int,
) -> None:
    """Not the upstream's 401/403 passed on (which tells a client its own key is wrong):
    a 502 ``upstream_auth`` saying the gateway's credentials were refused, on every route,
    none of the upstream's text (it quotes the key); one ERROR line per route however many
    requests fail (the rest counted into the next line, a minute later)."""
    gw = start()
    hostile.mode = f"auth{status}"
    with caplog.at_level(logging.ERROR, logger="ctxguard.serve"):
        answers = [
            chat(gw),
            chat(gw),
            chat(gw, stream=True),
            httpx.post(gw + "/v1/responses", json={"model": "m", "input": "hi"}, timeout=30),
            httpx.post(gw + "/tokenize", json={"prompt": "hi"}, timeout=30),
            httpx.post(gw + "/tokenize", json={"prompt": "hi"}, timeout=30),
            httpx.get(gw + "/v1/models", timeout=30),
        ]
    for response in answers:
        error = api_error(response, 502, "upstream_auth")
        assert f"refused the gateway's credentials (HTTP {status})" in error["message"]
        assert "operator" in error["message"] and "denied" not in error["message"]
        secret_free(response.text)
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    auth = [line for line in lines if "refused the gateway's credentials" in line]
    assert len(auth) == 3, lines  # chat, /tokenize, /v1/models: once each
    joined = " | ".join(auth)
    assert all(f"HTTP {status} on {what}" in joined for what in ("chat", "/tokenize", "/v1/models"))
    for line in auth:
        secret_free(line)


PASSWORD = 'UPW-s3cr\\et"pw'  # (a backslash and a quote: JSON escapes them)


@pytest.mark.parametrize("status", [400, 500])
@pytest.mark.parametrize("counter", ["tiktoken:cl100k_base", None], ids=["tiktoken", "vllm"])
def test_an_upstream_that_echoes_the_url_password_never_shows_it(
    start_gateway: Start,
    hostile_server: tuple[Hostile, str],
    caplog: pytest.LogCaptureFixture,
    status: int,
    counter: str | None,
) -> None:
    """The upstream URL's user and password go as Basic auth; an upstream that quotes
    them decoded (raw or JSON-escaped) had the password reach the client: only the
    upstream API key was taken out by value (the gateway's scrub and the vllm: counter's
    errors alike)."""
    hostile, url = hostile_server
    hostile.mode = f"basic:{status}"
    host = url.removeprefix("http://")
    settings: dict[str, Any] = {"counter": counter} if counter else {}
    gw = start_gateway(
        upstream=f"http://user:{quote(PASSWORD, safe='')}@{host}",
        url=private_memory_url(),
        upstream_api_key=KEY,
        limit=4096,
        max_tokens=256,
        **settings,
    )
    with caplog.at_level(logging.DEBUG):
        answers = [
            chat(gw),
            chat(gw, stream=True),
            httpx.post(gw + "/v1/responses", json={"model": "m", "input": "hi"}, timeout=30),
            httpx.post(gw + "/tokenize", json={"prompt": "hi"}, timeout=30),
            httpx.get(gw + "/v1/models", timeout=30),
        ]
    hostile.mode = "ok"
    for response in answers:
        assert response.status_code >= 400, response.text
        assert "bad credentials" in response.text  # (the upstream's text, scrubbed)
        for fragment in ("s3cr", quote(PASSWORD, safe="")):
            assert fragment not in response.text
        secret_free(response.text)
    assert "s3cr" not in caplog.text


def test_nan_and_infinity_are_refused_before_anything_is_stored(
    start: Callable[..., str], hostile: Hostile, redis_url: str, namespace: str, stored: Any
) -> None:
    gw = start(url=redis_url, namespace=namespace)
    for constant in ("NaN", "Infinity", "-Infinity"):
        raw = (
            '{"model":"m","messages":[{"role":"user","content":"hi"}],"temperature":'
            + constant
            + "}"
        )
        for path in ("/v1/chat/completions", "/v1/responses"):
            body = raw if path.endswith("completions") else raw.replace('"messages"', '"input"')
            response = httpx.post(
                gw + path,
                content=body,
                headers={"Content-Type": "application/json", "X-Session-Id": "nan"},
                timeout=30,
            )
            error = api_error(response, 400, "invalid_json")
            assert constant.lstrip("-") in error["message"]
    assert hostile.accept_encoding == []  # nothing went upstream
    assert stored("nan") == []


@pytest.mark.parametrize(
    "shape",
    [
        '{"choices":[{"message":"hello"}]}',
        '{"choices":[{"message":null}]}',
        '{"choices":[]}',
        '{"choices":"x"}',
        "[1,2]",
        '"text"',
        '{"choices":[{"message":{"content":7}}]}',
        '{"choices":[{"message":{"content":null,"tool_calls":[{"id":1}]}}]}',
        '{"choices":[{"message":{"content":null,"tool_calls":{"id":"a"}}}]}',
        "not json",
    ],
)
def test_a_malformed_reply_is_a_502_not_a_500(
    start: Callable[..., str], hostile: Hostile, shape: str
) -> None:
    gw = start()
    hostile.mode = "shape:" + shape
    api_error(chat(gw), 502, "upstream_bad_reply")
    response = httpx.post(gw + "/v1/responses", json={"model": "m", "input": "hi"}, timeout=30)
    api_error(response, 502, "upstream_bad_reply")


@pytest.mark.parametrize("shape", ["not json", "[1,2]", '{"data":"x"}', "null"])
def test_a_malformed_model_list_is_a_502(
    start: Callable[..., str], hostile: Hostile, shape: str
) -> None:
    gw = start()
    hostile.mode = "shape:" + shape
    api_error(httpx.get(gw + "/v1/models", timeout=30), 502, "upstream_bad_reply")


def test_a_reply_that_trickles_is_cut_at_the_upstream_timeout(
    start: Callable[..., str], hostile: Hostile
) -> None:
    # a byte every 0.25 s for 10 s: each read is quick, the whole call is not
    gw = start(upstream_timeout=1.0)
    hostile.mode = "drip"
    began = time.monotonic()
    api_error(chat(gw), 504, "upstream_timeout")
    assert time.monotonic() - began < 8  # (the whole reply would take 10 s)


def test_a_reply_past_the_size_cap_is_refused_not_buffered(
    start: Callable[..., str], hostile: Hostile, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(forward, "MAX_REPLY_BYTES", 64 * 1024)  # the flood is 256 KiB
    gw = start()
    hostile.mode = "flood"
    error = api_error(chat(gw), 502, "upstream_bad_reply")
    assert str(64 * 1024) in error["message"]
    hostile.mode = "ok"
    assert chat(gw).status_code == 200  # the gateway goes on


def test_a_stream_is_asked_for_uncompressed_and_read_decoded(
    start: Callable[..., str], hostile: Hostile, redis_url: str, namespace: str, stored: Any
) -> None:
    gw = start(url=redis_url, namespace=namespace)
    hostile.mode = "gzip"  # compresses whatever it was asked
    with httpx.stream(
        "POST",
        gw + "/v1/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True},
        headers={"X-Session-Id": "gz"},
        timeout=30,
    ) as response:
        text = "".join(response.iter_text())
    assert response.status_code == 200
    assert "data: [DONE]" in text and '"hello"' in text
    assert hostile.accept_encoding == ["identity"]
    assert [m["content"] for m in stored("gz")] == ["hi", "hello there"]


def test_an_image_part_is_the_clients_error_and_stores_nothing(
    start: Callable[..., str], hostile: Hostile, redis_url: str, namespace: str, stored: Any
) -> None:
    gw = start(url=redis_url, namespace=namespace)
    image = [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]
    response = httpx.post(
        gw + "/v1/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": image}]},
        headers={"X-Session-Id": "img"},
        timeout=30,
    )
    error = api_error(response, 400, "unsupported_content")
    assert error["param"] == "messages"
    assert hostile.accept_encoding == []
    assert stored("img") == []


def test_with_api_keys_the_forwarding_routes_need_one(
    start: Callable[..., str], hostile: Hostile
) -> None:
    gw = start(api_keys={"ck-alpha": "alpha"})
    for method, path, body in (("GET", "/v1/models", None), ("POST", "/tokenize", {"p": 1})):
        refused = httpx.request(method, gw + path, json=body, timeout=30)
        api_error(refused, 401, "invalid_api_key")
        taken = httpx.request(
            method, gw + path, json=body, headers={"Authorization": "Bearer ck-alpha"}, timeout=30
        )
        assert taken.status_code == 200, taken.text


def test_an_unexpected_error_is_a_500_without_its_message_or_a_traceback(
    start: Callable[..., str],
    hostile: Hostile,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"boom with redis://:{KEY}@host")

    gw = start()
    monkeypatch.setattr("ctxguard.serve.chat.parse_chat", broken)
    capfd.readouterr()
    with caplog.at_level(logging.DEBUG):
        response = chat(gw)
        time.sleep(0.5)  # (a handler that answers and then re-raises logs after the answer)
    error = api_error(response, 500, "internal_error")
    assert "internal error" in error["message"]
    assert "RuntimeError" not in response.text  # (the client cannot act on a class name)
    out, err = capfd.readouterr()  # uvicorn's own handler writes to the process's stderr
    logged = "\n".join([out, err, *(r.getMessage() for r in caplog.records)])
    assert "unexpected RuntimeError" in logged  # the type is logged...
    secret_free(logged)  # ...never the message
    assert "Traceback" not in logged and not any(r.exc_info for r in caplog.records)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    ("status", "seconds", "millis", "answered", "passed"),
    [
        (429, "7", "7000", 429, {"retry-after": "7", "retry-after-ms": "7000"}),
        (503, "3", "2500.5", 502, {"retry-after": "3", "retry-after-ms": "2500.5"}),
        (
            429,
            "Wed, 21 Oct 2037 07:28:00 GMT",
            "x",
            429,
            {"retry-after": "Wed, 21 Oct 2037 07:28:00 GMT"},
        ),
        (429, KEY, f"1 {KEY}", 429, {}),  # not a time: dropped
    ],
)
def test_the_upstreams_retry_after_reaches_the_client(
    start: Callable[..., str],
    hostile: Hostile,
    stream: bool,
    status: int,
    seconds: str,
    millis: str,
    answered: int,
    passed: dict[str, str],
) -> None:
    """(a 429's or an overloaded 503's Retry-After was dropped: OpenAI's SDKs, which wait
    what retry-after-ms / Retry-After say before retrying, retried on their own schedule)"""
    gw = start()
    hostile.mode = f"busy:{status}|{seconds}|{millis}"
    response = chat(gw, stream=stream)
    api_error(response, answered, "upstream_rejected" if answered == 429 else "upstream_error")
    got = {k: v for k, v in response.headers.items() if k.lower().startswith("retry-after")}
    assert got == passed
    secret_free(str(response.headers))


def test_a_reply_broken_off_is_a_502_that_says_so(
    start: Callable[..., str], hostile: Hostile, redis_url: str, namespace: str, stored: Any
) -> None:
    """(it was "cannot reach the model server": the server answered, and broke off)"""
    gw = start(url=redis_url, namespace=namespace)
    hostile.mode = "cut"
    response = httpx.post(
        gw + "/v1/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
        headers={"X-Session-Id": "cut"},
        timeout=30,
    )
    error = api_error(response, 502, "upstream_lost")
    assert "broke off its reply" in error["message"] and "cannot reach" not in error["message"]
    assert error["message"].endswith("send the request again")
    secret_free(response.text)
    assert [m["role"] for m in stored("cut")] == ["user"]  # no reply; a retry stores it once
    hostile.mode = "ok"
    response = httpx.post(
        gw + "/v1/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
        headers={"X-Session-Id": "cut"},
        timeout=30,
    )
    assert response.status_code == 200
    assert [m["role"] for m in stored("cut")] == ["user", "assistant"]


@pytest.mark.parametrize("stream", [False, True])
def test_a_redirect_or_an_empty_error_is_a_502_that_says_what_happened(
    start: Callable[..., str], hostile: Hostile, stream: bool
) -> None:
    # both ended "the model server answered HTTP 307:", with nothing after the colon
    gw = start()
    hostile.mode = "redirect"
    error = api_error(chat(gw, stream=stream), 502, "upstream_error")
    assert "HTTP 307, a redirect" in error["message"] and "set the upstream URL" in error["message"]
    assert "redirect-pw" not in error["message"] and "elsewhere" not in error["message"]
    hostile.mode = "empty502"
    error = api_error(chat(gw, stream=stream), 502, "upstream_error")
    assert error["message"] == "the model server answered HTTP 502: (no message)"
    hostile.mode = "empty404"  # (was a 404 with an empty message)
    error = api_error(chat(gw, stream=stream), 404, "upstream_rejected")
    assert error["message"] == "the model server answered HTTP 404 with no message"


@pytest.mark.parametrize(
    ("stream", "status", "code"), [(False, 504, "upstream_timeout"), (True, 502, "upstream_error")]
)
def test_an_error_whose_body_never_ends_is_answered_at_the_upstream_timeout(
    start: Callable[..., str], hostile: Hostile, stream: bool, status: int, code: str
) -> None:
    # a streaming call read an error body with no deadline but each read's: a body that
    # trickles forever held the client until its own timeout (here 30 s per read); a
    # non-streaming call's one deadline already covered it (a 504)
    gw = start(upstream_timeout=1.0)
    hostile.mode = "drip500"
    error = api_error(chat(gw, stream=stream), status, code)
    if stream:  # what came in time is the message
        assert error["message"].startswith("the model server answered HTTP 500: ")
        assert '"engine .' in error["message"]


@pytest.mark.parametrize(
    "usage",
    [
        '{"prompt_tokens": -1, "completion_tokens": 2}',
        '{"prompt_tokens": 1e400}',
        '{"prompt_tokens": 1' + "0" * 400 + "}",
        '{"completion_tokens": "7"}',
        '"lots"',
    ],
)
def test_a_reply_with_usage_no_server_could_report_is_stored_without_it(
    start: Callable[..., str],
    hostile: Hostile,
    redis_url: str,
    namespace: str,
    stored: Any,
    usage: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # the model did answer: a usage no server reports (negative, past 2**63, not a
    # number) is the upstream's fault, so the reply is stored and the usage dropped
    # (it was a 503 reply_not_stored, the answer lost to the client)
    gw = start(url=redis_url, namespace=namespace)
    reply = '{"role":"assistant","content":"fine"}'
    hostile.mode = f'shape:{{"choices":[{{"index":0,"message":{reply}}}],"usage":{usage}}}'
    with caplog.at_level(logging.WARNING, logger="ctxguard"):
        response = httpx.post(
            gw + "/v1/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
            headers={"X-Session-Id": "usage"},
            timeout=30,
        )
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"] == "fine"
    response = httpx.post(
        gw + "/v1/responses",
        json={"model": "m", "input": "hello", "conversation": "usage"},
        timeout=30,
    )
    assert response.status_code == 200, response.text
    assert response.json()["output"][0]["content"][0]["text"] == "fine"
    assert [m["content"] for m in stored("usage")] == ["hi", "fine", "hello", "fine"]
    if usage.startswith("{"):  # (not a dict: never usage, dropped as before, unlogged)
        assert any("usage" in r.getMessage() for r in caplog.records), caplog.text


@pytest.mark.parametrize(
    ("error", "status", "code"),
    [
        ({"object": "error", "message": "bad prompt", "code": 400}, 400, "upstream_rejected"),
        ({"object": "error", "message": "engine died", "code": 500}, 502, "upstream_error"),
        ({"object": "error", "message": "no code"}, 502, "upstream_error"),
        ({"error": {"message": "bad prompt", "code": 422}}, 422, "upstream_rejected"),
        ({"object": "error", "message": "bad key", "code": 401}, 502, "upstream_auth"),
    ],
)
@pytest.mark.parametrize("route", ["chat", "responses"])
def test_an_error_answered_with_http_200_is_that_error_and_stores_nothing(
    start: Callable[..., str],
    hostile: Hostile,
    redis_url: str,
    namespace: str,
    stored: Any,
    error: dict[str, Any],
    status: int,
    code: str,
    route: str,
) -> None:
    """(some vLLM versions answer an error with HTTP 200 and ``{"object": "error"}``: it
    was a generic 502 "unreadable reply", the upstream's message lost)"""
    gw = start(url=redis_url, namespace=namespace)
    said = f"{error.get('message') or error['error']['message']}: key {KEY}\n" + "x" * 400
    if "error" in error:
        error = {"error": {**error["error"], "message": said}}
    else:
        error = {**error, "message": said}
    hostile.mode = "shape:" + json.dumps(error)
    if route == "chat":
        response = httpx.post(
            gw + "/v1/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
            headers={"X-Session-Id": "err200"},
            timeout=30,
        )
    else:
        response = httpx.post(
            gw + "/v1/responses",
            json={"model": "m", "input": "hi", "conversation": "err200"},
            timeout=30,
        )
    body = api_error(response, status, code)
    if code == "upstream_auth":  # (the gateway's credentials: none of the upstream's text)
        assert "refused the gateway's credentials (HTTP 401)" in body["message"]
    else:
        assert said.split(":")[0] in body["message"] and "unreadable" not in body["message"]
    assert len(body["message"]) < 400  # cut to one short line
    secret_free(response.text)
    # no reply stored; a request the upstream refuses as wrong is taken back whole
    kept = [] if code == "upstream_rejected" else ["user"]
    assert [m["role"] for m in stored("err200")] == kept


@pytest.mark.parametrize("route", ["chat", "stream", "responses"])
def test_a_tool_call_cut_by_the_output_limit_says_to_raise_it(
    start: Callable[..., str],
    hostile: Hostile,
    redis_url: str,
    namespace: str,
    stored: Any,
    route: str,
) -> None:
    """(it was a 502 reply_not_stored quoting the arguments' JSON error, and "a reply like
    this one is refused again": nothing said the output limit cut it, nor what to raise)"""
    gw = start(url=redis_url, namespace=namespace)
    hostile.mode = "cutcall"
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
    if route == "responses":
        body = {"model": "m", "input": "weather?", "conversation": "cutcall"}
        body["tools"] = [{"type": "function", "name": "get_weather", "parameters": {}}]
        response = httpx.post(gw + "/v1/responses", json=body, timeout=30)
        message = api_error(response, 502, "reply_not_stored")["message"]
        assert message.endswith("with a larger max_output_tokens")
    else:
        body = {"model": "m", "messages": [{"role": "user", "content": "weather?"}]}
        body.update(tools=tools, stream=route == "stream")
        headers = {"X-Session-Id": "cutcall"}
        response = httpx.post(gw + "/v1/chat/completions", json=body, headers=headers, timeout=30)
        if route == "stream":
            assert response.status_code == 200
            assert "data: [DONE]" not in response.text
            last = [line for line in response.text.splitlines() if line.startswith("data:")][-1]
            error = json.loads(last[5:])["error"]
            assert error["code"] == "reply_not_stored"
            message = error["message"]
        else:
            message = api_error(response, 502, "reply_not_stored")["message"]
        assert message.endswith("with a larger max_tokens / max_completion_tokens")
    assert "tool call was cut by the output limit" in message
    assert "\n" not in message
    assert [m["role"] for m in stored("cutcall")] == ["user"]  # the reply not stored


REFUSAL = "I can't help with that."
AUDIO = {"id": "audio_1", "data": "UklGRiQAAABXQVZF" * 64, "expires_at": 1, "transcript": "Hi!"}


def _streamed(*deltas: dict[str, Any]) -> str:
    chunks = [{"choices": [{"index": 0, "delta": d}]} for d in deltas]
    chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    return "sse:" + json.dumps(chunks)


def _plain(message: dict[str, Any]) -> str:
    choice = {"index": 0, "message": {"role": "assistant", **message}, "finish_reason": "stop"}
    return "shape:" + json.dumps({"choices": [choice]})


@pytest.mark.parametrize(
    ("mode", "kept"),
    [
        (_plain({"content": None, "refusal": REFUSAL}), REFUSAL),
        (
            _streamed({"role": "assistant", "refusal": "I can't "}, {"refusal": "help with that."}),
            REFUSAL,
        ),
        (_plain({"content": None, "audio": AUDIO}), "Hi!"),
        (
            _streamed(
                {"role": "assistant", "audio": {"id": "audio_1", "transcript": "Hi"}},
                {"audio": {"data": AUDIO["data"], "transcript": "!"}},
            ),
            "Hi!",
        ),
    ],
    ids=["refusal", "refusal-streamed", "audio", "audio-streamed"],
)
def test_a_refusal_or_an_audio_reply_is_stored_as_what_the_model_said(
    start: Callable[..., str],
    hostile: Hostile,
    redis_url: str,
    namespace: str,
    stored: Any,
    mode: str,
    kept: str,
) -> None:
    """(a reply with content null and a refusal, or audio, was stored as an empty assistant
    turn: the next turn showed the model nothing of what it said) The text is stored as
    the content, which every counter counts and every template renders; the audio's data
    and expiring id are not kept."""
    gw = start(url=redis_url, namespace=namespace)
    hostile.mode = mode
    stream = mode.startswith("sse:")
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    response = httpx.post(
        gw + "/v1/chat/completions", json=body, headers={"X-Session-Id": "said"}, timeout=30
    )
    assert response.status_code == 200, response.text
    if stream:
        assert "data: [DONE]" in response.text
    turns = stored("said")
    assert [(m["role"], m["content"]) for m in turns] == [("user", "hi"), ("assistant", kept)]
    assert "audio" not in turns[1] and "UklGR" not in json.dumps(turns)


@pytest.mark.parametrize("stream", [False, True])
def test_an_empty_reply_is_not_stored_silently(
    start: Callable[..., str],
    hostile: Hostile,
    redis_url: str,
    namespace: str,
    stored: Any,
    stream: bool,
    caplog: pytest.LogCaptureFixture,
) -> None:
    gw = start(url=redis_url, namespace=namespace)
    hostile.mode = _streamed({"role": "assistant"}) if stream else _plain({"content": None})
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    with caplog.at_level(logging.WARNING, logger="ctxguard"):
        response = httpx.post(
            gw + "/v1/chat/completions", json=body, headers={"X-Session-Id": "empty"}, timeout=30
        )
    assert response.status_code == 200, response.text
    assert [(m["role"], m["content"]) for m in stored("empty")] == [
        ("user", "hi"),
        ("assistant", ""),
    ]
    assert any("stored as an empty assistant turn" in r.getMessage() for r in caplog.records)
