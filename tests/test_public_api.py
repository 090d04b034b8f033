"""The public door: what ``ctxguard`` exports, and sync/async twins that match."""

from __future__ import annotations

import inspect

import ctxguard
from ctxguard import AsyncGuard, Guard
from ctxguard.stores.memory import AsyncMemoryStore, MemoryStore
from ctxguard.stores.redis import AsyncRedisStore, RedisStore

EXPECTED = {
    "AsyncGuard",
    "BudgetError",
    "ConfigError",
    "ConflictError",
    "ContextLimit",
    "CorruptRecordError",
    "CtxGuardError",
    "ExtractiveSummarizer",
    "Guard",
    "GuardClosedError",
    "GuardConfig",
    "InvalidIdError",
    "InvalidInputError",
    "InvalidMessageError",
    "LimitSource",
    "Message",
    "MessageIdReusedError",
    "MessageTooLongError",
    "MissingDependencyError",
    "OutputReserveError",
    "ModelLimit",
    "OpenAISummarizer",
    "OperationEvent",
    "PreparedRequest",
    "ServerBusyError",
    "ServerLimit",
    "SessionFullError",
    "StaticLimit",
    "StoreConnectionError",
    "StoreError",
    "SummarizerError",
    "TemplateRefusedError",
    "TenantBudgetError",
    "TokenCounter",
    "TokenizerError",
    "ToolCall",
    "UncountableContentError",
    "load_counter",
    "open_async_store",
    "open_store",
}


def test_public_names_are_pinned() -> None:
    assert set(ctxguard.__all__) == EXPECTED
    for name in ctxguard.__all__:
        assert getattr(ctxguard, name) is not None


def test_every_error_shares_one_root() -> None:
    errors = [getattr(ctxguard, n) for n in ctxguard.__all__ if n.endswith("Error")]
    assert all(issubclass(e, ctxguard.CtxGuardError) for e in errors)


def test_every_error_of_the_tree_is_importable_from_ctxguard() -> None:
    import ctxguard.errors

    tree = {
        name
        for name, value in vars(ctxguard.errors).items()
        if isinstance(value, type) and issubclass(value, ctxguard.CtxGuardError)
    }
    assert tree - set(ctxguard.__all__) == set()
    assert {"ServerBusyError", "TenantBudgetError"} <= tree


def public_methods(cls: type) -> dict[str, bool]:
    return {
        name: inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn)
        for name, fn in inspect.getmembers(cls, inspect.isfunction)
        if not name.startswith("_")
    }


def test_guard_twins_have_the_same_methods() -> None:
    sync, aio = public_methods(Guard), public_methods(AsyncGuard)
    assert set(sync) - {"close"} == set(aio) - {"aclose"}
    assert all(aio[name] for name in aio if name not in ("counter",))


def test_store_twins_have_the_same_methods() -> None:
    for sync_cls, async_cls in [(MemoryStore, AsyncMemoryStore), (RedisStore, AsyncRedisStore)]:
        assert set(public_methods(sync_cls)) == set(public_methods(async_cls))
