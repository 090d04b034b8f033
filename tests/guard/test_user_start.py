"""A window that leaves messages out starts on a user turn, through the real guard."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import pytest

from ctxguard import ConfigError, GuardConfig, Message
from ctxguard.guard import Guard


class Heavy:
    """10 tokens a message counted alone, 20 in a rendered request: renders run over."""

    fingerprint = "heavy-test"
    exact = True
    additive = False

    def count_message(self, message: Message) -> int:
        return 10

    def request_overhead(self, *, tools: Any = None) -> int:
        return 0

    def count_request(self, messages: Sequence[Message], *, tools: Any = None) -> int:
        return 20 * len(messages)


def _history(guard: Guard) -> None:
    guard.append("s", [{"role": "system", "content": "sys"}])
    for turn in range(3):
        guard.append("s", [{"role": "user", "content": f"u{turn}"}])
        guard.append("s", [{"role": "assistant", "content": f"a{turn}"}])


@pytest.mark.parametrize("start_on_user", [True, False])
def test_a_render_trim_ends_on_a_user_turn(start_on_user: bool) -> None:
    # the items fit (80 of 110); the render (160) does not, and trimming 50 item
    # tokens leaves "a2, u3": an assistant first unless the policy drops it too
    guard = Guard(
        f"memory://{uuid.uuid4().hex}", counter=Heavy(), limit=110, start_on_user=start_on_user
    )
    _history(guard)
    req = guard.prepare("s", [{"role": "user", "content": "u3"}], max_tokens=0)
    roles = [m.role for m in req.messages]
    assert roles == (["system", "user"] if start_on_user else ["system", "assistant", "user"])
    assert req.tokens <= 110


def test_the_option_is_checked_and_recorded() -> None:
    with pytest.raises(ConfigError, match="start_on_user must be True or False"):
        GuardConfig(start_on_user="yes")  # type: ignore[arg-type]
    guard = Guard(f"memory://{uuid.uuid4().hex}", counter="approx", limit=5000, start_on_user=False)
    guard.prepare("s", [{"role": "user", "content": "hi"}])
    record = [r for r in guard.store.read_audit("s") if r["kind"] == "request"][-1]
    assert record["policy"]["start_on_user"] is False
