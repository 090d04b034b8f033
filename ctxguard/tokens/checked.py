"""A counter the caller wrote, held to the contract the guard relies on.

The guard plans, stores and audits on the counts a counter answers: a negative,
fractional or boolean count (or a string, or ``None``) would be stored as a message's
size or break the budget arithmetic, and an exception of the counter's own
(``RuntimeError``, ``KeyError``...) would leave the guard as it is. :func:`checked`
wraps a counter that :func:`~ctxguard.tokens.load_counter` did not make: every count
must be an int from 0 to 2**63-1, and what the counter raises that is not a
:class:`CtxGuardError` becomes a :class:`TokenizerError` naming the method and the
exception (redacted), with the original as ``__cause__``. Nothing is stored then: the
counts come before any write. ctxguard's own counters are trusted and not wrapped
(no cost on the hot path).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ctxguard._secrets import describe
from ctxguard._validate import MAX_INT, show, type_name
from ctxguard.errors import ConfigError, CtxGuardError, TokenizerError
from ctxguard.messages import Message
from ctxguard.tokens._protocol import TokenCounter, Tools

MAX_FINGERPRINT = 1024


class CheckedCounter:
    """``counter``'s answers, each checked (see the module docstring)."""

    def __init__(self, counter: TokenCounter) -> None:
        self.wrapped = counter
        name = type_name(counter)
        fp = _attribute(counter, "fingerprint")
        if not isinstance(fp, str) or not 1 <= len(fp) <= MAX_FINGERPRINT:
            raise ConfigError(
                f"counter {name}: fingerprint must be a non-empty string of at most "
                f"{MAX_FINGERPRINT} characters (it names the counts stored), got {show(fp)}"
            )
        self.fingerprint: str = fp
        self.exact: bool = _flag(counter, "exact", name)
        self.additive: bool = _flag(counter, "additive", name)
        self._name = name
        if callable(getattr(counter, "validate", None)):
            self.validate = self._validate

    def count_message(self, message: Message) -> int:
        return self._count("count_message", self.wrapped.count_message, message)

    def request_overhead(self, *, tools: Tools | None = None) -> int:
        return self._count("request_overhead", self.wrapped.request_overhead, tools=tools)

    def count_request(self, messages: Sequence[Message], *, tools: Tools | None = None) -> int:
        return self._count("count_request", self.wrapped.count_request, messages, tools=tools)

    def _validate(self, messages: Sequence[Message], *, tools: Tools | None = None) -> None:
        try:
            self.wrapped.validate(messages, tools=tools)  # type: ignore[attr-defined]
        except CtxGuardError:
            raise
        except Exception as exc:
            raise self._failed("validate", exc) from exc

    def _count(self, method: str, call: Callable[..., Any], *args: Any, **kwargs: Any) -> int:
        try:
            count = call(*args, **kwargs)
        except CtxGuardError:
            raise  # the counter's own refusal (TemplateRefusedError, ...) as it is
        except Exception as exc:
            raise self._failed(method, exc) from exc
        if type(count) is not int:
            if isinstance(count, bool) or not isinstance(count, int):
                raise self._bad_count(method, count)
            count = int(count)  # an int subclass (IntEnum, numpy-like): its plain value
        if not 0 <= count <= MAX_INT:
            raise self._bad_count(method, count)
        return count

    def _bad_count(self, method: str, count: object) -> TokenizerError:
        return TokenizerError(
            f"counter {self._name}: {method} must return a token count, an int from 0 to "
            f"2**63-1, got {show(count)}; fix the counter (nothing was stored)"
        )

    def _failed(self, method: str, exc: Exception) -> TokenizerError:
        return TokenizerError(
            f"counter {self._name}: {method} raised {describe(exc, 200)}; fix the counter "
            "(nothing was stored)"
        )

    def __getattr__(self, name: str) -> Any:
        """Anything else the counter offers (a ``name``, its own helpers), as it is."""
        if name == "wrapped":  # (before __init__ set it: no recursion)
            raise AttributeError(name)
        return getattr(self.wrapped, name)


def _attribute(counter: object, name: str) -> object:
    try:
        return getattr(counter, name)
    except Exception as exc:
        raise ConfigError(
            f"counter {type_name(counter)}: reading {name} raised {describe(exc, 200)}"
        ) from exc


def _flag(counter: object, flag: str, name: str) -> bool:
    value = _attribute(counter, flag)
    if not isinstance(value, bool):
        raise ConfigError(f"counter {name}: {flag} must be True or False, got {show(value)}")
    return value


def checked(counter: TokenCounter) -> TokenCounter:
    """``counter`` itself when ctxguard made it, else wrapped in :class:`CheckedCounter`."""
    if type(counter) is CheckedCounter or type(counter).__module__.startswith("ctxguard."):
        return counter
    return CheckedCounter(counter)
