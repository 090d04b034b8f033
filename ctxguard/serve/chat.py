"""``POST /v1/chat/completions``: fit with the Guard, forward, store the reply.

Session mode (a session id, see :mod:`ctxguard.serve.identity`): the client sends only
its new messages; :meth:`Guard.prepare` stores them (ids derived, so a retry stores
nothing twice) and returns the window; the window goes upstream with ``max_tokens`` set
to the reserve when the client gave none; the reply (assembled from the stream when
streaming, tool calls included) is stored by :meth:`Guard.complete` with the usage.
With ``--commit with_reply`` the prepare stores nothing: the complete stores the new
messages, the reply and the request record in one step, so a request that gets no whole
reply (the upstream refused it or failed, a timeout, the client gone) leaves the session
as it was (nothing to take back, no ``partial_reply`` record).
Stateless mode: the request's own messages are fitted on an in-memory guard and
nothing is kept. A request that cannot fit is never forwarded.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from starlette.requests import Request
from starlette.responses import Response

from ctxguard import Guard, PreparedRequest
from ctxguard.errors import ConflictError, CtxGuardError
from ctxguard.messages import Message
from ctxguard.serve import identity
from ctxguard.serve.forward import bad_reply, encode_json, post_json, send_upstream
from ctxguard.serve.gateway import Gateway, stored_anchor
from ctxguard.serve.idempotency import DIGEST_FIELD, KEY_FIELD, KeyLease, body_digest, wait_for_key
from ctxguard.serve.inbound import ChatRequest, check_storable, parse_chat, read_json
from ctxguard.serve.outcomes import (
    refuses_request,
    reply_not_stored,
    upstream_api_error,
    usable_usage,
)
from ctxguard.serve.relay import StreamRelay, relay_response
from ctxguard.serve.replay import replay_response
from ctxguard.serve.sse import finish_of, reply_of

CHAT_PATH = "/v1/chat/completions"
log = logging.getLogger("ctxguard.serve")
PREPARE_ATTEMPTS = 4
Reply = Callable[[], tuple[dict[str, Any], dict[str, Any] | None]]  # reply message, usage
T = TypeVar("T")


class NoReply(Exception):
    """A stream that finished (``[DONE]``) with no reply in it: nothing to store."""


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
    lease: KeyLease | None = None  # held while an Idempotency-Key runs
    prepared: PreparedRequest | None = field(default=None)
    tenant: str | None = None
    anchor_due: bool = False  # the anchor is read in prepare's thread, under the lock
    key: str | None = None  # the Idempotency-Key, kept in the reply's metadata
    digest: str | None = None  # with the request body's digest (``body_digest``)
    # each message's place in the request ("messages[i]"; /v1/responses: "input[i]" ...)
    places: list[str] | None = None

    def identify(self, anchor: str) -> None:
        """The new messages' ids and the reply's id, derived from ``anchor``."""
        chat = self.chat.messages
        ids = identity.message_ids(self.tenant, self.session_id, anchor, chat)
        self.reply_id = identity.reply_id(ids, anchor)
        self.messages = [Message.from_openai(m, id=i) for m, i in zip(chat, ids, strict=True)]

    def made_ids(self) -> dict[str, str]:
        """The ids the gateway made for this request's messages (the client sent none),
        each to the message's place in the request: for errors that name a message."""
        places = self.places or [f"messages[{i}]" for i in range(len(self.chat.messages))]
        return {
            m.id: place
            for m, raw, place in zip(self.messages, self.chat.messages, places, strict=False)
            if raw.get("id") != m.id
        }

    async def complete(
        self,
        reply: dict[str, Any],
        usage: dict[str, Any] | None,
        metadata: dict[str, Any] | None = None,
    ) -> None:
        await self._complete(lambda: (reply, usage), metadata)

    async def complete_stream(self, relay: StreamRelay) -> None:
        """:meth:`complete` with the reply assembled from the relayed events, in the same
        worker-thread call (the event loop parses no chunk); :class:`NoReply` when the
        events held no reply (``[DONE]`` and nothing before it that a choice said), with a
        session or without (a client must not take an empty stream for a whole reply, as a
        non-streaming answer without a choice is a 502)."""

        def build() -> tuple[dict[str, Any], dict[str, Any] | None]:
            if not relay.assembler.replied:
                raise NoReply
            return relay.assembler.message(), relay.assembler.usage

        if not self.stored:  # nothing to store, but an empty stream is no reply either
            if not await self.gateway.run(lambda: relay.assembler.replied):
                raise NoReply
            return
        await self._complete(build, None)

    async def _complete(self, build: Reply, metadata: dict[str, Any] | None) -> None:
        if not self.stored:
            return
        if self.key is not None:  # (a later request with the key and another body is told)
            metadata = {**(metadata or {}), KEY_FIELD: self.key}
            if self.digest is not None:
                metadata[DIGEST_FIELD] = self.digest
        await self.gateway.complete_with(lambda: self._complete_blocking(build, metadata))

    def _complete_blocking(self, build: Reply, metadata: dict[str, Any] | None) -> None:
        reply, usage = build()
        if reply.get("content") == "" and not reply.get("tool_calls"):
            log.warning(  # (stored: a server may end a reply at once; never silently)
                "the model's reply has no content, tool call, refusal or audio transcript; "
                "it is stored as an empty assistant turn (reply id %s)",
                self.reply_id,
            )
        message = Message.from_openai(reply, id=self.reply_id, metadata=metadata)
        usage = usable_usage(usage)
        self.guard.complete(self.session_id, message, prepared=self.prepared, usage=usage)

    async def store_reply(
        self,
        reply: dict[str, Any],
        usage: dict[str, Any] | None,
        metadata: dict[str, Any] | None = None,
        finish: str | None = None,
    ) -> None:
        """:meth:`complete` for a non-streaming answer (``finish``: its finish_reason): a
        failure is a 503 that says the model did answer, and whether a retry is safe
        (``outcomes.retry_advice``), or what to raise when the output limit cut a tool call."""
        keyed = self.lease is not None
        try:
            await self.complete(reply, usage, metadata)
        except CtxGuardError as exc:
            raise reply_not_stored(exc, keyed, self.cut_by_length(reply, finish)) from None

    def cut_by_length(self, reply: dict[str, Any], finish: str | None) -> str | None:
        """The output-limit field(s) to raise when ``reply`` is a tool call the limit cut
        (``finish_reason: "length"``), else None (see ``outcomes.reply_not_stored``)."""
        if finish != "length" or not reply.get("tool_calls"):
            return None
        field = self.chat.max_tokens_field
        return "max_tokens / max_completion_tokens" if field != "max_output_tokens" else field

    async def record_partial(self, relay: StreamRelay, reason: str) -> None:
        """An audit record for a reply that did not finish (nothing appended); none when
        the prepare stored nothing (``commit="with_reply"``: such a request leaves the
        session as it was)."""
        if not self.stored or (self.prepared is not None and self.prepared.unstored is not None):
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

    async def sent(self, call: Awaitable[T]) -> T:
        """``call`` (the upstream request); when the upstream refuses the request itself
        (``outcomes.refuses_request``: a 400, 404, 413, 415, 422 ...), what this request
        stored is taken back (:meth:`take_back`) before the refusal goes on."""
        try:
            return await call
        except Exception as exc:
            if refuses_request(exc):
                await self.take_back()
            raise

    async def take_back(self) -> None:
        """Take back the new messages this request's prepare stored, in one atomic, audited
        ``store.retract`` checked against the state token that write left: the client got
        an error and may never send the request again, so the session must not keep a user
        turn with no reply. A prepare that stored nothing (``commit="with_reply"``: no
        ``stored_ids``) has nothing to take back: nothing is written. Another write since
        (another request's turn): nothing is taken back (the checked retract refuses,
        nothing written), logged. A store that fails is logged; the client gets the
        upstream's answer either way."""
        prepared = self.prepared
        if not self.stored or prepared is None or not prepared.stored_ids:
            return
        self.prepared = None  # (taken back once)
        count, token = len(prepared.stored_ids), prepared.state_token
        ttl = self.guard.config.ttl_seconds or 0
        try:
            await self.gateway.run(
                self.guard.store.retract, self.session_id, count, None, ttl, token
            )
        except ConflictError:
            log.info(
                "the model server refused a request, but its session changed since the "
                "request was stored: its %d message(s) stay stored",
                count,
            )
        except CtxGuardError as exc:
            log.warning(
                "the model server refused a request; taking back its %d stored message(s) "
                "failed (%s): they stay stored",
                count,
                type(exc).__name__,
            )

    def release(self) -> None:
        if self.lease is not None:
            self.lease.release()
            self.lease = None


