"""The upstream call: a chat completions body out, the reply (or an OpenAI-shaped error) in.

Nothing the upstream says reaches a client unread: its error text goes through
:meth:`Gateway.scrub` (the upstream API key, any bearer credential), a non-streaming
reply is read whole within ``--upstream-timeout`` (one deadline for headers and body,
not per read) and at most :data:`MAX_REPLY_BYTES`, and a streaming one is asked for
uncompressed (the relay passes the bytes on as they come).
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import logging
import re
import time
from typing import Any

import httpx

from ctxguard._http import MAX_BODY
from ctxguard.serve.gateway import Gateway
from ctxguard.serve.openai_errors import ApiError, what_failed
from ctxguard.serve.outcomes import AUTH_STATUSES, upstream_api_error, upstream_auth
from ctxguard.serve.sse import error_of

JSON_HEADERS = {"Content-Type": "application/json"}
# the relay forwards the upstream's bytes as they come: they must be the events themselves
STREAM_HEADERS = {**JSON_HEADERS, "Accept-Encoding": "identity"}
MAX_REPLY_BYTES = MAX_BODY  # a non-streaming reply past this is refused (502), not buffered
# a stream past this is cut (its events are kept to assemble the reply): one event per
# token, each in a chunk's envelope (with logprobs, kilobytes), so several replies' worth
MAX_STREAM_BYTES = 4 * MAX_BODY
UPSTREAM_TEXT_CHARS = 300  # the upstream's error text passed on, scrubbed first
log = logging.getLogger("ctxguard.serve")


def encode_json(body: dict[str, Any]) -> bytes:
    """The body as httpx's ``json=`` would send it (done in the worker thread)."""
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


async def send_upstream(
    gw: Gateway, url: str, body: dict[str, Any] | bytes, *, stream: bool
) -> httpx.Response:
    """POST upstream (a dict, or JSON already encoded) and return the response with its
    body still to read; failures become OpenAI-shaped 502/504 (and upstream 4xx pass
    through, scrubbed). Each call's time to the response headers is reported by outcome
    (``Gateway.observe_upstream``, the ``/metrics`` histogram). The headers come within
    ``--upstream-timeout``; a streaming call's reads after them each wait that long at
    most; :func:`post_json` bounds a whole call."""
    started = time.perf_counter()
    content = body if isinstance(body, bytes) else encode_json(body)
    headers = STREAM_HEADERS if stream else JSON_HEADERS
    try:
        request = gw.client.build_request("POST", url, content=content, headers=headers)
        # the headers within one deadline (reads each have their own: headers sent a
        # line now and then would never time out)
        async with asyncio.timeout(gw.config.upstream_timeout):
            response = await gw.client.send(request, stream=True)
    except TimeoutError:
        gw.observe_upstream("timeout", started)
        raise timed_out(gw) from None
    except httpx.HTTPError as exc:
        error = gw.failed(exc)
        gw.observe_upstream("timeout" if error.status == 504 else "unavailable", started)
        raise error from None
    if response.status_code == 200:
        gw.observe_upstream("ok", started)
        return response
    status = response.status_code
    rejected = 400 <= status < 500 and status != 408 and status not in AUTH_STATUSES
    gw.observe_upstream("rejected" if rejected else "error", started)
    raise await upstream_error(gw, response)


async def post_json(gw: Gateway, url: str, body: dict[str, Any] | bytes) -> tuple[Any, bytes]:
    """A non-streaming POST: the reply decoded and its bytes, within one deadline
    (``--upstream-timeout`` for the headers and the whole body); 504 past it, 502 for a
    reply over :data:`MAX_REPLY_BYTES` or not JSON, and the error an upstream answered
    with HTTP 200 as that error (:func:`error_in_reply`)."""
    try:
        async with asyncio.timeout(gw.config.upstream_timeout):
            response = await send_upstream(gw, url, body, stream=False)
            raw = await read_capped(gw, response)
    except TimeoutError:
        raise timed_out(gw) from None
    data = decode_reply(gw, raw)
    if isinstance(data, dict) and "choices" not in data and error_of(data) is not None:
        raise error_in_reply(gw, data, raw)
    return data, raw


def error_in_reply(gw: Gateway, data: dict[str, Any], raw: bytes) -> ApiError:
    """An error the upstream sent with HTTP 200 (some vLLM versions answer
    ``{"object": "error", "message", "code"}`` so): answered as the same error with its
    ``code`` as the HTTP status would be (a 4xx passed through, anything else a 502),
    its message scrubbed and cut as every upstream error text is. Nothing is stored."""
    error = data.get("error")
    code = (error if isinstance(error, dict) else data).get("code")
    status = code if type(code) is int and 400 <= code < 600 else 502
    if status in AUTH_STATUSES:
        return upstream_auth(status, gw.shown_upstream, "chat", gw.log_throttle)
    detail = _upstream_message(gw, raw).strip() or "(no message)"
    if 400 <= status < 500 and status != 408:
        return ApiError(status, detail, code="upstream_rejected")
    return upstream_api_error(
        502, f"the model server answered HTTP 200 with an error: {detail}", "upstream_error"
    )


