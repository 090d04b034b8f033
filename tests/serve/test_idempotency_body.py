"""An Idempotency-Key names one request body: the same body (however its JSON is
formatted) replays the recorded reply; another body is a 422 ``idempotency_key_reused``,
nothing stored or sent, whether the first request is still in flight or done.

(It replayed the first request's reply to the same messages sent with another model,
temperature, max_tokens or tools, and a request with other messages waited for the
first one to finish before it was told.)
"""

from __future__ import annotations

import concurrent.futures
import json
import threading
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from ctxguard.serve.idempotency import body_digest
from tests.conftest import private_memory_url

from .test_chat import chat
from .test_retries import audit, wait_until
from .upstream import FakeVLLM

pytestmark = pytest.mark.redis

Stored = Callable[..., list[dict[str, Any]]]
KEY = {"Idempotency-Key": "one-request"}
TOOLS = [
    {
        "type": "function",
        "function": {"name": "weather", "parameters": {"type": "object", "properties": {}}},
    }
]
OTHER_BODIES: dict[str, dict[str, Any]] = {
    "messages": {"messages": [{"role": "user", "content": "another question"}]},
    "model": {"model": "another-model"},
    "temperature": {"temperature": 0.5},
    "max_tokens": {"max_tokens": 17},
    "tools": {"tools": TOOLS},
}


def post_raw(gateway: str, path: str, text: str, headers: dict[str, str]) -> httpx.Response:
    sent = {"Content-Type": "application/json", "X-Session-Id": "s1", **headers}
    return httpx.post(gateway + path, content=text.encode(), headers=sent, timeout=30)


def assert_reused(response: httpx.Response) -> None:
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["code"], error["param"]) == ("idempotency_key_reused", "Idempotency-Key")
    assert "\n" not in error["message"] and "new key" in error["message"]


def test_the_digest_ignores_formatting_and_delivery_but_not_the_route() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hé"}], "temperature": 0}
    reordered = json.loads(json.dumps(dict(reversed(body.items())), indent=3))
    digest = body_digest("/v1/chat/completions", body)
    assert body_digest("/v1/chat/completions", reordered) == digest
    streamed = {**body, "stream": True, "stream_options": {"include_usage": True}}
    assert body_digest("/v1/chat/completions", streamed) == digest
    assert body_digest("/v1/responses", body) != digest
    assert body_digest("/v1/chat/completions", {**body, "temperature": 1}) != digest


@pytest.mark.parametrize("stream", [False, True])
def test_the_same_body_with_other_key_order_and_spacing_replays(
    gateway: str, vllm: FakeVLLM, stored: Stored, stream: bool
) -> None:
    first = chat(gateway, "hello", stream=stream, headers=KEY, temperature=0.2)
    assert first.status_code == 200, first.text
    path = "/v1/chat/completions"
    text = (
        f'{{ "temperature" : 0.2 ,\n  "stream": {json.dumps(stream)},'
        '  "messages":[ {"content":"hello",   "role":"user"} ],\t"model":"m" }'
    )
    again = post_raw(gateway, path, text, KEY)
    assert again.status_code == 200, again.text
    assert again.headers["idempotent-replayed"] == "true"
    # a stream retried as a plain request (or the reverse) is the same request
    other_shape = chat(gateway, "hello", stream=not stream, headers=KEY, temperature=0.2)
    assert other_shape.headers["idempotent-replayed"] == "true"
    assert len(vllm.requests) == 1
    assert [m["content"] for m in stored("s1")] == ["hello", "echo: hello"]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("change", sorted(OTHER_BODIES))
def test_the_key_with_another_body_is_a_422_and_changes_nothing(
    gateway: str,
    vllm: FakeVLLM,
    stored: Stored,
    redis_url: str,
    namespace: str,
    change: str,
    stream: bool,
) -> None:
    assert chat(gateway, "hello", stream=stream, headers=KEY).status_code == 200
    before = (stored("s1"), audit(redis_url, namespace, "s1"))
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "hello"}],
        "stream": stream,
        **OTHER_BODIES[change],
    }
    sent = {"X-Session-Id": "s1", **KEY}
    other = httpx.post(gateway + "/v1/chat/completions", json=body, headers=sent, timeout=30)
    assert_reused(other)
    assert len(vllm.requests) == 1
    assert (stored("s1"), audit(redis_url, namespace, "s1")) == before
    # the first body still replays, and a new key is a new request
    assert chat(gateway, "hello", stream=stream, headers=KEY).headers["idempotent-replayed"]
    fresh = {"X-Session-Id": "s1", "Idempotency-Key": "a-new-one"}
    new = httpx.post(gateway + "/v1/chat/completions", json=body, headers=fresh, timeout=30)
    assert new.status_code == 200 and len(vllm.requests) == 2


@pytest.mark.parametrize("change", ["messages", "temperature"])
def test_another_body_while_the_first_is_in_flight_is_refused_at_once(
    gateway: str, vllm: FakeVLLM, stored: Stored, change: str
) -> None:
    vllm.hold = threading.Event()  # the first request stays upstream until let go
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        first = pool.submit(chat, gateway, "SLOW please", headers=KEY)
        wait_until(lambda: len(vllm.requests) == 1, "the first request upstream")
        body = {
            "model": "m",
            "messages": [{"role": "user", "content": "SLOW please"}],
            **OTHER_BODIES[change],
        }
        sent = {"X-Session-Id": "s1", **KEY}
        other = httpx.post(gateway + "/v1/chat/completions", json=body, headers=sent, timeout=30)
        # told while the first runs (it did wait for the first's reply, then compared)
        assert not first.done()
        assert_reused(other)
        vllm.hold.set()
        assert first.result().status_code == 200
    assert len(vllm.requests) == 1
    assert [m["content"] for m in stored("s1")] == ["SLOW please", "echo: SLOW please"]


def test_responses_the_same_body_replays_and_another_is_a_422(
    gateway: str, vllm: FakeVLLM, stored: Stored
) -> None:
    body = {"model": "m", "input": "hello", "conversation": "s1", "temperature": 0.2}
    first = httpx.post(gateway + "/v1/responses", json=body, headers=KEY, timeout=30)
    assert first.status_code == 200, first.text
    text = json.dumps(dict(reversed(body.items())), indent=2)
    again = post_raw(gateway, "/v1/responses", text, KEY)
    assert again.status_code == 200 and again.json()["id"] == first.json()["id"]
    before = stored("s1")
    other = httpx.post(
        gateway + "/v1/responses", json={**body, "temperature": 0.9}, headers=KEY, timeout=30
    )
    assert_reused(other)
    assert len(vllm.requests) == 1 and stored("s1") == before


def test_an_in_process_store_compares_too(start_gateway: Any, vllm: FakeVLLM) -> None:
    gateway = start_gateway(url=private_memory_url(), max_tokens=256)
    vllm.hold = threading.Event()
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        first = pool.submit(chat, gateway, "SLOW please", headers=KEY)
        wait_until(lambda: len(vllm.requests) == 1, "the first request upstream")
        in_flight = chat(gateway, "SLOW please", headers=KEY, temperature=0.5)
        assert not first.done()
        assert_reused(in_flight)
        vllm.hold.set()
        assert first.result().status_code == 200
    assert_reused(chat(gateway, "SLOW please", headers=KEY, temperature=0.5))
    again = chat(gateway, "SLOW please", headers=KEY)
    assert again.headers["idempotent-replayed"] == "true"
    assert len(vllm.requests) == 1
