"""``ctxguard export`` / ``ctxguard import``: sessions as JSON Lines, losslessly.

One line per item so large sessions stream and diff well::

    {"type": "header", "format": "ctxguard-export", "version": 1}
    {"type": "session", "session_id": ..., "counter": ..., "ttl_seconds": ..., "summary": {...}}
    {"type": "message", "session_id": ..., "seq": 0, "tokens": 12, "message": {...}}
    {"type": "audit", "session_id": ..., "index": 0, "record": {...}}

Import is idempotent: messages are appended by id (a retry stores nothing),
and the summary and audit trail are restored verbatim only into a session
that did not exist; into an existing one only audit records it does not hold
yet are added, so a re-import never doubles them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any

import click
from rich.table import Table

from ctxguard.cli.common import (
    EXIT_BAD_INPUT,
    EXIT_CODES_HELP,
    EXIT_CORRUPT,
    add_row,
    emit_json,
    fail,
    handles_errors,
    json_option,
    note,
    opened_store,
    stdout,
    store_options,
)
from ctxguard.cli.show import message_json
from ctxguard.cli.snapshot import Snapshot, require_snapshot
from ctxguard.messages import Message
from ctxguard.stores.base import NewMessage, SessionStore, Summary, WriteOptions

FORMAT = "ctxguard-export"
VERSION = 1
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
        ids = sorted(store.list_sessions("")) if all_sessions else list(sessions)
        snaps = [_exportable(require_snapshot(store, s)) for s in ids]
    with click.open_file(out, "w", encoding="utf-8") as handle:
        write_lines(handle, export_lines(snaps))
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
            "summary": snap.summary.model_dump(mode="json") if snap.summary else None,
        }
        for stored in snap.messages:
            yield {"type": "message", "session_id": snap.session_id, **message_json(stored)}
        for index, record in enumerate(snap.audit):
            yield {"type": "audit", "session_id": snap.session_id, "index": index, "record": record}


def write_lines(handle: IO[str], lines: Iterable[dict[str, Any]]) -> None:
    for line in lines:
        handle.write(json.dumps(line, ensure_ascii=False, separators=(",", ":")) + "\n")


# -- import -------------------------------------------------------------------


@dataclass
class Incoming:
    """One session as read from an export file."""

    session_id: str
    counter: str | None = None
    ttl_seconds: int | None = None
    summary: Summary | None = None
    messages: list[NewMessage] = field(default_factory=list)
    audit: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Imported:
    """What an import did to one session."""

    session_id: str
    new_session: bool
    stored: int = 0
    duplicates: int = 0
    audit_added: int = 0
    summary_version: int = 0


@click.command("import", epilog=_IMPORT_EPILOG)
@click.argument("file", type=click.Path(allow_dash=True, dir_okay=False))
@store_options
@json_option
@handles_errors
def import_command(
    file: str, url: str, namespace: str | None, tenant: str | None, as_json: bool
) -> None:
    """Load sessions from an export file; importing the same file twice changes nothing."""
    with click.open_file(file, "r", encoding="utf-8") as handle:
        incoming = read_export(handle)
    with opened_store(url, namespace, tenant) as store:
        done = [import_session(store, item) for item in incoming]
    if as_json:
        emit_json([vars(d) for d in done])
        return
    stdout().print(_import_table(done))


def read_export(handle: Iterable[str]) -> list[Incoming]:
    """Parse and validate the whole file before writing anything."""
    sessions: dict[str, Incoming] = {}
    for number, line in enumerate(handle, 1):
        if not line.strip():
            continue
        try:
            _take(sessions, json.loads(line), number)
        except (ValueError, KeyError, TypeError) as exc:
            fail(f"line {number}: not a ctxguard export line ({exc})", EXIT_BAD_INPUT)
    return list(sessions.values())


def _take(sessions: dict[str, Incoming], item: dict[str, Any], number: int) -> None:
    kind = item["type"]
    if kind == "header":
        if item.get("format") != FORMAT or item.get("version") != VERSION:
            raise ValueError(f"unsupported export {item.get('format')} v{item.get('version')}")
        return
    sid = str(item["session_id"])
    if kind == "session":
        summary = Summary.model_validate(item["summary"]) if item.get("summary") else None
        sessions[sid] = Incoming(sid, item.get("counter"), item.get("ttl_seconds"), summary)
    elif sid not in sessions:
        raise ValueError(f"{kind} line before the session line of {sid!r}")
    elif kind == "message":
        message = Message.from_record(json.dumps(item["message"]))
        sessions[sid].messages.append(NewMessage(message, item.get("tokens")))
    elif kind == "audit":
        sessions[sid].audit.append(dict(item["record"]))
    else:
        raise ValueError(f"unknown line type {kind!r}")


def import_session(store: SessionStore, item: Incoming) -> Imported:
    existing = store.info(item.session_id)
    done = Imported(item.session_id, new_session=existing is None)
    options = WriteOptions(counter=item.counter, ttl_seconds=item.ttl_seconds)
    for start in range(0, len(item.messages), BATCH):
        result = store.append(item.session_id, item.messages[start : start + BATCH], options)
        done.stored += len(result.stored)
        done.duplicates += len(result.duplicates)
    done.audit_added = _add_missing_audit(store, item)
    turns = [int(r["turn"]) for r in item.audit if r.get("kind") == "request"]
    _, done.summary_version = store.restore(
        item.session_id, max(turns, default=0), item.summary, item.ttl_seconds or 0
    )
    if item.summary is not None and done.summary_version != item.summary.version:
        note(f"warning: {item.session_id} already has summary v{done.summary_version}; kept it")
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
            "yes" if d.new_session else "no",
            str(d.stored),
            str(d.duplicates),
            str(d.audit_added),
            f"v{d.summary_version}" if d.summary_version else "-",
        )
    return table
