"""POST /v1/chat/completions through a real gateway (uvicorn) to a vLLM-shaped upstream."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from ctxguard import Guard

from .upstream import FakeVLLM

pytestmark = pytest.mark.redis

Stored = Callable[..., list[dict[str, Any]]]


def chat(
    gateway: str,
    content: str,
    session: str | None = "s1",
    stream: bool = False,
    headers: dict[str, str] | None = None,
    **fields: Any,
) -> httpx.Response:
    body: dict[str, Any] = {
        "model": "m",
        "messages": [{"role": "user", "content": content}],
        "stream": stream,
        **fields,
    }
    sent = {**({"X-Session-Id": session} if session else {}), **(headers or {})}
    return httpx.post(f"{gateway}/v1/chat/completions", json=body, headers=sent, timeout=30)


def sse_chunks(response: httpx.Response) -> list[dict[str, Any]]:
    out = []
    for line in response.text.splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            out.append(json.loads(line[6:]))
    return out


def test_a_session_keeps_history_and_sends_the_whole_window(
    gateway: str, vllm: FakeVLLM, stored: Stored
) -> None:
    first = chat(gateway, "hello there")
    assert first.status_code == 200, first.text
    assert first.json()["choices"][0]["message"]["content"] == "echo: hello there"
    second = chat(gateway, "and again")
    assert second.status_code == 200
    sent = vllm.requests[-1]
    assert [m["content"] for m in sent["messages"]] == [
        "hello there",
        "echo: hello there",
        "and again",
    ]
    assert sent["max_tokens"] == 256  # the reserve, since the client gave none
    history = stored("s1")
    assert [(m["role"], m["content"]) for m in history] == [
        ("user", "hello there"),
        ("assistant", "echo: hello there"),
        ("user", "and again"),
        ("assistant", "echo: and again"),
    ]


def test_the_clients_max_tokens_is_kept_and_reserved(gateway: str, vllm: FakeVLLM) -> None:
    assert chat(gateway, "hi", max_tokens=17).status_code == 200
    assert vllm.requests[-1]["max_tokens"] == 17
    assert "max_tokens" not in {
        k for k, v in vllm.requests[-1].items() if k == "max_completion_tokens"
    }


def test_streaming_passes_chunks_and_stores_the_assembled_reply(
    gateway: str, vllm: FakeVLLM, stored: Stored
) -> None:
    response = chat(gateway, "one two three", stream=True)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    chunks = sse_chunks(response)
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == "echo: one two three"
    assert response.text.rstrip().endswith("data: [DONE]")
    # the gateway asked for usage; the client did not, so it gets no usage-only chunk
    assert vllm.requests[-1]["stream_options"] == {"include_usage": True}
    assert all(c["choices"] for c in chunks)
    assert stored("s1")[-1]["content"] == "echo: one two three"


def test_events_that_arrive_together_are_all_relayed(
    gateway: str, vllm: FakeVLLM, stored: Stored
) -> None:
    # the upstream writes the whole stream at once: every event of that one read reaches
    # the client, the usage chunk the gateway asked for is still held back, [DONE] last
    response = chat(gateway, "BATCH one two three", stream=True)
    chunks = sse_chunks(response)
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == "echo: BATCH one two three"
    assert all(c["choices"] for c in chunks)
    assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == "stop"
    assert response.text.rstrip().endswith("data: [DONE]")
    assert response.text.count("[DONE]") == 1
    assert stored("s1")[-1]["content"] == "echo: BATCH one two three"


def test_a_client_that_asks_for_usage_gets_it(gateway: str) -> None:
    response = chat(gateway, "hi", stream=True, stream_options={"include_usage": True})
    assert sse_chunks(response)[-1]["usage"]["completion_tokens"] == 3


@pytest.mark.parametrize("stream", [False, True])
def test_tool_calls_are_stored_whole(gateway: str, stored: Stored, stream: bool) -> None:
    response = chat(gateway, "CALL_TOOL please", stream=stream)
    assert response.status_code == 200
    reply = stored("s1")[-1]
    assert reply["role"] == "assistant"
    assert reply["tool_calls"] == [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
        }
    ]
    tool = {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}
    body = {"model": "m", "messages": [tool]}
    after = httpx.post(
        f"{gateway}/v1/chat/completions", json=body, headers={"X-Session-Id": "s1"}, timeout=30
    )
    assert after.status_code == 200, after.text
    assert [m["role"] for m in stored("s1")] == ["user", "assistant", "tool", "assistant"]


def test_the_window_is_fitted_and_every_request_fits(
    start_gateway: Callable[..., str],
    redis_url: str,
    namespace: str,
    vllm: FakeVLLM,
    stored: Stored,
) -> None:
    vllm.max_model_len = 600
    gateway = start_gateway(url=redis_url, namespace=namespace, max_tokens=100)
    for turn in range(12):
        response = chat(gateway, f"turn {turn}: " + "lorem ipsum dolor sit amet " * 8)
        assert response.status_code == 200, response.text
    assert all(p + 100 <= 600 for p in vllm.prompt_tokens)
    assert len(vllm.requests[-1]["messages"]) < 24  # older turns were left out
    assert len(stored("s1")) == 24  # but all are stored


def test_over_the_limit_is_a_400_that_never_reaches_the_model(
    gateway: str, vllm: FakeVLLM, stored: Stored
) -> None:
    response = chat(gateway, "word " * 5000)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "context_length_exceeded"
    assert error["type"] == "invalid_request_error"
    assert "limit 4096" in error["message"] and "reserved for output 256" in error["message"]
    assert vllm.requests == []
    assert stored("s1") == []


def test_stateless_requests_are_fitted_and_nothing_is_stored(
    gateway: str, vllm: FakeVLLM, redis_url: str, namespace: str
) -> None:
    response = chat(gateway, "no session here", session=None)
    assert response.status_code == 200
    assert vllm.requests[-1]["messages"] == [{"role": "user", "content": "no session here"}]
    assert vllm.requests[-1]["max_tokens"] == 256
    from ctxguard import open_store

    store = open_store(redis_url, namespace=namespace)
    try:
        assert list(store.list_sessions()) == []
    finally:
        store.close()
    too_long = chat(gateway, "word " * 5000, session=None)
    assert too_long.json()["error"]["code"] == "context_length_exceeded"


def test_session_id_sources_in_order(gateway: str, stored: Stored) -> None:
    url = f"{gateway}/v1/chat/completions"
    message = [{"role": "user", "content": "x"}]
    httpx.post(url, json={"messages": message, "user": "from-user"}, timeout=30)
    httpx.post(
        url,
        json={"messages": message, "user": "from-user", "metadata": {"session_id": "from-meta"}},
        timeout=30,
    )
    httpx.post(
        url,
        json={"messages": message, "user": "u", "metadata": {"session_id": "m"}},
        headers={"X-Session-Id": "from-header"},
        timeout=30,
    )
    assert len(stored("from-user")) == 2
    assert len(stored("from-meta")) == 2
    assert len(stored("from-header")) == 2
    assert stored("u") == [] and stored("m") == []


def test_header_ids_are_read_as_utf8(gateway: str, stored: Stored) -> None:
    """(ASGI hands header bytes over as Latin-1: ``séssion-ü`` was stored as
    ``sÃ©ssion-Ã¼``, another session than the same id in ``metadata.session_id``, and a
    UTF-8 Idempotency-Key was refused for a control character it does not hold)"""
    url = f"{gateway}/v1/chat/completions"
    headers = {
        "X-Session-Id": "séssion-ü".encode(),
        "X-Tenant": b"acme",
        "Idempotency-Key": "ключ".encode(),
    }
    body = {"model": "m", "messages": [{"role": "user", "content": "héllo"}]}
    first = httpx.post(url, json=body, headers=headers, timeout=30)
    assert first.status_code == 200, first.text
    again = httpx.post(url, json=body, headers=headers, timeout=30)
    assert again.headers["idempotent-replayed"] == "true"
    assert [m["content"] for m in stored("séssion-ü", "acme")] == ["héllo", "echo: héllo"]
    body = {"model": "m", "messages": [{"role": "user", "content": "more"}]}
    body["metadata"] = {"session_id": "séssion-ü"}
    assert httpx.post(url, json=body, headers={"X-Tenant": b"acme"}).status_code == 200
    assert len(stored("séssion-ü", "acme")) == 4
    # a tenant name is ASCII: the refusal shows the name the client wrote
    refused = httpx.post(url, json=body, headers={"X-Tenant": "tenänt".encode()}, timeout=30)
    assert refused.status_code == 400
    assert refused.json()["error"]["message"].startswith("tenant (X-Tenant) 'tenänt' is not")


@pytest.mark.parametrize("name", ["X-Session-Id", "X-Tenant", "Idempotency-Key"])
def test_a_header_that_is_not_utf8_is_a_400(gateway: str, stored: Stored, name: str) -> None:
    response = chat(gateway, "latin-1", headers={name: "séssion".encode("latin-1")})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["code"], error["param"]) == ("invalid_header", name)
    assert error["message"] == f"the {name} header is not valid UTF-8; send it as UTF-8 text"
    assert stored("s1") == [] and stored("séssion") == []


@pytest.mark.parametrize(
    ("headers", "metadata", "where"),
    [
        ({"X-Session-Id": ""}, None, "X-Session-Id"),
        ({}, {"session_id": ""}, "metadata.session_id"),
        ({}, {"session_id": " "}, "metadata.session_id"),
    ],
)
def test_an_empty_session_id_is_a_400_not_a_stateless_request(
    gateway: str, vllm: FakeVLLM, headers: dict[str, str], metadata: Any, where: str
) -> None:
    """(an empty X-Session-Id or metadata.session_id made the request stateless: the
    client's history was silently not kept)"""
    body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    if metadata is not None:
        body["metadata"] = metadata
    url = f"{gateway}/v1/chat/completions"
    response = httpx.post(url, json=body, headers=headers, timeout=30)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["code"], error["param"]) == ("invalid_session_id", where)
    assert "is empty; send a session id, or leave it out" in error["message"]
    assert vllm.requests == []


