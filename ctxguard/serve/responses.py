"""``POST /v1/responses`` and ``GET /v1/responses/{id}``, backed by the Redis session.

The state vLLM keeps in process memory lives in the session instead: a response id
names its session (``resp_<session, base64url>.<reply message id>``), so
``previous_response_id`` continues that session and ``GET`` reads the reply back.
``conversation`` is a session id. Requests are translated to the upstream's chat
completions and fitted by the same Guard (truncation is always ``auto``).

Supported: text input (string, or ``message`` items with text parts), ``instructions``
(stored once as a pinned system message; the same text is not stored again),
function tools, ``function_call`` and ``function_call_output`` items, ``store``,
``max_output_tokens``. Not yet: streaming, branching from an older response (the
session continues from its newest message), ``truncation: "disabled"``, built-in
tools, images and files, ``/v1/responses/compact``.
"""

from __future__ import annotations

import base64
import binascii
import json
import uuid
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ctxguard import Guard
from ctxguard.errors import CtxGuardError, InvalidIdError
from ctxguard.ids import validate_id
from ctxguard.messages import Message
from ctxguard.serve import identity
from ctxguard.serve.chat import CHAT_PATH, Turn, open_turn, prepare
from ctxguard.serve.forward import bad_reply, post_json
from ctxguard.serve.gateway import Gateway
from ctxguard.serve.idempotency import body_digest
from ctxguard.serve.inbound import ChatRequest, read_json
from ctxguard.serve.openai_errors import ApiError, bad_request, from_ctxguard, json_kind
from ctxguard.serve.sse import reply_of
from ctxguard.stores.base import StoredMessage

RESPONSES_PATH = "/v1/responses"


def response_id(session_id: str, reply_id: str) -> str:
    encoded = base64.urlsafe_b64encode(session_id.encode()).decode().rstrip("=")
    return f"resp_{encoded}.{reply_id}"


def parse_response_id(value: object, param: str) -> tuple[str, str]:
    """(session id, reply message id) of a response id this gateway made."""
    if not isinstance(value, str) or not value.startswith("resp_") or "." not in value:
        raise bad_request(f"{param} is not a response id of this gateway", param=param)
    encoded, _, reply = value[5:].partition(".")
    try:
        session = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode()
        return validate_id(session, param), validate_id(reply, param)
    except (binascii.Error, UnicodeDecodeError, ValueError, InvalidIdError):
        raise bad_request(f"{param} is not a response id of this gateway", param=param) from None


def _text_of(content: object, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") not in (
                "input_text",
                "output_text",
                "text",
            ):
                raise bad_request(
                    f"{where}: only text content parts are supported yet", param="input"
                )
            parts.append(str(part.get("text", "")))
        return "".join(parts)
    raise bad_request(f"{where}: content must be a string or a list of parts", param="input")


def input_messages(body: dict[str, Any], places: list[str] | None = None) -> list[dict[str, Any]]:
    """The request's ``instructions`` and ``input`` as chat messages; ``places``, when
    given, gets each message's place in the request (``instructions``, ``input[i]``).

    Function calls and their outputs are checked here, in the request's terms (the Guard
    would refuse the same in chat-completions terms, naming ids the client never saw)."""
    out: list[dict[str, Any]] = []
    where_of: list[str] = [] if places is None else places
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise bad_request("'instructions' must be a string", param="instructions")
        digest = identity.reply_id([instructions], "instructions")
        out.append({"role": "system", "content": instructions, "id": "gw-i-" + digest[5:]})
        where_of.append("instructions")
    items = body.get("input")
    if isinstance(items, str):
        where_of.append("input")
        return [*out, {"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise bad_request("'input' must be a string or a non-empty array of items", param="input")
    waiting: int | None = None  # the last function_call not followed by an output or user
    answered: dict[str, int] = {}  # call_id -> the output in the current run of outputs
    for index, item in enumerate(items):
        where = f"input[{index}]"
        if not isinstance(item, dict):
            raise bad_request(f"{where} must be an object", param="input")
        kind = item.get("type", "message")
        if kind != "function_call_output":
            answered.clear()
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise bad_request(f"{where}: unknown role {role!r}", param="input")
            out.append({"role": role, "content": _text_of(item.get("content"), where)})
            if role == "user":
                waiting = None
        elif kind == "function_call_output":
            call_id = _text_field(item, "call_id", where, "the id of the call it answers")
            if call_id in answered:
                raise bad_request(
                    f"{where} and input[{answered[call_id]}] both answer call_id {call_id!r}; "
                    "send one function_call_output per call",
                    param=f"{where}.call_id",
                )
            answered[call_id] = index
            output = item.get("output")
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": call_id,
                    "content": output if isinstance(output, str) else _text_of(output, where),
                }
            )
            waiting = None
        elif kind == "function_call":
            call = {
                "id": _text_field(item, "call_id", where, "the call's id"),
                "type": "function",
                "function": {
                    "name": _text_field(item, "name", where, "the function called"),
                    "arguments": _arguments(item, where),
                },
            }
            out.append({"role": "assistant", "content": None, "tool_calls": [call]})
            waiting = index
        else:
            raise bad_request(f"{where}: item type {kind!r} is not supported yet", param="input")
        where_of.append(where)
    if waiting is not None:  # (the Guard refuses it too, in its own terms)
        raise bad_request(
            f"input[{waiting}]: this function_call has no function_call_output after it; "
            "send its output after it, or leave it out (the gateway stores the model's "
            "calls itself)",
            param=f"input[{waiting}]",
        )
    return out


