"""Requests the gateway must refuse, or take, before anything is stored or forwarded:
``n`` > 1 in a session, a body not declared JSON, an assistant message with nothing in
it, pending tool calls, and the terms its errors speak (the request's fields, never the
Python API's calls, keywords or class names). Each refusal is an OpenAI-shaped 4xx with
one line, and the store is the same before and after."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from ctxguard.errors import StoreConnectionError
from ctxguard.serve.outcomes import reply_not_stored

from .conftest import Start
from .test_chat import chat
from .upstream import FakeVLLM

pytestmark = pytest.mark.redis

CHAT = "/v1/chat/completions"
PYTHON_TERMS = (
    "prepare()",
    "complete()",
    "append()",
    "=...",
    "max_tokens=",
    "GuardConfig",
    "Error:",
    "ToolCall",
    "FunctionCall",
    "TextPart",
    "ImagePart",
    "ImageURL",
    "content.str",
    "tagged-union",
    "got int",
    "got list",
    "got dict",
)


def refused(response: httpx.Response, status: int, code: str | None) -> dict[str, Any]:
    """The OpenAI-shaped error, on one line, in the request's terms."""
    assert response.status_code == status, response.text
    error: dict[str, Any] = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == code, error
    assert error["type"] == "invalid_request_error"
    assert "\n" not in error["message"]
    speaks_http(error["message"])
    return error


def speaks_http(message: str) -> None:
    said = [term for term in PYTHON_TERMS if term in message]
    assert not said, f"{said} in {message!r}"


def post(gateway: str, body: dict[str, Any], session: str | None = "s1", **headers: str) -> Any:
    sent = {**({"X-Session-Id": session} if session else {}), **headers}
    return httpx.post(gateway + CHAT, json=body, headers=sent, timeout=30)


def said(*messages: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": list(messages), **fields}


USER = {"role": "user", "content": "hello"}


# -- n > 1 ----------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_n_over_one_with_a_session_is_a_400_and_nothing_is_stored_or_sent(
    gateway: str, vllm: FakeVLLM, snapshot: Callable[[str], Any], stream: bool
) -> None:
    assert chat(gateway, "first").status_code == 200
    before, sent = snapshot("s1"), len(vllm.requests)
    error = refused(chat(gateway, "again", stream=stream, n=3), 400, "unsupported_parameter")
    assert error["param"] == "n"
    assert "session" in error["message"] and "'n'" in error["message"]
    assert snapshot("s1") == before
    assert len(vllm.requests) == sent


def test_n_over_one_without_a_session_is_forwarded(gateway: str, vllm: FakeVLLM) -> None:
    response = chat(gateway, "hi", session=None, n=2)
    assert response.status_code == 200, response.text
    assert vllm.requests[-1]["n"] == 2


@pytest.mark.parametrize("n", [0, -1, "2", 1.5, True])
def test_an_n_that_is_not_a_positive_integer_is_a_400(gateway: str, n: Any) -> None:
    error = refused(chat(gateway, "hi", session=None, n=n), 400, None)
    assert error["param"] == "n"


@pytest.mark.parametrize("usage", ["no", 1, "true", {}])
def test_an_include_usage_that_is_not_a_boolean_is_a_400_and_nothing_is_stored_or_sent(
    gateway: str, vllm: FakeVLLM, snapshot: Callable[[str], Any], usage: Any
) -> None:
    # "no" was taken as a client asking for usage (truthy), and forwarded for the model
    # server to read as it liked
    body = said(USER, stream=True, stream_options={"include_usage": usage})
    error = refused(post(gateway, body, session="iu"), 400, None)
    assert error["param"] == "stream_options.include_usage"
    assert vllm.requests == []
    assert snapshot("iu") == ([], None, [])


@pytest.mark.parametrize("path", [CHAT, "/v1/responses"])
def test_tools_nested_too_deep_are_named_as_the_tools_and_nothing_is_stored_or_sent(
    gateway: str, vllm: FakeVLLM, snapshot: Callable[[str], Any], path: str
) -> None:
    # the Guard's words named the tools, the answer's param the messages
    deep: Any = "x"
    for _ in range(100):
        deep = {"a": deep}
    function = {"name": "f", "parameters": deep}
    if path == CHAT:
        body = said(USER, tools=[{"type": "function", "function": function}])
    else:
        tools = [{"type": "function", **function}]
        body = {"model": "m", "input": "hi", "conversation": "tl", "tools": tools}
    response = httpx.post(gateway + path, json=body, headers={"X-Session-Id": "tl"}, timeout=30)
    error = refused(response, 400, "invalid_tools")
    assert error["param"] == "tools" and error["message"].startswith("tools ")
    assert vllm.requests == []
    assert snapshot("tl") == ([], None, [])


