"""The guardrail inside a real LiteLLM proxy (``litellm --config``), driven by ``openai``.

Needs the proxy's own dependencies (FastAPI and friends), which ``litellm`` alone does
not bring and ``litellm[proxy]`` cannot install from every index: skipped when the
proxy cannot be imported. The model is LiteLLM's ``mock_response`` (no upstream).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ctxguard import Guard

from .processes import LiteLLMProxy

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no cost-map download
pytestmark = pytest.mark.redis
ROOT = Path(__file__).resolve().parents[2]
ENV = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY": "true",
}
CONFIG = """
model_list:
  - model_name: local
    litellm_params:
      model: openai/local
      api_key: none
      mock_response: "hello from the model"
guardrails:
  - guardrail_name: ctxguard
    litellm_params:
      guardrail: ctxguard.adapters.litellm.CtxGuardGuardrail
      mode: [pre_call, post_call]
      default_on: true
      url: os.environ/CTXGUARD_TEST_PROXY_STORE
      namespace: {namespace}
      counter: approx
      limit: 400
      max_tokens: 64
"""


def _proxy_importable() -> bool:
    env = {**os.environ, **ENV}
    probe = subprocess.run(
        [sys.executable, "-c", "import litellm.proxy.proxy_server"],
        capture_output=True,
        timeout=120,
        env=env,
    )
    return probe.returncode == 0


@pytest.fixture(scope="module")
def proxy_available() -> None:
    pytest.importorskip("litellm")
    if not _proxy_importable():
        pytest.skip("LiteLLM's proxy dependencies (fastapi, ...) are not installed")


@pytest.fixture
def proxy(proxy_available: None, redis_url: str, namespace: str, tmp_path: Path) -> Iterator[str]:
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG.format(namespace=namespace), encoding="utf-8")
    server = LiteLLMProxy(config, {**ENV, "CTXGUARD_TEST_PROXY_STORE": redis_url})
    try:
        yield server.url
    finally:
        server.stop()


def stored(redis_url: str, namespace: str, session_id: str) -> list[tuple[str, Any]]:
    guard = Guard(redis_url, namespace=namespace, limit=400)
    try:
        return [(s.message.role, s.message.content) for s in guard.store.read(session_id)]
    finally:
        guard.close()


def test_the_proxy_fits_records_and_refuses(proxy: str, redis_url: str, namespace: str) -> None:
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"{proxy}/v1", api_key="unused", timeout=60)
    session = {"X-Session-Id": "proxy-chat"}
    for text in ("hi", "again"):
        reply = client.chat.completions.create(
            model="local", messages=[{"role": "user", "content": text}], extra_headers=session
        )
        assert reply.choices[0].message.content == "hello from the model"
    chunks = client.chat.completions.create(
        model="local",
        messages=[{"role": "user", "content": "stream"}],
        stream=True,
        extra_headers=session,
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    answer = ("assistant", "hello from the model")
    expected = [("user", "hi"), answer, ("user", "again"), answer, ("user", "stream"), answer]
    assert stored(redis_url, namespace, "proxy-chat") == expected

    huge = " ".join(f"w{i}" for i in range(2000))
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model="local", messages=[{"role": "user", "content": huge}], extra_headers=session
        )
    error = caught.value.body
    assert isinstance(error, dict)
    assert error["type"] == "invalid_request_error"
    assert error["param"] == "messages"
    assert error["provider_specific_fields"] == {"ctxguard_code": "context_length_exceeded"}
    assert "limit 400" in error["message"]
    assert stored(redis_url, namespace, "proxy-chat") == expected
