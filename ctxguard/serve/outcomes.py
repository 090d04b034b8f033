"""What a turn's failures are answered with: the model's reply not stored (503 when the
store failed, 502 when the reply is refused, and whether a retry is safe), what the
upstream did (httpx failures in HTTP's words, its refusal of the gateway's own
credentials), and the upstream's usage kept only when :meth:`Guard.complete` takes it.
Pure functions over the error tree, and :class:`LogThrottle` (each gateway holds one) for
the log lines a flood of failing requests would repeat.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Hashable
from typing import Any

import httpx

from ctxguard._validate import check_usage
from ctxguard.errors import (
    CtxGuardError,
    InvalidInputError,
    StoreConnectionError,
    StoreError,
    TokenizerError,
)
from ctxguard.serve.openai_errors import ApiError, what_failed

log = logging.getLogger("ctxguard.serve")
LOG_EVERY = 60.0  # seconds between two log lines of one kind of failure (the first at once)
AUTH_STATUSES = frozenset({401, 403})  # the model server refused the gateway's credentials


def reply_not_stored(exc: CtxGuardError, keyed: bool, cut: str | None = None) -> ApiError:
    """The answer when the model replied but the reply could not be stored, saying
    whether a retry is safe (:func:`retry_advice`): a 503 when the store failed (a retry
    may pass), a 502 when the reply itself is refused (the same reply would be again).
    ``cut``: the request's output-limit field(s) when the reply, a tool call, was cut by
    that limit (``finish_reason: "length"``): its arguments are not whole, which is why it
    is refused, and a larger limit is what to send."""
    if cut is not None and not isinstance(exc, StoreError | TokenizerError):
        return ApiError(
            502,
            "the model's reply was not stored: its tool call was cut by the output limit "
            "(finish_reason 'length'), so its arguments are not whole; send the request "
            f"again with a larger {cut}",
            type="server_error",
            code="reply_not_stored",
        )
    advice = retry_advice(exc, keyed)
    if not isinstance(exc, StoreError | TokenizerError):  # refused, not failed
        advice += ", but a reply like this one is refused again"
    return ApiError(
        503 if isinstance(exc, StoreError) else 502,
        f"the model answered but the reply could not be stored ({exc}); {advice}",
        type="server_error",
        code="reply_not_stored",
    )


def retry_advice(exc: CtxGuardError, keyed: bool) -> str:
    """Whether retrying the request is safe after ``exc`` stored no reply, or may have.

    A retry re-sends the same messages, recognised by ids derived from the session's
    newest reply: if the reply was stored after all, that anchor moved and the retry
    stores the turn again. Only a store connection lost once the write was sent leaves
    that open (a script writes all or nothing and checks before it writes); an
    Idempotency-Key covers it (the retry replays the stored reply or makes the call).
    """
    if keyed:
        return "retrying with the same Idempotency-Key is safe"
    if isinstance(exc, StoreConnectionError) and not exc.never_reached:
        return (
            "the reply may have been stored: read the session before retrying, or retry "
            "with an Idempotency-Key (without one a retry stores the turn twice if it was)"
        )
    return "retrying the request is safe"


# an upstream 4xx that may pass on a retry of the same request: a timeout, a conflict,
# too early, too many requests (the gateway's own credentials refused, 401/403, is an
# ``upstream_auth`` 502: the operator's to fix, and then the same request passes)
TRANSIENT_4XX = frozenset({408, 409, 425, 429})


def refuses_request(exc: Exception) -> bool:
    """Whether ``exc`` is the upstream saying the request itself is wrong (a 4xx passed
    on as ``upstream_rejected``, 400, 404, 413, 415, 422 ..., not a
    :data:`TRANSIENT_4XX`): the same request would be refused again, so what it stored
    is taken back (``chat.Turn.take_back``)."""
    return (
        isinstance(exc, ApiError)
        and exc.code == "upstream_rejected"
        and 400 <= exc.status < 500
        and exc.status not in TRANSIENT_4XX
    )


class LogThrottle:
    """At most one log line per kind of failure each :data:`LOG_EVERY` seconds: the first
    at once, the next saying how many were not logged meanwhile (a refused credential
    fails every request: one line each would flood the log)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._next: dict[Hashable, float] = {}
        self._missed: dict[Hashable, int] = {}

    def due(self, kind: Hashable) -> int | None:
        """How many of ``kind`` went unlogged before this one, which is to be logged; None
        when it is not (counted for the next line)."""
        now = time.monotonic()
        with self._lock:
            if now < self._next.get(kind, float("-inf")):
                self._missed[kind] = self._missed.get(kind, 0) + 1
                return None
            self._next[kind] = now + LOG_EVERY
            return self._missed.pop(kind, 0)


def upstream_auth(status: int, where: str, what: str, throttle: LogThrottle) -> ApiError:
    """The answer when the model server ``where`` refused the gateway's own credentials
    (HTTP ``status``, 401 or 403, on ``what``: "chat", "/v1/models", "/tokenize"): a 502
    ``upstream_auth`` (not the upstream's 401/403, which would tell the client that its own
    key is wrong), whose one line says the gateway's operator must fix them; nothing the
    upstream said is passed on (it may quote the key). Logged at ERROR, throttled."""
    missed = throttle.due((status, what))
    if missed is not None:
        log.error(
            "the model server %s refused the gateway's credentials (HTTP %d on %s): set the "
            "upstream API key (CTXGUARD_SERVE_UPSTREAM_API_KEY / upstream_api_key) or the "
            "user and password of the upstream URL%s",
            where,
            status,
            what,
            f"; {missed} more since the last such line" if missed else "",
        )
    return upstream_api_error(
        502,
        f"the model server refused the gateway's credentials (HTTP {status}): the gateway's "
        "upstream API key or upstream URL password is wrong or lacks access; its operator "
        "must fix it (the key this request sent is not the cause)",
        "upstream_auth",
    )


def upstream_api_error(status: int, message: str, code: str) -> ApiError:
    """The answer for what the upstream did (OpenAI error type ``upstream_error``)."""
    return ApiError(status, message, type="upstream_error", code=code)


def upstream_failure(exc: Exception, where: str) -> tuple[int, str, str]:
    """Status, message and code for an httpx failure talking to the upstream (what
    happened in HTTP's words; httpx's class name goes to the log, not to the client)."""
    if isinstance(exc, httpx.TimeoutException):
        return 504, f"the model server {where} did not answer in time", "upstream_timeout"
    if isinstance(exc, TokenizerError):
        return 502, str(exc), "upstream_tokenizer"
    log.warning("the model server %s failed: %s", where, type(exc).__name__)
    return (
        502,
        f"cannot reach the model server {where} ({what_failed(exc)})",
        "upstream_unavailable",
    )


def usable_usage(usage: object) -> dict[str, Any] | None:
    """The upstream's ``usage`` when :meth:`Guard.complete` takes it, else None (logged):
    the model did answer, so a usage no server reports (negative, past 2**63-1, NaN, not
    a number) is dropped rather than lose the reply (it was a 502 ``reply_not_stored``)."""
    if not isinstance(usage, dict):
        return None
    try:
        check_usage(usage)
    except InvalidInputError as exc:
        log.warning("the model server's usage is not stored with its reply: %s", exc)
        return None
    return usage
