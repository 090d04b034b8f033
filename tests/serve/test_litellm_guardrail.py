"""The LiteLLM guardrail in front of a vLLM-shaped server, called through LiteLLM itself.

Each turn runs as LiteLLM's proxy runs it: the guardrail's ``pre_call`` hook, then a
real ``litellm.acompletion`` over HTTP to the local upstream (``hosted_vllm``), then the
``post_call`` hook (or the streaming iterator hook). The guardrail's limit and counter
are the gateway's defaults: the upstream's ``/v1/models`` and ``/tokenize``.
"""

from __future__ import annotations

import os
import uuid
from typing import Any

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no cost-map download
litellm = pytest.importorskip("litellm")

from litellm.caching import DualCache  # noqa: E402
from litellm.types.guardrails import GuardrailEventHooks  # noqa: E402
from litellm.types.proxy.auth.user_api_key_auth import UserAPIKeyAuth  # noqa: E402

from ctxguard.adapters.litellm import CtxGuardGuardrail, GuardrailRefusal  # noqa: E402

from .upstream import MODEL, FakeVLLM  # noqa: E402

pytestmark = pytest.mark.redis
RESERVE = 128


def request(session: str | None, messages: list[dict[str, Any]], **body: Any) -> dict[str, Any]:
    headers = {"x-session-id": session} if session else {}
    return {
        "model": "qwen",
        "messages": messages,
        "litellm_call_id": str(uuid.uuid4()),
        "metadata": {},
        "proxy_server_request": {"headers": headers},
        **body,
    }


async def pre_call(g: CtxGuardGuardrail, data: dict[str, Any]) -> dict[str, Any]:
    assert g.should_run_guardrail(data=data, event_type=GuardrailEventHooks.pre_call)
    out: dict[str, Any] = await g.async_pre_call_hook(
        user_api_key_dict=UserAPIKeyAuth(), cache=DualCache(), data=data, call_type="acompletion"
    )
    return out


async def complete(vllm: FakeVLLM, data: dict[str, Any], **extra: Any) -> Any:
    return await litellm.acompletion(
        model=f"hosted_vllm/{MODEL}",
        api_base=f"{vllm.url}/v1",
        api_key="none",
        messages=data["messages"],
        max_tokens=data["max_tokens"],
        **extra,
    )


@pytest.fixture
async def guardrail(vllm: FakeVLLM, redis_url: str, namespace: str) -> Any:
    vllm.max_model_len = 1024
    g = CtxGuardGuardrail(
        guardrail_name="ctxguard",
        event_hook=["pre_call", "post_call"],
        default_on=True,
        url=redis_url,
        namespace=namespace,
        upstream=vllm.url,
        max_tokens=RESERVE,
    )
    yield g
    await g.aclose()


async def test_every_request_litellm_sends_fits_and_the_session_is_kept(
    guardrail: CtxGuardGuardrail, vllm: FakeVLLM, stored: Any
) -> None:
    system = {"role": "system", "content": "Answer briefly."}
    for turn in range(12):
        text = f"turn {turn}: " + " ".join(f"word{turn}x{i}" for i in range(40))
        new = ([system] if turn == 0 else []) + [{"role": "user", "content": text}]
        data = await pre_call(guardrail, request("conv", new))
        response = await complete(vllm, data)
        await guardrail.async_post_call_success_hook(
            data=data, user_api_key_dict=UserAPIKeyAuth(), response=response
        )
        assert response.choices[0].message.content == "echo: " + text
    # what reached the server fit, counted by the server's own template
    assert len(vllm.prompt_tokens) == 12
    assert max(vllm.prompt_tokens) + RESERVE <= 1024
    assert all(r["max_tokens"] == RESERVE for r in vllm.requests)
    assert len(vllm.requests[-1]["messages"]) < 25  # older turns were left out
    assert vllm.requests[-1]["messages"][0] == system
    history = stored("conv")
    assert [m["role"] for m in history] == ["system"] + ["user", "assistant"] * 12
    assert history[-1]["content"] == "echo: " + text


