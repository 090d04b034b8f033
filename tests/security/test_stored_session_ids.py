"""A session an older version stored under an id the id rule now refuses (a format
character, U+2028/U+2029: see test_id_characters.py) stays reachable for reading and
removal, and is never written again.

The session is made the way such a version made it: through the Guard and the store,
with ``validate_id`` held to that version's rule (control characters and surrogates
only), then the rule is put back. Then, on memory, Redis and Redis Cluster:
``ctxguard sessions`` lists it on one line (its id escaped), ``show``, ``export``,
``audit``, ``replay``, ``report`` and ``delete`` take it, the store's reads and its
delete take it (the delete leaves no key of it), and every write (Guard, AsyncGuard,
the store's writes, ``repair``, ``import``) refuses it with a one-line
InvalidIdError that says the session can still be read and deleted, storing nothing.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from click.testing import CliRunner, Result

import ctxguard.ids
from ctxguard import AsyncGuard, Guard, InvalidIdError
from ctxguard.cli import cli
from ctxguard.guard.plan import SummaryRequest
from ctxguard.messages import Message
from ctxguard.stores import open_async_store, open_store
from ctxguard.stores.base import NewMessage, RecordWrite, Summary, WriteOptions
from ctxguard.stores.integrity import RepairPlan
from ctxguard.stores.keys import _session_keys, _stored_session_keys
from tests import store_diff

BADS = ["\u200b", "\u200d", "\u202e", "\u2028", "\u2029", "\ufeff"]
PLAIN = "plain-1"
MSG = [{"role": "user", "content": "hello there"}]
REPLY = {"role": "assistant", "content": "hi"}
_REAL = ctxguard.ids.validate_id


def _older_rule(value: object, what: str = "id", *, stored: bool = False) -> str:
    """validate_id as versions before the Cf/Zl/Zp rule had it (Cc and Cs only)."""
    return _REAL(value, what, stored=True)


@pytest.fixture(
    params=[
        "memory",
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("cluster", marks=pytest.mark.cluster),
    ]
)
def url(request: pytest.FixtureRequest, namespace: str) -> str:
    if request.param == "memory":
        return f"memory://{namespace}"
    return str(request.getfixturevalue(f"{request.param}_url"))  # namespace purged after


@pytest.fixture(params=BADS, ids=lambda b: f"U+{ord(b):04X}")
def legacy(
    request: pytest.FixtureRequest, url: str, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    """A session stored under ``chat<bad>1`` (two turns, a summary, audit records) by
    the older rule, beside a plain one; the rule put back afterwards."""
    session = f"chat{request.param}1"
    with monkeypatch.context() as patch:
        for module in list(sys.modules.values()):
            if getattr(module, "__name__", "").startswith("ctxguard") and (
                getattr(module, "validate_id", None) is _REAL
            ):
                patch.setattr(module, "validate_id", _older_rule)
        guard = Guard(url, counter="approx", limit=4096, namespace=namespace)
        for sid in (session, PLAIN):
            for _ in range(2):
                prepared = guard.prepare(sid, MSG)
                guard.complete(sid, REPLY, prepared=prepared)
        stored = guard.store.read(session)
        summary = Summary(
            version=1,
            text="they said hello",
            covers_to=2,
            from_id=stored[0].message.id,
            to_id=stored[1].message.id,
        )
        assert guard.store.commit_summary(session, summary, 0)
        guard.close()
    _session_keys.cache_clear()  # what the older rule let into the write side's cache
    _stored_session_keys.cache_clear()
    yield session


def _store(url: str, namespace: str) -> Any:
    return open_store(url, namespace=namespace)


def _cli(url: str, namespace: str, *args: str, input: str | None = None) -> Result:  # noqa: A002
    env = {"CTXGUARD_URL": url, "CTXGUARD_NAMESPACE": namespace}
    return CliRunner().invoke(cli, list(args), env=env, input=input, catch_exceptions=False)


def _keys_of(snap: store_diff.Snapshot, session: str) -> list[str]:
    """The snapshot's keys of ``session`` (memory: ``<id>:...``; Redis: ``{<enc id>}``)."""
    from ctxguard.stores.keys import encode_session_id

    return [
        k for k in snap if k.startswith(f"{session}:") or f"{{{encode_session_id(session)}}}" in k
    ]