@pytest.mark.parametrize("path", [CHAT, "/v1/responses"])
@pytest.mark.parametrize(
    "function", [{"parameters": {"type": "object"}}, {"name": ""}, {"name": 5}, None]
)
def test_a_function_tool_without_a_name_is_a_400_and_nothing_is_stored_or_sent(
    gateway: str, vllm: FakeVLLM, snapshot: Callable[[str], Any], path: str, function: Any
) -> None:
    """(it was forwarded, after the turn's messages were stored; the server refuses it)"""
    good = {"name": "f", "parameters": {"type": "object"}}
    if path == CHAT:
        bad = (
            {"type": "function"} if function is None else {"type": "function", "function": function}
        )
        body = said(USER, tools=[{"type": "function", "function": good}, bad])
    else:
        bad = {"type": "function", **(function or {})}
        body = {
            "model": "m",
            "input": "hi",
            "conversation": "tn",
            "tools": [{"type": "function", **good}, bad],
        }
    response = httpx.post(gateway + path, json=body, headers={"X-Session-Id": "tn"}, timeout=30)
    error = refused(response, 400, "invalid_tools")
    assert error["param"] == "tools[1]" and error["message"].startswith("tools[1]: ")
    assert vllm.requests == []
    assert snapshot("tn") == ([], None, [])


@pytest.mark.parametrize("role", ["user", "system", "developer", "assistant"])
def test_content_as_an_empty_array_is_a_400_and_nothing_is_stored_or_sent(
    gateway: str, vllm: FakeVLLM, snapshot: Callable[[str], Any], role: str
) -> None:
    """(it was stored, a turn of nothing in every later request; OpenAI refuses it)"""
    body = said({"role": "system", "content": "s"}, {"role": role, "content": []}, USER)
    error = refused(post(gateway, body), 400, "invalid_message")
    assert error["param"] == "messages[1]" and "empty array" in error["message"]
    assert vllm.requests == []
    assert snapshot("s1") == ([], None, [])


def test_n_of_one_with_a_session_is_a_turn(gateway: str, stored: Any) -> None:
    assert chat(gateway, "hi", n=1).status_code == 200
    assert [m["role"] for m in stored("s1")] == ["user", "assistant"]


# -- Content-Type -----------------------------------------------------------------------

ROUTES = [
    (CHAT, {"model": "m", "messages": [USER]}),
    ("/v1/responses", {"model": "m", "input": "hello"}),
    ("/tokenize", {"model": "m", "prompt": "hello"}),
]


@pytest.mark.parametrize(("path", "body"), ROUTES, ids=["chat", "responses", "tokenize"])
@pytest.mark.parametrize(
    "content_type", ["text/plain", "application/x-www-form-urlencoded", "application/jsonp", None]
)
def test_a_body_not_sent_as_json_is_a_415_on_every_post_route(
    gateway: str,
    vllm: FakeVLLM,
    snapshot: Callable[[str], Any],
    path: str,
    body: dict[str, Any],
    content_type: str | None,
) -> None:
    import json

    headers = {"X-Session-Id": "ct"}
    if content_type is not None:
        headers["Content-Type"] = content_type
    calls = vllm.tokenize_calls
    response = httpx.post(gateway + path, content=json.dumps(body), headers=headers, timeout=30)
    error = refused(response, 415, "unsupported_media_type")
    assert "Content-Type: application/json" in error["message"]
    assert (content_type or "no Content-Type") in error["message"]
    assert error["param"] == "Content-Type"
    assert vllm.requests == [] and vllm.tokenize_calls == calls
    assert snapshot("ct") == ([], None, [])


