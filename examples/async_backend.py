"""An asyncio chatbot backend turn, with tool calls, on the in-process store.

What a FastAPI (or any asyncio) handler does per request: prepare the request
under the server's limit, call the model, store the reply with the server's
usage. The "model" here is a local function that asks for a tool once, so the
example runs anywhere; swap ``fake_model`` for your OpenAI-compatible client.

    python examples/async_backend.py
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from ctxguard import AsyncGuard, PreparedRequest

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "order_status",
            "description": "Look up an order",
            "parameters": {"type": "object", "properties": {"order": {"type": "string"}}},
        },
    }
]


async def fake_model(request: PreparedRequest) -> dict[str, Any]:
    """Stands in for ``client.chat.completions.create(**request.request_kwargs())``."""
    last = request.messages[-1]
    if last.role == "user" and "order" in last.text:
        call = {
            "id": "call_1",
            "type": "function",
            "function": {"name": "order_status", "arguments": json.dumps({"order": "1138"})},
        }
        message = {"role": "assistant", "content": None, "tool_calls": [call]}
    else:
        message = {"role": "assistant", "content": f"Done ({len(request.messages)} messages seen)."}
    return {"message": message, "usage": {"prompt_tokens": request.tokens, "completion_tokens": 9}}


async def handle(guard: AsyncGuard, session: str, new: list[dict[str, Any]]) -> dict[str, Any]:
    """One backend turn: prepare, call the model, store the reply (tool turns loop)."""
    while True:
        request = await guard.prepare(session, new, max_tokens=256, tools=TOOLS)
        answer = await fake_model(request)
        await guard.complete(session, answer["message"], prepared=request, usage=answer["usage"])
        print(f"  turn {request.turn}: {request.tokens} tokens of {request.prompt_budget} allowed")
        calls = answer["message"].get("tool_calls")
        if not calls:
            return answer["message"]
        new = [
            {"role": "tool", "tool_call_id": c["id"], "content": '{"status": "shipped"}'}
            for c in calls
        ]


async def main() -> None:
    guard = AsyncGuard("memory://", counter="approx", limit=2048)
    await guard.append("s1", [{"role": "system", "content": "You are a support agent."}])
    reply = await handle(guard, "s1", [{"role": "user", "content": "Where is my order?"}])
    print("reply:", reply["content"])
    reply = await handle(guard, "s1", [{"role": "user", "content": "Thanks!"}])
    print("reply:", reply["content"])
    audit = [r for r in await guard.store.read_audit("s1") if r["kind"] == "request"]
    print(
        f"{len(audit)} requests audited; every one within its limit:",
        all(r["tokens"] + r["reserved_output"] <= r["limit"] for r in audit),
    )
    await guard.aclose()


if __name__ == "__main__":
    asyncio.run(main())