def _one_line_refusal(exc: BaseException, bad: str) -> None:
    text = str(exc)
    assert isinstance(exc, InvalidIdError), repr(exc)
    assert text.isprintable() and f"U+{ord(bad):04X}" in text, text
    assert "can still be read and deleted" in text, text


# -- reading -------------------------------------------------------------------------


def test_the_store_reads_it_sync_and_async(url: str, namespace: str, legacy: str) -> None:
    store = _store(url, namespace)
    try:
        assert legacy in list(store.list_sessions())
        assert list(store.list_sessions(legacy[:5])) == [legacy]  # a prefix with the character
        info = store.info(legacy)
        assert info is not None and info.session_id == legacy and info.message_count == 4
        assert [s.message.role for s in store.read(legacy)] == ["user", "assistant"] * 2
        assert len(store.read_last(legacy, 1)) == 1
        found, token = store.read_with_token(legacy)
        assert len(found) == 4 and token
        summary = store.get_summary(legacy)
        assert summary is not None and summary.version == 1
        assert [r["kind"] for r in store.read_audit(legacy)].count("request") == 2
        assert store.inspect(legacy) is not None
    finally:
        store.close()

    async def run() -> None:
        astore = open_async_store(url, namespace=namespace)
        try:
            assert legacy in [s async for s in astore.list_sessions()]
            info = await astore.info(legacy)
            assert info is not None and info.message_count == 4
            assert len(await astore.read(legacy)) == 4
            assert len(await astore.read_last(legacy, 2)) == 2
            assert (await astore.get_summary(legacy)) is not None
            assert await astore.read_audit(legacy)
        finally:
            await astore.close()

    asyncio.run(run())


def test_sessions_lists_it_on_one_line_escaped(url: str, namespace: str, legacy: str) -> None:
    result = _cli(url, namespace, "sessions")
    assert result.exit_code == 0, result.output
    rows = [line for line in result.stdout.splitlines() if "chat" in line]
    assert len(rows) == 1, result.stdout  # (str.splitlines ends a line at U+2028 too)
    assert repr(legacy) in rows[0] and rows[0].isprintable(), rows
    data = json.loads(_cli(url, namespace, "sessions", "--json").stdout)
    assert {r["session_id"] for r in data} == {legacy, PLAIN}


@pytest.mark.parametrize(
    "args",
    [["show"], ["show", "--json"], ["audit"], ["replay"], ["report", "--html", "-"]],
    ids=lambda a: " ".join(a),
)
def test_the_read_commands_take_it(url: str, namespace: str, legacy: str, args: list[str]) -> None:
    result = _cli(url, namespace, *args, legacy)
    assert result.exit_code in (0, 1), (result.exit_code, result.output)  # 1: a finding
    if args == ["show", "--json"]:
        data = json.loads(result.stdout)
        assert data["info"]["session_id"] == legacy and len(data["messages"]) == 4
    elif args[0] == "report":
        assert repr(legacy).replace("'", "&#x27;") in result.stdout
        assert legacy not in result.stdout  # (a raw bidi override turns the page around)
    else:
        assert repr(legacy) in result.stdout and legacy not in result.stdout, result.stdout


