"""replay: under its own settings a stored session reproduces what was sent."""

from __future__ import annotations

from pathlib import Path

import pytest
from faults.servers import free_port

from ctxguard.guard import Guard
from ctxguard.stores.base import SessionStore
from tests.conftest import recorded_ids

from .conftest import CHAT, CORRUPT, TOOLS, Cli, long_text

pytestmark = pytest.mark.redis


@pytest.mark.parametrize("session", [CHAT, TOOLS])
def test_replay_under_recorded_settings_reproduces_every_turn(
    run: Cli, sessions: None, store: SessionStore, session: str
) -> None:
    recorded = [r for r in store.read_audit(session) if r["kind"] == "request"]
    turns = run.json("replay", session)
    assert [t["turn"] for t in turns] == [r["turn"] for r in recorded]
    for turn, record in zip(turns, recorded, strict=True):
        assert turn["same"], turn
        assert turn["replayed_ids"] == recorded_ids(store, session, record)
        assert turn["replayed_tokens"] == record["tokens"]
    assert any(r.get("dropped") for r in recorded)  # the session did drop messages
    assert any(r.get("summary_version") for r in recorded)  # and sent summaries
    assert run("replay", session, "--check").exit_code == 0


def test_what_if_a_bigger_limit_keeps_more(run: Cli, sessions: None) -> None:
    turns = run.json("replay", CHAT, "--limit", "8000", "--no-summaries")
    assert all(t["error"] is None for t in turns)
    assert any(t["added"] for t in turns)
    assert all(t["limit"] == 8000 for t in turns)
    assert run("replay", CHAT, "--limit", "8000", "--check").exit_code == 1
    table = run("replay", CHAT, "--limit", "8000")
    assert table.exit_code == 0 and "differs" in table.stdout


def test_a_smaller_limit_shows_errors_not_a_crash(run: Cli, sessions: None) -> None:
    turns = run.json("replay", CHAT, "--limit", "150")
    assert any(t["error"] for t in turns)


def test_unloadable_counter_asks_for_another(run: Cli, sessions: None) -> None:
    result = run("replay", CHAT, "--counter", "nonsense:zzz")
    assert result.exit_code == 6
    assert "--counter" in result.stderr


@pytest.mark.parametrize("command", ["replay", "report"])
def test_a_counter_specs_password_is_never_printed(
    run: Cli, sessions: None, command: str, tmp_path: Path
) -> None:
    """(``cannot load counter 'vllm:http://user:vpass@host'``: the CLI quoted the spec as
    given, while the library's own part of the message was redacted)"""
    spec = f"vllm:http://user:vp%40ss-QJ9@127.0.0.1:{free_port()}"
    args = ["--html", str(tmp_path / "r.html")] if command == "report" else []
    result = run(command, CHAT, "--counter", spec, *args)
    text = result.output + result.stderr
    assert "vllm:http://***@127.0.0.1" in text, text
    assert "QJ9" not in text and "vp%40ss" not in text, text
    if command == "report":
        assert "QJ9" not in (tmp_path / "r.html").read_text()


def test_malformed_and_corrupt_sessions_replay_without_a_traceback(
    run: Cli, sessions: None, store: SessionStore
) -> None:
    store.add_audit(TOOLS, {"turn": 0, "kind": "request", "sent_ids": ["x"]}, retention=0)
    last = run.json("replay", TOOLS)[-1]
    assert last["error"].startswith("record lacks") and not last["same"]
    corrupt = run("replay", CORRUPT)
    assert corrupt.exit_code == 0 and "1 undecodable record(s) skipped" in corrupt.stderr


def test_replay_shows_which_windows_now_start_on_a_user_turn(
    run: Cli, redis_url: str, redis_namespace: str
) -> None:
    # long questions, short answers: the window keeps an answer whose question it drops
    guard = Guard(
        redis_url, counter="approx", limit=420, namespace=redis_namespace, start_on_user=False
    )
    try:
        guard.append("greedy", [{"role": "system", "content": "Be brief."}])
        for turn in range(6):
            question = {"role": "user", "content": long_text(turn)}
            req = guard.prepare("greedy", [question], max_tokens=100)
            guard.complete("greedy", {"role": "assistant", "content": "ok"}, prepared=req)
    finally:
        guard.close()
    recorded = run.json("replay", "greedy")
    assert all(t["same"] for t in recorded)
    assert any(t["recorded_start"] == "assistant" for t in recorded)
    now = run.json("replay", "greedy", "--start-on-user")
    assert all(t["replayed_start"] == "user" for t in now)
    changed = [t for t in now if not t["same"]]
    assert changed and all(t["recorded_start"] == "assistant" for t in changed)
    table = run("replay", "greedy", "--start-on-user")
    assert "assistant → user" in table.stdout


def test_replay_shows_the_prefix_model_for_the_recorded_and_the_stable_policy(
    run: Cli, sessions: None
) -> None:
    ids = ("--counter", "tiktoken:cl100k_base")  # the sessions' approx counter has no ids
    assert all(t["recorded_prefilled"] is None for t in run.json("replay", CHAT))
    turns = run.json("replay", CHAT, *ids, "--policy", "stable", "--low-water", "0.5")
    assert all(t["error"] is None for t in turns)
    for t in turns:
        for key in ("recorded_reused", "recorded_prefilled", "replayed_reused"):
            assert isinstance(t[key], int)
        assert t["replayed_reused"] + t["replayed_prefilled"] == t["replayed_tokens"]
    recorded = sum(t["recorded_prefilled"] for t in turns[1:])
    stable = sum(t["replayed_prefilled"] for t in turns[1:])
    assert stable < recorded  # the recorded sliding window dropped messages: it re-prefilled
    table = run("replay", CHAT, *ids, "--policy", "stable")
    assert table.exit_code == 0 and "prefilled" in table.stdout


@pytest.mark.parametrize("bad", ["1.5", "-3", "half"])
def test_a_bad_low_water_is_refused(run: Cli, sessions: None, bad: str) -> None:
    result = run("replay", CHAT, "--policy", "stable", "--low-water", bad)
    assert result.exit_code == 2 and "--low-water" in result.stderr


@pytest.mark.parametrize(
    "option", ["--limit", "--max-tokens", "--safety-margin", "--max-window-messages"]
)
@pytest.mark.parametrize("value", [str(2**63), "1" + "0" * 23])
def test_counts_past_64_bits_are_usage_errors(
    run: Cli, sessions: None, option: str, value: str
) -> None:
    result = run("replay", CHAT, option, value)
    assert result.exit_code == 2 and option in result.stderr
    assert run("replay", CHAT, option, str(2**63 - 1)).exit_code in (
        0,
        1,
    )  # the bound itself is taken
