"""One vllm: counter shared by many threads sends their counts side by side.

The gateway counts in worker threads (anyio's pool: 40 by default) through one
counter, so one HTTP client. httpcore's pool holds 10 connections unless told
otherwise; the 11th concurrent count waited for a free one, so 40 threads were
served ten at a time. Here a server holds every /tokenize until `N` of them are in
flight at once (a barrier): a pool under `N` never gets there, and its counts fail.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

import httpx
import pytest
from local_http import JsonServer

from ctxguard import _http
from ctxguard.errors import TokenizerError
from ctxguard.messages import user
from ctxguard.tokens import load_counter

N = 40  # anyio's default worker threads, which the gateway counts in
HELD = 20.0  # how long the server waits for all N to arrive (only a broken pool waits)


class AllAtOnce:
    """Answers a count of a "together ..." message only once `N` are in flight at once."""

    def __init__(self) -> None:
        self.barrier = threading.Barrier(N, timeout=HELD)
        self.lock = threading.Lock()
        self.in_flight = self.most = 0
        self.server = JsonServer(self.answer)

    def answer(self, path: str, body: Any, headers: Mapping[str, str]) -> tuple[int, Any]:
        texts = [str(m.get("content")) for m in body.get("messages", [])]
        words = (texts or [body.get("prompt", "")])[-1].split()
        if words[:1] != ["together"]:  # the loader's probes, sent one at a time
            return 200, {"count": 3 + 5 * len(texts), "tokens": [], "max_model_len": 8192}
        with self.lock:
            self.in_flight += 1
            self.most = max(self.most, self.in_flight)
        try:
            self.barrier.wait()
        except threading.BrokenBarrierError:
            return 503, {"detail": "not all requests arrived together"}
        finally:
            with self.lock:
                self.in_flight -= 1
        return 200, {"count": len(words), "tokens": [], "max_model_len": 8192}


def test_forty_threads_count_side_by_side_through_one_counter() -> None:
    server = AllAtOnce()
    try:
        counter = load_counter(f"vllm:{server.server.url}", timeout=HELD + 30)
        requests = [[user(" ".join(["together"] * (i + 1)))] for i in range(N)]
        with ThreadPoolExecutor(N) as pool:
            counts = list(pool.map(counter.count_request, requests))
    finally:
        server.server.close()
    assert counts == [i + 1 for i in range(N)]
    assert server.most == N


def test_a_call_waiting_for_a_free_connection_still_ends_at_its_deadline() -> None:
    arrived, release = threading.Event(), threading.Event()

    def answer(path: str, body: Any, headers: Mapping[str, str]) -> tuple[int, Any]:
        if path == "/hold":
            arrived.set()
            release.wait(HELD)
        return 200, {"count": 1}

    server = JsonServer(answer)
    # the client's own timeout is long: only the call's deadline can end the wait
    one = httpx.Limits(max_connections=1, keepalive_expiry=_http.KEEPALIVE_EXPIRY)
    http = httpx.Client(timeout=HELD * 2, transport=_http._Transport(one))
    call = partial(_http.request, http, "POST", json={}, shown="the server", error=TokenizerError)
    try:
        with ThreadPoolExecutor(1) as pool:
            held = pool.submit(call, f"{server.url}/hold", seconds=HELD * 2)
            assert arrived.wait(HELD), "the first call never reached the server"
            started = time.monotonic()
            with pytest.raises(TokenizerError, match=r"the server .*within 1 s \(deadline\)"):
                call(f"{server.url}/quick", seconds=1.0)
            waited = time.monotonic() - started
            release.set()
            assert held.result().status_code == 200  # the held call was not disturbed
    finally:
        release.set()
        http.close()
        server.close()
    assert waited < HELD / 2  # ended by its own deadline (1 s), not when the connection freed
