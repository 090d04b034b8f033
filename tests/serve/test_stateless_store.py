"""A request without a session (stateless) is fitted in a store of its own, which no
client of the process can open: with ``url=memory://`` the gateway's stateless guard used
the process's shared ``memory://`` store, so while such a request ran its
``stateless-<uuid>`` session was listed (and readable) under the default tenant by the
gateway's own tenant guards and by any other client of the process."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from ctxguard import open_store, stores
from ctxguard.stores import MemoryStore

from .conftest import Start
from .upstream import FakeVLLM

pytestmark = pytest.mark.timeout(120)

REQUESTS = {
    "chat": ("/v1/chat/completions", {"messages": [{"role": "user", "content": "no session"}]}),
    "responses": ("/v1/responses", {"input": "no session", "store": False}),
}


@pytest.mark.parametrize("route", list(REQUESTS))
def test_a_stateless_session_is_in_no_store_a_client_can_open(
    route: str, start_gateway: Start, vllm: FakeVLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stores, "_memory", {})  # a fresh map of the process's stores
    gateway = start_gateway(url="memory://", max_tokens=64)
    held: list[str] = []
    listed: list[tuple[str, str, str]] = []
    read: list[tuple[str | None, int]] = []
    delete = MemoryStore.delete

    def looking_first(store: MemoryStore, session_id: str) -> bool:
        # the moment before the gateway deletes its stateless session: it is still held
        if session_id.startswith("stateless-") and store.info(session_id) is not None:
            held.append(session_id)
            for shared in list(stores._memory.values()):  # every store a URL has opened
                listed.extend((shared.namespace, shared.tenant, s) for s in shared.list_sessions())
            for tenant in (None, "stateless"):  # and what a client opening one reads
                opened = open_store("memory://", tenant=tenant)
                read.append((tenant, len(opened.read(session_id))))
        return delete(store, session_id)

    monkeypatch.setattr(MemoryStore, "delete", looking_first)
    path, body = REQUESTS[route]
    # the gateway's default tenant has a session of its own, so its store is open
    kept = {"messages": [{"role": "user", "content": "kept"}], "model": "m"}
    response = httpx.post(
        gateway + "/v1/chat/completions", json=kept, headers={"X-Session-Id": "s1"}, timeout=30
    )
    assert response.status_code == 200, response.text
    response = httpx.post(gateway + path, json={"model": "m", **body}, timeout=30)
    assert response.status_code == 200, response.text
    assert len(held) == 1  # the request's session was there, in the gateway's store
    assert listed == [("ctxg", "default", "s1")], listed  # and no client saw it
    assert read == [(None, 0), ("stateless", 0)]
    after: list[Any] = [s for m in stores._memory.values() for s in m.list_sessions()]
    assert after == ["s1"]
