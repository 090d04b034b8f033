"""``ctxguard export`` / ``ctxguard import``: sessions as JSON Lines, losslessly.

One line per item so large sessions stream and diff well::

    {"type": "header", "format": "ctxguard-export", "version": 1}
    {"type": "session", "session_id": ..., "counter": ..., "ttl_seconds": ...,
     "created_at": "2025-...", "summary": {...}}
    {"type": "message", "session_id": ..., "seq": 0, "tokens": 12, "message": {...}}
    {"type": "audit", "session_id": ..., "index": 0, "record": {...}}

Import reads and validates the whole file first (:mod:`ctxguard.cli.import_file`)
and writes nothing if any line is wrong. It is idempotent: messages are
appended by id (a retry stores nothing), and the summary and audit trail are
restored verbatim only into a session that did not exist; into an existing one
only audit records it does not hold yet are added, so a re-import never
doubles them. Plain OpenAI chat JSONL imports as new sessions.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import click
from rich.table import Table

from ctxguard._record_time import comparable_record
from ctxguard.cli.common import (
    EXIT_BAD_INPUT,
    EXIT_CODES_HELP,
    EXIT_CORRUPT,
    add_row,
    emit_json,
    exit_code_for,
    fail,
    handles_errors,
    json_option,
    json_text,
    note,
    opened_store,
    scrub,
    stdout,
    store_options,
    writable_output,
)
from ctxguard.cli.import_file import (
    FORMAT,
    VERSION,
    ImportFile,
    ImportFileError,
    Incoming,
    read_import_file,
)
from ctxguard.cli.quoting import suggest
from ctxguard.cli.repair import inspect_session
from ctxguard.cli.show import message_json
from ctxguard.cli.snapshot import Snapshot, read_messages, require_snapshot
from ctxguard.errors import CtxGuardError
from ctxguard.stores.base import SessionStore, WriteOptions
from ctxguard.stores.integrity import find_problems

BATCH = 500

_EXPORT_EPILOG = f"""\b
Examples:
  ctxguard export chat-123 chat-456 --out sessions.jsonl
  ctxguard export --all --out backup.jsonl --url redis://localhost:6379/0
  ctxguard export chat-123 --out -        # to stdout

{EXIT_CODES_HELP}
"""

_IMPORT_EPILOG = f"""\b
Examples:
  ctxguard import backup.jsonl --url redis://localhost:6379/0
  ctxguard import backup.jsonl --namespace staging --json
  cat sessions.jsonl | ctxguard import -
  ctxguard import chats.jsonl       # OpenAI JSONL: one {{"messages": [...]}} per line

\b
Formats: a `ctxguard export` file (restored as it was: ids, counts, summary,
audit trail, created_at), or OpenAI chat JSONL, one {{"messages": [...],
"tools": [...]}} object per line, each line a new session with a generated id
(printed; tools are checked, not stored). The whole file is validated before
anything is written: any bad line (or a missing, unreadable or non-UTF-8 file)
exits 2 naming the file, line and field, with nothing written.

