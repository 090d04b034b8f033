"""A local server shaped like vLLM's OpenAI server, for the gateway's tests (real HTTP).

``/v1/models`` (with ``max_model_len``), ``/tokenize`` rendered by a real offline
tokenizer (Qwen2.5's chat template, the way vLLM renders Hugging Face templates), and
``/v1/chat/completions`` non-streaming and SSE-streaming, with tool calls. Every chat
request is kept (``requests``) with its exact prompt count, so tests check that what
reached the "GPU" fit. What the reply does is scripted by the last user message:

- ``CALL_TOOL`` -> a ``get_weather`` tool call (arguments streamed in pieces)
- ``CALL_TWICE`` -> (not streamed) two ``get_weather`` calls with one id, as some
  models number their calls
- with ``first_tool_arguments`` set, a user message on a request that offers tools -> a
  call of the request's first tool with those arguments (a tool result is then echoed)
- ``FAIL500``   -> HTTP 500 (and with ``fail_status`` set, every request: that status;
  ``on_request``, if set, is called with each body first)
- ``SLOW``      -> waits ``slow_seconds`` before answering (timeouts), or, with ``hold``
  set to an Event, until the test sets it
- ``STALL``     -> streams two chunks, then waits until the client goes away
- ``BATCH``     -> streams the whole reply in one write (events arrive together)
- ``CUT``       -> streams the first word, then ends the stream cleanly (no finish, no [DONE])
- ``ERRSTREAM`` -> streams the first word, then an error event quoting the request's
  Authorization header (as vLLM reports a failure mid-stream), then ``[DONE]``;
  ``ERROLDSTREAM`` the same with the older ``{"object": "error"}`` shape
- ``JSONSTREAM`` -> answers a streaming request with a plain JSON completion
- with ``refuse`` holding a path (``/v1/models``, ``/tokenize``, ``/metrics``): that
  path answers its status (401, 403) with an error quoting the request's Authorization
- anything else -> ``echo: <text>``, streamed word by word
"""

from __future__ import annotations

import asyncio
import copy
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

MODEL = "Qwen/Qwen2.5-7B-Instruct"


