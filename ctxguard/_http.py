"""Every HTTP call ctxguard makes, with an overall deadline and a cap on the body.

httpx's timeouts bound each connect / read / write on its own, so a server that
drip-feeds bytes (a header line, or a one-byte chunk, every few hundred ms) keeps a
call alive forever. Here the configured timeout is a deadline for the whole call:
connect, headers and body.

* sync: the client's transport caps every socket operation at the time left until
  the deadline (a small :class:`httpcore.NetworkBackend` wrapper, read from a
  context variable so one client serves several calls and threads), and the body
  is streamed with the deadline checked between chunks;
* async: ``asyncio.timeout`` around the whole request.

On expiry the caller's own typed error is raised (``error``), naming the URL as the
caller shows it (redacted) and the deadline. Bodies are read up to :data:`MAX_BODY`
bytes, so a server streaming fast without end cannot exhaust memory.
"""

from __future__ import annotations

import asyncio
import base64
import contextvars
import json
import ssl
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import httpcore
import httpx

from ctxguard.errors import CtxGuardError

MAX_BODY = 16 * 1024 * 1024
# A pooled connection idle this long is closed, not reused. uvicorn (so vLLM and SGLang)
# closes one idle for 5 s; a client that keeps it as long (httpx's default is 5 s,
# httpcore's pool keeps it forever) can send on it in the instant the server closes
# it, and the call fails with no reply although the server is fine. 2 s leaves 3 s.
KEEPALIVE_EXPIRY = 2.0
# httpx's own pool sizes (100 connections, 20 kept idle): built alone, httpcore's pool
# holds 10, and the 11th concurrent call on one client waited for a free connection
# (the gateway counts through one vllm: counter from up to 40 worker threads).
LIMITS = httpx.Limits(
    max_connections=100, max_keepalive_connections=20, keepalive_expiry=KEEPALIVE_EXPIRY
)

# monotonic time by which the current call must be over (None: no call in progress)
_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "ctxguard_http_deadline", default=None
)


@dataclass(frozen=True)
class Reply:
    """A complete answer: status and body (at most MAX_BODY bytes)."""

    status_code: int
    content: bytes
    encoding: str = "utf-8"

    @property
    def text(self) -> str:
        return self.content.decode(self.encoding, errors="replace")

    def json(self) -> Any:
        """The body as JSON; ValueError when it is not (nested past the interpreter's
        recursion limit too: a server's body must not raise RecursionError here)."""
        try:
            return json.loads(self.content)
        except RecursionError:
            raise ValueError("the body is JSON nested too deeply to decode") from None


def _left(timeout: float | None) -> float | None:
    """The per-operation timeout, capped at the time left before the call's deadline."""
    end = _DEADLINE.get()
    if end is None:
        return timeout
    left = end - time.monotonic()
    if left <= 0:
        raise httpcore.ReadTimeout("overall deadline passed")
    return left if timeout is None else min(timeout, left)


