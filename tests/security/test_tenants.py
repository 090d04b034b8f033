"""Two tenants (and two namespaces) with the same session id never see each other's data."""

from __future__ import annotations

from typing import Any

import pytest

from ctxguard.guard import AsyncGuard, Guard
from ctxguard.messages import Message
from ctxguard.stores import NewMessage, WriteOptions

pytestmark = [pytest.mark.timeout(60)]
SID = "same-session"


def msg(text: str) -> NewMessage:
    return NewMessage(Message(role="user", content=text), 2)


async def test_stores_of_two_tenants_are_disjoint(store_factory: Any) -> None:
    acme = store_factory.make(tenant="acme")
    globex = store_factory.make(tenant="globex")
    await acme.append(SID, [msg("acme secret")], WriteOptions(counter="c"))
    await acme.add_audit(SID, {"kind": "note", "who": "acme"}, retention=5)
    await globex.append(SID, [msg("globex secret")], WriteOptions(counter="c"))

    assert [m.message.content for m in await acme.read(SID)] == ["acme secret"]
    assert [m.message.content for m in await globex.read(SID)] == ["globex secret"]
    assert await globex.read_audit(SID) == []
    window = await globex.fetch_window(SID, 10_000, WriteOptions(counter="c"))
    assert [m.message.content for m in window.recent] == ["globex secret"]
    assert await acme.list_sessions() == await globex.list_sessions() == [SID]

    assert await globex.delete(SID)
    assert [m.message.content for m in await acme.read(SID)] == ["acme secret"]
    assert await globex.read(SID) == []


async def test_guards_of_two_tenants_are_disjoint(store_factory: Any) -> None:
    stores = {t: store_factory.make(tenant=t) for t in ("acme", "globex")}
    guards: dict[str, Any] = {}
    for tenant, store in stores.items():
        cls = AsyncGuard if store_factory.mode == "async" else Guard
        guards[tenant] = cls(store.raw, counter="approx", limit=4096, max_tokens=64)

    for tenant, guard in guards.items():
        turn = [{"role": "user", "content": f"{tenant} private question"}]
        req = guard.prepare(SID, turn)
        req = await req if store_factory.mode == "async" else req
        texts = [m.text for m in req.messages]
        assert texts == [f"{tenant} private question"]  # nothing of the other tenant
    for tenant, store in stores.items():
        audit = await store.read_audit(SID)
        assert len([r for r in audit if r["kind"] == "request"]) == 1
        other = "globex" if tenant == "acme" else "acme"
        assert all(other not in str(r) for r in audit)
