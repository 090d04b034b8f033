"""import: the whole file is validated first; any bad input exits 2 in one line, nothing written.

Runs on the in-process store (``memory://<namespace>`` is shared within the
process, so the CLI and the test see the same sessions) and on the private Redis.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from ctxguard.stores.base import SessionStore

from .conftest import EXISTING, Cli


def snapshot(store: SessionStore) -> dict[str, Any]:
    """Everything the store holds, to compare before and after a refused import."""
    out: dict[str, Any] = {}
    for session in sorted(store.list_sessions()):
        info = store.info(session)
        assert info is not None
        out[session] = (
            store.read(session),
            store.read_audit(session),
            store.get_summary(session),
            info.message_count,
            info.token_total,
            info.created_at,
        )
    return out


HEADER = {"type": "header", "format": "ctxguard-export", "version": 1}


def session_line(sid: str, **extra: Any) -> dict[str, Any]:
    return {"type": "session", "session_id": sid, "counter": "approx", "ttl_seconds": None, **extra}


def message_line(sid: str, seq: int, **extra: Any) -> dict[str, Any]:
    message = {"role": "user", "content": f"hello {seq}", "id": f"{sid}-m{seq}"}
    return {"type": "message", "session_id": sid, "seq": seq, "tokens": 3, "message": message,
            **extra}  # fmt: skip


def request_record(turn: Any) -> dict[str, Any]:
    return {"turn": turn, "kind": "request", "sent_ids": [], "tokens": 5, "limit": 100}


def audit_line(sid: str, record: dict[str, Any]) -> dict[str, Any]:
    return {"type": "audit", "session_id": sid, "index": 0, "record": record}


def good_file() -> list[dict[str, Any]]:
    """A valid first session: whatever follows it, it must not be written on refusal."""
    return [
        HEADER,
        session_line("good-1"),
        message_line("good-1", 0),
        message_line("good-1", 1),
        audit_line("good-1", request_record(1)),
        session_line("bad-2"),
        message_line("bad-2", 0),
    ]


def write_jsonl(path: Path, lines: list[Any]) -> None:
    path.write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")


def with_bad_line(line: dict[str, Any]) -> list[Any]:
    return [*good_file(), line]


def _replace(obj: dict[str, Any], **changes: Any) -> dict[str, Any]:
    return {**obj, **changes}


BAD_LINES: dict[str, tuple[list[Any], str]] = {
    "tokens is a string": (
        with_bad_line(message_line("bad-2", 1, tokens="abc")),
        "line 8: field tokens",
    ),
    "tokens is a list": (
        with_bad_line(message_line("bad-2", 1, tokens=[])),
        "line 8: field tokens",
    ),
    "tokens is negative": (
        with_bad_line(message_line("bad-2", 1, tokens=-4)),
        "line 8: field tokens",
    ),
    "tokens is a bool": (
        with_bad_line(message_line("bad-2", 1, tokens=True)),
        "line 8: field tokens",
    ),
    "ttl is a string": (
        [*good_file()[:5], session_line("bad-2", ttl_seconds="abc")],
        "line 6: field ttl_seconds",
    ),
    "audit turn is a string": (
        with_bad_line(audit_line("bad-2", request_record("abc"))),
        "line 8: field record (request).turn",
    ),
    "audit turn is null": (
        with_bad_line(audit_line("bad-2", request_record(None))),
        "line 8: field record (request).turn",
    ),
    "audit turn is missing": (
        with_bad_line(audit_line("bad-2", {"kind": "request", "tokens": 1})),
        "line 8: field record (request).turn",
    ),
    "audit tokens is a string": (
        with_bad_line(audit_line("bad-2", _replace(request_record(2), tokens="9"))),
        "line 8: field record (request).tokens",
    ),
    "audit record has no kind": (
        with_bad_line(audit_line("bad-2", {"turn": 3})),
        "line 8: field record.kind",
    ),
    "a message with a bad role": (
        with_bad_line(_replace(message_line("bad-2", 1), message={"role": "wizard"})),
        "line 8: field message",
    ),
    "a message that is not an object": (
        with_bad_line(_replace(message_line("bad-2", 1), message="hi")),
        "line 8: field message",
    ),
    "an unknown field": (
        with_bad_line(message_line("bad-2", 1, colour="red")),
        "line 8: field colour",
    ),
    "an unknown line type": (
        with_bad_line({"type": "mystery", "session_id": "bad-2"}),
        "line 8",
    ),
    "a session id with a control character": (
        [*good_file()[:5], session_line("bad\x01id")],
        "line 6: field session_id",
    ),
    "a repeated message id": (
        with_bad_line(message_line("bad-2", 0)),
        "line 8: message id 'bad-2-m0' repeats line 7",
    ),
    "a message before its session line": (
        with_bad_line(message_line("nowhere", 0)),
        "line 8: message line before the session line",
    ),
    "a summary beyond the history": (
        [
            *good_file()[:5],
            session_line("bad-2", summary={"version": 1, "text": "s", "covers_to": 9}),
            message_line("bad-2", 0),
        ],
        "line 6: field summary",
    ),
    "a summary covers_to that is a string": (
        [
            *good_file()[:5],
            session_line("bad-2", summary={"version": 1, "text": "s", "covers_to": "1"}),
        ],
        "line 6: field summary.covers_to",
    ),
    "an audit rid the store would refuse": (
        with_bad_line(audit_line("bad-2", {"kind": "note", "rid": "not a valid rid!"})),
        "line 8: field record: audit record rid",
    ),
    "audit policy that is not an object": (
        with_bad_line(audit_line("bad-2", _replace(request_record(2), policy="x"))),
        "line 8: field record (request).policy",
    ),
    "audit decisions that are not a list": (
        with_bad_line(audit_line("bad-2", _replace(request_record(2), decisions="notalist"))),
        "line 8: field record (request).decisions",
    ),
    "audit dropped that is a number": (
        with_bad_line(audit_line("bad-2", _replace(request_record(2), dropped=5))),
        "line 8: field record (request).dropped",
    ),
    "tokens without a counter": (
        [*good_file()[:5], session_line("bad-2", counter=None), message_line("bad-2", 0)],
        "line 7: field tokens: session 'bad-2' has no counter (line 6)",
    ),
    "no header": (good_file()[1:], "line 1"),
    "an array line": (with_bad_line([1, 2]), "line 8"),  # type: ignore[list-item]
    "a second header": (with_bad_line(HEADER), "line 8: a second header"),
    "a wrong format version": ([_replace(HEADER, version=2), *good_file()[1:]], "line 1"),
}


@pytest.mark.parametrize("case", sorted(BAD_LINES))
def test_a_bad_line_refuses_the_whole_file(
    case: str, target: tuple[Cli, SessionStore], tmp_path: Path
) -> None:
    run, store = target
    _existing(store)
    lines, where = BAD_LINES[case]
    path = tmp_path / "bad.jsonl"
    write_jsonl(path, lines)
    before = snapshot(store)
    result = run("import", str(path))
    _refused(result, where, str(path))
    assert snapshot(store) == before


RAW_FILES: dict[str, tuple[bytes, str]] = {
    "tokens of 1e400": (b'{"type":"message","session_id":"bad-2","tokens":1e400}', "line 8"),
    "an audit number of 1e400": (
        b'{"type":"audit","session_id":"bad-2","record":{"kind":"note","x":1e400}}',
        "line 8: not JSON (1e400 is beyond the range of a JSON number)",
    ),
    "NaN tokens": (b'{"type":"message","session_id":"bad-2","tokens":NaN}', "line 8: not JSON"),
    "broken JSON": (b'{"type": "message", "session_id": ', "line 8: not JSON"),
    "invalid UTF-8": (b'{"type":"audit","session_id":"bad-2","record":{"kind":"\xff"}}', "line 8"),
}


@pytest.mark.parametrize("case", sorted(RAW_FILES))
def test_bytes_that_are_not_json_or_not_utf8_refuse_the_file(
    case: str, target: tuple[Cli, SessionStore], tmp_path: Path
) -> None:
    run, store = target
    _existing(store)
    tail, where = RAW_FILES[case]
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b"".join(json.dumps(x).encode() + b"\n" for x in good_file()) + tail + b"\n")
    before = snapshot(store)
    result = run("import", str(path))
    _refused(result, where, str(path))
    assert snapshot(store) == before


def test_missing_unreadable_and_empty_files_exit_2_in_one_line(
    target: tuple[Cli, SessionStore], tmp_path: Path
) -> None:
    run, store = target
    _existing(store)
    before = snapshot(store)
    _refused(run("import", str(tmp_path / "nope.jsonl")), "No such file", "nope.jsonl")
    _refused(run("import", str(tmp_path)), "cannot read", str(tmp_path))
    if os.geteuid() != 0:  # root reads anything
        locked = tmp_path / "locked.jsonl"
        write_jsonl(locked, good_file())
        locked.chmod(0)
        _refused(run("import", str(locked)), "Permission denied", "locked.jsonl")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n  \n")
    _refused(run("import", str(empty)), "is empty: nothing to import", "empty.jsonl")
    _refused(run("import", "-", input=""), "stdin is empty", "stdin")
    assert snapshot(store) == before


def test_openai_jsonl_imports_each_line_as_a_new_session(
    target: tuple[Cli, SessionStore], tmp_path: Path
) -> None:
    run, store = target
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    chats = [
        {
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "hi"},
            ]
        },
        {
            "messages": [
                {"role": "user", "content": "call f"},
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "content": "42"},
                {"role": "assistant", "content": "It is 42."},
            ],
            "tools": tools,
        },
    ]
    path = tmp_path / "chats.jsonl"
    write_jsonl(path, chats)
    result = run("import", str(path), "--json")
    assert result.exit_code == 0, result.stderr
    done = json.loads(result.stdout)
    assert [d["stored"] for d in done] == [2, 4]
    ids = [d["session_id"] for d in done]
    for session_id in ids:
        assert session_id in result.stderr  # the generated ids are printed
    stored = [[s.message.to_openai() for s in store.read(i)] for i in ids]
    assert stored[0] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
    ]
    assert stored[1][1]["tool_calls"] == [call]
    # a bad conversation anywhere refuses the file, naming the format
    write_jsonl(path, [chats[0], {"messages": [{"role": "user"}]}])
    before = snapshot(store)
    refused = run("import", str(path))
    _refused(refused, "line 2: messages.0", str(path))
    write_jsonl(path, [chats[0], {"messages": "hi"}])
    _refused(run("import", str(path)), "OpenAI chat JSONL", str(path))
    write_jsonl(path, [{"prompt": "hi", "completion": "there"}])
    _refused(run("import", str(path)), "not a known format", str(path))
    assert snapshot(store) == before


def test_import_keeps_created_at(target: tuple[Cli, SessionStore], tmp_path: Path) -> None:
    run, store = target
    when = datetime(2024, 5, 17, 8, 30, tzinfo=UTC)
    path = tmp_path / "old.jsonl"
    write_jsonl(
        path, [HEADER, session_line("old", created_at=when.isoformat()), message_line("old", 0)]
    )
    assert run("import", str(path)).exit_code == 0
    info = store.info("old")
    assert info is not None and info.created_at == when
    exported = tmp_path / "again.jsonl"
    assert run("export", "old", "--out", str(exported)).exit_code == 0
    assert json.loads(exported.read_text().splitlines()[1])["created_at"] == when.isoformat()


def test_header_only_file_imports_nothing_and_says_so(
    target: tuple[Cli, SessionStore], tmp_path: Path
) -> None:
    run, _ = target
    path = tmp_path / "h.jsonl"
    write_jsonl(path, [HEADER])
    result = run("import", str(path))
    assert result.exit_code == 0
    assert "no sessions in the file" in result.stderr


def test_unwritable_output_paths_exit_2_in_one_line(
    target: tuple[Cli, SessionStore], tmp_path: Path
) -> None:
    run, store = target
    _existing(store)
    for bad in (tmp_path / "no" / "such" / "dir.jsonl", tmp_path):
        _refused(run("export", EXISTING, "--out", str(bad)), "cannot write", str(bad))
        _refused(run("report", EXISTING, "--html", str(bad)), "cannot write", str(bad))


def test_a_store_failure_midway_says_which_sessions_were_written(
    target: tuple[Cli, SessionStore], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ctxguard.cli import transfer
    from ctxguard.errors import StoreConnectionError

    run, _ = target
    path = tmp_path / "two.jsonl"
    write_jsonl(path, good_file())
    real = transfer.import_session

    def failing(s: SessionStore, item: transfer.Incoming) -> transfer.Imported:
        if item.session_id == "bad-2":
            raise StoreConnectionError("append failed: lost the connection to the store")
        return real(s, item)

    monkeypatch.setattr(transfer, "import_session", failing)
    result = run("import", str(path))
    assert result.exit_code == 3
    assert result.stderr.count("\n") == 1
    assert "stopped at session 'bad-2'" in result.stderr
    assert "written in full before it: 'good-1'" in result.stderr


def _existing(store: SessionStore) -> None:
    from ctxguard.messages import Message
    from ctxguard.stores.base import NewMessage, WriteOptions

    message = Message(role="user", content="keep me", id="keep-1")
    store.append(EXISTING, [NewMessage(message, 2)], WriteOptions(counter="approx"))


def _refused(result: Any, where: str, name: str) -> None:
    assert result.exit_code == 2, (result.exit_code, result.stderr)
    assert result.stdout == ""
    err = result.stderr
    assert err.startswith("error: ") and err.endswith("\n") and err.count("\n") == 1, err
    assert where in err, err
    assert name in err, err
    assert "Traceback" not in err


def test_an_audit_record_the_store_would_refuse_writes_nothing_before_it(
    target: tuple[Cli, SessionStore], tmp_path: Path
) -> None:
    """(rid-a and rid-b were written, rid-b without its audit, before the store refused
    the record's rid; a second import failed the same way.)"""
    run, store = target
    path = tmp_path / "rid.jsonl"
    bad = {"kind": "note", "rid": "not a valid rid!"}
    write_jsonl(
        path,
        [
            HEADER,
            session_line("rid-a"),
            message_line("rid-a", 0),
            session_line("rid-b"),
            message_line("rid-b", 0),
            message_line("rid-b", 1),
            audit_line("rid-b", bad),
        ],
    )
    for _ in range(2):
        _refused(run("import", str(path)), "line 7: field record: audit record rid", str(path))
        assert snapshot(store) == {}


def test_a_message_id_stored_with_other_content_refuses_the_file_before_any_write(
    target: tuple[Cli, SessionStore], tmp_path: Path
) -> None:
    """(good-1 was written in full, then the store refused bad-2's message whose id it
    holds with other content: a half-import, exit 2.) Now the ids the store holds are
    checked before the first write: nothing of the file is written."""
    run, store = target
    from ctxguard.messages import Message
    from ctxguard.stores.base import NewMessage, WriteOptions

    held = Message(role="user", content="the stored text", id="bad-2-m1")
    store.append("bad-2", [NewMessage(held, 4)], WriteOptions(counter="approx"))
    before = snapshot(store)
    path = tmp_path / "reused.jsonl"
    write_jsonl(path, [*good_file(), message_line("bad-2", 1)])  # bad-2-m1: "hello 1"
    for _ in range(2):
        _refused(run("import", str(path)), "line 8: message id 'bad-2-m1'", str(path))
        assert snapshot(store) == before
    # the same message again (a retry of what is stored) is no refusal
    same = message_line("bad-2", 1)
    same["message"] = {**same["message"], "content": "the stored text"}
    write_jsonl(path, [*good_file(), same])
    assert run("import", str(path)).exit_code == 0
    assert sorted(store.list_sessions()) == ["bad-2", "good-1"]


def test_a_file_naming_another_counter_for_a_stored_session_is_refused_before_any_write(
    target: tuple[Cli, SessionStore], tmp_path: Path
) -> None:
    """(the import switched bad-2's counter and dropped the counts it held: `show` then
    showed its stored messages' tokens as `?`.) Now refused up front, nothing written."""
    run, store = target
    from ctxguard.messages import Message
    from ctxguard.stores.base import NewMessage, WriteOptions

    held = Message(role="user", content="the stored text", id="held-1")
    store.append("bad-2", [NewMessage(held, 4)], WriteOptions(counter="tiktoken:cl100k_base"))
    before = snapshot(store)
    path = tmp_path / "other-counter.jsonl"
    write_jsonl(path, good_file())  # bad-2's session line says "approx"
    for _ in range(2):
        _refused(
            run("import", str(path)), "line 6: session 'bad-2' is stored with counter", str(path)
        )
        assert snapshot(store) == before
    # the stored counter named in the file: imported, the stored count kept
    lines = good_file()
    lines[5] = session_line("bad-2", counter="tiktoken:cl100k_base")
    write_jsonl(path, lines)
    assert run("import", str(path)).exit_code == 0
    assert [s.tokens for s in store.read("bad-2")] == [4, 3]


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/full"])
def test_a_device_that_never_ends_is_refused_at_its_first_nul_byte(device: str) -> None:
    """(``ctxguard import /dev/zero`` read until memory ran out and was killed.) Run in a
    child whose address space is capped, so the unfixed read fails instead of eating
    the machine."""
    import resource
    import subprocess
    import sys

    from tests.conftest import private_memory_url

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))

    ran = subprocess.run(
        [sys.executable, "-m", "ctxguard", "import", device, "--url", private_memory_url()],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=cap,
    )
    assert ran.returncode == 2, ran.stderr
    assert ran.stdout == ""
    err = ran.stderr
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert f"{device}: line 1: a NUL byte" in err and "nothing imported" in err