class _Stream(httpcore.NetworkStream):
    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, _left(timeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, _left(timeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.NetworkStream:
        return _Stream(self._inner.start_tls(ssl_context, server_hostname, _left(timeout)))

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _Backend(httpcore.NetworkBackend):
    def __init__(self) -> None:
        self._inner = httpcore.SyncBackend()

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        return _Stream(
            self._inner.connect_tcp(host, port, _left(timeout), local_address, socket_options)
        )

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.NetworkStream:
        return _Stream(self._inner.connect_unix_socket(path, _left(timeout), socket_options))

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


class _Transport(httpx.HTTPTransport):
    """httpx's transport over a connection pool whose sockets respect the deadline.

    Replacing ``_pool`` is the one private detail used (``handle_request`` only
    calls the pool); the pool itself is built from public httpcore API.
    """

    def __init__(self, limits: httpx.Limits = LIMITS) -> None:
        super().__init__()
        self._pool = httpcore.ConnectionPool(
            ssl_context=httpx.create_ssl_context(),
            network_backend=_Backend(),
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
        )


def client(*, timeout: float, headers: Any = None, base_url: str = "") -> httpx.Client:
    """A sync client for :func:`request` (its sockets honour the call deadline)."""
    return httpx.Client(base_url=base_url, timeout=timeout, headers=headers, transport=_Transport())


def _expired(shown: str, seconds: float) -> str:
    return f"no complete answer from {shown} within {seconds:g} s (deadline)"


def _too_big(shown: str) -> str:
    return (
        f"{shown} sent more than {MAX_BODY // 2**20} MiB; refusing to read further "
        "(is this the right URL?)"
    )


class _Body:
    def __init__(self, shown: str, error: type[CtxGuardError]) -> None:
        self.chunks: list[bytes] = []
        self.size = 0
        self.shown, self.error = shown, error

    def add(self, chunk: bytes) -> None:
        self.size += len(chunk)
        if self.size > MAX_BODY:
            raise self.error(_too_big(self.shown))
        self.chunks.append(chunk)

    def reply(self, response: httpx.Response) -> Reply:
        return Reply(response.status_code, b"".join(self.chunks), response.encoding or "utf-8")


# a connection that broke under a request: the server may never have read it
_BROKEN = (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)


def known_secrets(base_url: str, headers: Mapping[str, str] | None) -> list[str]:
    """What a server must not echo back into our errors: the headers we send (an API
    key, raw and after its scheme) and the URL's password, raw (as written and decoded)
    and as the Basic credential it goes as, with the ``user:password`` pair; each also
    JSON-escaped; longest first (one under 4 characters is left to the redaction by
    form)."""
    values = {v for v in (headers or {}).values() if isinstance(v, str)}
    values |= {v.split(None, 1)[-1] for v in values if v.strip()}
    try:
        url = httpx.URL(base_url)
        user, password = url.username, url.password
        written = url.userinfo.decode("ascii", "replace").partition(":")[2]
    except Exception:  # (checked before: a URL httpx takes)
        user, password, written = "", "", ""
    if password:
        pair = f"{user}:{password}"
        values |= {password, written, pair, base64.b64encode(pair.encode()).decode()}
    values |= {json.dumps(v)[1:-1] for v in values}  # as an error body quotes them
    return sorted((v for v in values if len(v) >= 4), key=len, reverse=True)


def without_userinfo(url: str) -> tuple[str, httpx.BasicAuth | None]:
    """``url`` without its user and password, and those as the Basic auth httpx would
    send for them (None when it has none): for a client whose requests go to paths under
    ``url`` (httpx logs every request's URL, and each of its exceptions keeps it)."""
    parsed = httpx.URL(url)
    if not parsed.userinfo:
        return url, None
    auth = httpx.BasicAuth(parsed.username, parsed.password)
    return str(parsed.copy_with(username=None, password=None)), auth


def _build(
    http: httpx.Client | httpx.AsyncClient, method: str, url: str, kwargs: dict[str, Any]
) -> tuple[httpx.Request, httpx.Auth | None]:
    """The request, with a URL's user and password moved into Basic auth (what httpx
    would send for them): httpx logs every request's URL, and each of its exceptions keeps
    the request, so a password left in the URL would reach logs and error trackers."""
    request = http.build_request(method, url, **kwargs)
    if not request.url.userinfo:
        return request, None
    auth = httpx.BasicAuth(request.url.username, request.url.password)
    bare = request.url.copy_with(username=None, password=None)
    return http.build_request(method, bare, **kwargs), auth


def request(
    http: httpx.Client,
    method: str,
    url: str,
    *,
    seconds: float,
    shown: str,
    error: type[CtxGuardError],
    idempotent: bool = False,
    **kwargs: Any,
) -> Reply:
    """One call, over within `seconds` or `error`; other failures stay httpx.HTTPError.

    ``idempotent``: a call that is safe to send twice is sent once more (inside the
    same deadline) when the connection breaks before a whole reply came back. A
    kept-alive connection the server closes as the request goes out (uvicorn, so
    vLLM, closes idle ones after 5 s) fails that way although the server is fine.
    """
    end = time.monotonic() + seconds
    token = _DEADLINE.set(end)
    kwargs.setdefault("timeout", seconds)  # also bounds the wait for a free pooled connection
    try:
        built, auth = _build(http, method, url, kwargs)
        for attempt in (1, 2):
            try:
                response = http.send(built, auth=auth or httpx.USE_CLIENT_DEFAULT, stream=True)
                try:
                    body = _Body(shown, error)
                    for chunk in response.iter_bytes():
                        if time.monotonic() >= end:
                            raise error(_expired(shown, seconds))
                        body.add(chunk)
                    return body.reply(response)
                finally:
                    response.close()
            except _BROKEN:
                if not idempotent or attempt == 2 or time.monotonic() >= end:
                    raise
        raise AssertionError("unreachable")  # pragma: no cover
    except httpx.TimeoutException:
        if time.monotonic() >= end:
            raise error(_expired(shown, seconds)) from None
        raise
    finally:
        _DEADLINE.reset(token)


async def arequest(
    http: httpx.AsyncClient,
    method: str,
    url: str,
    *,
    seconds: float,
    shown: str,
    error: type[CtxGuardError],
    **kwargs: Any,
) -> Reply:
    """The asyncio twin of :func:`request`: the whole call under ``asyncio.timeout``."""
    built, auth = _build(http, method, url, kwargs)
    try:
        async with asyncio.timeout(seconds):
            response = await http.send(built, auth=auth or httpx.USE_CLIENT_DEFAULT, stream=True)
            try:
                body = _Body(shown, error)
                async for chunk in response.aiter_bytes():
                    body.add(chunk)
                return body.reply(response)
            finally:
                await response.aclose()
    except TimeoutError:
        raise error(_expired(shown, seconds)) from None