@pytest.mark.parametrize(("path", "body"), ROUTES, ids=["chat", "responses", "tokenize"])
@pytest.mark.parametrize(
    "content_type", ["application/json; charset=utf-8", "Application/JSON", "application/json"]
)
def test_json_with_parameters_or_in_any_case_is_taken(
    gateway: str, path: str, body: dict[str, Any], content_type: str
) -> None:
    import json

    response = httpx.post(
        gateway + path,
        content=json.dumps(body),
        headers={"Content-Type": content_type},
        timeout=30,
    )
    assert response.status_code == 200, response.text


# -- an assistant message with nothing in it ------------------------------------------------


@pytest.mark.parametrize(
    "empty",
    [
        {"role": "assistant"},
        {"role": "assistant", "content": None},
        {"role": "assistant", "content": None, "tool_calls": []},
        {"role": "assistant", "content": None, "name": "bot"},
    ],
    ids=["bare", "null-content", "no-calls", "only-a-name"],
)
@pytest.mark.parametrize("session", ["s1", None], ids=["session", "stateless"])
def test_an_assistant_message_with_nothing_in_it_is_a_400_and_nothing_is_stored(
    gateway: str,
    vllm: FakeVLLM,
    snapshot: Callable[[str], Any],
    empty: dict[str, Any],
    session: str | None,
) -> None:
    assert chat(gateway, "first").status_code == 200
    before, sent = snapshot("s1"), len(vllm.requests)
    response = post(gateway, said(USER, empty, {"role": "user", "content": "and?"}), session)
    error = refused(response, 400, "invalid_message")
    assert error["param"] == "messages[1]"
    assert error["message"].startswith("messages[1]: an assistant message needs content")
    assert snapshot("s1") == before
    assert len(vllm.requests) == sent


def test_assistant_messages_a_server_takes_are_stored(gateway: str, stored: Any) -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    messages = [
        USER,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "assistant", "content": ""},
        {"role": "assistant", "content": None, "refusal": "I can't."},
        {"role": "user", "content": "thanks"},
    ]
    response = post(gateway, said(*messages))
    assert response.status_code == 200, response.text
    roles = [m["role"] for m in stored("s1")]
    assert roles == ["user", "assistant", "tool", "assistant", "assistant", "user", "assistant"]


# -- errors in the request's terms ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"max_tokens": 5000}, "max_tokens"),
        ({"max_completion_tokens": 5000}, "max_completion_tokens"),
        ({"max_completion_tokens": 5000, "max_tokens": 10}, "max_completion_tokens"),
    ],
)
def test_an_output_limit_that_leaves_no_room_names_the_body_field(
    gateway: str, vllm: FakeVLLM, snapshot: Callable[[str], Any], fields: dict[str, Any], field: str
) -> None:
    error = refused(post(gateway, said(USER, **fields)), 400, "context_length_exceeded")
    assert error["param"] == field
    assert error["message"].startswith(f"'{field}': 5000 output tokens")
    assert "4096" in error["message"]
    assert vllm.requests == []
    assert snapshot("s1")[:2] == ([], None)


@pytest.mark.parametrize(
    "limits",
    [
        {"max_tokens": 3000, "max_completion_tokens": 10},
        {"max_tokens": 10, "max_completion_tokens": 3000},
    ],
)
def test_both_output_limits_given_fit_for_the_larger(
    gateway: str, vllm: FakeVLLM, limits: dict[str, int]
) -> None:
    """(the request was fitted for max_completion_tokens alone, and forwarded with both:
    a server reading max_tokens, as the fake does, got more than its context; vLLM reads
    max_completion_tokens, the other way round)"""
    long = {"role": "user", "content": "word " * 1400}
    assert post(gateway, said(long)).status_code == 200  # ~2,800 tokens stored with the reply
    response = post(gateway, said(USER, **limits))
    assert response.status_code == 200, response.text
    sent = vllm.requests[-1]
    assert (sent["max_tokens"], sent["max_completion_tokens"]) == (
        limits["max_tokens"],
        limits["max_completion_tokens"],
    )  # forwarded as given
    assert vllm.prompt_tokens[-1] + 3000 <= vllm.max_model_len  # room for either one


def test_the_responses_output_limit_is_named_as_responses_names_it(gateway: str) -> None:
    body = {"model": "m", "input": "hello", "max_output_tokens": 5000}
    response = httpx.post(gateway + "/v1/responses", json=body, timeout=30)
    error = refused(response, 400, "context_length_exceeded")
    assert error["param"] == "max_output_tokens"
    assert error["message"].startswith("'max_output_tokens': 5000")


