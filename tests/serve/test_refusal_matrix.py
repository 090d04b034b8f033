"""Every refused gateway request changes nothing stored on Redis but one ``refused`` audit
record (tests/store_diff.py compares every key of the namespace, leases included): on
/v1/chat/completions and /v1/responses with a conversation, with and without an
Idempotency-Key, streamed or not. (A request the upstream refuses, 400/422..., is taken
back: tests/serve/test_upstream_refusal.py; after a transient 4xx, 429, its user message
stays stored once.)"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest

from ctxguard.stores import open_store
from tests import store_diff

from .conftest import Start
from .upstream import FakeVLLM

pytestmark = pytest.mark.redis

CHAT, RESPONSES = "/v1/chat/completions", "/v1/responses"
CALLS = [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]

# name -> (the new messages, extra body fields)
CLASSES: dict[str, tuple[list[Any], dict[str, Any]]] = {
    "bad-role": ([{"role": "bogus", "content": "x"}], {}),
    "reused-id": ([{"role": "user", "content": "changed", "id": "c-1"}], {}),
    "reused-id-in-batch": (
        [
            {"role": "user", "content": "a", "id": "d"},
            {"role": "user", "content": "b", "id": "d"},
        ],
        {},
    ),
    "non-text-media": (
        [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "AA"}}]}],
        {},
    ),
    "huge-int": ([{"role": "user", "content": "x", "n": 10**5000}], {}),
    "orphan-tool-result": ([{"role": "tool", "tool_call_id": "nope", "content": "42"}], {}),
    "orphan-call-output": ([{"type": "function_call_output", "call_id": "no", "output": "4"}], {}),
    "unanswered-call": ([{"role": "assistant", "content": None, "tool_calls": CALLS}], {}),
    "over-budget": ([{"role": "user", "content": "word " * 6000}], {}),
    "bad-max-tokens": ([{"role": "user", "content": "hi"}], {"max_tokens": 10**20}),
}


CHAT_ONLY = {"reused-id", "reused-id-in-batch", "orphan-tool-result", "unanswered-call"}
RESPONSES_ONLY = {"orphan-call-output"}  # (the Responses API's input items carry no ids)


@contextmanager
def _seeded(
    start_gateway: Start, redis_url: str, namespace: str, path: str
) -> Iterator[tuple[str, Any]]:
    """A gateway on ``redis_url`` whose session ``s1`` holds one done turn (its request
    sent with Idempotency-Key "seed"), and a store on the same namespace (closed after)."""
    gateway = start_gateway(url=redis_url, namespace=namespace, max_tokens=256)
    seed = _body(path, [{"role": "user", "content": "hello", "id": "c-1"}], {}, False)
    assert _post(gateway, path, seed, "seed").status_code == 200
    store = open_store(redis_url, namespace=namespace)
    try:
        yield gateway, store
    finally:
        store.close()


def _settled(store: Any, url: str) -> store_diff.Snapshot:
    """The namespace once the leases of requests answered are released (the gateway gives
    a lease back after it answers): a lease still held after that is in the snapshot."""
    snap = store_diff.take(store, url)
    for _ in range(200):
        if not any(":lease:" in k for k in snap):
            break
        time.sleep(0.02)
        snap = store_diff.take(store, url)
    return snap


def _pairs() -> list[Any]:
    return [
        pytest.param(name, path, id=f"{name}-{label}")
        for name in CLASSES
        for path, label in ((CHAT, "chat"), (RESPONSES, "responses"))
        if not (path == CHAT and name in RESPONSES_ONLY)
        and not (path == RESPONSES and name in CHAT_ONLY)
    ]


def _body(path: str, messages: list[Any], extra: dict[str, Any], stream: bool) -> Any:
    if path == CHAT:
        return {"model": "m", "messages": messages, "stream": stream, **extra}
    extra = {("max_output_tokens" if k == "max_tokens" else k): v for k, v in extra.items()}
    return {"model": "m", "input": messages, "conversation": "s1", "stream": stream, **extra}


def _post(gateway: str, path: str, body: Any, key: str | None) -> httpx.Response:
    headers = {"X-Session-Id": "s1"} if path == CHAT else {}
    if key:
        headers["Idempotency-Key"] = key
    content = body if isinstance(body, bytes) else None
    if content is None:
        import json

        try:
            content = json.dumps(body).encode()
        except ValueError:  # (an int past str()'s limit: write it out by hand)
            content = json.dumps(body, default=str).encode()
    headers["Content-Type"] = "application/json"
    return httpx.post(gateway + path, content=content, headers=headers, timeout=30)


def _huge(body: Any) -> bytes:
    import json

    text = json.dumps(body).replace('"n": "HUGE"', '"n": ' + "9" * 5000)
    return text.encode()


@pytest.mark.parametrize("key", [None, "k-1"], ids=["no-key", "key"])
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize(("name", "path"), _pairs())
def test_a_refused_request_stores_nothing(
    start_gateway: Start,
    vllm: FakeVLLM,
    redis_url: str,
    namespace: str,
    name: str,
    path: str,
    stream: bool,
    key: str | None,
) -> None:
    with _seeded(start_gateway, redis_url, namespace, path) as (gateway, store):
        before = _settled(store, redis_url)
        sent = len(vllm.requests)
        messages, extra = CLASSES[name]
        if name == "huge-int":
            body: Any = _huge(
                _body(path, [{"role": "user", "content": "x", "n": "HUGE"}], {}, stream)
            )
        else:
            body = _body(path, messages, extra, stream)
        answer = _post(gateway, path, body, key)
        assert 400 <= answer.status_code < 500, answer.text
        assert len(vllm.requests) == sent  # nothing went upstream
        store_diff.assert_refused_only(before, _settled(store, redis_url), refused=True)
        if key:  # the same key again: refused again, still nothing stored but records
            again = _post(gateway, path, body, key)
            assert 400 <= again.status_code < 500, again.text
            assert len(vllm.requests) == sent


@pytest.mark.parametrize("path", [CHAT, RESPONSES], ids=["chat", "responses"])
def test_a_key_reused_with_another_body_stores_nothing(
    start_gateway: Start, vllm: FakeVLLM, redis_url: str, namespace: str, path: str
) -> None:
    """An Idempotency-Key a done request used, sent with another body: a 422, nothing
    sent, nothing stored (docs: serve/idempotency.py)."""
    with _seeded(start_gateway, redis_url, namespace, path) as (gateway, store):
        before = _settled(store, redis_url)
        sent = len(vllm.requests)
        other = _body(path, [{"role": "user", "content": "other"}], {}, False)
        answer = _post(gateway, path, other, "seed")
        assert answer.status_code == 422, answer.text
        assert len(vllm.requests) == sent
        store_diff.assert_refused_only(before, _settled(store, redis_url), refused=True)


@pytest.mark.parametrize("path", [CHAT, RESPONSES], ids=["chat", "responses"])
def test_a_transient_upstream_refusal_stores_the_new_message_only(
    start_gateway: Start, vllm: FakeVLLM, redis_url: str, namespace: str, path: str
) -> None:
    """The upstream answers 429 (busy: a retry may pass): the new user message stays
    stored once (the request was sent; a retry stores nothing twice), with its request
    record; no reply, no lease left behind."""
    with _seeded(start_gateway, redis_url, namespace, path) as (gateway, store):
        before = [s.message.role for s in store.read("s1")]
        vllm.fail_status = 429
        try:
            answer = _post(
                gateway, path, _body(path, [{"role": "user", "content": "next"}], {}, False), "k"
            )
        finally:
            vllm.fail_status = None
        assert 400 <= answer.status_code < 500, answer.text
        after = _settled(store, redis_url)
        assert not any(":lease:" in k for k in after)
        assert [s.message.role for s in store.read("s1")] == [*before, "user"]
