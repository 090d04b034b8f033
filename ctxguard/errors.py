"""One exception tree for the whole library.

Every error ctxguard raises derives from :class:`CtxGuardError`; backend errors
(redis-py, tokenizers, HTTP) are wrapped with the original kept as ``__cause__``.
Catch the family you can act on::

    CtxGuardError
    ├── InvalidInputError            bad input from the caller; nothing was stored
    │   ├── InvalidMessageError      a message that breaks the chat format
    │   │   └── MessageIdReusedError a stored message's id given to another message
    │   ├── InvalidIdError           empty, over-long or control-character ids
    │   └── ConfigError              a bad URL, option or model configuration
    │       └── ServerAuthError      the model server refused the limit lookup's credentials
    ├── StoreError                   the session store failed
    │   ├── StoreConnectionError     could not reach or lost the store (retryable)
    │   ├── CorruptRecordError       a stored record or key is not what ctxguard wrote
    │   ├── SessionFullError         the session holds its configured maximum
    │   └── ConflictError            a compare-and-set lost a race
    ├── TokenizerError               a tokenizer or chat template cannot be used
    │   ├── TemplateRefusedError     the chat template rejects this conversation
    │   └── TokenizerAuthError       the model server refused the vllm: counter's credentials
    ├── BudgetError                  the request cannot fit its token budget
    │   ├── MessageTooLongError      one message is over the per-message cap
    │   ├── OutputReserveError       the output reserve leaves no room for a prompt
    │   ├── ServerBusyError          the model server is past its pressure thresholds
    │   └── TenantBudgetError        the tenant spent its token budget for the window
    ├── UpstreamAuthError            a model server refused ctxguard's credentials (401/403;
    │                                ServerAuthError and TokenizerAuthError are also one)
    ├── SummarizerError              a summarizer failed (recorded, never content)
    ├── GuardClosedError             the guard was closed; nothing was stored
    ├── NotCopyableError             a guard, store or adapter copied or pickled
    └── MissingDependencyError       an optional extra is not installed

Each error's message says what was wrong and what to do about it. Every error
copies and pickles whole (type, message and attributes), so it crosses a process pool.
"""

from __future__ import annotations

from typing import Any, Literal

ConnectionPhase = Literal["connect", "tls", "write", "read", "lost"]


def _rebuilt(cls: type[CtxGuardError], args: tuple[Any, ...]) -> CtxGuardError:
    """An error as pickled: its message as it was, not passed through ``__init__`` again
    (whose parameters are the parts it is made of, not the message); the attributes are
    restored after it, as for any exception."""
    return cls.__new__(cls, *args)


class CtxGuardError(Exception):
    """Root of every error raised by ctxguard."""

    def __reduce__(self) -> tuple[Any, ...]:
        # Exception's own re-calls cls(*args): a TypeError for an error whose __init__
        # takes its parts (needed=..., session_id, ...), and a garbled message for one
        # that builds its text from one argument (GuardClosedError).
        return (_rebuilt, (type(self), self.args), self.__dict__ or None)


class InvalidInputError(CtxGuardError, ValueError):
    """The caller passed something ctxguard cannot accept. Nothing was stored."""


class InvalidMessageError(InvalidInputError):
    """A message breaks the chat format (role, content, tool calls)."""


class MessageIdReusedError(InvalidMessageError):
    """A new message reuses the id of a stored message with other content (role,
    content, name, tool calls, tool_call_id, extra: all but the time and ``metadata``,
    ctxguard's annotations, which no model sees). An id names one message: the same id
    with the same message is a retry and stores nothing; with another message it is
    refused, and nothing of the call is stored. Not a :class:`ConflictError`: retrying
    cannot help, a new id does."""

    def __init__(self, session_id: str, message_id: str) -> None:
        self.session_id = session_id
        self.message_id = message_id
        super().__init__(
            f"message id {message_id!r} is stored in session {session_id!r} with other "
            "content; an id names one message: give this message a new id (no message of "
            "this call was stored)"
        )


class InvalidIdError(InvalidInputError):
    """A session, message, namespace or tenant id is not acceptable."""


class ConfigError(InvalidInputError):
    """A store URL, option or model configuration is not usable."""


class StoreError(CtxGuardError):
    """The session store failed; the backend's error is the ``__cause__``."""


