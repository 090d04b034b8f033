"""Bad input and faults: OpenAI-shaped 4xx/5xx, nothing stored twice, no secret shown."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from faults.fake_servers import fake_server
from faults.servers import RedisServer, free_port

from ctxguard import open_store
from ctxguard.errors import (
    CorruptRecordError,
    CtxGuardError,
    InvalidMessageError,
    StoreConnectionError,
    TokenizerError,
)
from ctxguard.serve.outcomes import reply_not_stored

from .test_chat import chat
from .upstream import FakeVLLM

pytestmark = pytest.mark.redis

Stored = Callable[..., list[dict[str, Any]]]
URL = "/v1/chat/completions"


def sessions(redis_url: str, namespace: str) -> list[str]:
    store = open_store(redis_url, namespace=namespace)
    try:
        return list(store.list_sessions())
    finally:
        store.close()


def error_of(response: httpx.Response) -> dict[str, Any]:
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert "\n" not in error["message"]
    return dict(error)


TWO_CALLS = b'{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}'
BAD_BODIES: list[tuple[str, bytes, dict[str, str], int, str | None]] = [
    ("not json", b"{nope", {}, 400, None),
    ("array body", b"[1, 2]", {}, 400, None),
    ("no messages", b'{"model": "m"}', {}, 400, "messages"),
    ("messages not a list", b'{"messages": "hi"}', {}, 400, "messages"),
    ("unknown role", b'{"messages": [{"role": "wizard", "content": "x"}]}', {}, 400, "messages[0]"),
    ("content a number", b'{"messages": [{"role": "user", "content": 5}]}', {}, 400, "messages[0]"),
    (
        "stream not bool",
        b'{"messages": [{"role": "user", "content": "x"}], "stream": "yes"}',
        {},
        400,
        "stream",
    ),
    (
        "max_tokens text",
        b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": "9"}',
        {},
        400,
        "max_tokens",
    ),
    (
        "tools not a list",
        b'{"messages": [{"role": "user", "content": "x"}], "tools": {}}',
        {},
        400,
        "tools",
    ),
    (
        "session id too long",
        b'{"messages": [{"role": "user", "content": "x"}]}',
        {"X-Session-Id": "s" * 300},
        400,
        "X-Session-Id",
    ),
    (
        "bad tenant",
        b'{"messages": [{"role": "user", "content": "x"}]}',
        {"X-Tenant": "a:b"},
        400,
        "X-Tenant",
    ),
    (
        "user field not a string",
        b'{"messages": [{"role": "user", "content": "x"}], "user": 7}',
        {},
        400,
        "user",
    ),
    (
        "two tool calls with one id",
        b'{"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": null, '
        b'"tool_calls": [' + b", ".join([TWO_CALLS] * 2) + b"]}, "
        b'{"role": "tool", "content": "sunny", "tool_call_id": "c1"}]}',
        {},
        400,
        None,
    ),
    (
        "oversize body",
        b'{"messages": [{"role": "user", "content": "' + b"x" * 5000 + b'"}]}',
        {},
        413,
        None,
    ),
]


@pytest.mark.parametrize(
    ("body", "headers", "status", "param"),
    [case[1:] for case in BAD_BODIES],
    ids=[case[0] for case in BAD_BODIES],
)
def test_bad_input_is_an_openai_4xx_and_nothing_is_stored(
    start_gateway: Callable[..., str],
    redis_url: str,
    namespace: str,
    vllm: FakeVLLM,
    body: bytes,
    headers: dict[str, str],
    status: int,
    param: str | None,
) -> None:
    gateway = start_gateway(url=redis_url, namespace=namespace, max_body_bytes=4096)
    sent = {"X-Session-Id": "s1", "Content-Type": "application/json", **headers}
    response = httpx.post(gateway + URL, content=body, headers=sent, timeout=30)
    assert response.status_code == status, response.text
    error = error_of(response)
    assert error["type"] == "invalid_request_error"
    if param is not None:
        assert error["param"] == param
    assert vllm.requests == []
    assert sessions(redis_url, namespace) == []


def test_upstream_500_is_a_502_and_a_retry_stores_the_message_once(
    gateway: str, vllm: FakeVLLM, stored: Stored
) -> None:
    chat(gateway, "first")
    vllm.fail_status = 500
    for _ in range(3):
        response = chat(gateway, "second")
        assert response.status_code == 502
        assert error_of(response)["code"] == "upstream_error"
    vllm.fail_status = None
    assert chat(gateway, "second").status_code == 200
    contents = [m["content"] for m in stored("s1")]
    assert contents == ["first", "echo: first", "second", "echo: second"]
    assert [m["content"] for m in vllm.requests[-1]["messages"]] == contents[:3]
    # the same text after a reply is a new turn, not a retry
    assert chat(gateway, "second").status_code == 200
    assert [m["content"] for m in stored("s1")][4:] == ["second", "echo: second"]


def test_upstream_timeout_is_a_504_and_the_retry_does_not_duplicate(
    start_gateway: Callable[..., str],
    redis_url: str,
    namespace: str,
    vllm: FakeVLLM,
    stored: Stored,
) -> None:
    vllm.slow_seconds = 2.0
    gateway = start_gateway(url=redis_url, namespace=namespace, upstream_timeout=0.3)
    response = chat(gateway, "SLOW answer")
    assert response.status_code == 504
    assert error_of(response)["code"] == "upstream_timeout"
    assert chat(gateway, "SLOW answer").status_code == 504
    assert [m["content"] for m in stored("s1")] == ["SLOW answer"]


def test_upstream_down_is_a_502_and_nothing_is_duplicated(
    start_gateway: Callable[..., str],
    redis_url: str,
    namespace: str,
    vllm: FakeVLLM,
    stored: Stored,
) -> None:
    dead = f"http://user:upstream-pw@127.0.0.1:{free_port()}"
    gateway = start_gateway(
        upstream=dead,
        counter=f"vllm:{vllm.url}",
        limit=4096,
        url=redis_url,
        namespace=namespace,
        upstream_api_key="sk-upstream-secret",
    )
    for stream in (False, True, False):
        response = chat(gateway, "anyone there?", stream=stream)
        assert response.status_code == 502
        assert error_of(response)["code"] == "upstream_unavailable"
        assert "upstream-pw" not in response.text and "sk-upstream" not in response.text
    assert [m["content"] for m in stored("s1")] == ["anyone there?"]


def test_health_follows_the_store_and_reports_the_model_server(
    start_gateway: Callable[..., str], redis_url: str, namespace: str, vllm: FakeVLLM
) -> None:
    """(/health answered 503 "store": "TokenizerError" while only the model server's
    /tokenize was down: a liveness probe would restart every gateway while vLLM restarts)"""
    dead = f"http://127.0.0.1:{free_port()}"
    for upstream, counter in ((dead, "unavailable"), (vllm.url, "ok")):
        gateway = start_gateway(
            upstream=upstream, counter=f"vllm:{upstream}", url=redis_url, namespace=namespace
        )
        health = httpx.get(gateway + "/health", timeout=30)
        assert health.status_code == 200, health.text
        assert health.json() == {"status": "ok", "store": "ok", "counter": counter}


def test_redis_down_is_a_503_and_nothing_is_forwarded(
    start_gateway: Callable[..., str],
    vllm: FakeVLLM,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    url = f"redis://:hunter2-secret@127.0.0.1:{free_port()}/0"
    gateway = start_gateway(url=url, upstream_api_key="sk-upstream-secret")
    for stream in (False, True):
        response = chat(gateway, "hello", stream=stream)
        assert response.status_code == 503
        assert error_of(response)["code"] == "store_unavailable"
        assert "hunter2" not in response.text
    assert vllm.requests == []
    health = httpx.get(gateway + "/health", timeout=30)
    assert health.status_code == 503
    assert "hunter2" not in health.text
    assert "hunter2" not in caplog.text and "sk-upstream-secret" not in caplog.text


def test_a_store_that_sends_the_password_back_is_a_503_without_it(
    start_gateway: Callable[..., str],
    vllm: FakeVLLM,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A server that knows no AUTH quotes it (and the password) in its refusal: the
    gateway's answers, its health check and its logs hold neither form of it."""
    caplog.set_level(logging.DEBUG)
    with fake_server("echoing") as echoing:
        url = f"redis://:hunter2%40secret@127.0.0.1:{echoing.port}/0"
        gateway = start_gateway(url=url, upstream_api_key="sk-upstream-secret")
        for stream in (False, True):
            response = chat(gateway, "hello", stream=stream)
            assert response.status_code == 503
            error = error_of(response)
            assert error["code"] == "store_unavailable"
            assert "refused the connection handshake" in error["message"]
            assert "hunter2" not in response.text
        health = httpx.get(gateway + "/health", timeout=30)
    assert health.status_code == 503
    assert "hunter2" not in health.text
    assert vllm.requests == []
    assert "hunter2" not in caplog.text and "sk-upstream-secret" not in caplog.text