def test_export_writes_it_one_record_a_line(url: str, namespace: str, legacy: str) -> None:
    result = _cli(url, namespace, "export", legacy, "--out", "-")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()  # (U+2028/U+2029 too would end a line here)
    records = [json.loads(line) for line in lines]
    assert records[1]["type"] == "session" and records[1]["session_id"] == legacy
    assert sum(r["type"] == "message" for r in records) == 4
    assert all(r.get("session_id", legacy) == legacy for r in records)
    every = _cli(url, namespace, "export", "--all", "--out", "-")  # (one such session in
    assert every.exit_code == 0, every.output  # a store refused the whole --all before)
    sessions = [json.loads(line) for line in every.stdout.splitlines()]
    assert {r["session_id"] for r in sessions if r["type"] == "session"} == {legacy, PLAIN}
    audit = _cli(url, namespace, "audit", "--all")
    assert audit.exit_code in (0, 1) and repr(legacy) in audit.stdout, audit.output


# -- removing ------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["cli", "python", "python-async"])
def test_delete_removes_every_key_of_it_and_nothing_else(
    url: str, namespace: str, legacy: str, how: str
) -> None:
    store = _store(url, namespace)
    try:
        before = store_diff.take(store, url)
        assert _keys_of(before, legacy)
        if how == "cli":
            result = _cli(url, namespace, "delete", "--yes", legacy)
            assert result.exit_code == 0, result.output
            assert result.stderr.count("\n") == 1 and result.stderr[:-1].isprintable()
        elif how == "python":
            assert store.delete(legacy) is True
        else:

            async def run() -> bool:
                astore = open_async_store(url, namespace=namespace)
                try:
                    return bool(await astore.delete(legacy))
                finally:
                    await astore.close()

            assert asyncio.run(run()) is True
        after = store_diff.take(store, url)
        assert _keys_of(after, legacy) == []
        assert {k: v for k, v in before.items() if k not in _keys_of(before, legacy)} == after
        assert store.info(legacy) is None and legacy not in list(store.list_sessions())
    finally:
        store.close()


# -- writing -------------------------------------------------------------------------


def _guard_writes(guard: Guard, session: str) -> dict[str, Callable[[], Any]]:
    request = SummaryRequest(None, 0, 0, 2)
    return {
        "prepare": lambda: guard.prepare(session, MSG),
        "append": lambda: guard.append(session, MSG),
        "complete": lambda: guard.complete(session, REPLY),
        "replace_tail": lambda: guard.replace_tail(session, 0, MSG),
        "summarize": lambda: guard.summarize(session, request),
    }


def _store_writes(store: Any, session: str) -> dict[str, Callable[[], Any]]:
    new = [NewMessage(Message(role="user", content="x"), 1)]
    options = WriteOptions(counter="approx")
    write = RecordWrite(audit={"kind": "note"})
    summary = Summary(version=2, text="s", covers_to=1)
    plan = RepairPlan("f", [], [], [], {}, False)
    return {
        "append": lambda: store.append(session, new, options),
        "fetch_window": lambda: store.fetch_window(session, 100, options, new),
        "commit_if_unchanged": lambda: store.commit_if_unchanged(
            session, "t", 100, options, new, 0, write
        ),
        "set_token_counts": lambda: store.set_token_counts(session, "approx", {0: 1}),
        "commit_summary": lambda: store.commit_summary(session, summary, 1),
        "retract": lambda: store.retract(session, 1),
        "replace_tail": lambda: store.replace_tail(session, 0, new),
        "restore": lambda: store.restore(session, 1, None),
        "add_audit": lambda: store.add_audit(session, {"kind": "note"}, 0),
        "record": lambda: store.record(session, write),
        "append_with_audit": lambda: store.append_with_audit(session, new, options, write),
        "acquire_lease": lambda: store.acquire_lease(session, "k", "me", 5.0),
        "release_lease": lambda: store.release_lease(session, "k", "me"),
        "repair": lambda: store.repair(session, plan, {"kind": "repair"}),
    }


