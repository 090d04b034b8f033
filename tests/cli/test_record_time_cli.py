"""The CLI over a session whose message records were written the earlier way
(``"created_at"`` in ISO form, before the compact ``"t"`` and the positional record of a
plain message), or in a mix of the three forms: show, export, replay and audit answer
exactly as over the same session written now, and export writes the ISO records."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ctxguard.messages import iso_record
from ctxguard.stores.base import SessionStore
from ctxguard.stores.keys import KeySpace
from tests.conftest import raw_client

from .conftest import CHAT, TOOLS, Cli

pytestmark = pytest.mark.redis


def form(record: bytes) -> str:
    return "array" if record.startswith(b"[") else "iso" if b'"created_at"' in record else "t"


@pytest.mark.parametrize("which", ["all", "mixed"])
@pytest.mark.parametrize("session", [CHAT, TOOLS])
def test_earlier_records_show_export_replay_and_audit_as_before(
    run: Cli,
    sessions: None,
    store: SessionStore,
    redis_url: str,
    redis_namespace: str,
    session: str,
    which: str,
    tmp_path: Path,
) -> None:
    commands = [("show", session), ("replay", session), ("audit", session)]

    def export() -> list[str]:
        out = tmp_path / f"export-{len(list(tmp_path.iterdir()))}.jsonl"
        assert run("export", session, "--out", str(out)).exit_code == 0
        return out.read_text(encoding="utf-8").splitlines()

    before = [run.json(*c) for c in commands]
    exported = export()
    key = KeySpace(redis_namespace).session_keys(session)[1]
    client = raw_client(redis_url)
    try:
        records = client.lrange(key, 0, -1)
        assert {form(r) for r in records} <= {"array", "t"} and "array" in {
            form(r) for r in records
        }
        assert all(b'"created_at"' not in r for r in records)  # written now
        for seq, stored in enumerate(store.read(session)):
            if which == "all" or seq % 3 == 0:
                client.lset(key, seq, iso_record(stored.message))
        now = client.lrange(key, 0, -1)
        if which == "all":
            assert all(json.loads(r)["created_at"] for r in now)
        else:
            assert "iso" in {form(r) for r in now} and "array" in {form(r) for r in now}
    finally:
        client.close()
    after = [run.json(*c) for c in commands]
    assert after == before
    assert export() == exported
    assert '"created_at"' in "".join(exported) and '["u",' not in "".join(exported)
    assert run("replay", session, "--check").exit_code == 0
    assert run("audit", session).exit_code == 0
