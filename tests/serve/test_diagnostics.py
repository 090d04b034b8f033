"""The gateway's diagnostics speak the request's terms: no Python class name
(``ConnectError``, ``RuntimeError``, ``TokenizerError`` ...) in a body (the gateway's log
names it), ``/v1/responses`` errors by ``input[i]`` paths, and no id the gateway made for
a message (``gw-...``), which the client never saw."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from faults.servers import free_port

from .test_chat import chat
from .upstream import FakeVLLM

pytestmark = pytest.mark.redis

# a Python class name as Python, redis-py and httpx spell theirs
CLASS_NAME = re.compile(r"\b[A-Z][a-z]+(?:[A-Z][a-z]*)*(?:Error|Exception|Timeout)\b")


def plain(text: str) -> None:
    """Nothing a client cannot act on: no class name, no id it never saw."""
    assert not CLASS_NAME.search(text), text
    assert "gw-" not in text, text


def test_health_says_what_failed_in_words_and_logs_the_class(
    start_gateway: Callable[..., str],
    vllm: FakeVLLM,
    redis_url: str,
    namespace: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    dead_store = f"redis://127.0.0.1:{free_port()}/0"
    dead = f"http://127.0.0.1:{free_port()}"
    gateway = start_gateway(url=dead_store, upstream=vllm.url, counter=f"vllm:{dead}")
    with caplog.at_level(logging.WARNING):
        health = httpx.get(gateway + "/health", timeout=30)
    assert health.status_code == 503
    assert health.json() == {
        "status": "unavailable",
        "store": "unreachable",
        "counter": "unavailable",
    }
    plain(health.text)
    assert "StoreConnectionError" in caplog.text and "TokenizerError" in caplog.text


def test_an_unreachable_upstream_is_a_502_in_words(
    start_gateway: Callable[..., str],
    redis_url: str,
    namespace: str,
    vllm: FakeVLLM,
    caplog: pytest.LogCaptureFixture,
) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    gateway = start_gateway(
        upstream=dead, counter=f"vllm:{vllm.url}", limit=4096, url=redis_url, namespace=namespace
    )
    with caplog.at_level(logging.WARNING):
        for stream in (False, True):
            response = chat(gateway, "anyone there?", stream=stream)
            assert response.status_code == 502
            error = response.json()["error"]
            assert error["code"] == "upstream_unavailable"
            assert "refused or could not be made" in error["message"]
            plain(response.text)
    assert "ConnectError" in caplog.text


def responses(gateway: str, items: list[dict[str, Any]]) -> dict[str, Any]:
    body = {"model": "m", "input": items}
    response = httpx.post(gateway + "/v1/responses", json=body, timeout=30)
    assert response.status_code == 400, response.text
    plain(response.text)
    assert "messages" not in response.text and "tool_call" not in response.text
    error: dict[str, Any] = response.json()["error"]
    return error


CALL = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}
OUTPUT = {"type": "function_call_output", "call_id": "c1", "output": "sunny"}


@pytest.mark.parametrize(
    ("items", "param", "said"),
    [
        ([{**CALL, "arguments": "not json"}, OUTPUT], "input[0].arguments", "JSON"),
        ([{**CALL, "arguments": {"a": 1}}, OUTPUT], "input[0].arguments", "an object"),
        ([{**CALL, "name": ""}, OUTPUT], "input[0].name", "non-empty"),
        ([{**CALL, "call_id": 7}, OUTPUT], "input[0].call_id", "a number"),
        ([CALL, {**OUTPUT, "call_id": None}], "input[1].call_id", "null"),
        ([{"role": "user", "content": "hi"}, CALL], "input[1]", "no function_call_output"),
        ([CALL, OUTPUT, OUTPUT], "input[2].call_id", "input[2] and input[1] both answer"),
    ],
    ids=["not-json", "object", "no-name", "call-id", "output-call-id", "pending", "twice"],
)
def test_responses_function_call_errors_name_input_paths(
    gateway: str, vllm: FakeVLLM, items: list[dict[str, Any]], param: str, said: str
) -> None:
    error = responses(gateway, items)
    assert error["param"] == param and said in error["message"], error
    assert vllm.requests == []


def test_an_error_naming_a_message_names_its_place_not_a_made_id(
    gateway: str, vllm: FakeVLLM
) -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    messages = [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "c1", "content": "rainy"},
    ]
    body = {"model": "m", "messages": messages}
    response = httpx.post(
        gateway + "/v1/chat/completions", json=body, headers={"X-Session-Id": "s1"}, timeout=30
    )
    assert response.status_code == 400, response.text
    plain(response.text)
    assert "messages[2] and messages[3]" in response.json()["error"]["message"]
    assert vllm.requests == []


def test_a_guard_error_naming_a_message_the_gateway_named_reads_by_its_place() -> None:
    """(it read "message messages[0] (user) is over max_message_tokens")"""
    from ctxguard.errors import MessageTooLongError
    from ctxguard.serve.openai_errors import from_ctxguard

    made = "gw-" + "a" * 20
    exc = MessageTooLongError(
        f"message {made!r} (user) is over max_message_tokens", needed=9, limit=4, reserved=0
    )
    error = from_ctxguard(exc, names={made: "messages[3]"})
    text = error.message
    plain(text)
    assert "messages[3] (user) is over max_message_tokens" in text
    assert "message messages[3]" not in text


def test_health_answers_within_its_deadline_when_the_store_never_answers(
    start_gateway: Callable[..., str],
    vllm: FakeVLLM,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # a store that accepts and never answers held /health for the read timeout times the
    # retries (~40 s by default), past any liveness probe's wait
    from faults.fake_servers import fake_server

    from ctxguard.serve import app

    monkeypatch.setattr(app, "HEALTH_SECONDS", 0.5)
    with fake_server("handshake_then_silent") as silent:
        gateway = start_gateway(url=silent.url, upstream=vllm.url, limit=4096)
        with caplog.at_level(logging.WARNING):
            health = httpx.get(gateway + "/health", timeout=60)
    assert health.status_code == 503
    assert health.json()["store"] == "not answering"
    plain(health.text)
    assert "did not answer within 0.5s" in caplog.text
