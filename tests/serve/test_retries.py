"""Idempotency-Key, and clients that go away mid-stream."""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from ctxguard import Guard

from .test_chat import chat, sse_chunks
from .upstream import FakeVLLM

pytestmark = pytest.mark.redis

Stored = Callable[..., list[dict[str, Any]]]


def wait_until(condition: Callable[[], bool], what: str, seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def audit(redis_url: str, namespace: str, session: str) -> list[dict[str, Any]]:
    guard = Guard(redis_url, limit=4096, namespace=namespace)
    try:
        return guard.store.read_audit(session)
    finally:
        guard.close()


@pytest.mark.parametrize("stream", [False, True])
def test_a_repeated_idempotency_key_returns_the_recorded_reply(
    gateway: str, vllm: FakeVLLM, stored: Stored, stream: bool
) -> None:
    key = {"Idempotency-Key": "req-1"}
    first = chat(gateway, "CALL_TOOL now", stream=stream, headers=key)
    again = chat(gateway, "CALL_TOOL now", stream=stream, headers=key)
    assert first.status_code == again.status_code == 200
    assert again.headers["idempotent-replayed"] == "true"
    assert len(vllm.requests) == 1
    history = stored("s1")
    assert [m["role"] for m in history] == ["user", "assistant"]
    if stream:
        calls = [
            c["choices"][0]["delta"]["tool_calls"]
            for c in sse_chunks(again)
            if c["choices"] and c["choices"][0]["delta"].get("tool_calls")
        ]
        assert calls[0][0]["function"]["arguments"] == '{"city": "Paris"}'
    else:
        message = again.json()["choices"][0]["message"]
        assert message["tool_calls"] == first.json()["choices"][0]["message"]["tool_calls"]
    # a new key is a new turn
    assert chat(gateway, "CALL_TOOL now", headers={"Idempotency-Key": "req-2"}).status_code == 200
    assert len(vllm.requests) == 2
    assert len(stored("s1")) == 4


def test_a_retry_while_the_first_is_in_flight_waits_for_it(
    gateway: str, vllm: FakeVLLM, stored: Stored
) -> None:
    vllm.slow_seconds = 1.0
    key = {"Idempotency-Key": "slow-1"}
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        first = pool.submit(chat, gateway, "SLOW please", headers=key)
        wait_until(lambda: len(vllm.requests) == 1, "the first request upstream")
        second = pool.submit(chat, gateway, "SLOW please", headers=key)
        answers = [first.result(), second.result()]
    assert [a.status_code for a in answers] == [200, 200]
    assert len(vllm.requests) == 1
    assert answers[1].json()["choices"][0]["message"]["content"] == "echo: SLOW please"
    assert [m["content"] for m in stored("s1")] == ["SLOW please", "echo: SLOW please"]


@pytest.mark.parametrize("stream", [False, True])
def test_a_key_reused_with_other_messages_is_a_422_and_stores_nothing(
    gateway: str, vllm: FakeVLLM, stored: Stored, stream: bool
) -> None:
    """(it made a second model call and stored a second turn under the same key)"""
    key = {"Idempotency-Key": "reused"}
    assert chat(gateway, "first body", stream=stream, headers=key).status_code == 200
    other = chat(gateway, "another body", stream=stream, headers=key)
    assert other.status_code == 422, other.text
    error = other.json()["error"]
    assert (error["code"], error["param"]) == ("idempotency_key_reused", "Idempotency-Key")
    assert len(vllm.requests) == 1
    assert [m["content"] for m in stored("s1")] == ["first body", "echo: first body"]
    again = chat(gateway, "first body", stream=stream, headers=key)  # the same body replays
    assert again.headers["idempotent-replayed"] == "true"
    response = httpx.post(
        gateway + "/v1/responses",
        json={"model": "m", "input": "third body", "conversation": "s1"},
        headers=key,
        timeout=30,
    )
    assert response.status_code == 422 and len(vllm.requests) == 1


def test_an_idempotency_key_after_a_failure_calls_the_model_again(
    gateway: str, vllm: FakeVLLM, stored: Stored
) -> None:
    key = {"Idempotency-Key": "k"}
    vllm.fail_status = 503
    assert chat(gateway, "hi", headers=key).status_code == 502
    vllm.fail_status = None
    assert chat(gateway, "hi", headers=key).status_code == 200
    assert [m["content"] for m in stored("s1")] == ["hi", "echo: hi"]


def test_a_client_that_disconnects_mid_stream(
    gateway: str, vllm: FakeVLLM, stored: Stored, redis_url: str, namespace: str
) -> None:
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "STALL here"}]}
    with (
        httpx.Client(timeout=30) as client,
        client.stream(
            "POST", gateway + "/v1/chat/completions", json=body, headers={"X-Session-Id": "s1"}
        ) as response,
    ):
        assert response.status_code == 200
        lines = response.iter_lines()
        first = next(line for line in lines if line.startswith("data: "))
        assert "assistant" in first
        assert vllm.stall_started.wait(20)
    # leaving the block closed the connection: the upstream request is cancelled ...
    wait_until(lambda: vllm.cancelled == 1, "the upstream request to be cancelled")
    # ... and the partial reply is in the audit trail, not in the history
    wait_until(
        lambda: any(r.get("kind") == "partial_reply" for r in audit(redis_url, namespace, "s1")),
        "the partial reply record",
    )
    partial = next(r for r in audit(redis_url, namespace, "s1") if r["kind"] == "partial_reply")
    assert partial["reason"] == "client_disconnected"
    assert partial["content"] == "echo:"
    assert [m["content"] for m in stored("s1")] == ["STALL here"]
    # the client retries: the message is not stored twice
    vllm.stall_enabled = False
    retry = chat(gateway, "STALL here", stream=True)
    assert retry.status_code == 200
    assert [m["content"] for m in stored("s1")] == ["STALL here", "echo: STALL here"]
    assert [m["content"] for m in vllm.requests[-1]["messages"]] == ["STALL here"]


