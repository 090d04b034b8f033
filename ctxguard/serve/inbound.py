"""Reading and checking a request body before anything is stored or forwarded."""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ctxguard._validate import show
from ctxguard.errors import InvalidMessageError
from ctxguard.messages import Message, says_nothing
from ctxguard.serve.openai_errors import ApiError, bad_request, json_kind

if TYPE_CHECKING:  # parse_chat is used without Starlette (the LiteLLM guardrail)
    from starlette.requests import Request


async def read_json(request: Request, max_bytes: int, seconds: float) -> dict[str, Any]:
    """The body as a JSON object; 415 unless it is declared JSON, 413 past ``max_bytes``
    (read no further), 408 unless it has all come within ``seconds`` (uvicorn bounds no
    body read: a client sending a byte now and then held its request open for ever),
    400 if not JSON."""
    check_json_type(request.headers.get("content-type"))
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise _too_large(max_bytes)
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(seconds):
            async for chunk in request.stream():
                size += len(chunk)
                if size > max_bytes:
                    raise _too_large(max_bytes)
                chunks.append(chunk)
    except TimeoutError:
        raise ApiError(
            408,
            f"the request body did not arrive within {seconds:g} s; send it whole at once",
            code="request_timeout",
        ) from None
    text = _text_of(b"".join(chunks))
    try:
        body = json.loads(text, parse_constant=_no_constant)
    except _NotJSON as exc:
        raise bad_request(
            f"the request body holds {exc}, which JSON has not; send a number or null",
            code="invalid_json",
        ) from None
    except RecursionError:
        raise bad_request(
            "the request body nests arrays or objects too deeply to read; flatten it",
            code="invalid_json",
        ) from None
    except ValueError:
        raise bad_request("the request body is not valid JSON", code="invalid_json") from None
    if not isinstance(body, dict):
        raise bad_request(
            f"the request body must be a JSON object, got {json_kind(body)}",
            code="invalid_json",
        )
    if _SURROGATE_ESCAPE.search(text) is not None:  # (only an escape can make one now)
        found = lone_surrogate(body)
        if found is not None:
            where, param = found
            raise bad_request(
                f"{where} holds a lone UTF-16 surrogate (a \\ud800-\\udfff escape without "
                "its pair), which is not Unicode text; send the text as valid UTF-8",
                param=param,
                code="invalid_json",
            )
    return body


# a \uD800-\uDFFF escape: most are pairs (an emoji from an ASCII-only encoder), a few not
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89abcdefABCDEF]")


def _text_of(raw: bytes) -> str:
    """The body decoded as Python's json would (UTF-8, or UTF-16/32 told by its first
    bytes), but strictly: json's own decoding lets an encoded surrogate through
    (``surrogatepass``), a str no encoder takes when it is stored or forwarded."""
    try:
        return raw.decode(json.detect_encoding(raw))
    except UnicodeDecodeError:
        raise bad_request(
            "the request body is not UTF-8 text; send the JSON encoded as UTF-8",
            code="invalid_json",
        ) from None


def lone_surrogate(body: dict[str, Any]) -> tuple[str, str | None] | None:
    """Where ``body`` holds a string (or key) with a lone surrogate, in JSON-path terms
    (``messages[0].content``), and the field to name as ``param``; None if nowhere.
    Python's json reads ``"\\ud800"`` into a str that no UTF-8 encoder takes: found here,
    it is the client's 400, not a failure when the body is stored or forwarded. Walked
    without recursion (the body may nest deeply)."""
    stack: list[tuple[Any, str]] = [(body, "")]
    while stack:
        value, path = stack.pop()
        if isinstance(value, str):
            if not _is_unicode(value):
                return path, path
        elif isinstance(value, dict):
            items = list(value.items())
            for key, item in reversed(items):
                if not _is_unicode(key):
                    return (f"a key in {path}", path) if path else ("a key of the body", None)
                stack.append((item, f"{path}.{key[:40]}" if path else key[:40]))
        elif isinstance(value, list):
            stack.extend((item, f"{path}[{i}]") for i, item in reversed(list(enumerate(value))))
    return None