def test_every_write_still_refuses_it_and_stores_nothing(
    url: str, namespace: str, legacy: str
) -> None:
    bad = next(c for c in legacy if c in BADS)
    guard = Guard(url, counter="approx", limit=4096, namespace=namespace)
    store = guard.store
    before = store_diff.take(store, url)
    writes = {f"Guard.{k}": v for k, v in _guard_writes(guard, legacy).items()}
    writes.update({f"store.{k}": v for k, v in _store_writes(store, legacy).items()})
    for name, call in writes.items():
        with pytest.raises(InvalidIdError) as caught:
            call()
        _one_line_refusal(caught.value, bad)
        assert store_diff.take(store, url) == before, name
    aguard = AsyncGuard(url, counter="approx", limit=4096, namespace=namespace)

    async def run() -> None:
        for call in (
            lambda: aguard.prepare(legacy, MSG),
            lambda: aguard.append(legacy, MSG),
            lambda: aguard.complete(legacy, REPLY),
            lambda: aguard.replace_tail(legacy, 0, MSG),
            lambda: aguard.store.append(legacy, [NewMessage(Message(role="user", content="x"), 1)]),
            lambda: aguard.store.retract(legacy, 1),
        ):
            with pytest.raises(InvalidIdError) as caught:
                await call()
            _one_line_refusal(caught.value, bad)
        await aguard.aclose()

    asyncio.run(run())
    guard.close()
    assert store_diff.take(_store(url, namespace), url) == before


def test_repair_and_import_refuse_it_in_one_line(url: str, namespace: str, legacy: str) -> None:
    exported = _cli(url, namespace, "export", legacy, "--out", "-").stdout
    assert _cli(url, namespace, "delete", "--yes", legacy).exit_code == 0
    store = _store(url, namespace)
    before = store_diff.take(store, url)
    for args, stdin in ((["import", "-"], exported), (["repair", legacy], None)):
        result = _cli(url, namespace, *args, input=stdin)
        assert result.exit_code == 2, (args, result.output)
        err = result.stderr
        assert err.startswith("error: ") and err.count("\n") == 1 and err[:-1].isprintable(), err
    assert store_diff.take(store, url) == before
    store.close()


@pytest.mark.parametrize("bad", ["\x1b", "\x00", "\ud800"], ids=["U+001B", "U+0000", "surrogate"])
def test_reads_and_deletes_still_refuse_what_no_version_stored(
    url: str, namespace: str, bad: str
) -> None:
    """The older rule is the reads' floor: a control character or a lone surrogate, which
    no version took, is refused by them as before."""
    store = _store(url, namespace)
    try:
        for call in (
            lambda: store.info(f"s{bad}1"),
            lambda: store.read(f"s{bad}1"),
            lambda: store.read_audit(f"s{bad}1"),
            lambda: store.delete(f"s{bad}1"),
            lambda: list(store.list_sessions(f"s{bad}")),
        ):
            with pytest.raises(InvalidIdError) as caught:
                call()
            assert str(caught.value).isprintable()
    finally:
        store.close()


@pytest.mark.parametrize(
    "session", ["chat\u200b1", "a\u2028b", "x\u00a0y'z\\", "-\u202e\U000e0001"]
)
def test_a_shell_line_quotes_an_unprintable_id_so_bash_gives_it_back(session: str) -> None:
    """``suggest`` (the command lines an error tells to run) writes such an id in bash's
    ``$'...'`` quoting, printable, and bash reads it back as the id."""
    import shutil
    import subprocess

    from ctxguard.cli.quoting import shown_id, suggest

    line = suggest("show --json", session)
    assert line.isprintable() and shown_id(session) == repr(session)
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("no bash")
    words = line.removeprefix("ctxguard show --json").strip()
    out = subprocess.run(
        [bash, "-c", f"printf %s {words.removeprefix('-- ')}"],
        capture_output=True,
        env={"LC_ALL": "C.UTF-8"},
        check=True,
        timeout=10,
    ).stdout
    assert out.decode() == session
