"""Inputs that validate as shapes but cannot be stored as JSON are refused, typed.

Lone surrogates, bytes or arbitrary objects in metadata, and tool-call
arguments nested too deeply for ``json.loads`` once escaped as bare
``PydanticSerializationError`` / ``RecursionError`` from inside a store;
they must be InvalidMessageError (a CtxGuardError) before anything is stored.
"""

from __future__ import annotations

from typing import Any

import pytest

from ctxguard.errors import CtxGuardError, InvalidInputError
from ctxguard.guard import Guard
from ctxguard.messages import Message
from tests.conftest import private_memory_url

CASES = {
    "lone-surrogate-content": {"role": "user", "content": "a\ud800b"},
    "lone-surrogate-name": {"role": "user", "content": "x", "name": "\udfff"},
    "object-in-metadata": {"role": "user", "content": "x", "metadata": {"k": object()}},
    "bytes-in-metadata": {"role": "user", "content": "x", "metadata": {"k": b"\xff"}},
    "deep-tool-arguments": {
        "role": "assistant",
        "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": "[" * 100_000}}],
    },
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_unstorable_input_is_refused_typed_and_stores_nothing(case: str) -> None:
    guard = Guard(private_memory_url(), counter="approx", limit=4096)
    data: Any = CASES[case]
    with pytest.raises(InvalidInputError):
        Message.from_openai(data)
    with pytest.raises(CtxGuardError):
        guard.prepare("s", [data])
    assert guard.store.read("s") == []
