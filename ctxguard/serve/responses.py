"""``POST /v1/responses`` and ``GET /v1/responses/{id}``, backed by the Redis session.

The state vLLM keeps in process memory lives in the session instead: a response id
names its session (``resp_<session, base64url>.<reply message id>``), so
``previous_response_id`` continues that session and ``GET`` reads the reply back.
``conversation`` is a session id. Requests are translated to the upstream's chat
completions and fitted by the same Guard (truncation is always ``auto``).

Supported: text input (string, or ``message`` items with text parts), ``instructions``
(stored once as a pinned system message; the same text is not stored again),
function tools, ``function_call`` and ``function_call_output`` items, ``store``,
``max_output_tokens``, ``text.format`` (as chat's ``response_format``). Not yet:
streaming, branching from an older response (the session continues from its newest
message), ``truncation: "disabled"``, built-in tools, images and files,
``/v1/responses/compact``.
"""

from __future__ import annotations

import base64
import binascii
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
from ctxguard.serve.openai_errors import ApiError, bad_request
from ctxguard.serve.outcomes import usable_usage
from ctxguard.serve.responses_input import chat_response_format, chat_tools, input_messages
from ctxguard.serve.sse import finish_of, reply_of
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
    # the key first: a client without one is told so, not about its body (read after)
    tenant = identity.tenant_of(request.headers, gw.config.api_keys, gw.config.tenant)
    body = await read_json(request, gw.config.max_body_bytes, gw.config.upstream_timeout)
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
    chat_response_format(body.get("text"))  # a bad text.format: 400 before anything is stored
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
        raise gw.answer(
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
        if not store:  # (the conversation is the session: its turns are stored)
            raise bad_request(
                "store: false with conversation is not supported yet; leave out store, or "
                "the conversation for a stateless request",
                param="store",
            )
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
    response_format = chat_response_format(body.get("text"))
    if response_format is not None:
        out["response_format"] = response_format
    data, _ = await turn.sent(post_json(gw, f"{gw.upstream}{CHAT_PATH}", out))
    try:
        reply = reply_of(data)
    except ValueError:
        raise bad_reply(gw) from None
    rid = (
        response_id(turn.session_id, turn.reply_id)
        if turn.stored
        else "resp_" + identity.reply_id([turn.session_id], "stateless")[5:]
    )
    usage = usable_usage(data.get("usage")) or {}
    metadata = {
        "model": str(data.get("model") or body.get("model", "")),
        "usage": usage,
        "previous_response_id": body.get("previous_response_id"),
        "conversation": conversation,
        "store": turn.stored,
    }
    await turn.store_reply(reply, usage, metadata, finish_of(data))
    message = Message.from_openai(reply, id=turn.reply_id or "stateless", metadata=metadata)
    return JSONResponse(response_object(message, rid))


async def get_response(request: Request) -> Response:
    gw: Gateway = request.app.state.gateway
    tenant = identity.tenant_of(request.headers, gw.config.api_keys, gw.config.tenant)
    value = request.path_params["response_id"]
    session, reply = parse_response_id(value, "response_id")
    try:
        guard = await gw.guard_async(tenant)
        stored = await gw.run(guard.store.read, session)
    except CtxGuardError as exc:
        raise gw.answer(exc) from None
    for item in reversed(stored):
        if item.message.id == reply and item.message.role == "assistant":
            return JSONResponse(response_object(item.message, value))
    raise ApiError(404, f"no response {value!r} is stored", code="not_found")