def test_a_nul_byte_in_a_file_names_its_line(
    target: tuple[Cli, SessionStore], tmp_path: Path
) -> None:
    run, store = target
    path = tmp_path / "nul.jsonl"
    path.write_bytes(b"".join(json.dumps(x).encode() + b"\n" for x in good_file()) + b"\0\n")
    _refused(run("import", str(path)), "line 8: a NUL byte", "nul.jsonl")
    assert snapshot(store) == {}


def test_a_number_past_4000_digits_is_refused_in_the_file_s_terms(
    target: tuple[Cli, SessionStore], tmp_path: Path
) -> None:
    """(the error advised sys.set_int_max_str_digits(), words for Python programmers)"""
    run, store = target
    before = snapshot(store)
    line = message_line("big-1", 0)
    line["message"]["extra"] = {"n": 0}
    path = tmp_path / "big.jsonl"
    text = json.dumps(line).replace('"n": 0', '"n": ' + "7" * 5000)
    path.write_text(json.dumps(HEADER) + "\n" + json.dumps(session_line("big-1")) + "\n" + text)
    result = run("import", str(path))
    _refused(result, "line 3: not JSON (a number of 5,000 digits; at most 4,000", str(path))
    assert "sys." not in result.stderr
    assert snapshot(store) == before


def test_a_counter_spec_with_a_password_is_not_shown_when_refused(
    target: tuple[Cli, SessionStore], tmp_path: Path
) -> None:
    """(the refusal above quoted the file's counter spec as written, password and all.)"""
    run, store = target
    from ctxguard.messages import Message
    from ctxguard.stores.base import NewMessage, WriteOptions

    held = Message(role="user", content="the stored text", id="held-1")
    store.append("bad-2", [NewMessage(held, 4)], WriteOptions(counter="tiktoken:cl100k_base"))
    lines = good_file()
    lines[5] = session_line("bad-2", counter="vllm:http://admin:pw-SECRET-9@127.0.0.1:9")
    path = tmp_path / "secret-counter.jsonl"
    write_jsonl(path, lines)
    result = run("import", str(path))
    assert result.exit_code == 2, result.output
    assert "bad-2" in result.output and "counter" in result.output
    assert "pw-SECRET-9" not in result.output and "***" in result.output
