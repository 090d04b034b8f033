"""Damaged or odd audit records and arguments: each reported in one line, never a traceback.

Sessions are written with the Python API in the test's own namespace; the records
are planted the way a foreign writer or a hand-made import file would leave them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ctxguard.messages import Message
from ctxguard.stores import records
from ctxguard.stores.base import NewMessage, SessionStore, WriteOptions
from ctxguard.stores.keys import KeySpace
from tests.conftest import raw_client

from .conftest import Cli

SID = "edges-1"


def _session(store: SessionStore, *records: dict[str, Any]) -> None:
    messages = [
        NewMessage(Message(role="user", content=f"hello {i}", id=f"m{i}"), 3) for i in range(2)
    ]
    store.append(SID, messages, WriteOptions(counter="approx"))
    for record in records:
        store.add_audit(SID, record, retention=0)


def _one_line_error(result: Any, code: int) -> str:
    assert result.exit_code == code, (result.exit_code, result.stderr)
    err: str = result.stderr
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    return err


GOOD = {"turn": 0, "kind": "request", "sent_ids": ["m0"], "tokens": 3, "limit": 100}


@pytest.mark.redis
def test_one_undecodable_audit_record_is_reported_and_the_rest_still_read(
    run: Cli, store: SessionStore, redis_url: str, redis_namespace: str
) -> None:
    """(The whole trail was dropped: audit said 0 requests, replay found no counter spec.)"""
    _session(store, {**GOOD, "counter_spec": "approx"})
    client = raw_client(redis_url)
    try:
        client.rpush(KeySpace(redis_namespace).session_keys(SID)[6], b"{bad json")
    finally:
        client.close()
    store.add_audit(SID, {**GOOD, "counter_spec": "approx"}, retention=0)
    audit = run("audit", SID, "--json")
    assert audit.exit_code == 1, audit.stderr
    found = json.loads(audit.stdout)
    assert found["sessions"][0]["requests"] == 2
    assert [(v["check"], v["where"]) for v in found["violations"]] == [
        ("corrupt_record", "record audit 1")
    ]
    shown = run.json("show", SID)
    assert len(shown["audit"]) == 2
    replay = run("replay", SID)
    assert replay.exit_code == 0, replay.stderr
    assert "no counter spec" not in replay.stderr
    repair = run("repair", SID, "--dry-run")
    assert repair.exit_code == 0 and "record audit 1 does not decode" in repair.stderr


WRONG_TYPES = {
    "counter_spec on a string policy": {
        **GOOD,
        "policy": "x",
        "counter_spec": "hf:/nope",
        "limit": 0,
        "tokens": 0,
    },
    "decisions that are not a list": {
        **GOOD,
        "decisions": "notalist",
        "dropped": 5,
        "tokens": 5,
    },
}


@pytest.mark.parametrize("case", sorted(WRONG_TYPES))
def test_a_record_field_of_the_wrong_type_is_a_damaged_record_not_a_traceback(
    case: str, target: tuple[Cli, SessionStore], tmp_path: Path
) -> None:
    """(audit, show and report --html raised AttributeError / TypeError.)"""
    run, store = target
    _session(store, GOOD, WRONG_TYPES[case])
    audit = run("audit", SID, "--json")
    assert audit.exit_code == 1, audit.stderr
    violations = json.loads(audit.stdout)["violations"]
    assert [(v["check"], v["where"]) for v in violations] == [("corrupt_record", "record audit 1")]
    assert "field record (request)." in violations[0]["detail"]
    for args in (("show", SID), ("show", SID, "--json"), ("replay", SID, "--counter", "approx")):
        result = run(*args)
        assert result.exit_code == 0, (args, result.stderr)
    report = run("report", SID, "--html", str(tmp_path / "r.html"))
    assert report.exit_code == 0, report.stderr
    _one_line_error(run("export", SID, "--out", str(tmp_path / "e.jsonl")), 4)


def test_a_non_finite_stored_number_is_refused_in_one_line_not_printed_as_infinity(
    target: tuple[Cli, SessionStore], tmp_path: Path
) -> None:
    """(show --json printed Infinity, not JSON; export wrote a file its import refused.)"""
    run, store = target
    # stored as a release before the store refused non-finite numbers stored it
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(records, "refuse_non_finite", lambda record: None)
        _session(store, {"kind": "note", "x": float("inf")})
    assert "cannot carry" in _one_line_error(run("show", SID, "--json"), 4)
    out = tmp_path / "e.jsonl"
    assert "cannot carry" in _one_line_error(run("export", SID, "--out", str(out)), 4)
    assert not out.exists()


def test_export_writes_a_session_named_twice_once(
    target: tuple[Cli, SessionStore], tmp_path: Path
) -> None:
    """(It was written twice and the file's own import refused it.)"""
    run, store = target
    _session(store, GOOD)
    out = tmp_path / "e.jsonl"
    assert run("export", SID, SID, "--out", str(out)).exit_code == 0
    kinds = [json.loads(line)["type"] for line in out.read_text().splitlines()]
    assert kinds.count("session") == 1
    assert run("import", str(out)).exit_code == 0


def test_a_prefix_that_is_not_text_is_bad_input_in_one_line(
    target: tuple[Cli, SessionStore],
) -> None:
    """(A lone surrogate, what Python makes of a \\xff argument, raised UnicodeEncodeError.)"""
    run, _ = target
    assert "prefix" in _one_line_error(run("sessions", "--prefix", "\udcff"), 2)
    assert "prefix" in _one_line_error(run("sessions", "--prefix", "a\nb"), 2)


def test_a_url_that_is_not_text_is_a_config_error_without_the_password() -> None:
    """(The connection-error path quoted the password and raised UnicodeEncodeError.)"""
    result = Cli("redis://:hunter\udcffpw@127.0.0.1:1/0", "x")("show", "s1")
    err = _one_line_error(result, 2)
    assert "not UTF-8" in err and "hunter" not in err