def test_the_gateways_own_reserve_is_named_as_its_setting(
    start_gateway: Start, redis_url: str, namespace: str
) -> None:
    gw = start_gateway(url=redis_url, namespace=namespace, max_tokens=5000)
    error = refused(post(gw, said(USER)), 400, "context_length_exceeded")
    assert error["message"].startswith("the gateway's output reserve of 5000 tokens")
    assert "send a smaller 'max_tokens'" in error["message"]


@pytest.mark.parametrize(
    ("message", "where"),
    [
        (
            {"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f"}}]},
            "tool_calls[0].function.arguments",
        ),
        (
            {
                "role": "assistant",
                "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{"}}],
            },
            "tool_calls[0].function.arguments",
        ),
        ({"role": "user", "content": [{"type": "text"}]}, "content[0].text"),
        ({"role": "user", "content": [{"type": "text", "text": "a", "x": 1}]}, "content[0].x"),
        (
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": 5}}]},
            "content[0].image_url.url",
        ),
        ({"role": "user", "content": [{"type": "input_audio"}]}, "content[0]"),
    ],
)
def test_a_malformed_message_is_described_by_its_json_path(
    gateway: str, snapshot: Callable[[str], Any], message: dict[str, Any], where: str
) -> None:
    error = refused(post(gateway, said(message, USER)), 400, "invalid_message")
    assert f": {where}: " in error["message"], error["message"]
    assert error["param"] == "messages[0]"
    assert snapshot("s1") == ([], None, [])


def test_tool_calls_left_unanswered_are_named_by_position(
    gateway: str, snapshot: Callable[[str], Any]
) -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    pending = {"role": "assistant", "content": None, "tool_calls": [call]}
    error = refused(post(gateway, said(USER, pending)), 400, "invalid_message")
    assert error["message"].startswith("messages[1]: this assistant message calls tools")
    assert snapshot("s1") == ([], None, [])


@pytest.mark.parametrize(
    ("raw", "kind"), [("[1]", "an array"), ('"hi"', "a string"), ("5", "a number")]
)
def test_a_body_that_is_no_object_is_named_in_json_terms(gateway: str, raw: str, kind: str) -> None:
    response = httpx.post(
        gateway + CHAT, content=raw, headers={"Content-Type": "application/json"}, timeout=30
    )
    error = refused(response, 400, "invalid_json")
    assert error["message"].endswith(f"got {kind}")


@pytest.mark.parametrize(("value", "kind"), [(5, "a number"), (["a"], "an array")])
def test_a_session_id_that_is_no_string_is_named_in_json_terms(
    gateway: str, value: Any, kind: str
) -> None:
    body = said(USER, metadata={"session_id": value})
    error = refused(post(gateway, body, session=None), 400, "invalid_session_id")
    assert error["message"].endswith(f"must be a string, got {kind}")
    assert error["param"] == "metadata.session_id"


def test_a_reply_that_could_not_be_stored_names_no_class() -> None:
    error = reply_not_stored(StoreConnectionError("the store at redis://h:1 went away"), False)
    assert error.message.startswith("the model answered but the reply could not be stored (the")
    speaks_http(error.message)


# -- cache_control on content parts -------------------------------------------------------------


def test_cache_control_on_parts_is_kept_sent_and_not_counted(
    gateway: str, vllm: FakeVLLM, stored: Any
) -> None:
    mark = {"type": "ephemeral"}
    parts = [
        {"type": "text", "text": "a long shared preamble", "cache_control": mark},
        {"type": "text", "text": "the question"},
    ]
    marked = post(gateway, said({"role": "user", "content": parts}), session="marked")
    assert marked.status_code == 200, marked.text
    plain_parts = [{k: v for k, v in p.items() if k != "cache_control"} for p in parts]
    plain = post(gateway, said({"role": "user", "content": plain_parts}), session="plain")
    assert plain.status_code == 200, plain.text
    key = "X-Ctxguard-Prompt-Tokens"
    assert marked.headers[key] == plain.headers[key]
    assert vllm.requests[0]["messages"][0]["content"] == parts  # sent as the client sent it
    assert stored("marked")[0]["content"] == parts