async def chat_completions(request: Request) -> Response:
    gw: Gateway = request.app.state.gateway
    headers = request.headers
    # the key first: a client without one is told so, not about its body (read after)
    tenant = identity.tenant_of(headers, gw.config.api_keys, gw.config.tenant)
    body = await read_json(request, gw.config.max_body_bytes, gw.config.upstream_timeout)
    chat = parse_chat(body)
    session_id, where = identity.session_id_of(headers, body)
    if session_id is not None:
        check_storable(chat)
    turn: Turn | None = None
    try:
        turn, replay = await open_turn(
            gw, tenant, session_id, chat, headers, body_digest(CHAT_PATH, body)
        )
        if replay is not None:
            return replay_response(replay, body, chat.stream)
        try:
            return await _fit_and_forward(gw, turn, body, chat)
        except BaseException:
            turn.release()
            raise
    except CtxGuardError as exc:
        raise gw.answer(
            exc,
            session_param=where or "X-Session-Id",
            output_param=chat.max_tokens_field,
            names=None if turn is None else turn.made_ids(),
        ) from None


async def open_turn(
    gw: Gateway,
    tenant: str | None,
    session_id: str | None,
    chat: ChatRequest,
    headers: Any,
    digest: str,
) -> tuple[Turn, Message | None]:
    """The request's turn, and the recorded reply when its Idempotency-Key has one
    (``digest``: the body's, see :func:`ctxguard.serve.idempotency.body_digest`)."""
    if session_id is None:
        guard = await gw.stateless_guard_async()
        messages = [Message.from_openai(m) for m in chat.messages]
        sid = gw.stateless_session()
        return Turn(gw, guard, sid, False, "", messages, chat), None
    key = identity.idempotency_key_of(headers)
    guard = await gw.guard_async(tenant)
    turn = Turn(gw, guard, session_id, True, "", [], chat, tenant=tenant)
    if key is None:
        # the anchor (newest stored reply) is read in the same worker-thread call as
        # the prepare, under the session's lock (see prepare)
        turn.anchor_due = True
        return turn, None
    turn.identify(identity.idempotency_anchor(key))
    turn.key, turn.digest = key, digest
    # one request per key at a time, across workers and gateways on this store
    turn.lease, replay = await wait_for_key(gw, guard, session_id, key, turn.reply_id, digest)
    if replay is not None:
        return turn, replay
    return turn, None


