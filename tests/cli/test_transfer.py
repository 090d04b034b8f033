"""export / delete / import: a lossless, idempotent round trip; delete asks first."""

from __future__ import annotations

import json
import os
import resource
import stat
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from ctxguard.guard import Guard
from ctxguard.stores.base import SessionStore
from ctxguard.stores.keys import SUFFIXES, KeySpace
from tests.conftest import raw_client

from .conftest import CHAT, CORRUPT, TOOLS, Cli

pytestmark = pytest.mark.redis


def state(store: SessionStore, session: str) -> dict[str, Any]:
    """Everything a session holds that an import must restore."""
    info = store.info(session)
    assert info is not None
    return {
        "messages": store.read(session),
        "info": (info.message_count, info.token_total, info.counter, info.summary_version),
        "audit_count": info.audit_count,
        "summary": store.get_summary(session),
        "audit": store.read_audit(session),
    }


def test_export_delete_import_round_trip_is_identical(
    run: Cli, sessions: None, store: SessionStore, guard: Guard, tmp_path: Path
) -> None:
    before = {s: state(store, s) for s in (CHAT, TOOLS)}
    out = tmp_path / "export.jsonl"
    assert run("export", CHAT, TOOLS, "--out", str(out)).exit_code == 0
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert lines[0]["type"] == "header"
    assert any(line["type"] == "message" and line["message"].get("tool_calls") for line in lines)
    for session in (CHAT, TOOLS):
        assert run("delete", session, "--yes").exit_code == 0
        assert store.info(session) is None
    imported = run.json("import", str(out))
    assert [i["new_session"] for i in imported] == [True, True]
    assert {s: state(store, s) for s in (CHAT, TOOLS)} == before
    # the store's turn counter came back too: the next request is numbered after the last
    last = max(r["turn"] for r in before[CHAT]["audit"] if r["kind"] == "request")
    assert guard.prepare(CHAT, [{"role": "user", "content": "again"}]).turn == last + 1


def test_reimport_changes_nothing(
    run: Cli, sessions: None, store: SessionStore, tmp_path: Path
) -> None:
    out = tmp_path / "export.jsonl"
    assert run("export", CHAT, "--out", str(out)).exit_code == 0
    before = state(store, CHAT)
    for _ in range(2):
        again = run.json("import", str(out))
        assert again == [
            {
                "session_id": CHAT,
                "new_session": False,
                "stored": 0,
                "duplicates": 21,
                "audit_added": 0,
                "summary_version": before["info"][3],
                "empty": False,
            }
        ]
    assert state(store, CHAT) == before


def test_import_into_a_session_missing_some_audit_adds_only_those(
    run: Cli, sessions: None, store: SessionStore, tmp_path: Path
) -> None:
    out = tmp_path / "export.jsonl"
    assert run("export", TOOLS, "--out", str(out)).exit_code == 0
    lines = out.read_text().splitlines()
    extra = {
        "type": "audit",
        "session_id": TOOLS,
        "index": 99,
        "record": {"kind": "usage", "of_turn": 1, "estimated": 5, "prompt_tokens": 5},
    }
    out.write_text("\n".join([*lines, json.dumps(extra)]) + "\n")
    assert run.json("import", str(out))[0]["audit_added"] == 1
    assert run.json("import", str(out))[0]["audit_added"] == 0


def test_export_all_refuses_a_session_with_an_undecodable_record(
    run: Cli, sessions: None, tmp_path: Path
) -> None:
    result = run("export", "--all", "--out", str(tmp_path / "x.jsonl"))
    assert result.exit_code == 4
    assert CORRUPT in result.stderr and "record 5" in result.stderr