@pytest.mark.parametrize(
    ("name", "code"),
    [("X-Tenant", "invalid_tenant"), ("Idempotency-Key", "invalid_idempotency_key")],
)
@pytest.mark.parametrize("value", [""])  # (" " is "" on the wire: HTTP strips it)
def test_an_empty_tenant_or_idempotency_key_is_a_400_not_the_default(
    gateway: str, vllm: FakeVLLM, stored: Stored, name: str, code: str, value: str
) -> None:
    """(an empty X-Tenant took the default tenant's sessions, and an empty Idempotency-Key
    was ignored: a retry the client believed safe stored the turn twice)"""
    response = chat(gateway, "hi", headers={name: value})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["code"], error["param"]) == (code, name)
    assert (
        f"{name} is empty; send a" in error["message"]
        and "leave the header out" in error["message"]
    )
    assert vllm.requests == [] and stored("s1") == []


def test_tenants_are_separate(gateway: str, stored: Stored) -> None:
    chat(gateway, "for acme", headers={"X-Tenant": "acme"})
    chat(gateway, "for globex", headers={"X-Tenant": "globex"})
    assert stored("s1", "acme")[0]["content"] == "for acme"
    assert stored("s1", "globex")[0]["content"] == "for globex"
    assert stored("s1") == []