{EXIT_CODES_HELP}
"""


@click.command("export", epilog=_EXPORT_EPILOG)
@click.argument("sessions", nargs=-1)
@click.option("--all", "all_sessions", is_flag=True, help="Export every session in the store.")
@click.option("--out", "out", required=True, help="Output file (JSON Lines), or - for stdout.")
@store_options
@handles_errors
def export_command(
    sessions: tuple[str, ...],
    all_sessions: bool,
    out: str,
    url: str,
    namespace: str | None,
    tenant: str | None,
) -> None:
    """Write sessions (messages, token counts, summary, audit records) as JSON Lines."""
    if bool(sessions) == all_sessions:
        fail("give SESSION ids or --all", EXIT_BAD_INPUT)
    with opened_store(url, namespace, tenant) as store:
        # each session once (the first mention's place): a repeat would make a file its
        # own import refuses
        ids = sorted(store.list_sessions("")) if all_sessions else list(dict.fromkeys(sessions))
        snaps = [_exportable(require_snapshot(store, s)) for s in ids]
    text = json_lines(export_lines(snaps))  # before the file is opened: it may refuse
    with writable_output(out) as handle:
        handle.write(text)
    if out != "-":
        count = sum(len(s.messages) for s in snaps)
        note(f"exported {len(snaps)} session(s), {count} messages to {out}")


def _exportable(snap: Snapshot) -> Snapshot:
    """An export must be lossless, so a session with an undecodable record is refused."""
    if snap.corrupt:
        bad = snap.corrupt[0]
        fail(
            f"session {snap.session_id!r}: record {bad.position} does not decode ({bad.detail}); "
            "run `ctxguard audit` and repair or delete it first",
            EXIT_CORRUPT,
        )
    return snap


def export_lines(snaps: Iterable[Snapshot]) -> Iterator[dict[str, Any]]:
    yield {"type": "header", "format": FORMAT, "version": VERSION}
    for snap in snaps:
        ttl = snap.info.ttl_seconds
        yield {
            "type": "session",
            "session_id": snap.session_id,
            "counter": snap.info.counter,
            "ttl_seconds": None if ttl is None else math.ceil(ttl),
            "created_at": snap.info.created_at.isoformat(),
            "summary": snap.summary.model_dump(mode="json") if snap.summary else None,
        }
        for stored in snap.messages:
            yield {"type": "message", "session_id": snap.session_id, **message_json(stored)}
        for index, record in enumerate(snap.audit):
            yield {"type": "audit", "session_id": snap.session_id, "index": index, "record": record}


def json_lines(lines: Iterable[dict[str, Any]]) -> str:
    """One JSON text a line; U+2028/U+2029 (in a text: a session id an older version
    took, a message's content) escaped, as many line readers end a line there."""
    text = "".join(json_text(line, separators=(",", ":")) + "\n" for line in lines)
    return text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


# -- import -------------------------------------------------------------------


@dataclass
class Imported:
    """What an import did to one session."""

    session_id: str
    new_session: bool
    stored: int = 0
    duplicates: int = 0
    audit_added: int = 0
    summary_version: int = 0
    empty: bool = False  # nothing to store: no session was made


@click.command("import", epilog=_IMPORT_EPILOG)
@click.argument("file")
@store_options
@json_option
@handles_errors
def import_command(
    file: str, url: str, namespace: str | None, tenant: str | None, as_json: bool
) -> None:
    """Load sessions from an export file (or OpenAI JSONL); a re-import changes nothing."""
    try:
        parsed = read_import_file(file)
    except ImportFileError as exc:
        fail(f"{exc}; nothing imported", EXIT_BAD_INPUT)
    if not parsed.sessions:
        note(f"{parsed.name}: no sessions in the file; nothing imported")
    with opened_store(url, namespace, tenant) as store:
        try:
            check_held_ids(store, parsed)
        except ImportFileError as exc:
            fail(f"{exc}; nothing imported", EXIT_BAD_INPUT)
        done = write_all(store, parsed, url)
    if parsed.format == "openai-jsonl" and done:
        note(f"imported {len(done)} OpenAI-format conversation(s) as new sessions:")
        for d in done:
            note(f"  {d.session_id}")
    if as_json:
        emit_json([vars(d) for d in done])
        return
    stdout().print(_import_table(done))


def check_held_ids(store: SessionStore, parsed: ImportFile) -> None:
    """Refuse the file when a message's id is stored in its session with another message,
    or when the file names another counter than the one a stored session's counts are in.

    The store refuses such a message as it appends it, after the sessions before it were
    written: checked here first, so a refusal writes nothing."""
    for item in parsed.sessions:
        info = None if item.generated else store.info(item.session_id)
        if info is None:
            continue
        _check_intact(store, parsed, item)
        if item.counter and info.counter and info.message_count and item.counter != info.counter:
            # (the store would switch the session's counter and drop every count it holds)
            raise ImportFileError(
                f"{parsed.name}: line {item.line}: session {item.session_id!r} is stored with "
                f"counter {info.counter!r}, the file's is {item.counter!r}: its stored token "
                "counts would be dropped; import into another namespace, or write the "
                "stored counter in the file's session line"
            )
        held = {s.message.id: s.message for s in read_messages(store, item.session_id, [])}
        for new, number in zip(item.messages, item.message_lines, strict=True):
            msg_id = new.message.id
            stored = held.get(msg_id)
            if stored is not None and comparable_record(
                stored.to_record(), msg_id
            ) != comparable_record(new.encoded(), msg_id):
                raise ImportFileError(
                    f"{parsed.name}: line {number}: message id {msg_id!r} is stored in session "
                    f"{item.session_id!r} with other content; an id names one message: give "
                    "the message in the file a new id, or import into another namespace"
                )


def _check_intact(store: SessionStore, parsed: ImportFile, item: Incoming) -> None:
    """Refuse a file naming a stored session whose keys disagree (``ctxguard audit``'s
    checks): its append would be refused as CORRUPT after the sessions before it."""
    raw = inspect_session(store, item.session_id)
    problems = [] if raw is None else find_problems(item.session_id, raw)
    if problems:
        first = problems[0]
        raise ImportFileError(
            f"{parsed.name}: line {item.line}: session {item.session_id!r} is stored damaged "
            f"({first.key} {first.detail}); run `{suggest('repair', item.session_id)}` first, "
            "or import into another namespace"
        )


def write_all(store: SessionStore, parsed: ImportFile, url: str) -> list[Imported]:
    """Write every session of a validated file; a failure says what was written."""
    done: list[Imported] = []
    for item in parsed.sessions:
        try:
            done.append(import_session(store, item))
        except CtxGuardError as exc:
            written = ", ".join(repr(d.session_id) for d in done) or "none"
            again = (
                "delete it and import again"
                if item.generated
                else "importing the file again is safe (appends are idempotent)"
            )
            fail(
                scrub(
                    f"import of {parsed.name} stopped at session {item.session_id!r} "
                    f"({type(exc).__name__}: {exc}); written in full before it: {written}; "
                    f"{item.session_id!r} may be partly written: {again}",
                    url,
                ),
                exit_code_for(exc),
            )
    return done


def import_session(store: SessionStore, item: Incoming) -> Imported:
    existing = store.info(item.session_id)
    done = Imported(item.session_id, new_session=existing is None)
    options = WriteOptions(counter=item.counter, ttl_seconds=item.ttl_seconds)
    for start in range(0, len(item.messages), BATCH):
        result = store.append(item.session_id, item.messages[start : start + BATCH], options)
        done.stored += len(result.stored)
        done.duplicates += len(result.duplicates)
    done.audit_added = _add_missing_audit(store, item)
    _, done.summary_version = store.restore(
        item.session_id,
        item.turns,
        item.summary,
        item.ttl_seconds or 0,
        created_at=item.created_at,
    )
    if item.summary is not None and done.summary_version != item.summary.version:
        note(f"warning: {item.session_id} already has summary v{done.summary_version}; kept it")
    if done.new_session and not (done.stored or done.audit_added):
        done.empty = store.info(item.session_id) is None  # (a session line alone)
        done.new_session = not done.empty
    return done


def _add_missing_audit(store: SessionStore, item: Incoming) -> int:
    held = {_canonical(r) for r in store.read_audit(item.session_id)}
    added = 0
    for record in item.audit:
        if _canonical(record) not in held:
            store.add_audit(item.session_id, record, 0, item.ttl_seconds or 0)
            held.add(_canonical(record))
            added += 1
    return added


def _canonical(record: dict[str, Any]) -> str:
    # without its rid: a record exported before rids existed is stored with a new one
    return json.dumps({k: v for k, v in record.items() if k != "rid"}, sort_keys=True, default=str)


def _import_table(done: list[Imported]) -> Table:
    table = Table(title="import")
    for name in ("session", "new", "stored", "duplicates", "audit added", "summary"):
        table.add_column(name)
    for d in done:
        add_row(
            table,
            d.session_id,
            "no (empty: not made)" if d.empty else "yes" if d.new_session else "no",
            str(d.stored),
            str(d.duplicates),
            str(d.audit_added),
            f"v{d.summary_version}" if d.summary_version else "-",
        )
    return table
