"""``POST /v1/chat/completions``: fit with the Guard, forward, store the reply.

Session mode (a session id, see :mod:`ctxguard.serve.identity`): the client sends only
its new messages; :meth:`Guard.prepare` stores them (ids derived, so a retry stores
nothing twice) and returns the window; the window goes upstream with ``max_tokens`` set
to the reserve when the client gave none; the reply (assembled from the stream when
streaming, tool calls included) is stored by :meth:`Guard.complete` with the usage.
Stateless mode: the request's own messages are fitted on an in-memory guard and
nothing is kept. A request that cannot fit is never forwarded.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
from starlette.requests import Request
from starlette.responses import Response

from ctxguard import Guard, PreparedRequest
from ctxguard.errors import CtxGuardError
from ctxguard.messages import Message
from ctxguard.serve import identity
from ctxguard.serve.gateway import Gateway, reply_not_stored, upstream_failure
from ctxguard.serve.inbound import ChatRequest, parse_chat, read_json
from ctxguard.serve.openai_errors import ApiError, from_ctxguard
from ctxguard.serve.relay import StreamRelay, relay_response
from ctxguard.serve.replay import replay_response
from ctxguard.serve.sse import reply_of

CHAT_PATH = "/v1/chat/completions"


@dataclass
class Turn:
    """One request's context: where it is stored and what it was given."""

    gateway: Gateway
    guard: Guard
    session_id: str
    stored: bool  # False in stateless mode
    reply_id: str
    messages: list[Message]
    chat: ChatRequest
    key: tuple[str | None, str, str] | None = None
    prepared: PreparedRequest | None = field(default=None)

    async def complete(
        self,
        reply: dict[str, Any],
        usage: dict[str, Any] | None,
        metadata: dict[str, Any] | None = None,
    ) -> None:
        if not self.stored:
            return
        await self.gateway.complete(
            self.guard, self.session_id, reply, self.reply_id, self.prepared, usage, metadata
        )

    async def store_reply(
        self,
        reply: dict[str, Any],
        usage: dict[str, Any] | None,
        metadata: dict[str, Any] | None = None,
    ) -> None:
        """:meth:`complete` for a non-streaming answer: a failure is a 503 that says the
        model did answer (a retry is safe: the same ids are stored once)."""
        try:
            await self.complete(reply, usage, metadata)
        except CtxGuardError as exc:
            raise reply_not_stored(exc) from None

    async def record_partial(self, relay: StreamRelay, reason: str) -> None:
        """An audit record for a reply that did not finish (nothing appended)."""
        if not self.stored:
            return
        text = "".join(relay.assembler.content)
        record: dict[str, Any] = {
            "rid": identity.reply_id([self.reply_id, relay.attempt], "partial"),
            "kind": "partial_reply",
            "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "reply_id": self.reply_id,
            "reason": reason,
            "chunks": relay.assembler.chunks,
            "content": text,
            "tool_calls": len(relay.assembler.tool_calls),
        }
        if self.prepared is not None:
            record["of_turn"] = self.prepared.turn
        config = self.guard.config
        await self.gateway.run(
            self.guard.store.add_audit,
            self.session_id,
            record,
            config.audit_retention,
            config.ttl_seconds or 0,
        )

    def release(self) -> None:
        if self.key is not None:
            event = self.gateway.inflight.pop(self.key, None)
            if event is not None:
                event.set()


async def chat_completions(request: Request) -> Response:
    gw: Gateway = request.app.state.gateway
    body = await read_json(request, gw.config.max_body_bytes)
    chat = parse_chat(body)
    headers = request.headers
    tenant = identity.tenant_of(headers, gw.config.api_keys, gw.config.tenant)
    session_id, where = identity.session_id_of(headers, body)
    try:
        turn, replay = await open_turn(gw, tenant, session_id, chat, headers)
        if replay is not None:
            return replay_response(replay, body, chat.stream)
        try:
            return await _fit_and_forward(gw, turn, body, chat)
        except BaseException:
            turn.release()
            raise
    except CtxGuardError as exc:
        raise from_ctxguard(exc, session_param=where or "X-Session-Id") from None


