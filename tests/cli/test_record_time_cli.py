"""The CLI over a session whose message records were written the earlier way
(``"created_at"`` in ISO form, before the compact ``"t"``): show, replay and audit
answer exactly as over the same session written now."""

from __future__ import annotations

import json

import pytest

from ctxguard.messages import iso_record
from ctxguard.stores.base import SessionStore
from ctxguard.stores.keys import KeySpace
from tests.conftest import raw_client

from .conftest import CHAT, TOOLS, Cli

pytestmark = pytest.mark.redis


@pytest.mark.parametrize("session", [CHAT, TOOLS])
def test_earlier_records_show_replay_and_audit_as_before(
    run: Cli,
    sessions: None,
    store: SessionStore,
    redis_url: str,
    redis_namespace: str,
    session: str,
) -> None:
    commands = [("show", session), ("replay", session), ("audit", session)]
    before = [run.json(*c) for c in commands]
    key = KeySpace(redis_namespace).session_keys(session)[1]
    client = raw_client(redis_url)
    try:
        records = client.lrange(key, 0, -1)
        assert all(b'"t":' in r and b'"created_at"' not in r for r in records)  # written now
        for seq, stored in enumerate(store.read(session)):
            client.lset(key, seq, iso_record(stored.message))
        assert all(json.loads(r)["created_at"] for r in client.lrange(key, 0, -1))
    finally:
        client.close()
    after = [run.json(*c) for c in commands]
    assert after == before
    assert run("replay", session, "--check").exit_code == 0
    assert run("audit", session).exit_code == 0