def test_api_keys_choose_the_tenant(
    start_gateway: Callable[..., str], redis_url: str, namespace: str, stored: Stored
) -> None:
    gateway = start_gateway(url=redis_url, namespace=namespace, api_keys={"sk-acme": "acme"})
    assert chat(gateway, "no key").status_code == 401
    wrong = chat(gateway, "bad key", headers={"Authorization": "Bearer sk-nope"})
    assert wrong.status_code == 401 and "sk-nope" not in wrong.text
    ok = chat(
        gateway, "with key", headers={"Authorization": "Bearer sk-acme", "X-Tenant": "globex"}
    )
    assert ok.status_code == 200
    assert stored("s1", "acme")[0]["content"] == "with key"
    assert stored("s1", "globex") == []


@pytest.mark.parametrize(
    ("method", "path", "content", "content_type"),
    [
        ("POST", "/v1/chat/completions", b"not json", "application/json"),
        ("POST", "/v1/chat/completions", b'{"messages": 5}', "application/json"),
        ("POST", "/v1/chat/completions", b"{}", "text/plain"),
        ("POST", "/v1/responses", b"not json", "application/json"),
        ("POST", "/v1/responses", b'{"input": 5}', "application/json"),
        ("GET", "/v1/responses/not-an-id", b"", "application/json"),
    ],
)
def test_without_a_key_a_bad_request_is_a_401_not_a_4xx_about_its_body(
    start_gateway: Callable[..., str],
    redis_url: str,
    namespace: str,
    method: str,
    path: str,
    content: bytes,
    content_type: str,
) -> None:
    # the body was read and judged first: a client with no key was told about its body
    gateway = start_gateway(url=redis_url, namespace=namespace, api_keys={"sk-acme": "acme"})
    response = httpx.request(
        method, gateway + path, content=content, headers={"Content-Type": content_type}, timeout=30
    )
    assert response.status_code == 401, response.text
    assert response.json()["error"]["code"] == "invalid_api_key"


@pytest.mark.parametrize("bad", ["\u2028", "\u2029", "\u200b", "\u202e"])
@pytest.mark.parametrize("where", ["X-Session-Id", "metadata.session_id"])
def test_a_session_id_with_a_separator_or_format_character_is_a_400(
    gateway: str, vllm: FakeVLLM, redis_url: str, namespace: str, bad: str, where: str
) -> None:
    """(U+2028/U+2029 end a line in log readers, U+200B/U+202E make one id look like
    another: such ids were stored as sessions)"""
    session = f"s{bad}1"
    body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    headers: dict[str, Any] = {}
    if where == "X-Session-Id":
        headers[where] = session.encode()
    else:
        body["metadata"] = {"session_id": session}
    url = f"{gateway}/v1/chat/completions"
    response = httpx.post(url, json=body, headers=headers, timeout=30)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["code"], error["param"]) == ("invalid_session_id", where)
    assert f"U+{ord(bad):04X}" in error["message"] and error["message"].isprintable()
    assert vllm.requests == []
    guard = Guard(redis_url, limit=4096, namespace=namespace)
    try:
        assert list(guard.store.list_sessions("")) == []
    finally:
        guard.close()
