"""A local HTTP server answering GET /metrics with Prometheus text that changes per scrape."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from tests.local_http import QuietHandler, serve_in_thread


def vllm_text(kv: float, waiting: int, model: str = "m") -> str:
    return (
        "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n"
        "# TYPE vllm:kv_cache_usage_perc gauge\n"
        f'vllm:kv_cache_usage_perc{{engine="0",model_name="{model}"}} {kv}\n'
        "# TYPE vllm:num_requests_waiting gauge\n"
        f'vllm:num_requests_waiting{{engine="0",model_name="{model}"}} {waiting}.0\n'
        f'vllm:num_requests_running{{engine="0",model_name="{model}"}} 12.0\n'
    )


def sglang_text(usage: float, queued: int) -> str:
    return (
        "# TYPE sglang:token_usage gauge\n"
        f'sglang:token_usage{{model_name="m"}} {usage}\n'
        f'sglang:num_queue_reqs{{model_name="m"}} {queued}\n'
    )


class MetricsServer:
    """Serves ``bodies[i]`` to the i-th scrape (the last one from then on)."""

    def __init__(self, bodies: Sequence[tuple[int, str]]) -> None:
        self.bodies = list(bodies)
        self.scrapes = 0
        lock = threading.Lock()
        outer = self

        class Handler(QuietHandler):
            def do_GET(self) -> None:
                with lock:
                    status, text = outer.bodies[min(outer.scrapes, len(outer.bodies) - 1)]
                    outer.scrapes += 1
                self.send(status, text.encode(), "text/plain; version=0.0.4")

        self.httpd = serve_in_thread(Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/metrics"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class Serving:
    """What ``start_http_server`` returned ``(server, thread)``, stopped by :meth:`close`."""

    def __init__(self, started: tuple[Any, threading.Thread]) -> None:
        self.server, self.thread = started
        self.port = int(self.server.server_address[1])

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)
