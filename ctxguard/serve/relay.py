"""Relaying an upstream SSE stream to the client, event by event, with disconnect handling.

Each complete event goes to the client as soon as it arrives (the usage-only chunk is
held back when the gateway, not the client, asked for it). A client that goes away
cancels the relay: the upstream response is closed (so the model server stops
generating) and the finish callback runs shielded from the cancellation, with the
reason (``None`` when the reply finished).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Awaitable, Callable, Mapping

import anyio
import httpx
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from ctxguard.serve.sse import EventSplitter, ReplyAssembler, event_data

Finish = Callable[[str | None], Awaitable[None]]


class StreamRelay:
    """Upstream bytes in, client events out; the reply assembled on the way."""

    def __init__(self, upstream: httpx.Response, drop_usage: bool) -> None:
        self.upstream = upstream
        self.drop_usage = drop_usage
        self.assembler = ReplyAssembler()
        self.splitter = EventSplitter()
        self.attempt = uuid.uuid4().hex
        self.error: str | None = None

    def events_of(self, data: bytes) -> list[bytes]:
        """The events to forward from one upstream read."""
        out: list[bytes] = []
        for event in self.splitter.feed(data):
            payload = event_data(event)
            chunk = self.assembler.add(payload) if payload is not None else None
            if (
                self.drop_usage
                and chunk is not None
                and not chunk.get("choices")
                and chunk.get("usage") is not None
            ):
                continue
            out.append(event)
        return out


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
            await self.finish(reason)

    async def _stream(self, send: Send) -> str | None:
        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        )
        relay = self.relay
        reason: str | None = None
        try:
            async for data in relay.upstream.aiter_raw():
                for event in relay.events_of(data):
                    await send({"type": "http.response.body", "body": event, "more_body": True})
        except httpx.HTTPError as exc:
            reason = (
                "upstream_timeout" if isinstance(exc, httpx.TimeoutException) else "upstream_lost"
            )
            error = {
                "error": {
                    "message": f"the model server stopped mid-stream ({type(exc).__name__})",
                    "type": "upstream_error",
                    "param": None,
                    "code": reason,
                }
            }
            body = b"data: " + json.dumps(error).encode() + b"\n\n"
            await send({"type": "http.response.body", "body": body, "more_body": True})
        rest = relay.splitter.rest()
        if rest.strip():
            await send({"type": "http.response.body", "body": rest, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        if reason is None and not relay.assembler.finished:
            reason = "upstream_ended"
        return reason


def relay_response(relay: StreamRelay, finish: Finish, headers: Mapping[str, str]) -> RelayResponse:
    return RelayResponse(relay, finish, headers)
