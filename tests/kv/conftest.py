"""A small vLLM-shaped HTTP server on 127.0.0.1 (real sockets, no monkeypatching)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest


@dataclass
class FakeServer:
    """Routes map a path to (status, content type, body); hits records what was asked."""

    url: str = ""
    routes: dict[str, tuple[int, str, str]] = field(default_factory=dict)
    hits: list[str] = field(default_factory=list)
    auth_headers: list[str | None] = field(default_factory=list)

    def json(self, path: str, payload: Any, status: int = 200) -> None:
        self.routes[path] = (status, "application/json", json.dumps(payload))

    def text(self, path: str, body: str, status: int = 200) -> None:
        self.routes[path] = (status, "text/plain; version=0.0.4", body)


def vllm_models(model: str, max_model_len: int) -> dict[str, Any]:
    """The shape of vLLM's GET /v1/models (ModelCard)."""
    card = {
        "id": model,
        "object": "model",
        "created": 1700000000,
        "owned_by": "vllm",
        "root": model,
        "parent": None,
        "max_model_len": max_model_len,
        "permission": [{"id": "modelperm-1", "object": "model_permission"}],
    }
    return {"object": "list", "data": [card]}


def vllm_metrics(
    num_gpu_blocks: int,
    block_size: int = 16,
    kv_cache_size_tokens: int | None = None,
    kv_cache_max_concurrency: float | None = None,
) -> str:
    """Prometheus text with vllm:cache_config_info as vLLM exposes it (labels only)."""
    labels = {
        "block_size": str(block_size),
        "cache_dtype": "auto",
        "enable_prefix_caching": "True",
        "gpu_memory_utilization": "0.9",
        "num_cpu_blocks": "None",
        "num_gpu_blocks": str(num_gpu_blocks),
        "num_gpu_blocks_override": "None",
    }
    if kv_cache_size_tokens is not None:
        labels["kv_cache_size_tokens"] = str(kv_cache_size_tokens)
    if kv_cache_max_concurrency is not None:
        labels["kv_cache_max_concurrency"] = str(kv_cache_max_concurrency)
    rendered = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return (
        "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{engine="0",model_name="m"} 0.0\n'
        "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
        "# TYPE vllm:cache_config_info gauge\n"
        f"vllm:cache_config_info{{{rendered}}} 1.0\n"
    )


@pytest.fixture
def fake_vllm() -> Iterator[FakeServer]:
    fake = FakeServer()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            fake.hits.append(self.path)
            fake.auth_headers.append(self.headers.get("Authorization"))
            status, ctype, body = fake.routes.get(self.path, (404, "text/plain", "Not Found"))
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, fmt: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    fake.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield fake
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
