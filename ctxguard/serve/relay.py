"""Relaying an upstream SSE stream to the client, event by event, with disconnect handling.

Each complete event goes to the client as soon as it arrives (the usage-only chunk is
held back when the gateway, not the client, asked for it). A client that goes away
cancels the relay: the upstream response is closed (so the model server stops
generating) and the finish callback runs shielded from the cancellation, with the
reason (``None`` when the reply finished). A stream that ends unfinished (an error event
from the upstream, a cut, a timeout, a body that is not SSE, a stream past
``forward.MAX_STREAM_BYTES`` that would never end) ends with the gateway's own
error event and no ``[DONE]``, so the client never takes a partial reply for a whole one.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping

import anyio
import httpx
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from ctxguard.serve import forward
from ctxguard.serve.openai_errors import ApiError, what_failed
from ctxguard.serve.sse import EventSplitter, ReplyAssembler, clean_event, error_of, event_data

log = logging.getLogger("ctxguard.serve")

Finish = Callable[[str | None], Awaitable[None]]


class StreamRelay:
    """Upstream bytes in, client events out. Events are kept as bytes and parsed once, when
    the reply is assembled after the stream (nothing but a substring test per event on the
    way, so relaying costs little more than copying)."""

    def __init__(
        self,
        upstream: httpx.Response,
        drop_usage: bool,
        scrub: Callable[[str], str] = str,
        stall_seconds: float | None = None,
    ) -> None:
        self.upstream = upstream
        # the longest wait for an event with data (``--upstream-timeout``): each read has
        # that timeout too, but bytes that never make an event (a byte every few hundred
        # ms) kept the stream, and the upstream connection, open for ever
        self.stall_seconds = stall_seconds
        self.drop_usage = drop_usage
        self.scrub = scrub  # for what the upstream says in an error event
        self.events: list[bytes] = []  # every event as received, parsed only on demand
        self.splitter = EventSplitter()
        self.attempt = uuid.uuid4().hex
        self.held = b""
        self.failed = False  # the upstream put an error in the stream: nothing more is sent
        self._assembler: ReplyAssembler | None = None
        self._folded = 0

    def events_of(self, data: bytes) -> list[bytes]:
        """The events to forward from one upstream read. An error event (generation failed
        after the stream started) is not forwarded as it came: the stream ends with the
        gateway's own error event in its place (the upstream's text scrubbed), and no
        ``[DONE]``."""
        out: list[bytes] = []
        for raw in self.splitter.feed(data):
            if self.failed:
                break
            event = clean_event(raw)
            if event is None:
                continue
            if b'"error"' in event and self._error(event):
                break
            self.events.append(event)
            if b"[DONE]" in event or (self.drop_usage and b'"usage"' in event):
                payload = event_data(event)
                if payload is not None:
                    if payload.strip() == "[DONE]":
                        self.held = event  # sent once the reply is stored
                        continue
                    if self.drop_usage and _usage_only(payload):
                        continue
            out.append(event)
        return out

    def _error(self, event: bytes) -> bool:
        payload = event_data(event)
        try:
            chunk = json.loads(payload) if payload is not None else None
        except ValueError:
            return False
        message = error_of(chunk) if isinstance(chunk, dict) else None
        if message is None:
            return False
        self.failed = True
        self.held = _error_event(
            f"the model server failed mid-stream: {self.scrub(message)[:300]}; the reply "
            "was not stored, send the request again",
            "upstream_error",
        )
        return True

    def end(self, reason: str) -> None:
        """The stream ended unfinished (``reason``): it ends with an error event in place
        of whatever it left unfinished (a partial event, or a body that was not SSE)."""
        self.splitter.rest()
        if not self.failed and not self.held:
            what = "ended the stream" if self.events else "answered with no event stream"
            self.held = _error_event(
                f"the model server {what} before the reply finished; the reply was not "
                "stored, send the request again",
                reason,
            )

    def end_too_large(self, cap: int) -> None:
        """The upstream streamed past ``cap`` bytes: the stream ends with an error event,
        the reply not stored."""
        self.held = _error_event(
            f"the model server streamed more than {cap} bytes without finishing the reply; "
            "the reply was not stored, ask for fewer output tokens",
            "upstream_too_large",
        )
        self.end("upstream_too_large")

    @property
    def assembler(self) -> ReplyAssembler:
        """The reply folded from every chunk so far (each parsed once, on first use)."""
        if self._assembler is None:
            self._assembler = ReplyAssembler()
        for event in self.events[self._folded :]:
            payload = event_data(event)
            if payload is not None:
                self._assembler.add(payload)
        self._folded = len(self.events)
        return self._assembler


def _usage_only(payload: str) -> bool:
    try:
        chunk = json.loads(payload)
    except ValueError:
        return False
    return isinstance(chunk, dict) and not chunk.get("choices") and chunk.get("usage") is not None


class RelayResponse(Response):
    """A streaming response that watches for the client going away while it streams."""

    def __init__(self, relay: StreamRelay, finish: Finish, headers: Mapping[str, str]) -> None:
        self.relay = relay
        self.finish = finish
        self.status_code = 200
        self.background = None
        self.media_type = "text/event-stream"
        self.init_headers({**headers, "Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        reason: str | None = "client_disconnected"
        async with anyio.create_task_group() as group:

            async def watch() -> None:
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        group.cancel_scope.cancel()
                        return

            group.start_soon(watch)
            try:
                reason = await self._stream(send)
            except OSError:
                reason = "client_disconnected"
            finally:
                group.cancel_scope.cancel()
        with anyio.CancelScope(shield=True):
            await self.relay.upstream.aclose()
            try:
                await self.finish(reason)  # stored before the client sees [DONE]
            except Exception as exc:  # the client already has a 200: say it in the stream
                log.error("storing a streamed reply failed: %s", type(exc).__name__)
                self.relay.held = _error_event(
                    exc.message
                    if isinstance(exc, ApiError)
                    else "the reply could not be stored (an internal error: the gateway's log "
                    "names it); send the request again",
                    (exc.code if isinstance(exc, ApiError) else None) or "reply_not_stored",
                )
            if reason != "client_disconnected":
                with contextlib.suppress(OSError):
                    tail = self.relay.held + self.relay.splitter.rest()
                    if tail.strip():
                        await send({"type": "http.response.body", "body": tail, "more_body": True})
                    await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _stream(self, send: Send) -> str | None:
        """Start the response and relay every event but ``[DONE]``; the reason it ended."""
        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        )
        relay = self.relay
        size = 0
        last_data = time.monotonic()
        try:
            async for data in relay.upstream.aiter_bytes():  # (decoded, if it came compressed)
                size += len(data)
                if size > forward.MAX_STREAM_BYTES:  # a stream that never ends: cut, not kept
                    relay.end_too_large(forward.MAX_STREAM_BYTES)
                    return "upstream_too_large"
                # the events one read brought, in one write (each as soon as it is whole)
                events = relay.events_of(data)
                if events:
                    body = events[0] if len(events) == 1 else b"".join(events)
                    await send({"type": "http.response.body", "body": body, "more_body": True})
                if relay.held or any(b"data:" in event for event in events):
                    last_data = time.monotonic()
                elif (
                    relay.stall_seconds is not None
                    and time.monotonic() - last_data > relay.stall_seconds
                ):
                    raise httpx.ReadTimeout("no event with data within the upstream timeout")
                if relay.failed:
                    relay.end("upstream_error")
                    return "upstream_error"
        except httpx.HTTPError as exc:
            timed_out = isinstance(exc, httpx.TimeoutException)
            reason = "upstream_timeout" if timed_out else "upstream_lost"
            log.warning("the model server stopped mid-stream: %s", type(exc).__name__)
            relay.held = _error_event(
                f"the model server stopped mid-stream ({what_failed(exc)}); the reply was "
                "not stored, send the request again",
                reason,
            )
            relay.end(reason)
            return reason
        if relay.held:  # [DONE] came: finished, and no chunk needs parsing here
            return None
        if relay.assembler.finished:
            return None
        relay.end("upstream_ended")
        return "upstream_ended"


def _error_event(message: str, code: str) -> bytes:
    error = {"error": {"message": message, "type": "upstream_error", "param": None, "code": code}}
    return b"data: " + json.dumps(error).encode() + b"\n\n"


def relay_response(relay: StreamRelay, finish: Finish, headers: Mapping[str, str]) -> RelayResponse:
    return RelayResponse(relay, finish, headers)
