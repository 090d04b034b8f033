"""The recorded reply for a repeated ``Idempotency-Key``, in the shape the client asked for."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from starlette.responses import JSONResponse, Response, StreamingResponse

from ctxguard.messages import Message


def replay_response(reply: Message, body: dict[str, Any], stream: bool) -> Response:
    """The recorded reply for a repeated Idempotency-Key, in the shape the client asked."""
    message = reply.to_openai()
    finish = "tool_calls" if message.get("tool_calls") else "stop"
    base = {
        "id": "chatcmpl-" + reply.id,
        "created": int(reply.created_at.timestamp()),
        "model": str(body.get("model", "")),
    }
    headers = {"Idempotent-Replayed": "true"}
    if not stream:
        payload = {
            **base,
            "object": "chat.completion",
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": None,
        }
        return JSONResponse(payload, headers=headers)
    delta: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
    if message.get("tool_calls"):
        delta["tool_calls"] = [{"index": i, **c} for i, c in enumerate(message["tool_calls"])]
    chunks = [
        {**base, "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta}]},
        {
            **base,
            "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": {}, "finish_reason": finish}],
        },
    ]

    async def events() -> AsyncIterator[bytes]:
        for chunk in chunks:
            yield b"data: " + json.dumps(chunk).encode() + b"\n\n"
        yield b"data: [DONE]\n\n"

    return StreamingResponse(events(), headers=headers, media_type="text/event-stream")
