"""``PreparedRequest.stored_ids`` and ``state_token``: what a prepare's own write stored and
the state token it left, so a caller can take the request back with a checked retract
(the gateway does when the model server refuses the request: ctxguard/serve/chat.py)."""

from __future__ import annotations

import pytest

from ctxguard import AsyncGuard, Guard
from ctxguard.errors import ConflictError
from ctxguard.messages import Message
from ctxguard.stores import NewMessage
from ctxguard.stores.memory import MemoryStore
from tests.conftest import private_memory_url


@pytest.mark.parametrize("cache", [0, 64], ids=["fetched", "cached"])
@pytest.mark.parametrize("audit_mode", ["sync", "with_reply"])
def test_a_prepare_says_what_it_stored_and_the_token_its_write_left(
    cache: int, audit_mode: str
) -> None:
    guard = Guard(
        MemoryStore(),
        counter="approx",
        limit=400,
        max_tokens=60,
        window_cache_size=cache,
        audit_mode=audit_mode,  # type: ignore[arg-type]
    )
    store = guard.store
    for turn in range(3):  # the first turn is fetched; later ones speculate on the cache
        asked = [Message(role="user", content=f"question {turn}", id=f"q{turn}")]
        prepared = guard.prepare("s", asked)
        assert prepared.stored_ids == (f"q{turn}",)
        assert prepared.state_token == store.read_with_token("s")[1] != ""
        again = guard.prepare("s", asked)  # a retry: stored nothing, so nothing to say
        assert again.stored_ids == () and again.state_token == ""
        guard.complete("s", Message(role="assistant", content=f"answer {turn}", id=f"a{turn}"))
    before = [s.message.id for s in store.read("s")]
    prepared = guard.prepare("s", [Message(role="user", content="late", id="late")])
    store.retract("s", len(prepared.stored_ids), expected_state=prepared.state_token)
    assert [s.message.id for s in store.read("s")] == before
    prepared = guard.prepare("s", [Message(role="user", content="late", id="late")])
    store.append("s", [NewMessage(Message(role="user", content="other", id="o"))])
    with pytest.raises(ConflictError):  # another write since: the token says so
        store.retract("s", len(prepared.stored_ids), expected_state=prepared.state_token)
    guard.close()


async def test_the_async_guard_says_it_too() -> None:
    guard = AsyncGuard(private_memory_url(), counter="approx", limit=400, max_tokens=60)
    prepared = await guard.prepare("s-async", [Message(role="user", content="hi", id="u")])
    assert prepared.stored_ids == ("u",)
    assert prepared.state_token == (await guard.store.read_with_token("s-async"))[1]
    await guard.aclose()
