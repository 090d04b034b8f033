"""audit: limits, provider validity, undecodable records, over-long messages, drift."""

from __future__ import annotations

import pytest

from ctxguard.stores.base import SessionStore

from .conftest import CHAT, CORRUPT, TOOLS, VIOLATION, Cli, plant_violation

pytestmark = pytest.mark.redis


def _found(data: dict[str, object]) -> set[tuple[str, str]]:
    return {(v["session"], v["check"]) for v in data["violations"]}  # type: ignore[attr-defined]


def test_audit_all_exits_1_and_names_the_corrupt_and_violating_sessions(
    run: Cli, sessions: None
) -> None:
    data = run.json("audit", "--all")
    assert data["ok"] is False
    # the pushed record also left the derived keys behind the message list
    assert _found(data) == {
        (CORRUPT, "corrupt_record"),
        (CORRUPT, "damaged_key"),
        (VIOLATION, "over_limit"),
    }
    over = next(v for v in data["violations"] if v["check"] == "over_limit")
    assert over["where"] == "turn 4" and "5100 > limit 1000" in over["detail"]
    table = run("audit", "--all")
    assert table.exit_code == 1
    count = f"{len(data['violations'])} violation(s)"
    for text in (VIOLATION, "over_limit", CORRUPT, "corrupt_record", "damaged_key", count):
        assert text in table.stdout


@pytest.mark.parametrize("session", [CHAT, TOOLS])
def test_guard_sessions_pass_the_audit(run: Cli, sessions: None, session: str) -> None:
    result = run("audit", session)
    assert result.exit_code == 0, result.stdout
    assert "no violations" in result.stdout
    data = run.json("audit", session)
    assert data["ok"] is True and data["sessions"][0]["requests"] >= 10


def test_tool_result_sent_without_its_call_is_invalid(
    run: Cli, sessions: None, store: SessionStore
) -> None:
    tool_ids = [s.message.id for s in store.read(TOOLS) if s.message.role == "tool"]
    record = {
        "turn": 0,
        "kind": "request",
        "sent_ids": [tool_ids[0], "ctxguard-summary-v1"],
        "tokens": 10,
        "limit": 900,
        "reserved_output": 100,
        "safety_margin": 0,
    }
    store.add_audit(TOOLS, record, retention=0)
    data = run.json("audit", TOOLS)
    assert _found(data) == {(TOOLS, "invalid_request")}
    assert "has no call" in data["violations"][0]["detail"]


def test_unknown_sent_id_is_reported(run: Cli, sessions: None, store: SessionStore) -> None:
    record = {"turn": 0, "kind": "request", "sent_ids": ["ghost"], "tokens": 1, "limit": 900}
    store.add_audit(CHAT, record, retention=0)
    assert _found(run.json("audit", CHAT)) == {(CHAT, "unknown_sent_id")}


def test_drift_p50_and_max_and_threshold(run: Cli, sessions: None) -> None:
    data = run.json("audit", CHAT)
    stats = data["sessions"][0]
    assert stats["usage_records"] == 10
    assert stats["drift_p50"] == 4.0 and stats["drift_max"] == 8  # drifts 0,4,8,0,4,8,...
    strict = run.json("audit", CHAT, "--max-drift", "5")
    assert _found(strict) == {(CHAT, "drift")}
    assert len(strict["violations"]) == 3
    assert run("audit", CHAT, "--max-drift", "8").exit_code == 0


def test_over_long_messages(run: Cli, sessions: None) -> None:
    data = run.json("audit", CHAT, "--max-message-tokens", "150")
    assert _found(data) == {(CHAT, "long_message")}
    assert len(data["violations"]) == 10  # the ten 188-token user messages


def test_planted_violation_helper_and_one_session(
    run: Cli, sessions: None, store: SessionStore
) -> None:
    plant_violation(store, CHAT)
    result = run("audit", CHAT)
    assert result.exit_code == 1 and "over_limit" in result.stdout


def test_audit_needs_a_session_or_all(run: Cli) -> None:
    assert run("audit").exit_code == 2
    assert run("audit", "x", "--all").exit_code == 2


def test_a_request_record_whose_stored_context_is_gone_is_reported(
    run: Cli, sessions: None, store: SessionStore, redis_url: str, redis_namespace: str
) -> None:
    """Only outside damage deletes a session's ``ctx`` key; every request record that
    named a context there is then reported, not skipped as a record of no kind."""
    import redis

    from ctxguard.stores.keys import SUFFIXES, KeySpace

    keys = dict(zip(SUFFIXES, KeySpace(redis_namespace).session_keys(CHAT), strict=True))
    client = redis.Redis.from_url(redis_url)
    try:
        assert client.exists(keys["ctx"]) == 1
        client.delete(keys["ctx"])
    finally:
        client.close()
    data = run.json("audit", CHAT)
    missing = [v for v in data["violations"] if v["check"] == "missing_context"]
    requests = sum(1 for r in store.read_audit(CHAT) if "ctx" in r and "kind" not in r)
    assert requests >= 10 and len(missing) == requests
    assert _found(data) == {(CHAT, "missing_context")}
    assert "is not in the session's ctx key" in missing[0]["detail"]
    assert missing[0]["where"].startswith("turn ")
    assert run("audit", CHAT).exit_code == 1
