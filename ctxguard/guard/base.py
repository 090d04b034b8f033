"""What :class:`Guard` and :class:`AsyncGuard` share: settings, counter, limit source."""

from __future__ import annotations

import inspect
from typing import Any

from ctxguard.errors import ConfigError
from ctxguard.guard.config import GuardConfig
from ctxguard.guard.core import GuardCore
from ctxguard.guard.setup import make_counter, make_limit
from ctxguard.kv.limit import ContextLimit, LimitSource
from ctxguard.tokens._protocol import TokenCounter


class GuardBase:
    """Builds the core from the constructor arguments; the subclasses only do I/O."""

    def __init__(
        self,
        *,
        counter: str | TokenCounter,
        limit: int | ContextLimit | LimitSource,
        config: GuardConfig | None,
        settings: dict[str, Any],
    ) -> None:
        self.config = config or GuardConfig(**settings)
        spec = counter if isinstance(counter, str) else None
        self.core = GuardCore(make_counter(counter), self.config, spec)
        self.limit_source = make_limit(limit)

    @staticmethod
    def _check_store(store: object, want_async: bool) -> None:
        """A sync store under AsyncGuard (or the reverse) fails at the first call; say so now."""
        is_async = inspect.iscoroutinefunction(getattr(store, "fetch_window", None))
        if is_async != want_async:
            wanted, use = (
                ("an async", "open_async_store") if want_async else ("a sync", "open_store")
            )
            raise ConfigError(
                f"{type(store).__name__} is not {wanted} session store; pass a URL or {use}(url)"
            )

    @property
    def counter(self) -> TokenCounter:
        """The token counter every count of this guard comes from."""
        return self.core.counter
