"""The guard's settings, in one immutable object stored with every audit record."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

from ctxguard._validate import MAX_SECONDS, is_seconds, show
from ctxguard.errors import ConfigError
from ctxguard.messages import Message

Summarizer = Callable[[str | None, Sequence[Message]], "str | Awaitable[str]"]


@dataclass(frozen=True)
class GuardConfig:
    """How the guard budgets requests. Every field has a safe default.

    ``audit_mode="sync"`` writes each request's audit record before
    :meth:`prepare` returns (durable): in the same round trip as the new
    messages when the session's window is cached, in one more after a fetch.
    ``"with_reply"`` writes it together with the reply in :meth:`complete`
    (with the server's usage in the same record), so even an uncached turn
    costs two round trips; a request whose ``complete`` never comes is recorded
    once the session's next prepare has stored its request (a refused one, or one
    that ends in ``ConflictError``, leaves it held for its ``complete``), at its
    next complete or ``close()``, and lost only if the process dies first.

    ``commit="with_reply"`` stores nothing at :meth:`prepare`: the new messages,
    the reply and the request record (with the server's usage) are stored by
    :meth:`complete` in one atomic step, given the :class:`PreparedRequest`
    (``prepared=``). A warm turn is then one script call (and one plain read of the state
    token, which says whether the cached window still holds), and a request that is never
    completed (the model call failed, the client went away) leaves nothing stored.
    When another writer changed the session between the two calls, the messages go
    after what it wrote and the record names the window as it was sent (``unseen``:
    the positions the request did not see). ``"prepare"`` (the default) stores the
    new messages before the model is called. With ``"with_reply"``, ``audit_mode``
    does not apply: the record always goes with the reply.

    ``window_cache_size`` is how many sessions' last windows the guard keeps
    in memory (0 turns it off), and ``window_cache_bytes`` about how much memory
    those copies may take together (64 MiB by default). With a
    cached window a prepare plans first and sends one atomic "commit if the
    session is unchanged" (which also writes the audit record); if anything
    else changed the session, the store answers with a fresh window and the
    guard plans again. It costs memory, not safety.

    ``max_tokens`` is the output reserved when a request does not say;
    ``summarize_after`` is how many dropped, not-yet-summarized messages
    trigger the summarizer; ``start_on_user`` makes a window that leaves older
    messages out begin on a user message after the pinned messages and the
    summary (what Bedrock, Gemini and Mistral's templates require; see
    :mod:`ctxguard.guard.policies`); ``oversized`` decides what happens to a single
    message over ``max_message_tokens``.

    ``ttl_seconds`` (off by default) is a sliding TTL on every key of a session,
    refreshed with slack on Redis (the in-process store refreshes on every write):
    a write whose session was refreshed less than the slack ago (``ttl_seconds /
    20``, at most 60 s; none under 20 s, where every write refreshes) refreshes
    nothing, so a session expires between ``ttl_seconds - slack`` and
    ``ttl_seconds`` after its last write. A key a write creates always gets the
    session's TTL (on Redis: one ``PTTL`` a write, where a refresh is an ``EXPIRE``
    per key).

    ``window_policy`` chooses how the window drops old messages: ``"sliding"``
    (newest messages that fit, every turn) or ``"stable"`` (grow at the end,
    cut rarely down to ``low_water`` so the server's prefix cache stays warm;
    see :mod:`ctxguard.guard.stable`). ``low_water`` is an int (prompt tokens
    left after a cut) or a float in (0, 1) (that fraction of the prompt budget); a
    mark at or above the prompt budget cuts at every user turn (a sliding window).

    ``prefix_block_size`` (off by default) adds to each request record the
    prefix-cache model's estimate of the prompt tokens the server reuses and
    prefills (``reused``, ``prefilled``; vLLM's rules at this block size, 16 on
    GPUs; see :mod:`ctxguard.guard.prefix_estimate`), when the counter has token
    ids. It costs a turn about 0.2-0.7 ms at 4k tokens with the tiktoken rule (its
    block hashes, its new messages encoded) and one render with ``hf:`` templates.

    ``connect_timeout`` and ``read_timeout`` (seconds) bound every call to a
    store the guard opens from a URL; ``None`` keeps the URL's
    ``socket_connect_timeout`` / ``socket_timeout`` or the defaults (5 s, 10 s).
    """

    max_tokens: int = 1024
    safety_margin: int = 0
    ttl_seconds: int | None = None
    max_stored_messages: int | None = None
    max_message_tokens: int | None = None
    oversized: Literal["reject", "truncate"] = "reject"
    max_window_messages: int | None = None
    degrade_tool_results: bool = True
    start_on_user: bool = True
    window_policy: Literal["sliding", "stable"] = "sliding"
    low_water: int | float = 0.5
    summarizer: Summarizer | None = None
    summarize_after: int = 20
    summary_mode: Literal["inline", "background"] = "inline"
    summary_role: Literal["system", "user"] = "system"
    summary_timeout: float = 30.0
    summary_max_tokens: int = 1024
    audit_retention: int = 1000
    audit_mode: Literal["sync", "with_reply"] = "sync"
    commit: Literal["prepare", "with_reply"] = "prepare"
    window_cache_size: int = 1024
    window_cache_bytes: int = 64 << 20
    prefix_block_size: int | None = None
    connect_timeout: float | None = None
    read_timeout: float | None = None

    def __post_init__(self) -> None:
        for name in (
            "max_tokens",
            "safety_margin",
            "summarize_after",
            "audit_retention",
            "window_cache_size",
            "window_cache_bytes",
        ):
            _non_negative(name, getattr(self, name))
        for name in (
            "ttl_seconds",
            "max_stored_messages",
            "max_message_tokens",
            "max_window_messages",
            "prefix_block_size",
        ):
            value = getattr(self, name)
            if value is not None and (type(value) is not int or not 0 < value < 2**63):
                raise ConfigError(f"{name} must be a positive int or None, got {show(value)}")
        if self.oversized not in ("reject", "truncate"):
            raise ConfigError(
                f"oversized must be 'reject' or 'truncate', got {show(self.oversized)}"
            )
        if self.summary_mode not in ("inline", "background"):
            raise ConfigError(
                f"summary_mode must be 'inline' or 'background', got {show(self.summary_mode)}"
            )
        if self.audit_mode not in ("sync", "with_reply"):
            raise ConfigError(
                f"audit_mode must be 'sync' or 'with_reply', got {show(self.audit_mode)}"
            )
        if self.commit not in ("prepare", "with_reply"):
            raise ConfigError(f"commit must be 'prepare' or 'with_reply', got {show(self.commit)}")
        if self.summary_role not in ("system", "user"):
            raise ConfigError(
                f"summary_role must be 'system' or 'user', got {show(self.summary_role)}"
            )
        timeout = self.summary_timeout
        if type(timeout) not in (int, float) or not 0 < timeout < float("inf"):
            raise ConfigError(
                f"summary_timeout must be a positive number of seconds, got {show(timeout)}"
            )
        if type(self.summary_max_tokens) is not int or self.summary_max_tokens <= 0:
            raise ConfigError(
                f"summary_max_tokens must be a positive int, got {show(self.summary_max_tokens)}"
            )
        for name in ("degrade_tool_results", "start_on_user"):
            if type(getattr(self, name)) is not bool:
                raise ConfigError(f"{name} must be True or False, got {show(getattr(self, name))}")
        if self.summarizer is not None and not callable(self.summarizer):
            raise ConfigError(
                "summarizer must be a callable (previous_summary, messages) -> str, "
                f"got {type(self.summarizer).__name__}"
            )
        for name in ("connect_timeout", "read_timeout"):
            _seconds_or_none(name, getattr(self, name))
        _check_window_policy(self.window_policy, self.low_water)

    def describe(self) -> dict[str, Any]:
        """The settings as plain data (for audit records and replay); no callables."""
        data = asdict(self)
        data["summarizer"] = _name_of(self.summarizer)
        return data


def is_async_callable(fn: object) -> bool:
    """True for ``async def`` functions and objects whose ``__call__`` is one."""
    import inspect

    call = type(fn).__dict__.get("__call__") if not inspect.isfunction(fn) else None
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(call)


def _check_window_policy(policy: object, low_water: object) -> None:
    if policy not in ("sliding", "stable"):
        raise ConfigError(f"window_policy must be 'sliding' or 'stable', got {show(policy)}")
    if type(low_water) is int and 0 <= low_water < 2**63:
        return
    if type(low_water) is float and 0.0 < low_water < 1.0:
        return
    raise ConfigError(
        "low_water must be a non-negative int (tokens) or a float in (0, 1) "
        f"(a fraction of the prompt budget), got {show(low_water)}"
    )


def _non_negative(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**63:
        raise ConfigError(f"{name} must be a non-negative int, got {show(value)}")


def _seconds_or_none(name: str, value: object) -> None:
    if value is None:
        return
    if not is_seconds(value):
        raise ConfigError(
            f"{name} must be a positive number of seconds (at most {MAX_SECONDS:,}) or None, "
            f"got {show(value)}"
        )


def _name_of(fn: object) -> str | None:
    if fn is None:
        return None
    return getattr(fn, "name", None) or getattr(fn, "__qualname__", None) or type(fn).__name__