def test_redis_restart_the_gateway_recovers_with_history(
    start_gateway: Callable[..., str], vllm: FakeVLLM, tmp_path: Path
) -> None:
    server = RedisServer(tmp_path / "redis", ["--appendonly", "yes", "--appendfsync", "always"])
    server.start()
    try:
        gateway = start_gateway(url=server.url, namespace="restart")
        assert chat(gateway, "before").status_code == 200
        server.stop()
        down = chat(gateway, "while down")
        assert down.status_code == 503
        server.start()
        assert chat(gateway, "after").status_code == 200
        sent = [m["content"] for m in vllm.requests[-1]["messages"]]
        assert sent == ["before", "echo: before", "after"]
    finally:
        server.stop(kill=True)


def test_unknown_routes_and_methods_are_openai_shaped(gateway: str) -> None:
    missing = httpx.get(gateway + "/v1/nothing", timeout=30)
    assert missing.status_code == 404
    assert error_of(missing)
    wrong = httpx.get(gateway + URL, timeout=30)
    assert wrong.status_code == 405
    assert error_of(wrong)


def test_an_upstream_that_cannot_say_its_limit_is_a_502_and_nothing_is_stored(
    start_gateway: Callable[..., str],
    redis_url: str,
    namespace: str,
    vllm: FakeVLLM,
    stored: Stored,
) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    gateway = start_gateway(
        upstream=dead, counter=f"vllm:{vllm.url}", url=redis_url, namespace=namespace
    )
    response = chat(gateway, "what is your limit?")
    assert response.status_code == 502
    assert error_of(response)["code"] == "upstream_unavailable"
    assert stored("s1") == []