async def open_turn(
    gw: Gateway,
    tenant: str | None,
    session_id: str | None,
    chat: ChatRequest,
    headers: Any,
) -> tuple[Turn, Message | None]:
    if session_id is None:
        guard = await gw.run(gw.stateless_guard)
        messages = [Message.from_openai(m) for m in chat.messages]
        sid = gw.stateless_session()
        return Turn(gw, guard, sid, False, "", messages, chat), None
    key = identity.idempotency_key_of(headers)
    guard = await gw.run(gw.guard, tenant)
    window = gw.config.idempotency_window
    if key is not None:
        anchor = identity.idempotency_anchor(key)
        token = (tenant, session_id, key)
        while (event := gw.inflight.get(token)) is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), gw.config.upstream_timeout)
        gw.inflight[token] = asyncio.Event()
    else:
        anchor = await gw.anchor(guard, session_id)
        token = None
    ids = identity.message_ids(tenant, session_id, anchor, chat.messages)
    rid = identity.reply_id(ids, anchor)
    messages = [Message.from_openai(m, id=i) for m, i in zip(chat.messages, ids, strict=True)]
    turn = Turn(gw, guard, session_id, True, rid, messages, chat, key=token)
    if key is not None:
        try:
            stored = await gw.run(guard.store.read_last, session_id, window)
        except BaseException:
            turn.release()
            raise
        for item in stored:
            if item.message.id == rid:
                turn.release()
                return turn, item.message
    return turn, None


async def _fit_and_forward(
    gw: Gateway, turn: Turn, body: dict[str, Any], chat: ChatRequest
) -> Response:
    try:
        turn.prepared = await prepare(gw, turn, chat)
    finally:
        if not turn.stored:
            await gw.run(turn.guard.store.delete, turn.session_id)
    prepared = turn.prepared
    out = dict(body)
    out["messages"] = prepared.openai_messages()
    if chat.max_tokens is None:
        out["max_tokens"] = prepared.reserved_output
    headers = {
        "X-Ctxguard-Prompt-Tokens": str(prepared.tokens),
        "X-Ctxguard-Limit": str(prepared.limit),
        "X-Ctxguard-Dropped": str(sum(b - a for a, b in prepared.dropped)),
    }
    url = f"{gw.upstream}{CHAT_PATH}"
    if chat.stream:
        drop_usage = False
        options = out.get("stream_options") or {}
        if not options.get("include_usage"):
            out["stream_options"] = {**options, "include_usage": True}
            drop_usage = True
        upstream = await send_upstream(gw, url, out, stream=True)
        relay = StreamRelay(upstream, drop_usage)
        return relay_response(relay, lambda reason: _finish_stream(turn, relay, reason), headers)
    try:
        upstream = await send_upstream(gw, url, out, stream=False)
        try:
            data = upstream.json()
            reply = reply_of(data)
        except (ValueError, KeyError, TypeError, IndexError):
            raise ApiError(
                502,
                f"the model server {gw.shown_upstream} answered with an unreadable reply",
                type="upstream_error",
                code="upstream_bad_reply",
            ) from None
        await turn.store_reply(reply, data.get("usage"))
    finally:
        turn.release()
    return Response(upstream.content, 200, headers, media_type="application/json")


async def prepare(gw: Gateway, turn: Turn, chat: ChatRequest) -> PreparedRequest:
    return await gw.prepare(turn.guard, turn.session_id, turn.messages, chat.max_tokens, chat.tools)


async def send_upstream(
    gw: Gateway, url: str, body: dict[str, Any], *, stream: bool
) -> httpx.Response:
    """POST upstream; failures become OpenAI-shaped 502/504 (and upstream 4xx pass through)."""
    try:
        request = gw.client.build_request("POST", url, json=body)
        response = await gw.client.send(request, stream=stream)
    except httpx.HTTPError as exc:
        status, message, code = upstream_failure(exc, gw.shown_upstream)
        raise ApiError(status, message, type="upstream_error", code=code) from None
    if response.status_code == 200:
        return response
    try:
        await response.aread()
    except httpx.HTTPError:
        pass
    finally:
        await response.aclose()
    detail = _upstream_message(response)
    if 400 <= response.status_code < 500 and response.status_code != 408:
        raise ApiError(response.status_code, detail, code="upstream_rejected")
    raise ApiError(
        502,
        f"the model server answered HTTP {response.status_code}: {detail}",
        type="upstream_error",
        code="upstream_error",
    )


def _upstream_message(response: httpx.Response) -> str:
    try:
        data = response.json()
    except ValueError:
        return response.text[:300]
    error = data.get("error", data) if isinstance(data, dict) else data
    if isinstance(error, dict):
        return str(error.get("message", error))[:300]
    return str(error)[:300]


async def _finish_stream(turn: Turn, relay: StreamRelay, reason: str | None) -> None:
    """After the stream: store the whole reply, or audit the partial one."""
    try:
        if reason is None:
            await turn.complete(relay.assembler.message(), relay.assembler.usage)
        else:
            await turn.record_partial(relay, reason)
    finally:
        turn.release()
