"""Turning the guard's constructor arguments into a counter and a limit source."""

from __future__ import annotations

from ctxguard._secrets import describe
from ctxguard._validate import type_name
from ctxguard.errors import ConfigError
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
    return limit


def checked_limit(value: object) -> ContextLimit:
    """What a limit source's ``resolve`` returned, if it is a :class:`ContextLimit`
    (a source the caller wrote may answer anything)."""
    if not isinstance(value, ContextLimit):
        raise ConfigError(
            f"the limit source must resolve to a ContextLimit(tokens, source), got "
            f"{type_name(value)}; fix the limit source (nothing was stored)"
        )
    return value


def limit_failure(exc: Exception) -> ConfigError:
    """What a limit source the caller wrote raised (not a ctxguard error), as one
    redacted line."""
    return ConfigError(
        f"the limit source raised {describe(exc, 200)}; fix the limit source (nothing was stored)"
    )
