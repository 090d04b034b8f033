"""What the agent-loop adapters share: the served limit, reported usage, ids known stored."""

from __future__ import annotations

import pytest
from kv.conftest import FakeServer, fake_vllm, vllm_metrics, vllm_models

from ctxguard import ContextLimit, Guard, ModelLimit, ServerLimit
from ctxguard.adapters import _served
from ctxguard.errors import ConfigError
from tests.conftest import private_memory_url

__all__ = ["fake_vllm"]  # the fixture, shared with the KV tests


def test_served_limit_of_every_source() -> None:
    guard = Guard(private_memory_url(), limit=900)
    assert _served.served_limit(guard).tokens == 900
    assert _served.served_limit(512).tokens == 512
    assert _served.served_limit(ContextLimit(77, "t")).tokens == 77
    limit = ModelLimit("meta-llama/Llama-3.1-8B-Instruct", max_model_len=4096)
    assert _served.served_limit(limit).tokens == 4096
    for bad in (True, "512", None, 0):
        with pytest.raises(ConfigError):
            _served.served_limit(bad)  # type: ignore[arg-type]


def test_usage_keeps_what_the_model_reported() -> None:
    assert _served.usage(12, 3) == {"prompt_tokens": 12, "completion_tokens": 3}
    assert _served.usage(0, 3) == {"prompt_tokens": None, "completion_tokens": 3}
    assert _served.usage(None, None) is None


def test_seen_ids_forget_the_least_recent_sessions() -> None:
    seen = _served.SeenIds(sessions=2)
    seen.of("a").add("m1")
    seen.of("b").add("m2")
    assert seen.of("a") == {"m1"}  # used again: now the most recent
    seen.of("c")
    assert seen.of("a") == {"m1"}
    assert seen.of("b") == set()  # forgotten (safe: the store skips stored ids)


def test_a_running_servers_limit_becomes_each_frameworks_window(fake_vllm: FakeServer) -> None:
    fake_vllm.json("/v1/models", vllm_models("m", 32768))
    fake_vllm.text("/metrics", vllm_metrics(52_510, 16))
    guard = Guard(private_memory_url(), limit=ServerLimit(fake_vllm.url), max_tokens=1024)
    assert _served.served_limit(ServerLimit(fake_vllm.url)).tokens == 32768
    langchain = pytest.importorskip("ctxguard.adapters.langchain")
    assert langchain.model_profile(guard) == {"max_input_tokens": 32768 - 1024}
    pydantic_ai = pytest.importorskip("ctxguard.adapters.pydantic_ai")
    assert pydantic_ai.model_profile(guard) == {"context_window": 32768}
