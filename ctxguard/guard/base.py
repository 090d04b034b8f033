"""What :class:`Guard` and :class:`AsyncGuard` share: settings, counter, limit source."""

from __future__ import annotations

import dataclasses
import inspect
import logging
from collections.abc import Mapping
from typing import Any

from ctxguard import _validate as v
from ctxguard._nocopy import NotCopyable
from ctxguard._secrets import describe
from ctxguard.errors import (
    ConfigError,
    CtxGuardError,
    GuardClosedError,
    InvalidMessageError,
    StoreError,
)
from ctxguard.guard import flows
from ctxguard.guard.config import GuardConfig
from ctxguard.guard.core import GuardCore
from ctxguard.guard.events import Kind, Observer, observed
from ctxguard.guard.prepared import PreparedRequest
from ctxguard.guard.setup import make_counter, make_limit
from ctxguard.kv.limit import ContextLimit, LimitSource
from ctxguard.messages import Message, record_of, says_nothing, to_message
from ctxguard.tokens._protocol import TokenCounter
from ctxguard.tokens.checked import CheckedCounter

_SETTINGS = frozenset(f.name for f in dataclasses.fields(GuardConfig))
log = logging.getLogger("ctxguard.guard")


def report_background_failure(session_id: str, exc: BaseException | None) -> None:
    """A background summary that raised (a damaged session, a record that could not be
    written): nobody awaits it, so it is logged here (one redacted line; an observer
    also sees the operation's error). A summarizer's own failure does not raise: it is
    a ``summary_failed`` record."""
    if exc is not None:
        log.warning(
            "background summary of session %r failed: %s",
            session_id,
            describe(exc),
        )