class StoreConnectionError(StoreError):
    """The store could not be reached, or the connection was lost mid-operation.

    ``phase`` says where: ``"connect"`` (no connection, or the server did not
    complete the connection handshake) and ``"tls"`` (the TLS handshake
    failed) mean the operation was never sent, so anything is safe to retry
    (``never_reached``); ``"write"`` (the server stopped reading before the whole
    command was sent: what was buffered can still reach it once it reads again),
    ``"read"`` (no reply within the read timeout) and ``"lost"`` (the connection
    dropped mid-operation) mean it may have run.
    ``None`` when not known.
    """

    def __init__(self, message: str, *, phase: ConnectionPhase | None = None) -> None:
        super().__init__(message)
        self.phase = phase

    @property
    def never_reached(self) -> bool:
        """True when the operation was certainly not sent to the store."""
        return self.phase in ("connect", "tls")


class CorruptRecordError(StoreError):
    """A stored record, or one of a session's keys, is not what ctxguard wrote.

    ``CorruptRecordError(session_id, position, detail)`` names a record that does
    not decode; with ``key=`` it names the damaged key (a Redis key name, or the
    part of a ``memory://`` session) instead. Nothing was written by the call that
    raised it. Other sessions are unaffected.
    """

    def __init__(
        self, session_id: str, position: int | str, detail: str, *, key: str | None = None
    ) -> None:
        self.session_id = session_id
        self.position = position
        self.key = key
        if key is not None:
            text = (
                f"session {session_id!r}: key {key} is corrupt ({detail}); it was written by "
                "something other than ctxguard, and nothing was written by this call. "
                "Export the session with `ctxguard export` and repair or delete that key."
            )
        else:
            text = (
                f"session {session_id!r}: record at position {position} does not decode "
                f"({detail}); it was written by something other than ctxguard, by a newer "
                "ctxguard (upgrade this process), or truncated. Export the session with "
                "`ctxguard export` and repair or delete that record."
            )
        super().__init__(text)


class SessionFullError(StoreError):
    """The session holds ``max_stored_messages`` already; nothing of the batch was stored."""

    def __init__(self, session_id: str, held: int, adding: int = 0, cap: int = 0) -> None:
        self.session_id = session_id
        self.held = held
        if adding and cap:  # (commit="with_reply": a turn refused before the model is called)
            what = (
                f"session {session_id!r} holds {held} messages; this turn would store "
                f"{adding} more (its reply included), over the configured maximum of {cap}"
            )
        else:
            what = f"session {session_id!r} already holds {held} messages, the configured maximum"
        super().__init__(
            f"{what} (max_stored_messages); raise it, export and delete the session, or "
            "start a new one"
        )


class ConflictError(StoreError):
    """A compare-and-set lost a race with another writer; retry with fresh state."""


class TokenizerError(CtxGuardError):
    """A tokenizer, encoding or chat template is missing or unusable."""


class UncountableContentError(TokenizerError):
    """A message holds content this counter cannot count (an image part, for a text
    tokenizer): the request's fault, not the tokenizer's."""


class TemplateRefusedError(TokenizerError):
    """The model's chat template rejects this conversation (it would on the server too)."""


class UpstreamAuthError(CtxGuardError):
    """A model server refused ctxguard's own credentials (HTTP 401 or 403) on a call
    ctxguard makes itself: the limit lookup (:class:`ServerAuthError`, from
    ``fetch_server_info`` / ``ServerLimit``) or the ``vllm:`` counter's ``/tokenize``
    (:class:`TokenizerAuthError`). The API key (``headers``) or the URL's user and
    password is wrong or lacks access. The counter's message carries the server's reason
    less any credential it echoes (ours by value, any other by form), as its other errors
    do; the limit lookup's says nothing of the server's text; the gateway answers its
    clients with neither. ``status``: 401 or 403; ``path``: what was asked."""

    def __init__(self, message: str, status: int, path: str) -> None:
        self.status = status
        self.path = path
        super().__init__(message)


class ServerAuthError(ConfigError, UpstreamAuthError):
    """The model server refused the credentials of the limit lookup (a ``ConfigError``,
    as any other unusable server answer there)."""


class TokenizerAuthError(TokenizerError, UpstreamAuthError):
    """The model server refused the ``vllm:`` counter's credentials on ``/tokenize``."""


