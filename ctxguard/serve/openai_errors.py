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


def from_ctxguard(exc: CtxGuardError, *, session_param: str = "X-Session-Id") -> ApiError:
    """The HTTP answer for an error the Guard raised."""
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
