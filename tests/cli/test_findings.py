"""audit finds requests sent without their newest messages and summaries beyond the history;
show/report list dropped ranges without the sent system message; the default store is named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ctxguard.guard import Guard
from ctxguard.guard.sent import sent_seqs
from ctxguard.stores.base import SessionStore, Summary
from tests.conftest import private_memory_url

from .conftest import Cli


def _guard(url: str, namespace: str, limit: int = 400) -> Guard:
    return Guard(url, counter="approx", limit=limit, namespace=namespace, max_tokens=50)


def _chat(guard: Guard, session: str, turns: int) -> None:
    guard.prepare(session, [{"role": "system", "content": "Be terse."}])
    for turn in range(turns):
        text = f"question {turn} " + "word " * 40
        req = guard.prepare(session, [{"role": "user", "content": text}])
        guard.complete(session, {"role": "assistant", "content": f"answer {turn}"}, prepared=req)


def _checks(data: dict[str, object]) -> set[str]:
    return {v["check"] for v in data["violations"]}  # type: ignore[attr-defined]


def test_request_without_its_user_message_and_summary_beyond_history_are_flagged(
    target: tuple[Cli, SessionStore], namespace: str
) -> None:
    run, store = target
    guard = _guard(run.url, namespace)
    _chat(guard, "s", 3)
    guard.close()
    assert run("audit", "s").exit_code == 0
    count = len(store.read("s"))
    # a request that sent only a summary (what a covers_to beyond the history caused)
    record = {
        "turn": 0,
        "kind": "request",
        "sent_ids": ["ctxguard-summary-v1"],
        "tokens": 10,
        "limit": 400,
        "message_count": count,
    }
    store.add_audit("s", record, retention=0)
    data = run.json("audit", "s")
    assert _checks(data) == {"missing_newest"}
    # the newest message was sent, but not the newest user message
    newest = store.read("s")[-1].message.id
    store.add_audit("s", {**record, "sent_ids": [newest]}, retention=0)
    found = [v for v in run.json("audit", "s")["violations"] if "user message" in v["detail"]]
    assert len(found) == 1
    # a summary that claims more messages than the session holds
    store.restore("s", 0, Summary(version=1, text="everything", covers_to=count + 5))
    data = run.json("audit", "s")
    assert "summary_beyond_history" in _checks(data)


def test_dropped_ranges_leave_out_the_sent_system_message(
    target: tuple[Cli, SessionStore], namespace: str, tmp_path: Path
) -> None:
    run, store = target
    guard = _guard(run.url, namespace, limit=300)
    _chat(guard, "long", 8)
    guard.close()
    requests = [r for r in store.read_audit("long") if r["kind"] == "request"]
    dropping = [r for r in requests if r.get("dropped")]
    assert dropping and all(0 in sent_seqs(r) for r in dropping)  # the system message went
    shown = run.json("show", "long")
    assert shown["info"]["counter_spec"] == "approx"
    text = run("show", "long").stdout
    assert "[0," not in text and "[1," in text
    assert "counter approx" in text
    page = tmp_path / "r.html"
    assert run("report", "long", "--html", str(page)).exit_code == 0
    assert "[0," not in page.read_text() and "[1," in page.read_text()


def test_show_labels_retract_records(target: tuple[Cli, SessionStore], namespace: str) -> None:
    run, store = target
    guard = _guard(run.url, namespace)
    _chat(guard, "r", 2)
    guard.close()
    removed = store.retract("r", 2)
    text = run("show", "r", "--full").stdout
    assert "removed 2 newest message(s)" in text
    assert removed[0].message.id in text
    assert "covers [None" not in text


def test_without_url_the_cli_says_it_looks_at_an_empty_in_process_store(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from click.testing import CliRunner

    from ctxguard import stores
    from ctxguard.cli import cli

    # a fresh process's in-process stores (other tests of this process use "memory://")
    monkeypatch.setattr(stores, "_memory", {})

    result = CliRunner().invoke(cli, ["sessions", "--json"], env={"CTXGUARD_URL": None})
    assert result.exit_code == 0
    assert json.loads(result.stdout) == []
    assert result.stderr.count("\n") == 1
    assert "no --url or CTXGUARD_URL" in result.stderr and "memory://" in result.stderr
    named = CliRunner().invoke(cli, ["sessions", "--url", "memory://"], env={"CTXGUARD_URL": None})
    assert named.stderr == ""
    by_env = CliRunner().invoke(cli, ["sessions"], env={"CTXGUARD_URL": "memory://"})
    assert by_env.stderr == ""


@pytest.mark.parametrize("command", ["sessions", "show", "audit", "export", "report", "import"])
def test_exit_codes_are_documented_in_help(command: str) -> None:
    result = Cli(private_memory_url(), "x")(command, "--help")
    assert "Exit codes:" in result.stdout and "2 bad input" in result.stdout