def _cli_with_file_size_limit(run: Cli, limit: int, *args: str) -> subprocess.CompletedProcess[str]:
    """``ctxguard *args`` in a process that may write files of at most ``limit`` bytes
    (what a full disk or a quota does halfway through)."""

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))

    env = {**os.environ, "CTXGUARD_URL": run.url, "CTXGUARD_NAMESPACE": run.namespace}
    code = "import sys; from ctxguard.cli import main; sys.argv[0] = 'ctxguard'; main()"
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        env=env,
        preexec_fn=cap,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_an_export_cut_short_leaves_the_old_file_as_it_was(
    run: Cli, sessions: None, tmp_path: Path
) -> None:
    """(the file was opened for writing at once: a write that failed halfway left a cut
    file in place of the old one)"""
    whole = tmp_path / "whole.jsonl"
    assert run("export", CHAT, TOOLS, "--out", str(whole)).exit_code == 0
    size = whole.stat().st_size
    assert size > 8192
    out = tmp_path / "backup.jsonl"
    out.write_text("the old backup\n")
    out.chmod(0o640)
    result = _cli_with_file_size_limit(run, size // 2, "export", CHAT, TOOLS, "--out", str(out))
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(f"error: cannot write {out}: File too large")
    assert out.read_text() == "the old backup\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["backup.jsonl", "whole.jsonl"]
    # a whole export replaces it, with the file's own permissions
    assert run("export", CHAT, TOOLS, "--out", str(out)).exit_code == 0
    assert out.read_text() == whole.read_text() and (out.stat().st_mode & 0o777) == 0o640


def test_an_export_into_a_pipe_is_written_as_it_goes(
    run: Cli, sessions: None, tmp_path: Path
) -> None:
    """A device or a pipe is not replaced by a file: it is written to."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()))
    reader.start()
    result = run("export", CHAT, "--out", str(fifo))
    reader.join(30)
    assert result.exit_code == 0, result.stderr
    assert stat.S_ISFIFO(fifo.stat().st_mode)
    assert got and got[0].count("\n") > 10


def test_export_to_stdout_and_import_from_stdin(
    run: Cli, sessions: None, store: SessionStore
) -> None:
    exported = run("export", TOOLS, "--out", "-")
    assert exported.exit_code == 0
    before = state(store, TOOLS)
    assert run("delete", TOOLS, "--yes").exit_code == 0
    assert run("import", "-", input=exported.stdout).exit_code == 0
    assert state(store, TOOLS) == before


def test_import_rejects_a_file_that_is_not_an_export(run: Cli, tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"type": "message", "session_id": "s"}\n')
    result = run("import", str(bad))
    assert result.exit_code == 2 and "line 1" in result.stderr


def test_delete_asks_and_a_no_keeps_the_session(
    run: Cli, sessions: None, store: SessionStore
) -> None:
    declined = run("delete", TOOLS, input="n\n")
    assert declined.exit_code == 8
    assert store.info(TOOLS) is not None
    assert run("delete", TOOLS, input="").exit_code == 8  # no answer means no
    accepted = run("delete", TOOLS, input="y\n")
    assert accepted.exit_code == 0
    assert store.info(TOOLS) is None
    assert run("delete", TOOLS, "--yes").exit_code == 7


def test_round_trip_of_a_session_whose_old_audit_records_were_trimmed(
    run: Cli, redis_url: str, redis_namespace: str, store: SessionStore, tmp_path: Path
) -> None:
    guard = Guard(
        redis_url,
        counter="approx",
        limit=900,
        namespace=redis_namespace,
        audit_retention=4,
        max_tokens=100,
    )
    for turn in range(6):
        guard.prepare("trimmed", [{"role": "user", "content": f"hello {turn}"}])
    guard.close()
    before = state(store, "trimmed")
    assert [r["turn"] for r in before["audit"]] == [3, 4, 5, 6]
    out = tmp_path / "t.jsonl"
    assert run("export", "trimmed", "--out", str(out)).exit_code == 0
    assert run("delete", "trimmed", "--yes").exit_code == 0
    assert run("import", str(out)).exit_code == 0
    assert state(store, "trimmed") == before
    assert store.add_audit("trimmed", {"turn": 0, "kind": "request"}, retention=0) == 7


def test_an_imported_trail_stores_each_context_once_and_exports_the_same(
    run: Cli,
    sessions: None,
    store: SessionStore,
    redis_url: str,
    redis_namespace: str,
    tmp_path: Path,
) -> None:
    keys = dict(zip(SUFFIXES, KeySpace(redis_namespace).session_keys(CHAT), strict=True))
    first, again = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    assert run("export", CHAT, "--out", str(first)).exit_code == 0
    assert run("delete", CHAT, "--yes").exit_code == 0
    assert run("import", str(first)).exit_code == 0
    client = raw_client(redis_url)
    try:
        contexts = client.hgetall(keys["ctx"])
        stored = [json.loads(r) for r in client.lrange(keys["audit"], 0, -1)]
    finally:
        client.close()
    requests = [r for r in store.read_audit(CHAT) if r["kind"] == "request"]
    assert requests and len(contexts) == 1  # one guard, one setting: one context
    assert all(r.get("ctx") == next(iter(contexts)).decode() for r in stored if "turn" in r)
    assert run("export", CHAT, "--out", str(again)).exit_code == 0

    def records(path: Path) -> list[Any]:
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        return [line for line in lines if line["type"] == "audit"]

    assert records(again) == records(first) and records(first)


def test_a_session_line_with_nothing_to_store_is_not_reported_as_a_new_session(
    run: Cli, store: SessionStore, tmp_path: Path
) -> None:
    """(it was reported "new: yes, stored 0", and no session existed afterwards)"""
    path = tmp_path / "empty.jsonl"
    lines = [
        {"type": "header", "format": "ctxguard-export", "version": 1},
        {"type": "session", "session_id": "nothing-here", "counter": None, "ttl_seconds": None},
    ]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert run.json("import", str(path)) == [
        {
            "session_id": "nothing-here",
            "new_session": False,
            "stored": 0,
            "duplicates": 0,
            "audit_added": 0,
            "summary_version": 0,
            "empty": True,
        }
    ]
    assert store.info("nothing-here") is None
    table = run("import", str(path))
    assert table.exit_code == 0 and "empty: not made" in table.stdout
