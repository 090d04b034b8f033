"""A credential given where another value goes is not echoed by the error about it.

Errors quote a caller's bad value (``show``): a store URL passed as ``max_tokens``, a
namespace, a tenant, a role, a log level, a tiktoken file, a KV model name, or pydantic's input of a
LlamaIndex field, came back with its password in the one line (and a tiktoken file's
``FileNotFoundError`` under it repeated the path). Every URL form of
``test_secret_property`` and a bearer credential, through each of those doors.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable

import pytest

from ctxguard import CtxGuardError, Guard, GuardConfig, Message, load_counter, open_store
from ctxguard.kv.catalogue import resolve_model
from ctxguard.serve.config import ServeConfig
from security.test_secret_property import leaks, url_forms
from tests.conftest import private_memory_url

PASSWORD = "QJ:/?ZX#@W"
SECRETS = [*url_forms(PASSWORD, "10.0.0.7:6380"), f"Bearer {PASSWORD.replace(' ', '')}"]


def _llamaindex(value: str) -> object:
    memory = pytest.importorskip("ctxguard.adapters.llamaindex").CtxGuardMemory
    return memory(max_tokens=value)


DOORS: dict[str, Callable[[str], object]] = {
    "Guard max_tokens": lambda v: Guard(private_memory_url(), limit=100, max_tokens=v),  # type: ignore[arg-type]
    "Guard namespace": lambda v: Guard(private_memory_url(), limit=100, namespace=v),
    "GuardConfig ttl_seconds": lambda v: GuardConfig(ttl_seconds=v),  # type: ignore[arg-type]
    "open_store tenant": lambda v: open_store(private_memory_url(), tenant=v),
    "a message's role": lambda v: Guard(private_memory_url(), limit=100).prepare(
        "s", [{"role": v, "content": "x"}]
    ),
    "Message role": lambda v: Message(role=v, content="x"),  # type: ignore[arg-type]
    "serve log_level": lambda v: ServeConfig(upstream="http://h:1", log_level=v),
    "serve tenant": lambda v: ServeConfig(upstream="http://h:1", tenant=v),
    "tiktoken file": lambda v: load_counter(f"tiktoken:{v}"),
    "LlamaIndex field": _llamaindex,
    "kv model": resolve_model,
}


@pytest.mark.parametrize("door", sorted(DOORS))
@pytest.mark.parametrize("secret", range(len(SECRETS)))
def test_a_credential_in_a_bad_value_is_not_echoed(door: str, secret: int) -> None:
    value = SECRETS[secret]
    with pytest.raises(CtxGuardError) as info:
        DOORS[door](value)
    text = "".join(traceback.format_exception(info.value)) + repr(info.value.args)
    assert not leaks(text, PASSWORD), (value, text)
    assert "\n" not in str(info.value)


def test_a_value_without_credentials_is_still_shown() -> None:
    with pytest.raises(CtxGuardError) as info:
        Guard(private_memory_url(), limit=100, max_tokens="redis://10.0.0.7:6380/0")  # type: ignore[arg-type]
    assert "redis://10.0.0.7:6380/0" in str(info.value)
