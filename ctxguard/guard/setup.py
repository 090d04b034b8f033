"""Turning the guard's constructor arguments into a counter and a limit source."""

from __future__ import annotations

from typing import Any

from ctxguard._secrets import describe
from ctxguard._validate import type_name
from ctxguard.errors import ConfigError, CtxGuardError
from ctxguard.kv.limit import ContextLimit, LimitSource, StaticLimit
from ctxguard.tokens._protocol import TokenCounter
from ctxguard.tokens.checked import checked


def make_counter(counter: str | TokenCounter) -> TokenCounter:
    if isinstance(counter, str):
        from ctxguard.tokens import load_counter

        return load_counter(counter)
    if not isinstance(counter, TokenCounter):
        raise ConfigError(
            f"counter must be a spec string like 'tiktoken:cl100k_base' or a TokenCounter, "
            f"got {type(counter).__name__}"
        )
    return checked(counter)  # the caller's own counter: its answers checked


def make_limit(limit: int | ContextLimit | LimitSource) -> LimitSource:
    if isinstance(limit, bool):
        raise ConfigError("limit must be an int, a ContextLimit or a LimitSource, got a bool")
    if isinstance(limit, int):
        return StaticLimit(limit)
    if isinstance(limit, ContextLimit):
        return StaticLimit(limit.tokens, limit.source)
    if not hasattr(limit, "resolve"):
        raise ConfigError(
            f"limit must be an int, a ContextLimit or a LimitSource, got {type(limit).__name__}"
        )
    if type(limit).__module__.startswith("ctxguard."):
        return limit
    return CheckedLimit(limit)  # the caller's own source: its answers checked


class CheckedLimit:
    """A limit source the caller wrote, held to the contract: ``resolve`` /
    ``aresolve`` answer a :class:`ContextLimit`, and what they raise that is not a
    :class:`CtxGuardError` is a :class:`ConfigError` naming it (redacted), raised
    before anything is stored. ctxguard's own sources are not wrapped."""

    def __init__(self, source: LimitSource) -> None:
        self.wrapped = source

    def resolve(self) -> ContextLimit:
        try:
            value: object = self.wrapped.resolve()
        except CtxGuardError:
            raise
        except Exception as exc:
            raise _limit_failure(exc) from exc
        return _checked_limit(value)

    async def aresolve(self) -> ContextLimit:
        aresolve = getattr(self.wrapped, "aresolve", None)
        try:
            value: object = await aresolve() if aresolve is not None else self.wrapped.resolve()
        except CtxGuardError:
            raise
        except Exception as exc:
            raise _limit_failure(exc) from exc
        return _checked_limit(value)

    def __getattr__(self, name: str) -> Any:
        """Anything else the source offers (``invalidate``...), as it is."""
        if name == "wrapped":
            raise AttributeError(name)
        return getattr(self.wrapped, name)


def _checked_limit(value: object) -> ContextLimit:
    if not isinstance(value, ContextLimit):
        raise ConfigError(
            f"the limit source must resolve to a ContextLimit(tokens, source), got "
            f"{type_name(value)}; fix the limit source (nothing was stored)"
        )
    return value


def _limit_failure(exc: Exception) -> ConfigError:
    return ConfigError(
        f"the limit source raised {describe(exc, 200)}; fix the limit source (nothing was stored)"
    )
