"""The public door: what ``ctxguard`` exports, and sync/async twins that match."""

from __future__ import annotations

import ast
import asyncio
import inspect
import pathlib

import pytest

import ctxguard
from ctxguard import AsyncGuard, Guard
from ctxguard.stores.memory import AsyncMemoryStore, MemoryStore
from ctxguard.stores.redis import AsyncRedisStore, RedisStore
from tests.conftest import private_memory_url

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
    "NotCopyableError",
    "OutputReserveError",
    "ModelLimit",
    "OpenAISummarizer",
    "OperationEvent",
    "PreparedRequest",
    "ServerAuthError",
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
    "TokenizerAuthError",
    "TokenizerError",
    "ToolCall",
    "UncountableContentError",
    "UpstreamAuthError",
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


# -- what the adapters, the gateway, the CLI and observe may use of a guard ----------------


def _guard_internals() -> set[str]:
    """The names of a guard's private methods and attributes, and its ``core``."""
    guard = Guard(private_memory_url(), counter="approx", limit=400)
    try:
        found = set(dir(Guard)) | set(dir(AsyncGuard)) | set(vars(guard))
    finally:
        guard.close()
    return {n for n in found if n.startswith("_") and not n.startswith("__")} | {"core"}


def test_the_rooms_above_the_guard_use_only_its_public_api() -> None:
    """adapters/, serve/, cli/ and observe/ use the public door (ARCHITECTURE.md): no
    ``guard._check_open()``, no ``guard.core.<x>`` (``closed`` and ``counter_spec`` say
    what they read). Attributes of ``self`` / ``cls`` are the module's own."""
    internals = _guard_internals()
    assert {"_check_open", "_closed", "core"} <= internals
    root = pathlib.Path(ctxguard.__file__).parent
    found = []
    for room in ("adapters", "serve", "cli", "observe"):
        for path in sorted((root / room).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if not isinstance(node, ast.Attribute) or node.attr not in internals:
                    continue
                if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                    continue
                found.append(f"{path.relative_to(root)}:{node.lineno}: {ast.unparse(node)}")
    assert found == []


@pytest.mark.parametrize("cls", [Guard, AsyncGuard])
def test_closed_and_counter_spec_are_read_only_properties(cls: type) -> None:
    guard = cls(private_memory_url(), counter="approx", limit=400)
    assert guard.closed is False and guard.counter_spec == "approx"
    with pytest.raises(AttributeError):
        guard.closed = True
    with pytest.raises(AttributeError):
        guard.counter_spec = "other"
    if isinstance(guard, AsyncGuard):
        asyncio.run(guard.aclose())
    else:
        guard.close()
    assert guard.closed is True


def test_counter_spec_is_none_for_a_counter_object() -> None:
    from ctxguard.tokens import load_counter

    guard = Guard(private_memory_url(), counter=load_counter("approx"), limit=400)
    assert guard.counter_spec is None
    guard.close()