class GuardBase(NotCopyable):
    """Builds the core from the constructor arguments; the subclasses only do I/O.

    Not copyable nor picklable (``NotCopyableError``): a guard holds its store's
    connections, a lock and per-process caches (windows, counts)."""

    _holds = "its store's connections, locks and per-process caches"
    _advice = (
        "make one per process from the same settings (one guard serves all of a "
        "process's threads or tasks)"
    )

    def __init__(
        self,
        *,
        counter: str | TokenCounter,
        limit: int | ContextLimit | LimitSource,
        config: GuardConfig | None,
        settings: dict[str, Any],
        observer: Observer | None = None,
    ) -> None:
        self.config = _config(config, settings)
        spec = counter if isinstance(counter, str) else None
        self.core = GuardCore(make_counter(counter), self.config, spec)
        self.limit_source = make_limit(limit)
        if observer is not None and not callable(observer):
            raise ConfigError(
                "observer must be a callable taking one OperationEvent, "
                f"got {v.type_name(observer)}"
            )
        self.core.observer = observer
        self._closed = False  # set by close() / aclose(): every later call refused

    @property
    def observer(self) -> Observer | None:
        """What receives one :class:`~ctxguard.guard.events.OperationEvent` per operation."""
        return self.core.observer

    def _observed(
        self,
        kind: Kind,
        session_id: str,
        flow: flows.Flow[flows.T],
        *,
        usage: Mapping[str, Any] | None = None,
        prepared: PreparedRequest | None = None,
    ) -> flows.Flow[flows.T]:
        """``flow`` itself, or (with an observer) ``flow`` timed and reported."""
        observer = self.core.observer
        if observer is None:
            return flow
        estimate = None if prepared is None else prepared.tokens
        return observed(flow, observer, kind, session_id, usage=usage, estimate=estimate)  # type: ignore[no-any-return]

    @staticmethod
    def _check_store(store: object, want_async: bool) -> None:
        """A sync store under AsyncGuard (or the reverse) fails at the first call; say so now."""
        use = "open_async_store" if want_async else "open_store"
        if not all(callable(getattr(store, m, None)) for m in ("append", "fetch_window", "read")):
            raise ConfigError(
                f"store must be a URL like 'redis://localhost:6379/0' or a session store "
                f"from {use}(url), got {v.type_name(store)}"
            )
        is_async = inspect.iscoroutinefunction(getattr(store, "fetch_window", None))
        if is_async != want_async:
            wanted, use = (
                ("an async", "open_async_store") if want_async else ("a sync", "open_store")
            )
            raise ConfigError(
                f"{type(store).__name__} is not {wanted} session store; pass a URL or {use}(url)"
            )

    @staticmethod
    def _foreign(store: object) -> bool:
        """A store the caller wrote (not one of ctxguard's): what it raises is checked."""
        return not type(store).__module__.startswith("ctxguard.")

    @staticmethod
    def _store_failed(store: object, method: str, exc: Exception) -> Exception:
        """What a store the caller wrote raised that is not a CtxGuardError, as a
        StoreError (the original is its ``__cause__``); a CtxGuardError as it is."""
        if isinstance(exc, CtxGuardError):
            return exc
        error = StoreError(
            f"the session store {v.type_name(store)} raised {describe(exc, 300)} in "
            f"{method}(); the operation may be partly written: fix the store and retry"
        )
        error.__cause__ = exc
        return error

    # -- the argument checks of the public methods (sync and async alike) -----------

    def _check_open(self) -> None:
        if self._closed:
            raise GuardClosedError(type(self).__name__)

    def _prepare_args(
        self, session_id: object, new: object, max_tokens: object, tools: object, what: str
    ) -> None:
        self._check_open()
        v.check_session_id(session_id)
        v.check_message_batch(new, what)
        v.check_max_tokens(max_tokens)
        v.check_tools(tools)

    def _complete_args(
        self, session_id: object, reply: object, prepared: object, usage: object
    ) -> tuple[Message, str]:
        """Checks ``complete``'s arguments; returns the reply as a Message, and its record
        when the guard made the Message now (else "": the caller's is serialised as it is)."""
        self._check_open()
        session = v.check_session_id(session_id)
        v.check_reply(reply)
        try:
            message = to_message(reply)  # type: ignore[arg-type]
        except InvalidMessageError as exc:
            raise InvalidMessageError(f"reply: {exc}") from None
        if message.role != "assistant":
            raise InvalidMessageError(
                f"reply: complete() stores the model's reply, an assistant message; got role "
                f"{message.role!r} (store other messages with append())"
            )
        if says_nothing(message):
            raise InvalidMessageError(
                "reply: an assistant reply needs content or tool_calls (servers refuse one "
                "with neither on later turns); pass content='' for an empty reply"
            )
        record = "" if message is reply else record_of(message)
        v.check_prepared(prepared, session)
        v.check_usage(usage)
        return message, record

    def _summarize_args(self, session_id: object, request: object) -> None:
        self._check_open()
        v.check_session_id(session_id)
        v.check_summary_request(request)

    @property
    def counter(self) -> TokenCounter:
        """The token counter every count of this guard comes from (the one passed in)."""
        counter = self.core.counter
        return counter.wrapped if isinstance(counter, CheckedCounter) else counter

    @property
    def counter_spec(self) -> str | None:
        """The counter's spec as given (``"approx"``, ``"hf:/path"``...), any URL's
        password hidden (as request records keep it); None for a counter object."""
        return self.core.counter_spec

    @property
    def closed(self) -> bool:
        """Whether ``close()`` / ``aclose()`` was called: every later call but that one
        raises :class:`~ctxguard.errors.GuardClosedError` and stores nothing."""
        return self._closed


def _config(config: object, settings: dict[str, Any]) -> GuardConfig:
    """``config=GuardConfig(...)`` or the same settings as keywords, not both."""
    unknown = sorted(set(settings) - _SETTINGS)
    if unknown:
        raise ConfigError(
            f"unknown setting {', '.join(map(repr, unknown))}; "
            f"the guard takes {', '.join(sorted(_SETTINGS))}"
        )
    if config is None:
        return GuardConfig(**settings)
    if not isinstance(config, GuardConfig):
        raise ConfigError(f"config must be a GuardConfig, got {v.type_name(config)}")
    if settings:
        raise ConfigError(
            f"pass settings either in config= or as keywords, not both (got config= and "
            f"{', '.join(sorted(settings))}); use dataclasses.replace(config, ...)"
        )
    return config