class BudgetError(CtxGuardError):
    """The request cannot be made to fit: the numbers say by how much."""

    def __init__(self, message: str, *, needed: int, limit: int, reserved: int) -> None:
        self.needed = needed
        self.limit = limit
        self.reserved = reserved
        super().__init__(
            f"{message} (needed {needed} tokens, limit {limit}, reserved for output "
            f"{reserved}, so {limit - reserved} available)"
        )


class MessageTooLongError(BudgetError):
    """One message is over the configured per-message cap."""


class OutputReserveError(BudgetError):
    """The output reserve (``max_tokens`` plus ``safety_margin``) leaves no room for any
    prompt in the limit. ``asked`` is the ``max_tokens`` passed to the call, None when
    the reserve is the guard's default (its ``max_tokens`` setting)."""

    def __init__(
        self, message: str, *, needed: int, limit: int, reserved: int, asked: int | None
    ) -> None:
        self.asked = asked
        super().__init__(message, needed=needed, limit=limit, reserved=reserved)


class ServerBusyError(BudgetError):
    """The model server's KV cache or queue is past the refusal threshold (retry later).

    Carries the numbers read from the server's ``/metrics``: ``kv_usage`` (0-1, or
    None when the server does not say), ``waiting`` (queued requests) and the
    thresholds passed. ``needed``/``limit``/``reserved`` are 0: no budget was made.
    """

    def __init__(
        self,
        message: str,
        *,
        kv_usage: float | None,
        waiting: float | None,
        kv_threshold: float,
        waiting_threshold: float,
    ) -> None:
        self.needed = self.limit = self.reserved = 0
        self.kv_usage = kv_usage
        self.waiting = waiting
        self.kv_threshold = kv_threshold
        self.waiting_threshold = waiting_threshold
        CtxGuardError.__init__(self, message)


class TenantBudgetError(BudgetError):
    """The tenant has spent its token budget for the current window (retry later).

    ``spent`` and ``budget`` are tokens over the last ``window_seconds``;
    ``retry_after`` is the seconds until the oldest spending leaves the window.
    """

    def __init__(
        self, message: str, *, spent: int, budget: int, window_seconds: float, retry_after: float
    ) -> None:
        self.needed, self.limit, self.reserved = spent, budget, 0
        self.spent, self.budget = spent, budget
        self.window_seconds, self.retry_after = window_seconds, retry_after
        CtxGuardError.__init__(self, message)


class SummarizerError(CtxGuardError):
    """A summarizer failed, timed out or returned unusable text."""


class GuardClosedError(CtxGuardError):
    """A :class:`Guard` or :class:`AsyncGuard` was used after ``close()`` /
    ``aclose()``: its connections are released (a call would open them again, and
    leak them), so the call is refused before anything is stored. Open a new guard."""

    def __init__(self, guard: str) -> None:
        super().__init__(
            f"this {guard} was closed; open a new {guard} for more calls (nothing was stored)"
        )


class NotCopyableError(CtxGuardError, TypeError):
    """A :class:`Guard`, :class:`AsyncGuard`, store or adapter holding one was copied
    (``copy.copy``, ``copy.deepcopy``) or pickled: it holds connections, locks and
    per-process caches that a copy would share or lose. Make one per process from the
    same settings, and share it between threads (or tasks) within the process. A
    ``TypeError`` too, as Python's own refusal to pickle a lock is."""

    def __init__(self, name: str, holds: str, advice: str, *, how: str = "copied") -> None:
        article = "an" if name[:1] in "AEIOU" else "a"
        super().__init__(f"{article} {name} holds {holds} and cannot be {how} or pickled; {advice}")


class MissingDependencyError(CtxGuardError, ImportError):
    """An optional dependency is missing; the message names the extra to install."""

    def __init__(self, feature: str, extra: str) -> None:
        self.extra = extra
        super().__init__(f"{feature} needs an optional dependency: pip install 'ctxguard[{extra}]'")


__all__ = [
    "BudgetError",
    "ConfigError",
    "ConflictError",
    "CorruptRecordError",
    "CtxGuardError",
    "GuardClosedError",
    "InvalidIdError",
    "InvalidInputError",
    "InvalidMessageError",
    "MessageIdReusedError",
    "MessageTooLongError",
    "MissingDependencyError",
    "NotCopyableError",
    "ServerAuthError",
    "SessionFullError",
    "StoreConnectionError",
    "StoreError",
    "SummarizerError",
    "TemplateRefusedError",
    "TokenizerAuthError",
    "TokenizerError",
    "UpstreamAuthError",
]
