"""The model server refusing the gateway's credentials on a call the gateway makes itself
(the limit lookup's ``/v1/models``, the ``vllm:`` counter's ``/tokenize``) is the same
502 ``upstream_auth`` as on a forwarded request (not ``upstream_unavailable`` /
``upstream_tokenizer``), with the same throttled ERROR line and never the key; the
library's own errors say the credentials were refused (``ServerAuthError``,
``TokenizerAuthError``)."""

from __future__ import annotations

import logging
from typing import Any

import httpx
import pytest

from ctxguard import (
    ConfigError,
    ServerAuthError,
    TokenizerAuthError,
    TokenizerError,
    UpstreamAuthError,
)
from ctxguard.kv import fetch_server_info
from ctxguard.tokens.vllm import load_vllm_counter
from tests.conftest import private_memory_url

from .conftest import Start
from .upstream import FakeVLLM

KEY = "sk-UPSTREAM-SECRET-0123456789"


def secret_free(text: str) -> None:
    for fragment in (KEY, KEY[:4], "SECRET", "denied"):
        assert fragment not in text, text


def chat(gw: str, session: str | None = None) -> httpx.Response:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    headers = {"X-Session-Id": session} if session else {}
    return httpx.post(gw + "/v1/chat/completions", json=body, headers=headers, timeout=30)


def responses(gw: str) -> httpx.Response:
    return httpx.post(gw + "/v1/responses", json={"model": "m", "input": "hi"}, timeout=30)


def auth_error(response: httpx.Response, status: int) -> None:
    assert response.status_code == 502, response.text
    error: dict[str, Any] = response.json()["error"]
    assert error["code"] == "upstream_auth", error
    assert f"refused the gateway's credentials (HTTP {status})" in error["message"]
    assert "operator" in error["message"] and "\n" not in error["message"]
    secret_free(response.text)


# (path refused, gateway settings: the call of its own that meets the refusal, the log's name)
CASES = {
    "limit": ("/v1/models", {"counter": "tiktoken:cl100k_base"}, "/v1/models (limit lookup)"),
    "counter": ("/tokenize", {"limit": 4096}, "/tokenize (token counter)"),
}


@pytest.mark.parametrize("status", [401, 403])
@pytest.mark.parametrize("case", list(CASES))
def test_the_gateways_own_calls_refused_are_upstream_auth(
    start_gateway: Start,
    vllm: FakeVLLM,
    caplog: pytest.LogCaptureFixture,
    case: str,
    status: int,
) -> None:
    path, settings, what = CASES[case]
    vllm.refuse = {path: status}
    gw = start_gateway(url=private_memory_url(), upstream_api_key=KEY, **settings)
    with caplog.at_level(logging.ERROR, logger="ctxguard.serve"):
        answers = [chat(gw, "s-auth"), chat(gw, "s-auth"), chat(gw), responses(gw)]
    for response in answers:
        auth_error(response, status)
    assert vllm.requests == []  # nothing reached the model
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    auth = [line for line in lines if f"HTTP {status} on {what}" in line]
    assert len(auth) == 1, lines  # throttled: one line for the four requests
    assert "refused the gateway's credentials" in auth[0]
    for line in lines:
        secret_free(line)


def test_a_refused_metrics_leaves_the_limit_from_v1_models(
    start_gateway: Start, vllm: FakeVLLM
) -> None:
    """/metrics (which a proxy may guard apart) only adds the cache figures: the limit
    is /v1/models', so a refused /metrics refuses no request."""
    vllm.refuse = {"/metrics": 401}
    gw = start_gateway(url=private_memory_url(), upstream_api_key=KEY)
    assert chat(gw).status_code == 200


@pytest.mark.parametrize("status", [401, 403])
def test_the_library_says_the_server_refused_the_credentials(vllm: FakeVLLM, status: int) -> None:
    headers = {"Authorization": f"Bearer {KEY}"}
    vllm.refuse = {"/v1/models": status, "/tokenize": status}
    with pytest.raises(ServerAuthError) as limit:
        fetch_server_info(vllm.url, headers=headers)
    with pytest.raises(TokenizerAuthError) as counter:
        load_vllm_counter(vllm.url, headers=headers)
    assert isinstance(limit.value, ConfigError) and isinstance(counter.value, TokenizerError)
    for error, path in ((limit.value, "/v1/models"), (counter.value, "/tokenize")):
        assert isinstance(error, UpstreamAuthError)
        assert (error.status, error.path) == (status, path)
        text = str(error)
        assert f"{path} answered HTTP {status}" in text and "refused the" in text
        assert "credentials" in text and "\n" not in text
        for fragment in (KEY, KEY[:4], "SECRET"):  # the key it quotes: never
            assert fragment not in text, text
        # the counter gives the server's reason less the credential, as for its other
        # errors (tests/security/test_foreign_text.py); the gateway none of it (above)
        assert ("denied: ***" in text) == (path == "/tokenize"), text
