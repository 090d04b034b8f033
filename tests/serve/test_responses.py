"""/v1/responses backed by the Redis session, through the real openai SDK."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest

from .upstream import MODEL, FakeVLLM

pytestmark = pytest.mark.redis

Stored = Callable[..., list[dict[str, Any]]]


@pytest.fixture
def client(gateway: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway + "/v1", api_key="unused", max_retries=0)


def test_previous_response_id_continues_the_stored_session(
    client: openai.OpenAI, vllm: FakeVLLM
) -> None:
    first = client.responses.create(model=MODEL, input="hello", instructions="Be brief.")
    assert first.output_text == "echo: hello"
    assert first.id.startswith("resp_")
    second = client.responses.create(
        model=MODEL, input="again", instructions="Be brief.", previous_response_id=first.id
    )
    assert second.output_text == "echo: again"
    sent = vllm.requests[-1]["messages"]
    assert [(m["role"], m["content"]) for m in sent] == [
        ("system", "Be brief."),  # stored once, pinned
        ("user", "hello"),
        ("assistant", "echo: hello"),
        ("user", "again"),
    ]
    fetched = client.responses.retrieve(second.id)
    assert fetched.output_text == "echo: again"
    assert fetched.previous_response_id == first.id
    assert fetched.usage is not None and fetched.usage.output_tokens == 3


def test_conversation_is_a_session(gateway: str, client: openai.OpenAI, stored: Stored) -> None:
    for text in ("one", "two"):
        client.responses.create(model=MODEL, input=text, extra_body={"conversation": "conv-1"})
    assert [m["content"] for m in stored("conv-1")] == ["one", "echo: one", "two", "echo: two"]


def test_function_calls_round_trip(client: openai.OpenAI, vllm: FakeVLLM) -> None:
    tools: Any = [
        {"type": "function", "name": "get_weather", "parameters": {"type": "object"}},
    ]
    first = client.responses.create(model=MODEL, input="CALL_TOOL", tools=tools)
    call = next(item for item in first.output if item.type == "function_call")
    assert (call.name, call.call_id) == ("get_weather", "call_1")
    assert vllm.requests[-1]["tools"][0]["function"]["name"] == "get_weather"
    second = client.responses.create(
        model=MODEL,
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}],
        tools=tools,
    )
    assert second.output_text == "echo: sunny"
    roles = [m["role"] for m in vllm.requests[-1]["messages"]]
    assert roles == ["user", "assistant", "tool"]


def test_store_false_keeps_nothing(
    gateway: str, client: openai.OpenAI, redis_url: str, namespace: str
) -> None:
    reply = client.responses.create(model=MODEL, input="forget me", store=False)
    assert reply.output_text == "echo: forget me"
    missing = httpx.get(f"{gateway}/v1/responses/{reply.id}", timeout=30)
    assert missing.status_code in (400, 404)
    from ctxguard import open_store

    store = open_store(redis_url, namespace=namespace)
    try:
        assert list(store.list_sessions()) == []
    finally:
        store.close()


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": 5}, "input"),
        ({"input": [{"type": "image", "url": "x"}]}, "input"),
        ({"input": "x", "stream": True}, "stream"),
        ({"input": "x", "truncation": "disabled"}, "truncation"),
        ({"input": "x", "previous_response_id": "resp_nope"}, "previous_response_id"),
        ({"input": "x", "previous_response_id": "resp_YQ.x", "conversation": "c"}, "conversation"),
        ({"input": "x", "tools": [{"type": "web_search"}]}, "tools"),
    ],
)
def test_unsupported_or_bad_requests_are_400s(
    gateway: str, vllm: FakeVLLM, body: dict[str, Any], param: str
) -> None:
    response = httpx.post(f"{gateway}/v1/responses", json={"model": MODEL, **body}, timeout=30)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == param
    assert vllm.requests == []


def test_over_the_limit_is_context_length_exceeded(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model=MODEL, input="word " * 5000)
    assert caught.value.code == "context_length_exceeded"