def test_a_model_reply_with_two_calls_of_one_id_is_not_stored_and_says_why(
    gateway: str, vllm: FakeVLLM, stored: Stored
) -> None:
    """Stored, it would make the session's every later request a 400 upstream."""
    response = chat(gateway, "CALL_TWICE please")
    assert response.status_code == 502
    error = error_of(response)
    assert error["code"] == "reply_not_stored"
    assert "'call_1'" in error["message"] and "give each call its own id" in error["message"]
    assert "Error" not in error["message"]  # (it named the Python class)
    assert [m["role"] for m in stored("s1")] == ["user"]
    assert chat(gateway, "and now?").status_code == 200  # the session goes on
    assert [m["role"] for m in stored("s1")] == ["user", "user", "assistant"]


@pytest.mark.parametrize("stream", [False, True])
def test_a_reply_that_cannot_be_stored_says_so(
    start_gateway: Callable[..., str], vllm: FakeVLLM, tmp_path: Path, stream: bool
) -> None:
    import concurrent.futures

    from .test_chat import sse_chunks
    from .test_retries import wait_until

    server = RedisServer(tmp_path / "redis").start()
    try:
        gateway = start_gateway(url=server.url, namespace="late")
        vllm.slow_seconds = 1.0
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            pending = pool.submit(chat, gateway, "SLOW reply", stream=stream)
            wait_until(lambda: len(vllm.requests) == 1, "the request upstream")
            server.stop()  # the reply cannot be stored now
            response = pending.result()
        if stream:  # the client has its 200 already: the stream ends with an error event
            assert response.status_code == 200
            last = sse_chunks(response)[-1]["error"]
            assert last["code"] == "reply_not_stored"
            assert "data: [DONE]" not in response.text
            message = last["message"]
        else:
            assert response.status_code == 503
            error = error_of(response)
            assert error["code"] == "reply_not_stored"
            assert "model answered" in error["message"]
            message = error["message"]
        # a stopped server refuses the connection: the write was never sent
        assert message.endswith("retrying the request is safe")
    finally:
        server.stop(kill=True)


@pytest.mark.parametrize(
    ("error", "status", "again"),
    [
        (StoreConnectionError("refused", phase="connect"), 503, False),
        (CorruptRecordError("s1", "msgs", "bad"), 503, False),
        (TokenizerError("the model server's /tokenize failed"), 502, False),
        (InvalidMessageError("two calls, one id"), 502, True),
    ],
)
@pytest.mark.parametrize("keyed", [False, True])
def test_a_refused_reply_says_a_retry_meets_the_same_refusal(
    error: CtxGuardError, status: int, again: bool, keyed: bool
) -> None:
    """A 503 (the store failed) may pass on retry; a 502 for a reply the gateway refuses
    says that the same reply is refused again (the OpenAI SDKs retry both)."""
    answer = reply_not_stored(error, keyed)
    assert answer.status == status
    assert answer.message.endswith("a reply like this one is refused again") is again


@pytest.mark.parametrize(
    ("error", "keyed", "advice"),
    [
        (StoreConnectionError("refused", phase="connect"), False, "retrying the request is safe"),
        (StoreConnectionError("no tls", phase="tls"), False, "retrying the request is safe"),
        (StoreConnectionError("timed out", phase="read"), False, "may have been stored"),
        (StoreConnectionError("sent part", phase="write"), False, "may have been stored"),
        (StoreConnectionError("dropped", phase="lost"), False, "may have been stored"),
        (StoreConnectionError("unknown"), False, "may have been stored"),
        (StoreConnectionError("timed out", phase="read"), True, "same Idempotency-Key is safe"),
        (CorruptRecordError("s1", "msgs", "bad"), False, "retrying the request is safe"),
        (InvalidMessageError("two calls, one id"), False, "retrying the request is safe"),
    ],
)
def test_a_reply_not_stored_says_whether_a_retry_is_safe(
    error: CtxGuardError, keyed: bool, advice: str
) -> None:
    """A retry without a key is recognised by ids anchored at the newest reply: if the
    reply landed after all (a connection lost once the write was sent), it would store the
    turn twice, so only then is the answer not "safe"."""
    answer = reply_not_stored(error, keyed)
    assert answer.code == "reply_not_stored"
    assert advice in answer.message.rsplit(";", 1)[1]  # the advice is the last clause