def _is_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_json_type(value: str | None) -> None:
    """A 415 unless ``value`` is ``application/json`` (parameters such as ``charset`` allowed),
    as vLLM answers: a body sent as text or a form was taken as JSON."""
    media = (value or "").split(";", 1)[0].strip().lower()
    if media != "application/json":
        given = f"Content-Type {show(media, 40)}" if media else "no Content-Type"
        raise ApiError(
            415,
            f"the request body must be sent as Content-Type: application/json, got {given}",
            param="Content-Type",
            code="unsupported_media_type",
        )


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
    n: int = 1  # choices asked for
    max_tokens_field: str = "max_tokens"  # the body field the output limit came in


def parse_chat(body: dict[str, Any]) -> ChatRequest:
    """Check the fields the gateway reads; every message is validated like the Guard would."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' must be a non-empty array of messages", param="messages")
    waiting: int | None = None  # the last assistant message calling tools, if unanswered
    for index, data in enumerate(messages):
        try:
            message = Message.from_openai(data)
        except InvalidMessageError as exc:
            raise _bad_message(index, str(exc)) from None
        if isinstance(data, dict) and data.get("content") == []:
            raise _bad_message(
                index,
                "content is an empty array of parts (OpenAI refuses it; stored, it would "
                'be in every later request); send at least one part, or a string such as ""',
            )
        if says_nothing(message):
            raise _bad_message(
                index,
                'an assistant message needs content or tool_calls; send content "" for an '
                "empty reply, or leave the message out",
            )
        if message.role in ("user", "tool"):
            waiting = None
        elif message.role == "assistant" and message.tool_calls:
            waiting = index
    if waiting is not None:  # (the Guard refuses it too, in its own terms)
        raise _bad_message(
            waiting,
            "this assistant message calls tools and no tool message after it answers them; "
            "send their results after it, or leave it out (the gateway stores the model's "
            "replies itself)",
        )
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise bad_request("'stream' must be true or false", param="stream")
    max_tokens: int | None = None
    field = "max_tokens"
    for name in ("max_completion_tokens", "max_tokens"):
        value = body.get(name)
        if value is None:
            continue
        if type(value) is not int or value < 1:
            raise bad_request(f"'{name}' must be a positive integer", param=name)
        # both given: the larger is reserved, so the request fits whichever one the
        # server reads (vLLM and SGLang read max_completion_tokens, others max_tokens)
        if max_tokens is None or value > max_tokens:
            max_tokens, field = value, name
    n = body.get("n")
    if n is None:
        n = 1
    if type(n) is not int or n < 1:
        raise bad_request("'n' must be a positive integer", param="n")
    tools = body.get("tools")
    if tools is not None and (
        not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools)
    ):
        raise bad_request("'tools' must be an array of tool objects", param="tools")
    for index, tool in enumerate(tools or ()):
        check_function_tool(tool.get("function"), tool.get("type", "function"), f"tools[{index}]")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise bad_request("'stream_options' must be an object", param="stream_options")
    usage = (options or {}).get("include_usage")
    if usage is not None and not isinstance(usage, bool):  # ("no" is truthy here)
        raise bad_request(
            "'stream_options.include_usage' must be true or false",
            param="stream_options.include_usage",
        )
    return ChatRequest(list(messages), stream, max_tokens, tools or None, n, field)


def check_function_tool(function: object, kind: object, where: str) -> None:
    """A 400 for a function tool without a name, before anything is stored or sent (the
    server refuses it, once the turn's messages were stored; the gateway leaves any
    other kind of tool to the server)."""
    if kind != "function":
        return
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str) or not name:
        raise bad_request(
            f"{where}: a function tool needs a 'function' object with a 'name' (a non-empty "
            "string)",
            param=where,
            code="invalid_tools",
        )


def check_storable(chat: ChatRequest) -> None:
    """What a request with a session asks that one stored reply cannot hold: a 400 before
    anything is stored or forwarded (a stateless request may ask it)."""
    if chat.n > 1:
        raise bad_request(
            f"'n': {chat.n} asks for {chat.n} choices, and a session stores one reply per "
            "turn; drop 'n' (or send 1), or send the request without a session id",
            param="n",
            code="unsupported_parameter",
        )


def _bad_message(index: int, problem: str) -> ApiError:
    where = f"messages[{index}]"
    return bad_request(f"{where}: {problem}", param=where, code="invalid_message")