def test_an_upstream_that_dies_mid_stream_is_recorded_as_partial(
    start_gateway: Callable[..., str],
    redis_url: str,
    namespace: str,
    vllm: FakeVLLM,
    stored: Stored,
) -> None:
    gateway = start_gateway(url=redis_url, namespace=namespace, upstream_timeout=0.5)
    response = chat(gateway, "STALL again", stream=True)
    assert response.status_code == 200
    chunks = sse_chunks(response)
    assert chunks[-1]["error"]["code"] == "upstream_timeout"
    assert "(no answer in time)" in chunks[-1]["error"]["message"]  # words, not ReadTimeout
    records = audit(redis_url, namespace, "s1")
    partial = [r for r in records if r.get("kind") == "partial_reply"]
    assert [p["reason"] for p in partial] == ["upstream_timeout"]
    assert [m["content"] for m in stored("s1")] == ["STALL again"]


def ended_with_error(response: httpx.Response, contents: list[str]) -> dict[str, Any]:
    """The error event a stream that did not finish ends with (no [DONE]), after the
    chunks of ``contents``."""
    assert response.status_code == 200
    assert "[DONE]" not in response.text
    chunks = sse_chunks(response)
    assert [c["choices"][0]["delta"].get("content") for c in chunks[:-1]] == contents
    error: dict[str, Any] = chunks[-1]["error"]
    return error


def partials(redis_url: str, namespace: str) -> list[tuple[str, str]]:
    """(reason, content) of each partial_reply record of session s1."""
    records = audit(redis_url, namespace, "s1")
    return [(r["reason"], r["content"]) for r in records if r.get("kind") == "partial_reply"]


def test_an_upstream_that_ends_without_finishing_is_recorded_as_partial(
    gateway: str, redis_url: str, namespace: str, stored: Stored
) -> None:
    # a clean end of the stream with no finish_reason and no [DONE]: not a whole reply,
    # and the client is told so (a stream that just stops reads as a whole answer)
    error = ended_with_error(chat(gateway, "CUT here", stream=True), ["", "echo:"])
    assert error["code"] == "upstream_ended"
    assert "ended the stream before the reply finished" in error["message"]
    assert partials(redis_url, namespace) == [("upstream_ended", "echo:")]
    assert [m["content"] for m in stored("s1")] == ["CUT here"]


@pytest.mark.parametrize("shape", ["ERRSTREAM", "ERROLDSTREAM"])
def test_an_error_event_mid_stream_is_not_a_reply(
    start_gateway: Callable[..., str],
    redis_url: str,
    namespace: str,
    vllm: FakeVLLM,
    stored: Stored,
    shape: str,
) -> None:
    """vLLM reports a failure after the stream started as an error event, then [DONE]:
    (the partial text was stored as the reply, the client got [DONE], and a retry under
    the same Idempotency-Key replayed the partial text as a success)"""
    gateway = start_gateway(url=redis_url, namespace=namespace, upstream_api_key="sk-up-secret")
    key = {"Idempotency-Key": "k-err"}
    for attempt in (1, 2):
        response = chat(gateway, f"{shape} please", stream=True, headers=key)
        assert "idempotent-replayed" not in response.headers
        assert "sk-up-secret" not in response.text
        error = ended_with_error(response, ["", "echo:"])
        assert error["code"] == "upstream_error"
        assert "failed mid-stream: CUDA out of memory (request had Bearer ***)" in error["message"]
        assert len(vllm.requests) == attempt  # the retry asks the model again
        assert [m["content"] for m in stored("s1")] == [f"{shape} please"]
    assert partials(redis_url, namespace) == [("upstream_error", "echo:")] * 2


def test_a_streaming_request_answered_without_an_event_stream(
    gateway: str, redis_url: str, namespace: str, stored: Stored
) -> None:
    """(the JSON body went on into the event stream, and the stream just stopped)"""
    response = chat(gateway, "JSONSTREAM here", stream=True)
    assert "chat.completion" not in response.text
    error = ended_with_error(response, [])
    assert error["code"] == "upstream_ended"
    assert "answered with no event stream" in error["message"]
    assert partials(redis_url, namespace) == [("upstream_ended", "")]
    assert [m["content"] for m in stored("s1")] == ["JSONSTREAM here"]