async def read_capped(gw: Gateway, response: httpx.Response) -> bytes:
    """The body of a streamed ``response`` (closed after), at most MAX_REPLY_BYTES."""
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in response.aiter_bytes():
            size += len(chunk)
            if size > MAX_REPLY_BYTES:
                raise upstream_api_error(
                    502,
                    f"the model server {gw.shown_upstream} answered with more than "
                    f"{MAX_REPLY_BYTES} bytes; ask for fewer output tokens",
                    "upstream_bad_reply",
                )
            chunks.append(chunk)
    except httpx.TimeoutException as exc:
        raise gw.failed(exc) from None
    except httpx.HTTPError as exc:  # (it was "cannot reach the model server": it answered)
        log.warning(
            "the model server %s broke off its reply: %s", gw.shown_upstream, type(exc).__name__
        )
        raise upstream_api_error(
            502,
            f"the model server {gw.shown_upstream} broke off its reply ({what_failed(exc)}); "
            "send the request again",
            "upstream_lost",
        ) from None
    finally:
        await response.aclose()
    return b"".join(chunks)


def decode_reply(gw: Gateway, raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        raise bad_reply(gw) from None


def bad_reply(gw: Gateway) -> ApiError:
    return upstream_api_error(
        502,
        f"the model server {gw.shown_upstream} answered with an unreadable reply",
        "upstream_bad_reply",
    )


def timed_out(gw: Gateway) -> ApiError:
    message = f"the model server {gw.shown_upstream} did not answer in time"
    return upstream_api_error(504, message, "upstream_timeout")


async def upstream_error(gw: Gateway, response: httpx.Response, what: str = "chat") -> ApiError:
    """The OpenAI-shaped error for a non-200 ``response`` to the call ``what`` (read at
    most 64 KiB within ``--upstream-timeout``, closed): a 4xx passes through with the
    upstream's own message, anything else is a 502; either message scrubbed of
    credentials. A 401/403 (the gateway's own credentials refused) is a 502
    ``upstream_auth`` saying so (``outcomes.upstream_auth``), none of the upstream's text."""
    if response.status_code in AUTH_STATUSES:
        await response.aclose()
        return upstream_auth(response.status_code, gw.shown_upstream, what, gw.log_throttle)
    raw = b""
    try:  # (within one deadline: a streaming call has none of its own around this)
        async with asyncio.timeout(gw.config.upstream_timeout):
            async for chunk in response.aiter_bytes():
                raw += chunk
                if len(raw) > 65536:
                    break
    except (httpx.HTTPError, TimeoutError):
        pass  # what came in time is the message
    finally:
        await response.aclose()
    detail = _upstream_message(gw, raw).strip()
    status = response.status_code
    if 400 <= status < 500 and status != 408:
        detail = detail or f"the model server answered HTTP {status} with no message"
        return ApiError(status, detail, code="upstream_rejected", headers=retry_after(response))
    detail = detail or "(no message)"
    if 300 <= status < 400:  # (httpx follows none: its Location may name another host)
        return upstream_api_error(
            502,
            f"the model server {gw.shown_upstream} answered HTTP {status}, a redirect, which "
            "the gateway does not follow; set the upstream URL to the model server itself",
            "upstream_error",
        )
    error = upstream_api_error(
        502, f"the model server answered HTTP {status}: {detail}", "upstream_error"
    )
    error.headers = retry_after(response)  # (an overloaded server's 503 says when to retry)
    return error


_DELTA_SECONDS = re.compile(r"[0-9]{1,9}")
_DATE_CHARS = re.compile(r"[A-Za-z0-9 ,:+-]{1,40}")  # "Wed, 21 Oct 2015 07:28:00 GMT"
_MILLISECONDS = re.compile(r"[0-9]{1,12}(\.[0-9]{1,6})?")


def retry_after(response: httpx.Response) -> dict[str, str]:
    """The upstream's ``Retry-After`` (seconds or an HTTP date) and ``retry-after-ms``
    (what OpenAI's SDKs wait for before retrying a 429 or 5xx), when well formed: passed
    on with its error, so clients back off as the model server asked. Anything else in
    them is dropped (a header is no place for the upstream's text)."""
    headers: dict[str, str] = {}
    seconds = response.headers.get("retry-after", "").strip()
    if _DELTA_SECONDS.fullmatch(seconds) or _http_date(seconds):
        headers["Retry-After"] = seconds
    millis = response.headers.get("retry-after-ms", "").strip()
    if _MILLISECONDS.fullmatch(millis):
        headers["retry-after-ms"] = millis
    return headers


def _http_date(text: str) -> bool:
    if not _DATE_CHARS.fullmatch(text):
        return False
    try:
        return email.utils.parsedate_to_datetime(text) is not None
    except (TypeError, ValueError, IndexError):
        return False


def _upstream_message(gw: Gateway, raw: bytes) -> str:
    """The upstream's error text, scrubbed before it is cut to UPSTREAM_TEXT_CHARS (a cut
    must never leave part of a key)."""
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        return gw.scrub(raw.decode("utf-8", "replace"))[:UPSTREAM_TEXT_CHARS]
    error = data.get("error", data) if isinstance(data, dict) else data
    if isinstance(error, dict):
        error = error.get("message", error)
    return gw.scrub(str(error))[:UPSTREAM_TEXT_CHARS]
