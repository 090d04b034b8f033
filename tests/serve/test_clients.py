"""Real clients against the gateway: the openai SDK (sync and async) and curl;
the pass-through endpoints."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest

from .upstream import MODEL, FakeVLLM

pytestmark = pytest.mark.redis

Stored = Callable[..., list[dict[str, Any]]]


def test_openai_sync_client_sessions_streaming_and_errors(
    gateway: str, vllm: FakeVLLM, stored: Stored
) -> None:
    client = openai.OpenAI(
        base_url=gateway + "/v1",
        api_key="unused",
        default_headers={"X-Session-Id": "sdk"},
        max_retries=0,
    )
    reply = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi from the sdk"}]
    )
    assert reply.choices[0].message.content == "echo: hi from the sdk"
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "now streaming"}], stream=True
    )
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert text == "echo: now streaming"
    assert [m["content"] for m in stored("sdk")] == [
        "hi from the sdk",
        "echo: hi from the sdk",
        "now streaming",
        "echo: now streaming",
    ]
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "word " * 5000}]
        )
    assert caught.value.code == "context_length_exceeded"
    assert len(vllm.requests) == 2


async def test_openai_async_client_with_tools(gateway: str, stored: Stored) -> None:
    client = openai.AsyncOpenAI(base_url=gateway + "/v1", api_key="unused", max_retries=0)
    headers = {"X-Session-Id": "async"}
    stream = await client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "CALL_TOOL weather"}],
        stream=True,
        extra_headers=headers,
    )
    arguments = ""
    async for chunk in stream:
        for call in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            arguments += call.function.arguments or "" if call.function else ""
    assert json.loads(arguments) == {"city": "Paris"}
    reply = await client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "tool", "tool_call_id": "call_1", "content": "sunny"}],
        extra_headers=headers,
    )
    assert reply.choices[0].message.content == "echo: sunny"
    assert [m["role"] for m in stored("async")] == ["user", "assistant", "tool", "assistant"]
    await client.close()


def test_curl(gateway: str, stored: Stored) -> None:
    curl = shutil.which("curl")
    if curl is None:
        pytest.skip("curl is not installed")
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "from curl"}]})
    url = gateway + "/v1/chat/completions"
    head = ["-H", "Content-Type: application/json", "-H", "X-Session-Id: curl-1"]
    out = subprocess.run(
        [curl, "-sS", *head, "-d", body, url],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert json.loads(out)["choices"][0]["message"]["content"] == "echo: from curl"
    streamed = subprocess.run(
        [curl, "-sSN", *head, "-d", json.dumps({**json.loads(body), "stream": True}), url],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert streamed.rstrip().endswith("data: [DONE]")
    assert len(stored("curl-1")) == 4


def test_models_shows_the_enforced_limit(
    start_gateway: Callable[..., str], redis_url: str, namespace: str, vllm: FakeVLLM
) -> None:
    default = start_gateway(url=redis_url, namespace=namespace)
    models = httpx.get(default + "/v1/models", timeout=30).json()
    assert models["data"][0]["id"] == MODEL
    assert models["data"][0]["max_model_len"] == 4096  # read from the upstream
    capped = start_gateway(url=redis_url, namespace=namespace, limit=1000)
    assert httpx.get(capped + "/v1/models", timeout=30).json()["data"][0]["max_model_len"] == 1000


def test_tokenize_and_health_pass_through(gateway: str, vllm: FakeVLLM, qwen: Any) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "count me"}]}
    counted = httpx.post(gateway + "/tokenize", json=body, timeout=30).json()
    expected = qwen.apply_chat_template(
        body["messages"], add_generation_prompt=True, tokenize=True, return_dict=False
    )
    assert counted["count"] == len(expected)
    health = httpx.get(gateway + "/health", timeout=30)
    assert health.status_code == 200 and health.json()["store"] == "ok"