async def test_a_streamed_tool_call_is_recorded_whole(
    guardrail: CtxGuardGuardrail, vllm: FakeVLLM, stored: Any
) -> None:
    data = await pre_call(guardrail, request("tools", [{"role": "user", "content": "CALL_TOOL"}]))
    stream = await complete(vllm, data, stream=True)
    chunks = [
        c
        async for c in guardrail.async_post_call_streaming_iterator_hook(
            user_api_key_dict=UserAPIKeyAuth(), response=stream, request_data=data
        )
    ]
    assert chunks
    reply = stored("tools")[-1]
    assert reply["role"] == "assistant"
    assert [c["function"] for c in reply["tool_calls"]] == [
        {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    ]


async def test_a_request_over_the_servers_limit_never_reaches_it(
    guardrail: CtxGuardGuardrail, vllm: FakeVLLM, stored: Any
) -> None:
    huge = " ".join(f"w{i}" for i in range(3000))
    with pytest.raises(GuardrailRefusal) as caught:
        await pre_call(guardrail, request("big", [{"role": "user", "content": huge}]))
    assert caught.value.status_code == 400
    assert caught.value.code == "context_length_exceeded"
    assert "1024" in caught.value.message
    assert vllm.requests == []
    assert stored("big") == []


@pytest.mark.parametrize("mode", ["CUT", "ERRSTREAM"])
async def test_a_stream_that_does_not_finish_stores_no_reply(
    guardrail: CtxGuardGuardrail, vllm: FakeVLLM, stored: Any, mode: str
) -> None:
    """A stream cut before its finish, or with an error event in it, is LiteLLM's error
    to the caller; the partial text is not stored as the reply. (LiteLLM drops the older
    ``{"object": "error"}`` event shape and ends such a stream with ``stop`` itself: not
    visible to a hook.)"""
    data = await pre_call(guardrail, request("part", [{"role": "user", "content": mode}]))
    stream = await complete(vllm, data, stream=True)
    chunks: list[Any] = []
    with pytest.raises(litellm.exceptions.MidStreamFallbackError):
        async for c in guardrail.async_post_call_streaming_iterator_hook(
            user_api_key_dict=UserAPIKeyAuth(), response=stream, request_data=data
        ):
            chunks.append(c)
    assert [c.choices[0].delta.content for c in chunks] == ["", "echo:"]
    assert [m["content"] for m in stored("part")] == [mode]


async def test_a_stream_with_no_finish_reason_stores_no_reply(
    guardrail: CtxGuardGuardrail, stored: Any
) -> None:
    """(a stream that ended without a finish_reason was stored as a whole reply)"""
    data = await pre_call(guardrail, request("nofin", [{"role": "user", "content": "hi"}]))

    async def chunks() -> Any:
        for text in ("half ", "a reply"):
            yield {"choices": [{"index": 0, "delta": {"content": text}}]}

    seen = [
        c
        async for c in guardrail.async_post_call_streaming_iterator_hook(
            user_api_key_dict=UserAPIKeyAuth(), response=chunks(), request_data=data
        )
    ]
    assert len(seen) == 2
    assert [m["content"] for m in stored("nofin")] == ["hi"]


async def test_the_older_error_event_never_reaches_the_hook(
    guardrail: CtxGuardGuardrail, vllm: FakeVLLM, stored: Any
) -> None:
    """A known limit, documented in the README: LiteLLM's parser drops an
    ``{"object": "error", ...}`` event before any hook sees it, and its own ``[DONE]``
    handling ends the stream with ``stop``; the hook sees a finished reply and stores the
    partial text. (When LiteLLM raises on it, as it does on ``{"error": ...}``, this test
    fails: drop the README note.)"""
    data = await pre_call(guardrail, request("old", [{"role": "user", "content": "ERROLDSTREAM"}]))
    stream = await complete(vllm, data, stream=True)
    chunks = [
        c
        async for c in guardrail.async_post_call_streaming_iterator_hook(
            user_api_key_dict=UserAPIKeyAuth(), response=stream, request_data=data
        )
    ]
    assert [c.choices[0].finish_reason for c in chunks] == [None, None, "stop"]
    assert all(c.model_dump().get("object") != "error" for c in chunks)
    assert [m["content"] for m in stored("old")] == ["ERROLDSTREAM", "echo:"]


async def test_n_over_one_with_a_session_is_refused_and_nothing_is_stored(
    guardrail: CtxGuardGuardrail, vllm: FakeVLLM, stored: Any
) -> None:
    with pytest.raises(GuardrailRefusal) as caught:
        await pre_call(guardrail, request("many", [{"role": "user", "content": "hi"}], n=2))
    assert (caught.value.status_code, caught.value.code) == (400, "unsupported_parameter")
    assert caught.value.param == "n"
    assert stored("many") == []
    data = await pre_call(guardrail, request(None, [{"role": "user", "content": "hi"}], n=2))
    assert data["n"] == 2  # stateless: LiteLLM sends it on


async def test_cache_control_on_parts_is_taken_and_passed_on(
    guardrail: CtxGuardGuardrail, vllm: FakeVLLM, stored: Any
) -> None:
    parts = [
        {"type": "text", "text": "a shared preamble", "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "the question"},
    ]
    data = await pre_call(guardrail, request("cc", [{"role": "user", "content": parts}]))
    assert data["messages"] == [{"role": "user", "content": parts}]  # as LiteLLM was given it
    response = await complete(vllm, data)
    await guardrail.async_post_call_success_hook(
        data=data, user_api_key_dict=UserAPIKeyAuth(), response=response
    )
    assert [m["role"] for m in stored("cc")] == ["user", "assistant"]
    assert stored("cc")[0]["content"] == parts


async def test_an_output_limit_that_leaves_no_room_names_the_field(
    guardrail: CtxGuardGuardrail, stored: Any
) -> None:
    body = request("room", [{"role": "user", "content": "hi"}], max_tokens=5000)
    with pytest.raises(GuardrailRefusal) as caught:
        await pre_call(guardrail, body)
    assert caught.value.message.startswith("'max_tokens': 5000 output tokens")
    assert "prepare()" not in caught.value.message
    assert stored("room") == []