def _shaped(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What vLLM hands a Hugging Face template: null content as "", arguments as objects."""
    out = copy.deepcopy(messages)
    for message in out:
        if message.get("content") is None:
            message["content"] = ""
        if isinstance(message["content"], list):
            message["content"] = "\n".join(p.get("text", "") for p in message["content"])
        for call in message.get("tool_calls") or ():
            call["function"]["arguments"] = json.loads(call["function"]["arguments"] or "{}")
    return out


class FakeVLLM:
    """The server; ``url`` once started. Thread-safe counters for the tests."""

    def __init__(self, tokenizer: Any, max_model_len: int = 4096) -> None:
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.requests: list[dict[str, Any]] = []
        self.prompt_tokens: list[int] = []
        self.cancelled = 0
        self.slow_seconds = 3.0
        self.hold: threading.Event | None = None  # set: SLOW waits for it, not slow_seconds
        self.tokenize_calls = 0
        self.fail_status: int | None = None  # answer every chat request with this status
        self.stall_enabled = True  # False: STALL streams like any other reply
        self.first_tool_arguments: dict[str, Any] | None = None  # call the first tool offered
        self.authorizations: list[str | None] = []  # each chat request's Authorization
        # called (in a worker thread) with each chat request's body before it is answered
        self.on_request: Callable[[dict[str, Any]], None] | None = None
        self._lock = threading.Lock()
        self.stall_started = threading.Event()
        self.refuse: dict[str, int] = {}  # path -> the status it answers (credentials refused)
        self.app = Starlette(
            routes=[
                Route("/v1/models", self.models, methods=["GET"]),
                Route("/tokenize", self.tokenize, methods=["POST"]),
                Route("/metrics", self.metrics, methods=["GET"]),
                Route("/v1/chat/completions", self.chat, methods=["POST"]),
            ]
        )
        self.server: uvicorn.Server | None = None
        self.url = ""

    # -- endpoints -------------------------------------------------------------------

    def refused(self, request: Request) -> Response | None:
        """The answer of a path in ``refuse``: its status, quoting the credential sent."""
        status = self.refuse.get(request.url.path)
        if status is None:
            return None
        auth = request.headers.get("authorization", "")
        return JSONResponse({"object": "error", "message": f"denied: {auth}"}, status)

    async def metrics(self, request: Request) -> Response:
        if (refused := self.refused(request)) is not None:
            return refused
        return Response("# no cache gauge here\n", media_type="text/plain")

    async def models(self, request: Request) -> Response:
        if (refused := self.refused(request)) is not None:
            return refused
        model = {"id": MODEL, "object": "model", "max_model_len": self.max_model_len}
        return JSONResponse({"object": "list", "data": [model]})

    def count(self, body: dict[str, Any]) -> int:
        if "prompt" in body:
            ids = self.tokenizer.encode(
                body["prompt"], add_special_tokens=body.get("add_special_tokens", True)
            )
            return len(ids)
        ids = self.tokenizer.apply_chat_template(
            _shaped(body["messages"]),
            tools=body.get("tools"),
            add_generation_prompt=body.get("add_generation_prompt", True),
            tokenize=True,
            return_dict=False,
        )
        return len(ids)

    async def tokenize(self, request: Request) -> Response:
        body = await request.json()
        if (refused := self.refused(request)) is not None:
            return refused
        with self._lock:
            self.tokenize_calls += 1
        try:
            count = self.count(body)
        except Exception as exc:  # the template refused: vLLM answers 400
            return JSONResponse({"object": "error", "message": str(exc), "code": 400}, 400)
        return JSONResponse({"count": count, "max_model_len": self.max_model_len, "tokens": []})

    async def chat(self, request: Request) -> Response:
        body = await request.json()
        prompt = self.count({"messages": body["messages"], "tools": body.get("tools")})
        with self._lock:
            self.requests.append(body)
            self.authorizations.append(request.headers.get("authorization"))
            self.prompt_tokens.append(prompt)
        max_tokens = body.get("max_tokens") or body.get("max_completion_tokens") or 0
        if prompt + max_tokens > self.max_model_len:
            message = (
                f"This model's maximum context length is {self.max_model_len} tokens. However, "
                f"you requested {prompt + max_tokens} tokens"
            )
            return JSONResponse({"object": "error", "message": message, "code": 400}, 400)
        last = next((m for m in reversed(body["messages"]) if m["role"] in ("user", "tool")), {})
        text = str(last.get("content") or "")
        if self.on_request is not None:
            await asyncio.to_thread(self.on_request, body)
        if self.fail_status is not None:
            error = {"object": "error", "message": "engine unavailable", "code": self.fail_status}
            return JSONResponse(error, self.fail_status)
        if "FAIL500" in text:
            return JSONResponse({"object": "error", "message": "engine died", "code": 500}, 500)
        if "SLOW" in text:
            if self.hold is not None:  # until the test lets it go (no race on a busy machine)
                await asyncio.to_thread(self.hold.wait, 120)
            else:
                await asyncio.sleep(self.slow_seconds)
        usage = {"prompt_tokens": prompt, "completion_tokens": 3, "total_tokens": prompt + 3}
        reply: dict[str, Any] = {"role": "assistant", "content": "echo: " + text}
        call: tuple[str, str] | None = None
        if "CALL_TOOL" in text or "CALL_TWICE" in text:
            call = ("get_weather", '{"city": "Paris"}')
        elif (
            self.first_tool_arguments is not None
            and body.get("tools")
            and last.get("role") == "user"
        ):
            call = (body["tools"][0]["function"]["name"], json.dumps(self.first_tool_arguments))
        if call is not None:
            function = {"name": call[0], "arguments": call[1]}
            reply = {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "call_1", "type": "function", "function": function}],
            }
            if "CALL_TWICE" in text:
                reply["tool_calls"] *= 2
        if not body.get("stream") or "JSONSTREAM" in text:
            return JSONResponse(
                {
                    "id": "chatcmpl-fake",
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": MODEL,
                    "choices": [
                        {
                            "index": 0,
                            "message": reply,
                            "finish_reason": "tool_calls" if "tool_calls" in reply else "stop",
                        }
                    ],
                    "usage": usage,
                }
            )
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        events = self.stream(
            reply, usage if include_usage else None, "STALL" in text and self.stall_enabled
        )
        if "BATCH" in text:
            events = _in_one_write(events)
        if "CUT" in text:
            events = _first_two(events)
        if "ERRSTREAM" in text or "ERROLDSTREAM" in text:
            said = f"CUDA out of memory (request had {request.headers.get('authorization')})"
            error: dict[str, Any] = {"message": said, "type": "InternalServerError"}
            error.update(param=None, code=500)
            shaped = {"error": error} if "ERRSTREAM" in text else {"object": "error", **error}
            events = _then(_first_two(events), shaped)
        return StreamingResponse(events, media_type="text/event-stream")

    async def stream(
        self, reply: dict[str, Any], usage: dict[str, Any] | None, stall: bool
    ) -> AsyncIterator[bytes]:
        def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
            data = {
                "id": "chatcmpl-fake",
                "object": "chat.completion.chunk",
                "created": 0,
                "model": MODEL,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }
            return b"data: " + json.dumps(data).encode() + b"\n\n"

        try:
            yield chunk({"role": "assistant", "content": ""})
            if reply.get("tool_calls"):
                call = reply["tool_calls"][0]
                head = {"index": 0, "id": call["id"], "type": "function"}
                head["function"] = {"name": call["function"]["name"], "arguments": ""}
                yield chunk({"tool_calls": [head]})
                arguments = call["function"]["arguments"]
                for piece in (arguments[:5], arguments[5:]):
                    yield chunk({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]})
                yield chunk({}, "tool_calls")
            else:
                words = str(reply["content"]).split(" ")
                for i, word in enumerate(words):
                    yield chunk({"content": word if i == 0 else " " + word})
                    if stall and i == 0:
                        self.stall_started.set()
                        await asyncio.sleep(3600)
                yield chunk({}, "stop")
            if usage is not None:
                data = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0}
                data.update(model=MODEL, choices=[], usage=usage)
                yield b"data: " + json.dumps(data).encode() + b"\n\n"
            yield b"data: [DONE]\n\n"
        except (asyncio.CancelledError, GeneratorExit):
            with self._lock:
                self.cancelled += 1
            raise

    # -- running ---------------------------------------------------------------------

    def start(self) -> FakeVLLM:
        self.server, self.url = serve_in_thread(self.app)
        return self

    def stop(self) -> None:
        if self.server is not None:
            stop_server(self.server)


async def _in_one_write(events: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    yield b"".join([event async for event in events])


async def _first_two(events: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    count = 0
    async for event in events:
        yield event
        count += 1
        if count == 2:
            return


async def _then(events: AsyncIterator[bytes], error: dict[str, Any]) -> AsyncIterator[bytes]:
    async for event in events:
        yield event
    yield b"data: " + json.dumps(error).encode() + b"\n\n"
    yield b"data: [DONE]\n\n"


def free_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


def serve_in_thread(app: Any) -> tuple[uvicorn.Server, str]:
    """Run ``app`` under uvicorn on a free port in a daemon thread; (server, base URL)."""
    sock = free_socket()
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=1)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    server_thread[id(server)] = thread
    return server, f"http://127.0.0.1:{port}"


server_thread: dict[int, threading.Thread] = {}


def stop_server(server: uvicorn.Server) -> None:
    server.should_exit = True
    thread = server_thread.pop(id(server), None)
    if thread is not None:
        thread.join(10)
