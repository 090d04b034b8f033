"""sessions, show, --help and error lines, on sessions written by the real Guard."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from ctxguard.cli import cli
from ctxguard.stores.base import SessionStore
from tests.conftest import private_memory_url

from .conftest import CHAT, CORRUPT, TOOLS, VIOLATION, Cli

pytestmark = pytest.mark.redis


def test_sessions_lists_every_session_with_counts(run: Cli, sessions: None) -> None:
    rows = {r["session_id"]: r for r in run.json("sessions")}
    assert set(rows) == {CHAT, TOOLS, CORRUPT, VIOLATION}
    assert rows[CHAT]["message_count"] == 21
    assert rows[CHAT]["token_total"] > 0
    assert rows[CHAT]["ttl_seconds"] is None
    assert rows[CHAT]["summary_version"] >= 1
    table = run("sessions")
    assert table.exit_code == 0
    assert CHAT in table.stdout  # brackets are data, not rich markup


@pytest.mark.parametrize(
    ("prefix", "expected"),
    [
        ("chat/1 [main]*", {CHAT}),
        ("chat/1 [", {CHAT}),
        ("*", set()),
        ("[ct]*", set()),
        ("?ools", set()),
        ("tools", {TOOLS}),
        ("", {CHAT, TOOLS, CORRUPT, VIOLATION}),
    ],
)
def test_prefix_with_glob_characters_matches_only_itself(
    run: Cli, sessions: None, prefix: str, expected: set[str]
) -> None:
    assert {r["session_id"] for r in run.json("sessions", "--prefix", prefix)} == expected


def test_show_gives_messages_tokens_summaries_and_audit(
    run: Cli, sessions: None, store: SessionStore
) -> None:
    data = run.json("show", CHAT)
    stored = store.read(CHAT)
    assert [m["message"]["id"] for m in data["messages"]] == [s.message.id for s in stored]
    assert [m["message"]["role"] for m in data["messages"]][:3] == ["system", "user", "assistant"]
    assert [m["tokens"] for m in data["messages"]] == [s.tokens for s in stored]
    summary = store.get_summary(CHAT)
    assert summary is not None
    assert data["summary"]["version"] == summary.version
    current = [s for s in data["summaries"] if s["current"]]
    assert current and current[0]["covers"] == [0, summary.covers_to]
    assert len(data["summaries"]) == summary.version  # every version's range, from the audit
    assert data["audit"] == store.read_audit(CHAT)
    text = run("show", CHAT)
    assert text.exit_code == 0
    for title in ("messages", "summaries", "audit records"):
        assert title in text.stdout


def test_show_lists_an_undecodable_record_instead_of_failing(run: Cli, sessions: None) -> None:
    data = run.json("show", CORRUPT)
    assert [c["position"] for c in data["corrupt"]] == ["5"]
    assert len(data["messages"]) == 5
    assert "undecodable records" in run("show", CORRUPT).stdout


def test_every_command_has_help_with_examples() -> None:
    for name in cli.list_commands(None):  # type: ignore[arg-type]
        result = Cli(private_memory_url(), "x")(name, "--help")
        assert result.exit_code == 0, name
        assert "Examples:" in result.stdout, name


def test_unknown_session_exits_7(run: Cli, sessions: None) -> None:
    for command in ("show", "replay", "report", "delete"):
        extra = ["--html", "/dev/null"] if command == "report" else []
        result = run(command, "no-such-session", *extra)
        assert result.exit_code == 7, (command, result.stderr)
        assert result.stderr.startswith("error: ")


def test_bad_url_is_bad_input() -> None:
    result = Cli("ftp://example.com", "x")("sessions")
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1 and "unknown store scheme" in result.stderr


def test_unreachable_store_exits_3_without_the_password() -> None:
    result = Cli("redis://:hunter2secret@127.0.0.1:1/0", "x")("sessions")
    assert result.exit_code == 3
    assert result.stderr.startswith("error: StoreConnectionError")
    assert "hunter2secret" not in result.stderr + result.stdout
    assert "***" in result.stderr


def test_python_dash_m_ctxguard_is_the_same_command() -> None:
    import subprocess
    import sys

    ran = subprocess.run(
        [sys.executable, "-m", "ctxguard", "sessions", "--url", private_memory_url(), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip().startswith("[")
    bad = subprocess.run(
        [sys.executable, "-m", "ctxguard", "sessions", "--url", "ftp://x"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and bad.stderr.startswith("error: ")


@pytest.mark.parametrize("args", [("show", "x"), ("replay", "x"), ("audit", "x"), ("sessions",)])
def test_an_unreachable_store_is_named_by_what_the_command_did(args: tuple[str, ...]) -> None:
    """(show, replay and audit said "repair failed": they only read the session)"""
    from faults.servers import free_port

    url = f"redis://:Sec9Pw@127.0.0.1:{free_port()}/0?socket_connect_timeout=0.5"
    result = CliRunner().invoke(cli, list(args), env={"CTXGUARD_URL": url})
    output = result.output + result.stderr
    assert result.exit_code != 0 and "StoreConnectionError" in output, output
    assert "repair failed" not in output and ("inspect failed" in output or "list" in output)
    assert "Sec9Pw" not in output and "Traceback" not in output


def test_a_store_that_never_answers_is_one_readable_line_without_the_password() -> None:
    """(The line read "... is it a Redis server (a TLS port needs rediss://)?*** nothing
    was sent": the redaction took "rediss://)?" for a URL with an empty query and hid
    that empty query as a secret.)"""
    import socket

    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts, never answers
        port = silent.getsockname()[1]
        url = f"redis://:hunter2secret@127.0.0.1:{port}/0?socket_timeout=0.2"
        result = Cli(url, "x")("sessions")
    assert result.exit_code == 3
    err = result.stderr
    assert err.startswith("error: StoreConnectionError") and err.count("\n") == 1, err
    assert "hunter2secret" not in err + result.stdout
    assert "(a TLS port needs rediss://)? nothing was sent" in err, err
