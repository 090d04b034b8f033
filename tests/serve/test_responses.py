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


def test_a_previous_response_id_that_names_nothing_stored_is_a_404_and_stores_nothing(
    start_gateway: Callable[..., str],
    redis_url: str,
    namespace: str,
    vllm: FakeVLLM,
    stored: Stored,
) -> None:
    """(an id naming a session that never existed made that session and stored the turn)"""
    # a window of 2: an older reply is looked for past the newest messages too
    gateway = start_gateway(url=redis_url, namespace=namespace, idempotency_window=2)
    client = openai.OpenAI(base_url=gateway + "/v1", api_key="unused", max_retries=0)
    first = client.responses.create(model=MODEL, input="hello")
    session = first.id[5:].partition(".")[0]
    user_id = stored_ids(stored, first.id)[0]
    for previous in (
        "resp_bm9uZXhpc3Q.gw-r-1",  # session "nonexist", never made
        f"resp_{session}.gw-r-nothing",  # the session, but no such reply
        f"resp_{session}.{user_id}",  # a stored message, but no response: the user's
    ):
        response = httpx.post(
            f"{gateway}/v1/responses",
            json={"model": MODEL, "input": "x", "previous_response_id": previous},
            timeout=30,
        )
        assert response.status_code == 404, response.text
        error = response.json()["error"]
        assert (error["code"], error["param"]) == (
            "previous_response_not_found",
            "previous_response_id",
        )
    assert stored("nonexist") == []
    assert len(vllm.requests) == 1
    assert [m["content"] for m in stored(_session(first.id))] == ["hello", "echo: hello"]
    for turn in range(3):  # the first reply falls out of the newest 2 after one of these
        client.responses.create(model=MODEL, input=f"more {turn}", previous_response_id=first.id)
    assert len(vllm.requests) == 4


def test_retrieving_a_stored_message_that_is_no_response_is_a_404(
    gateway: str, client: openai.OpenAI, stored: Stored
) -> None:
    """(GET /v1/responses/<session>.<id of the user's message> answered the user's own
    text as an assistant response)"""
    first = client.responses.create(model=MODEL, input="my own words")
    session = first.id[5:].partition(".")[0]
    user_id, reply_id = stored_ids(stored, first.id)
    assert (
        client.responses.retrieve(f"resp_{session}.{reply_id}").output_text == "echo: my own words"
    )
    response = httpx.get(f"{gateway}/v1/responses/resp_{session}.{user_id}", timeout=30)
    assert response.status_code == 404, response.text
    assert response.json()["error"]["code"] == "not_found"
    assert "my own words" not in response.text


def _session(response_id: str) -> str:
    import base64

    encoded = response_id[5:].partition(".")[0]
    return base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode()


def stored_ids(stored: Stored, response_id: str) -> list[str]:
    return [m["id"] for m in stored(_session(response_id))]


def test_over_the_limit_is_context_length_exceeded(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model=MODEL, input="word " * 5000)
    assert caught.value.code == "context_length_exceeded"


@pytest.mark.parametrize(
    ("body", "param", "said"),
    [
        ({"input": "forget me", "store": False}, "store", "store: false with conversation"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_text", "text": {"a": 1}}]}]},
            "input[0].content[0].text",
            "must be a string, got an object",
        ),
        (
            {"input": [{"role": "user", "content": [{"type": "input_text"}]}]},
            "input[0].content[0].text",
            "must be a string, got null",
        ),
    ],
    ids=["store-false", "text-object", "text-missing"],
)
def test_a_conversation_request_refused_stores_nothing_and_sends_nothing(
    gateway: str,
    vllm: FakeVLLM,
    snapshot: Callable[[str], Any],
    body: dict[str, Any],
    param: str,
    said: str,
) -> None:
    # store: false was stored in the conversation anyway; a text part's object was
    # stored and sent as its Python repr
    sent = {"model": MODEL, "conversation": "conv-r", **body}
    response = httpx.post(f"{gateway}/v1/responses", json=sent, timeout=30)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param
    assert said in error["message"] and "\n" not in error["message"]
    assert vllm.requests == []
    assert snapshot("conv-r") == ([], None, [])


SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}}


@pytest.mark.parametrize(
    ("text_format", "sent"),
    [
        (
            {"type": "json_schema", "name": "place", "schema": SCHEMA, "strict": True},
            {
                "type": "json_schema",
                "json_schema": {"name": "place", "schema": SCHEMA, "strict": True},
            },
        ),
        ({"type": "json_object"}, {"type": "json_object"}),
        ({"type": "text"}, None),
    ],
)
def test_text_format_is_sent_as_the_response_format(
    client: openai.OpenAI, vllm: FakeVLLM, text_format: Any, sent: Any
) -> None:
    """(it was dropped: a client asking for JSON got the model's free text, and a 200)"""
    client.responses.create(model=MODEL, input="where?", text={"format": text_format})
    assert vllm.requests[-1].get("response_format") == sent


@pytest.mark.parametrize(
    "text",
    [
        "json",
        {"format": {"type": "xml"}},
        {"format": "json_object"},
        {"format": {"type": "json_schema", "schema": SCHEMA}},  # no name
        {"format": {"type": "json_schema", "name": "place", "schema": "{}"}},
    ],
)
def test_a_bad_text_format_is_a_400_and_nothing_is_stored_or_sent(
    gateway: str, vllm: FakeVLLM, stored: Stored, text: Any
) -> None:
    body = {"model": MODEL, "input": "where?", "text": text, "conversation": "fmt"}
    response = httpx.post(gateway + "/v1/responses", json=body, timeout=30)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] in ("text", "text.format")
    assert "\n" not in error["message"]
    assert vllm.requests == [] and stored("fmt") == []