async def _fit_and_forward(
    gw: Gateway, turn: Turn, body: dict[str, Any], chat: ChatRequest
) -> Response:
    out = dict(body)
    drop_usage = False
    if chat.stream:
        options = out.get("stream_options") or {}
        if not options.get("include_usage"):
            out["stream_options"] = {**options, "include_usage": True}
            drop_usage = True

    def encode(prepared: PreparedRequest) -> bytes:
        out["messages"] = prepared.openai_messages()
        if chat.max_tokens is None:
            out["max_tokens"] = prepared.reserved_output
        return encode_json(out)

    prepared, content = await prepare_encoded(gw, turn, chat, encode)
    headers = {
        "X-Ctxguard-Prompt-Tokens": str(prepared.tokens),
        "X-Ctxguard-Limit": str(prepared.limit),
        "X-Ctxguard-Dropped": str(sum(b - a for a, b in prepared.dropped)),
    }
    url = f"{gw.upstream}{CHAT_PATH}"
    if chat.stream:
        upstream = await turn.sent(send_upstream(gw, url, content, stream=True))
        relay = StreamRelay(upstream, drop_usage, gw.scrub, gw.config.upstream_timeout)
        return relay_response(relay, lambda reason: _finish_stream(turn, relay, reason), headers)
    try:
        data, raw = await turn.sent(post_json(gw, url, content))
        try:
            reply = reply_of(data)
        except ValueError:
            raise bad_reply(gw) from None
        await turn.store_reply(reply, data.get("usage"), finish=finish_of(data))
    finally:
        turn.release()
    return Response(raw, 200, headers, media_type="application/json")


async def prepare(gw: Gateway, turn: Turn, chat: ChatRequest) -> PreparedRequest:
    """``Guard.prepare`` for ``turn`` (see :func:`prepare_encoded`)."""
    prepared, _ = await prepare_encoded(gw, turn, chat, None)
    return prepared


async def prepare_encoded(
    gw: Gateway,
    turn: Turn,
    chat: ChatRequest,
    encode: Callable[[PreparedRequest], bytes] | None,
) -> tuple[PreparedRequest, bytes]:
    """``Guard.prepare``, serialised per session within this worker (fewer lost races), and
    tried again after a lost race or a failed count (nothing was stored; the message ids
    make it safe anyway). One worker-thread call does the blocking part of a turn: the
    anchor read, the prepare, the upstream body's encoding and (stateless) the delete."""
    return await gw.prepare_with(
        turn.guard.store, turn.session_id, lambda: _prepare_blocking(turn, chat, encode)
    )


def _prepare_blocking(
    turn: Turn, chat: ChatRequest, encode: Callable[[PreparedRequest], bytes] | None
) -> tuple[PreparedRequest, bytes]:
    guard = turn.guard
    try:
        if turn.anchor_due:  # read again on every try: a lost race may be a new reply
            turn.identify(
                stored_anchor(guard, turn.session_id, turn.gateway.config.idempotency_window)
            )
        prepared = guard.prepare(
            turn.session_id, turn.messages, max_tokens=chat.max_tokens, tools=chat.tools
        )
        turn.prepared = prepared
        return prepared, encode(prepared) if encode is not None else b""
    finally:
        if not turn.stored:
            guard.store.delete(turn.session_id)


async def _finish_stream(turn: Turn, relay: StreamRelay, reason: str | None) -> None:
    """After the stream: store the whole reply (a failure: ``reply_not_stored``, which
    the relay sends as the stream's last event), or audit the partial one."""
    keyed = turn.lease is not None
    try:
        if reason is None:
            try:
                await turn.complete_stream(relay)
            except CtxGuardError as exc:
                cut = turn.cut_by_length(relay.assembler.message(), relay.assembler.finish_reason)
                raise reply_not_stored(exc, keyed, cut) from None
            except NoReply:  # (a non-streaming answer without a choice is a 502 too)
                await turn.record_partial(relay, "upstream_bad_reply")
                raise upstream_api_error(
                    502,
                    f"the model server {turn.gateway.shown_upstream} ended the stream with no "
                    "reply in it; the reply was not stored, send the request again",
                    "upstream_bad_reply",
                ) from None
        else:
            await turn.record_partial(relay, reason)
    finally:
        turn.release()
