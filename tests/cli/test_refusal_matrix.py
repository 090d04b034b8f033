"""A refused ``ctxguard import`` / ``repair`` / ``delete`` changes no key of the store
(tests/store_diff.py), whichever session of the file the refusal is in: a bad line last,
a message id stored with other content in the 2nd session, another counter than the
stored session's, a damaged stored session; on memory:// and Redis."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ctxguard import Guard
from ctxguard.messages import Message
from ctxguard.stores import NewMessage
from ctxguard.stores.base import SessionStore
from tests import store_diff

from .conftest import Cli

HEADER = {"type": "header", "format": "ctxguard-export", "version": 1}


def session(sid: str, **fields: Any) -> dict[str, Any]:
    return {"type": "session", "session_id": sid, **fields}


def message(sid: str, msg_id: str, content: str) -> dict[str, Any]:
    body = {"role": "user", "content": content, "id": msg_id}
    return {"type": "message", "session_id": sid, "message": body}


def good_first() -> list[dict[str, Any]]:
    return [HEADER, session("new-1"), message("new-1", "n1", "fresh"), message("new-1", "n2", "x")]


FILES: dict[str, list[Any]] = {
    "bad-line-last": [*good_first(), session("new-2"), {"type": "message", "session_id": "new-2"}],
    "reused-id-2nd-session": [
        *good_first(),
        session("held"),
        message("held", "h-new", "more"),
        message("held", "h1", "other content"),
    ],
    "other-counter-2nd-session": [
        *good_first(),
        session("held", counter="someone-else"),
        message("held", "h-new", "more"),
    ],
    "tokens-without-counter": [
        *good_first(),
        session("new-2"),
        {**message("new-2", "m", "x"), "tokens": 3},
    ],
    "summary-past-the-messages": [
        *good_first(),
        session(
            "new-2",
            summary={
                "text": "s",
                "version": 1,
                "covers_to": 5,
                "tokens": 1,
                "from_id": "a",
                "to_id": "b",
            },
        ),
        message("new-2", "m", "x"),
    ],
}


def _seed(cli: Cli) -> None:
    guard = Guard(cli.url, namespace=cli.namespace, counter="approx", limit=4000)
    try:
        guard.append("held", [{"role": "user", "content": "stored", "id": "h1"}])
    finally:
        guard.close()


@pytest.mark.parametrize("name", list(FILES))
def test_a_refused_import_writes_nothing(
    target: tuple[Cli, SessionStore], tmp_path: Path, name: str
) -> None:
    cli, store = target
    _seed(cli)
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in FILES[name]))
    before = store_diff.take(store, cli.url)
    result = cli("import", str(path))
    assert result.exit_code != 0, result.output
    assert "nothing imported" in result.stderr, result.stderr
    store_diff.assert_refused_only(before, store_diff.take(store, cli.url))


@pytest.mark.parametrize(
    "args",
    [
        ("repair", "nope"),
        ("repair", "held", "--dry-run"),
        ("repair", "held"),  # a healthy session: nothing to repair
        ("delete", "nope", "--yes"),
        ("delete", "held"),  # not confirmed (no input)
    ],
    ids=lambda a: "-".join(a),
)
def test_a_refused_or_idle_command_writes_nothing(
    target: tuple[Cli, SessionStore], args: tuple[str, ...]
) -> None:
    cli, store = target
    _seed(cli)
    before = store_diff.take(store, cli.url)
    cli(*args)
    store_diff.assert_refused_only(before, store_diff.take(store, cli.url))


def _damage(cli: Cli) -> None:
    """A record appended to session 'held' behind the store's back (msgs and meta's count
    disagree: every write script refuses the session as CORRUPT)."""
    from ctxguard.stores.keys import KeySpace
    from tests.conftest import raw_client

    client = raw_client(cli.url)
    try:
        keys = KeySpace(cli.namespace, "default").session_keys("held")
        client.rpush(keys[1], b"not json")
    finally:
        client.close()


def test_an_import_into_a_damaged_session_writes_nothing(
    target: tuple[Cli, SessionStore], tmp_path: Path
) -> None:
    """The 2nd session of the file is stored and damaged: refused before the 1st is written."""
    cli, store = target
    if cli.url.startswith("memory://"):
        pytest.skip("an in-process session is damaged only by a test; its append is taken")
    _seed(cli)
    _damage(cli)
    path = tmp_path / "in.jsonl"
    lines = [*good_first(), session("held"), message("held", "h-new", "more")]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    before = store_diff.take(store, cli.url)
    result = cli("import", str(path))
    assert result.exit_code != 0, result.output
    store_diff.assert_refused_only(before, store_diff.take(store, cli.url))


@pytest.mark.redis
def test_an_import_refused_for_a_damaged_session_quotes_it_in_the_repair_it_suggests(
    redis_url: str, redis_namespace: str, tmp_path: Path
) -> None:
    """``run `ctxguard repair <session>``` pasted a client-chosen id as is."""
    from ctxguard.stores.keys import KeySpace
    from tests.conftest import raw_client

    cli, sid = Cli(redis_url, redis_namespace), "-h; touch pwned"
    guard = Guard(redis_url, counter="approx", limit=4096, namespace=redis_namespace)
    guard.store.append(sid, [NewMessage(Message(role="user", content="x"), 1)])
    guard.close()
    client = raw_client(redis_url)
    try:
        client.rpush(KeySpace(redis_namespace).session_keys(sid)[1], b"not json")
    finally:
        client.close()
    path = tmp_path / "in.jsonl"
    path.write_text(json.dumps(HEADER) + "\n" + json.dumps(session(sid)) + "\n")
    result = cli("import", str(path))
    assert result.exit_code != 0 and result.stderr.count("\n") == 1, result.stderr
    assert "run `ctxguard repair -- '-h; touch pwned'` first" in result.stderr
