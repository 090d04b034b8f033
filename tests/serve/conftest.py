"""Fixtures for the gateway: a vLLM-shaped upstream and gateways under uvicorn (real HTTP)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ctxguard import Guard
from ctxguard.serve import create_app
from ctxguard.serve.config import ServeConfig

from .upstream import FakeVLLM, serve_in_thread, stop_server


@pytest.fixture(scope="session")
def qwen(hf_dirs: dict[str, Path]) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(hf_dirs["qwen-2.5"]), local_files_only=True)


@pytest.fixture(scope="session")
def vllm_server(qwen: Any) -> Iterator[FakeVLLM]:
    server = FakeVLLM(qwen).start()
    yield server
    server.stop()


@pytest.fixture
def vllm(vllm_server: FakeVLLM) -> Iterator[FakeVLLM]:
    """The shared upstream with its records cleared for this test."""
    vllm_server.requests.clear()
    vllm_server.authorizations.clear()
    vllm_server.prompt_tokens.clear()
    vllm_server.cancelled = 0
    vllm_server.max_model_len = 4096
    vllm_server.slow_seconds = 3.0
    vllm_server.stall_started.clear()
    vllm_server.fail_status = None
    vllm_server.on_request = None
    vllm_server.first_tool_arguments = None
    vllm_server.stall_enabled = True
    vllm_server.hold = None
    vllm_server.refuse = {}
    yield vllm_server
    if vllm_server.hold is not None:  # a test that failed holding a request: let it go
        vllm_server.hold.set()


Start = Callable[..., str]


@pytest.fixture
def start_gateway(vllm: FakeVLLM) -> Iterator[Start]:
    """``start_gateway(url=..., namespace=..., **settings)`` -> the gateway's base URL."""
    servers: list[Any] = []

    def start(**settings: Any) -> str:
        settings.setdefault("upstream", vllm.url)
        config = ServeConfig(**settings)
        server, url = serve_in_thread(create_app(config))
        servers.append(server)
        return url

    yield start
    for server in servers:
        stop_server(server)


@pytest.fixture
def gateway(start_gateway: Start, redis_url: str, namespace: str) -> str:
    """A gateway on the test's Redis namespace with the defaults (limit and counter from
    the upstream), reserve 256."""
    return start_gateway(url=redis_url, namespace=namespace, max_tokens=256)


@pytest.fixture
def stored(redis_url: str, namespace: str) -> Iterator[Callable[..., list[dict[str, Any]]]]:
    """``stored(session_id, tenant=None)``: the session's messages as OpenAI dicts + ids."""
    guards: dict[str | None, Guard] = {}

    def read(session_id: str, tenant: str | None = None) -> list[dict[str, Any]]:
        if tenant not in guards:
            guards[tenant] = Guard(redis_url, limit=4096, namespace=namespace, tenant=tenant)
        return [
            {**s.message.to_openai(), "id": s.message.id}
            for s in guards[tenant].store.read(session_id)
        ]

    yield read
    for guard in guards.values():
        guard.close()


@pytest.fixture
def snapshot(redis_url: str, namespace: str) -> Iterator[Callable[[str], Any]]:
    """A session's stored state, to compare before and after a refused request: its
    messages (seq, record, count), its message and token counts, its audit records."""
    guard = Guard(redis_url, limit=4096, namespace=namespace)

    def take(session: str) -> Any:
        store = guard.store
        info = store.info(session)
        messages = [(s.seq, s.message.to_record(), s.tokens) for s in store.read(session)]
        counts = None if info is None else (info.message_count, info.token_total)
        return messages, counts, store.read_audit(session)

    yield take
    guard.close()
