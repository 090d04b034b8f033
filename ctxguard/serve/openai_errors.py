"""OpenAI-shaped error bodies, and the mapping from ctxguard's error tree to HTTP.

``{"error": {"message", "type", "param", "code"}}``: the shape the ``openai`` SDKs read
(400 becomes ``BadRequestError`` with ``.code``). Messages are one line and never hold
a secret: they come from ctxguard's own errors, which redact URLs already.
"""

from __future__ import annotations

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
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = " ".join(message.split())[:1000]
        self.type = type
        self.param = param
        self.code = code

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
    exc: CtxGuardError, *, session_param: str = "X-Session-Id", output_param: str = "max_tokens"
) -> ApiError:
    """The HTTP answer for an error the Guard raised (``output_param``: the body field the
    output limit is asked in)."""
    if isinstance(exc, OutputReserveError):
        return ApiError(
            400, _no_room(exc, output_param), param=output_param, code="context_length_exceeded"
        )
    if isinstance(exc, BudgetError):
        return ApiError(
            400,
            f"This request does not fit the model's context: {exc}",
            param="messages",
            code="context_length_exceeded",
        )
    if isinstance(exc, InvalidIdError):
        return ApiError(400, str(exc), param=session_param, code="invalid_session_id")
    if isinstance(exc, UncountableContentError):
        return ApiError(400, str(exc), param="messages", code="unsupported_content")
    if isinstance(exc, TemplateRefusedError):
        return ApiError(400, str(exc), param="messages", code="template_refused")
    if isinstance(exc, ConfigError):
        return ApiError(500, str(exc), type="server_error", code="gateway_config")
    if isinstance(exc, MessageIdReusedError):
        # 400, not 409: the client must send a new id, and the OpenAI SDKs retry a 409
        return ApiError(400, str(exc), param="messages", code="message_id_reused")
    if isinstance(exc, InvalidInputError):
        return ApiError(400, str(exc), param="messages", code="invalid_message")
    if isinstance(exc, StoreConnectionError):
        return ApiError(
            503,
            f"the session store is unavailable; nothing was sent to the model ({exc})",
            type="server_error",
            code="store_unavailable",
        )
    if isinstance(exc, SessionFullError):
        return ApiError(409, str(exc), code="session_full")
    if isinstance(exc, ConflictError):
        return ApiError(409, str(exc), type="server_error", code="conflict")
    if isinstance(exc, StoreError):
        return ApiError(500, str(exc), type="server_error", code="store_error")
    if isinstance(exc, TokenizerError):
        return ApiError(502, str(exc), type="server_error", code="upstream_tokenizer")
    return ApiError(500, str(exc), type="server_error", code="ctxguard_error")


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
