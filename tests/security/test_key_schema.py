"""Hostile names at the key schema's doors: a namespace or tenant that is not exactly
``[A-Za-z0-9_.-]{1,64}`` is refused, with a typed one-line error, at every door that
takes one, before any key is made."""

from __future__ import annotations

import pytest

from ctxguard import Guard
from ctxguard.errors import ConfigError, CtxGuardError, InvalidIdError
from ctxguard.ids import validate_name
from ctxguard.serve.config import ServeConfig
from ctxguard.stores import AsyncMemoryStore, MemoryStore, open_store

# "$" in a regex matches before a final newline: "a\n" once passed as tenant "a\n"
HOSTILE_NAMES = ["a\n", "ns\n", "a\r\n", "a\x00", "a:b", "a*", "{a}", "a\\", ""]


@pytest.mark.parametrize("value", HOSTILE_NAMES)
def test_validate_name_refuses_separators_globs_and_a_final_newline(value: str) -> None:
    with pytest.raises(InvalidIdError) as caught:
        validate_name(value, "tenant")
    assert "\n" not in str(caught.value) and "1-64 characters" in str(caught.value)


@pytest.mark.parametrize("value", ["a\n", "x" * 64 + "\n"])
@pytest.mark.parametrize("what", ["namespace", "tenant"])
def test_a_name_with_a_final_newline_is_refused_at_every_door(value: str, what: str) -> None:
    with pytest.raises(InvalidIdError):
        Guard("memory://keys-schema", counter="approx", limit=4096, **{what: value})
    with pytest.raises(InvalidIdError):  # refused before any connection is made
        open_store("redis://127.0.0.1:1/0", **{what: value})
    encoded = value.replace("\n", "%0A")
    with pytest.raises(InvalidIdError):
        open_store(f"redis://127.0.0.1:1/0?{what}={encoded}")
    with pytest.raises(ConfigError) as caught:
        ServeConfig(upstream="http://127.0.0.1:1", api_keys={"k": value})
    assert isinstance(caught.value, CtxGuardError) and "\n" not in str(caught.value)


@pytest.mark.parametrize("value", [*HOSTILE_NAMES, 5, None, ["a"], b"a", "é"])
@pytest.mark.parametrize("what", ["namespace", "tenant"])
def test_memory_stores_built_directly_check_their_names(value: object, what: str) -> None:
    """``MemoryStore(...)``/``AsyncMemoryStore(...)`` took any object as their namespace
    and tenant (and reported it, e.g. to an adapter's serialised fields)."""
    with pytest.raises(InvalidIdError):
        MemoryStore(**{what: value})  # type: ignore[arg-type]
    with pytest.raises(InvalidIdError):
        AsyncMemoryStore(**{what: value})  # type: ignore[arg-type]
    assert MemoryStore("ns-2", "a.b").tenant == "a.b"
