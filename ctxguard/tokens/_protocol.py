"""The counter contract the guard programs against, and the fingerprint helper.

Kept free of any tokenizer import so ``import ctxguard.tokens`` stays light.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from ctxguard.messages import Message

Tools = Sequence[Mapping[str, Any]]


@runtime_checkable
class TokenCounter(Protocol):
    """What the guard needs from a tokenizer: per-message counts and the exact request count.

    ``fingerprint`` identifies tokenizer + chat template + options across processes;
    a stored per-message count is only reused when its fingerprint matches.
    ``additive`` promises ``count_request == request_overhead + sum(count_message)``
    for every conversation the template accepts (as far as build-time probes show).

    A counter whose ``count_request`` can refuse a conversation (``TemplateRefusedError``)
    should also define ``validate(messages, *, tools=None) -> None``, raising the same
    refusal for the same conversation without counting it: the guard calls it (through
    :func:`validate_request`) on every window it sends on the additive path, where
    ``count_request`` is never called. It is optional so that existing counters keep
    working; a counter without it is taken to accept every conversation.
    """

    fingerprint: str
    exact: bool
    additive: bool

    def count_message(self, message: Message) -> int: ...

    def request_overhead(self, *, tools: Tools | None = None) -> int: ...

    def count_request(self, messages: Sequence[Message], *, tools: Tools | None = None) -> int: ...


def fingerprint(*parts: str | bytes) -> str:
    """A stable identity: sha256 over length-prefixed parts (no ``id()``, no timestamps)."""
    digest = hashlib.sha256()
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        digest.update(len(data).to_bytes(8, "big"))
        digest.update(data)
    return digest.hexdigest()[:32]


def file_digest(path: str) -> str:
    """sha256 of a file's bytes, streamed."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def validate_request(
    counter: TokenCounter, messages: Sequence[Message], *, tools: Tools | None = None
) -> None:
    """Raise what ``counter.count_request`` would refuse, without counting (additive path).

    Calls the counter's optional ``validate``; counters without one accept everything.
    """
    validate = getattr(counter, "validate", None)
    if validate is not None:
        validate(messages, tools=tools)
