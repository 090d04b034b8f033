"""OpenAI-shaped error bodies, and the mapping from ctxguard's error tree to HTTP.

``{"error": {"message", "type", "param", "code"}}``: the shape the ``openai`` SDKs read
(400 becomes ``BadRequestError`` with ``.code``). Messages are one line and never hold
a secret: they come from ctxguard's own errors, which redact URLs already.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ctxguard.errors import (
    BudgetError,
    ConfigError,
    ConflictError,
    CtxGuardError,
    InvalidIdError,
    InvalidInputError,
    MessageIdReusedError,
    OutputReserveError,
    SessionFullError,
    StoreConnectionError,
    StoreError,
    TemplateRefusedError,
    TokenizerError,
    UncountableContentError,
)


class ApiError(Exception):
    """An error answer: status and the OpenAI error fields."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",  # noqa: A002 - the OpenAI field name
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = " ".join(message.split())[:1000]
        self.type = type
        self.param = param
        self.code = code
        self.headers = dict(headers or {})  # sent with the answer (the upstream's Retry-After)

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


def json_kind(value: object) -> str:
    """What ``value`` is in JSON's terms (an error names what the client sent, not Python's
    type)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list | tuple) else "an object"


def from_ctxguard(
    exc: CtxGuardError,
    *,
    session_param: str = "X-Session-Id",
    output_param: str = "max_tokens",
    names: Mapping[str, str] | None = None,
) -> ApiError:
    """The HTTP answer for an error the Guard raised (``output_param``: the body field the
    output limit is asked in; ``names``: the ids the gateway made for the request's
    messages, which the client never saw, each to its place in the request, e.g.
    ``messages[2]``, for the Guard's words that name a message by its id)."""
    text = str(exc)
    for made, place in (names or {}).items():  # ("message 'gw-..' (user)" -> "messages[0] (user)")
        text = text.replace(f"message {made!r}", place).replace(repr(made), place)
    if isinstance(exc, OutputReserveError):
        return ApiError(
            400, _no_room(exc, output_param), param=output_param, code="context_length_exceeded"
        )
    if isinstance(exc, BudgetError):
        return ApiError(
            400,
            f"This request does not fit the model's context: {text}",
            param="messages",
            code="context_length_exceeded",
        )
    if isinstance(exc, InvalidIdError):
        return ApiError(400, text, param=session_param, code="invalid_session_id")
    if isinstance(exc, UncountableContentError):
        return ApiError(400, text, param="messages", code="unsupported_content")
    if isinstance(exc, TemplateRefusedError):
        return ApiError(400, text, param="messages", code="template_refused")
    if isinstance(exc, ConfigError):
        return ApiError(500, text, type="server_error", code="gateway_config")
    if isinstance(exc, MessageIdReusedError):
        # 400, not 409: the client must send a new id, and the OpenAI SDKs retry a 409
        return ApiError(400, text, param="messages", code="message_id_reused")
    if isinstance(exc, InvalidInputError):
        if text.startswith("tools"):  # (the Guard's checks of the tools name them first)
            return ApiError(400, text, param="tools", code="invalid_tools")
        return ApiError(400, text, param="messages", code="invalid_message")
    if isinstance(exc, StoreConnectionError):
        return ApiError(
            503,
            f"the session store is unavailable; nothing was sent to the model ({text})",
            type="server_error",
            code="store_unavailable",
        )
    if isinstance(exc, SessionFullError):
        return ApiError(409, text, code="session_full")
    if isinstance(exc, ConflictError):
        return ApiError(409, text, type="server_error", code="conflict")
    if isinstance(exc, StoreError):
        return ApiError(500, text, type="server_error", code="store_error")
    if isinstance(exc, TokenizerError):
        return ApiError(502, text, type="server_error", code="upstream_tokenizer")
    return ApiError(500, text, type="server_error", code="ctxguard_error")


def _no_room(exc: OutputReserveError, field: str) -> str:
    """The Guard's words name its Python call; these name the request's field."""
    if exc.asked is not None:
        return (
            f"'{field}': {exc.asked} output tokens (with the gateway's margin, {exc.reserved}) "
            f"leave no room for a prompt in the model's {exc.limit}-token context; ask for "
            "fewer output tokens"
        )
    return (
        f"the gateway's output reserve of {exc.reserved} tokens leaves no room for a prompt "
        f"in the model's {exc.limit}-token context; send a smaller '{field}', or lower the "
        "gateway's max_tokens setting"
    )


def what_failed(exc: BaseException) -> str:
    """An httpx failure (or any other) in a few words a client understands (never its
    class name: that goes to the log)."""
    import httpx  # (the gateway's dependency; this module is imported without it too)

    if isinstance(exc, httpx.TimeoutException):
        return "no answer in time"
    if isinstance(exc, httpx.ConnectError):
        return "the connection was refused or could not be made"
    if isinstance(exc, httpx.RemoteProtocolError):
        return "it closed the connection or broke the HTTP protocol"
    if isinstance(exc, httpx.ReadError | httpx.WriteError | httpx.NetworkError):
        return "the connection broke"
    if isinstance(exc, httpx.DecodingError):
        return "its answer could not be decoded"
    if isinstance(exc, httpx.TooManyRedirects):
        return "too many redirects"
    if isinstance(exc, httpx.UnsupportedProtocol | httpx.InvalidURL):
        return "its URL cannot be used"
    return "the request failed"
