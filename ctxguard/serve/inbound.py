"""Reading and checking a request body before anything is stored or forwarded."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ctxguard.errors import InvalidMessageError
from ctxguard.messages import Message
from ctxguard.serve.openai_errors import ApiError, bad_request

if TYPE_CHECKING:  # parse_chat is used without Starlette (the LiteLLM guardrail)
    from starlette.requests import Request


async def read_json(request: Request, max_bytes: int) -> dict[str, Any]:
    """The body as a JSON object; 413 past ``max_bytes`` (read no further), 400 if not JSON."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise _too_large(max_bytes)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise _too_large(max_bytes)
        chunks.append(chunk)
    try:
        body = json.loads(b"".join(chunks), parse_constant=_no_constant)
    except _NotJSON as exc:
        raise bad_request(
            f"the request body holds {exc}, which JSON has not; send a number or null",
            code="invalid_json",
        ) from None
    except (ValueError, RecursionError):
        raise bad_request("the request body is not valid JSON", code="invalid_json") from None
    if not isinstance(body, dict):
        raise bad_request(
            f"the request body must be a JSON object, got {type(body).__name__}",
            code="invalid_json",
        )
    return body


class _NotJSON(ValueError):
    """NaN, Infinity or -Infinity: Python's json reads them, JSON (and the upstream) not."""


def _no_constant(name: str) -> Any:
    raise _NotJSON(name)


def _too_large(max_bytes: int) -> ApiError:
    return ApiError(413, f"the request body is over {max_bytes} bytes", code="request_too_large")


@dataclass(frozen=True)
class ChatRequest:
    """The parts of a chat completions body the gateway acts on (the rest is forwarded)."""

    messages: list[dict[str, Any]]
    stream: bool
    max_tokens: int | None
    tools: list[dict[str, Any]] | None


def parse_chat(body: dict[str, Any]) -> ChatRequest:
    """Check the fields the gateway reads; every message is validated like the Guard would."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' must be a non-empty array of messages", param="messages")
    for index, message in enumerate(messages):
        try:
            Message.from_openai(message)
        except InvalidMessageError as exc:
            raise bad_request(
                f"messages[{index}]: {exc}", param=f"messages[{index}]", code="invalid_message"
            ) from None
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise bad_request("'stream' must be true or false", param="stream")
    max_tokens: int | None = None
    for name in ("max_completion_tokens", "max_tokens"):
        value = body.get(name)
        if value is None:
            continue
        if type(value) is not int or value < 1:
            raise bad_request(f"'{name}' must be a positive integer", param=name)
        max_tokens = value if max_tokens is None else max_tokens
    tools = body.get("tools")
    if tools is not None and (
        not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools)
    ):
        raise bad_request("'tools' must be an array of tool objects", param="tools")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise bad_request("'stream_options' must be an object", param="stream_options")
    return ChatRequest(list(messages), stream, max_tokens, tools or None)