def _text_field(item: dict[str, Any], name: str, where: str, what: str) -> str:
    value = item.get(name)
    if not isinstance(value, str) or not value:
        raise bad_request(
            f"{where}.{name} must be a non-empty string ({what}), got {json_kind(value)}",
            param=f"{where}.{name}",
        )
    return value


def _arguments(item: dict[str, Any], where: str) -> str:
    value = item.get("arguments")
    if isinstance(value, str):
        try:
            json.loads(value)
            return value
        except (ValueError, RecursionError):
            pass
    shown = json_kind(value) if not isinstance(value, str) else repr(value[:40])
    raise bad_request(
        f"{where}.arguments must be a string holding the call's arguments as JSON, got {shown}",
        param=f"{where}.arguments",
    )


def chat_tools(tools: object) -> list[dict[str, Any]] | None:
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise bad_request("'tools' must be an array", param="tools")
    out = []
    for tool in tools:
        if not isinstance(tool, dict) or tool.get("type") != "function":
            raise bad_request("only function tools are supported yet", param="tools")
        function = {k: tool[k] for k in ("name", "description", "parameters") if k in tool}
        out.append({"type": "function", "function": function})
    return out or None


def output_items(reply: Message) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    text = reply.text
    if text:
        items.append(
            {
                "type": "message",
                "id": "msg_" + reply.id,
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        )
    for call in reply.tool_calls or ():
        items.append(
            {
                "type": "function_call",
                "id": "fc_" + call.id,
                "call_id": call.id,
                "name": call.function.name,
                "arguments": call.function.arguments,
                "status": "completed",
            }
        )
    return items


def response_object(reply: Message, rid: str) -> dict[str, Any]:
    meta = reply.metadata
    usage = meta.get("usage") or {}
    return {
        "id": rid,
        "object": "response",
        "created_at": int(reply.created_at.timestamp()),
        "status": "completed",
        "model": meta.get("model", ""),
        "output": output_items(reply),
        "previous_response_id": meta.get("previous_response_id"),
        "conversation": {"id": meta["conversation"]} if meta.get("conversation") else None,
        "store": meta.get("store", True),
        "truncation": "auto",
        "error": None,
        "incomplete_details": None,
        "usage": {
            "input_tokens": usage.get("prompt_tokens", 0),
            "output_tokens": usage.get("completion_tokens", 0),
            "total_tokens": usage.get("total_tokens", 0),
        },
    }


async def create_response(request: Request) -> Response:
    gw: Gateway = request.app.state.gateway
    body = await read_json(request, gw.config.max_body_bytes)
    if body.get("stream"):
        raise bad_request("streaming /v1/responses is not supported yet", param="stream")
    if body.get("truncation", "auto") != "auto":
        raise bad_request(
            "ctxguard serve always fits the request: only truncation 'auto' is supported",
            param="truncation",
        )
    store = body.get("store", True)
    if not isinstance(store, bool):
        raise bad_request("'store' must be true or false", param="store")
    max_tokens = body.get("max_output_tokens")
    if max_tokens is not None and (type(max_tokens) is not int or max_tokens < 1):
        raise bad_request(
            "'max_output_tokens' must be a positive integer", param="max_output_tokens"
        )
    tenant = identity.tenant_of(request.headers, gw.config.api_keys, gw.config.tenant)
    session, conversation = _session_of(body, store)
    places: list[str] = []
    messages = input_messages(body, places)
    tools = chat_tools(body.get("tools"))
    chat = ChatRequest(messages, False, max_tokens, tools, max_tokens_field="max_output_tokens")
    turn: Turn | None = None
    try:
        previous = body.get("previous_response_id")
        if previous is not None and session is not None:
            guard = await gw.guard_async(tenant)
            await gw.run(_check_previous, guard, session, previous, gw.config.idempotency_window)
        digest = body_digest(RESPONSES_PATH, body)
        turn, replay = await open_turn(gw, tenant, session, chat, request.headers, digest)
        turn.places = places
        if replay is not None:
            return JSONResponse(response_object(replay, response_id(session or "", replay.id)))
        try:
            return await _forward(gw, turn, body, chat, conversation)
        finally:
            turn.release()
    except CtxGuardError as exc:
        raise from_ctxguard(
            exc,
            session_param="conversation",
            output_param="max_output_tokens",
            names=None if turn is None else turn.made_ids(),
        ) from None


def _check_previous(guard: Guard, session: str, previous: str, window: int) -> None:
    """A 404, before anything is stored, unless ``previous`` names a reply (an assistant
    message) stored in its session (looked for among the newest ``window`` messages, then
    in the whole session)."""
    _, reply = parse_response_id(previous, "previous_response_id")

    def named(stored: list[StoredMessage]) -> bool:
        return any(s.message.id == reply and s.message.role == "assistant" for s in stored)

    found = named(guard.store.read_last(session, window))
    if not found and guard.store.info(session) is not None:
        found = named(guard.store.read(session))
    if not found:
        raise ApiError(
            404,
            f"previous response {previous!r} is not stored here; send the id of a response "
            "this gateway made, or start without previous_response_id",
            param="previous_response_id",
            code="previous_response_not_found",
        )


def _session_of(body: dict[str, Any], store: bool) -> tuple[str | None, str | None]:
    """(session id or None for stateless, conversation id if one was named)."""
    previous = body.get("previous_response_id")
    conversation = body.get("conversation")
    if isinstance(conversation, dict):
        conversation = conversation.get("id")
    if previous is not None and conversation is not None:
        raise bad_request(
            "use either previous_response_id or conversation, not both", param="conversation"
        )
    if previous is not None:
        session, _ = parse_response_id(previous, "previous_response_id")
        if not store:
            raise bad_request(
                "store: false with previous_response_id is not supported yet", param="store"
            )
        return session, None
    if conversation is not None:
        try:
            return validate_id(conversation, "conversation"), str(conversation)
        except InvalidIdError as exc:
            raise bad_request(str(exc), param="conversation") from None
    if not store:
        return None, None
    return "resp-" + uuid.uuid4().hex, None


async def _forward(
    gw: Gateway, turn: Turn, body: dict[str, Any], chat: ChatRequest, conversation: str | None
) -> Response:
    prepared = await prepare(gw, turn, chat)  # a stateless session is deleted in it
    out: dict[str, Any] = {
        "model": body.get("model", ""),
        "messages": prepared.openai_messages(),
        "max_tokens": prepared.reserved_output,
    }
    if chat.tools:
        out["tools"] = chat.tools
    for name in ("temperature", "top_p", "parallel_tool_calls", "tool_choice", "user"):
        if name in body:
            out[name] = body[name]
    data, _ = await post_json(gw, f"{gw.upstream}{CHAT_PATH}", out)
    try:
        reply = reply_of(data)
    except ValueError:
        raise bad_reply(gw) from None
    rid = (
        response_id(turn.session_id, turn.reply_id)
        if turn.stored
        else "resp_" + identity.reply_id([turn.session_id], "stateless")[5:]
    )
    metadata = {
        "model": str(data.get("model") or body.get("model", "")),
        "usage": data.get("usage") if isinstance(data.get("usage"), dict) else {},
        "previous_response_id": body.get("previous_response_id"),
        "conversation": conversation,
        "store": turn.stored,
    }
    await turn.store_reply(reply, metadata["usage"], metadata)
    message = Message.from_openai(reply, id=turn.reply_id or "stateless", metadata=metadata)
    return JSONResponse(response_object(message, rid))


async def get_response(request: Request) -> Response:
    gw: Gateway = request.app.state.gateway
    value = request.path_params["response_id"]
    session, reply = parse_response_id(value, "response_id")
    tenant = identity.tenant_of(request.headers, gw.config.api_keys, gw.config.tenant)
    try:
        guard = await gw.guard_async(tenant)
        stored = await gw.run(guard.store.read, session)
    except CtxGuardError as exc:
        raise from_ctxguard(exc) from None
    for item in reversed(stored):
        if item.message.id == reply and item.message.role == "assistant":
            return JSONResponse(response_object(item.message, value))
    raise ApiError(404, f"no response {value!r} is stored", code="not_found")
