"""``ctxguard show``: a session's messages, summaries and audit trail, as stored."""

from __future__ import annotations

import json
from typing import Any

import click
from rich.console import Group, RenderableType
from rich.markup import escape
from rich.table import Table

from ctxguard.cli.common import (
    EXIT_CODES_HELP,
    add_row,
    emit_json,
    handles_errors,
    json_option,
    opened_store,
    short,
    stdout,
    store_options,
)
from ctxguard.cli.quoting import shown_id
from ctxguard.cli.sessions import info_json
from ctxguard.cli.snapshot import Snapshot, dropped_ranges, format_ranges, require_snapshot
from ctxguard.guard.sent import sent_count
from ctxguard.messages import iso_record
from ctxguard.stores.base import StoredMessage

_EPILOG = f"""\b
Examples:
  ctxguard show chat-123 --url redis://localhost:6379/0
  ctxguard show chat-123 --full           # whole message text, not a preview
  ctxguard show chat-123 --json | jq '.audit[] | select(.kind=="request")'

{EXIT_CODES_HELP}
"""


@click.command("show", epilog=_EPILOG)
@click.argument("session")
@click.option("--full", is_flag=True, help="Print whole message text instead of previews.")
@store_options
@json_option
@handles_errors
def show_command(
    session: str, full: bool, url: str, namespace: str | None, tenant: str | None, as_json: bool
) -> None:
    """Show messages (role, tokens), summaries and the ranges they cover, and audit records."""
    with opened_store(url, namespace, tenant) as store:
        snap = require_snapshot(store, session)
    if as_json:
        emit_json(snapshot_json(snap))
        return
    stdout().print(Group(*_sections(snap, full)))


def snapshot_json(snap: Snapshot) -> dict[str, Any]:
    return {
        "info": {**info_json(snap.info), "counter_spec": counter_spec(snap)},
        "messages": [message_json(s) for s in snap.messages],
        "summary": snap.summary.model_dump(mode="json") if snap.summary else None,
        "summaries": summary_ranges(snap),
        "audit": snap.audit,
        "corrupt": [{"position": c.position, "detail": c.detail} for c in snap.corrupt],
    }


def message_json(stored: StoredMessage) -> dict[str, Any]:
    record = json.loads(iso_record(stored.message))
    return {"seq": stored.seq, "tokens": stored.tokens, "message": record}


def summary_ranges(snap: Snapshot) -> list[dict[str, Any]]:
    """Each summary version with the message range it stands for, oldest first."""
    rows = []
    for version, summary in sorted(snap.summary_texts().items()):
        rows.append(
            {
                "version": version,
                "covers": [0, summary.covers_to],
                "from_id": summary.from_id,
                "to_id": summary.to_id,
                "current": snap.summary is not None and snap.summary.version == version,
                "text": summary.text,
            }
        )
    return rows


def _sections(snap: Snapshot, full: bool) -> list[RenderableType]:
    info = snap.info
    spec = counter_spec(snap)
    counter = info.counter or "no counter"
    if spec and info.counter:
        counter = f"counter {spec}, fingerprint {info.counter}"
    head = (
        f"[bold]{escape(shown_id(snap.session_id))}[/]  {info.message_count} messages, "
        f"{info.token_total} tokens "
        f"({escape(counter)}), summary v{info.summary_version}, "
        f"{info.audit_count} audit records"
    )
    parts: list[RenderableType] = [head, _messages_table(snap, full)]
    if snap.corrupt:
        parts.append(_corrupt_table(snap))
    parts.append(_summaries_table(snap, full))
    parts.append(audit_table(snap.audit))
    return parts


def _messages_table(snap: Snapshot, full: bool) -> Table:
    table = Table(title="messages")
    for name in ("seq", "id", "role", "tokens", "content"):
        table.add_column(name, justify="right" if name in ("seq", "tokens") else "left")
    for stored in snap.messages:
        message = stored.message
        text = message.text
        if message.tool_calls:
            calls = ", ".join(f"{c.function.name}({c.id})" for c in message.tool_calls)
            text = f"{text} [calls {calls}]".strip()
        if message.tool_call_id:
            text = f"[result of {message.tool_call_id}] {text}"
        add_row(
            table,
            str(stored.seq),
            message.id,
            message.role,
            "?" if stored.tokens is None else str(stored.tokens),
            text if full else short(text),
        )
    return table


def _corrupt_table(snap: Snapshot) -> Table:
    table = Table(title="undecodable records", style="red")
    table.add_column("position")
    table.add_column("detail")
    for bad in snap.corrupt:
        add_row(table, bad.position, bad.detail)
    return table


def _summaries_table(snap: Snapshot, full: bool) -> Table:
    table = Table(title="summaries")
    for name in ("version", "covers", "from id", "to id", "current", "text"):
        table.add_column(name)
    for row in summary_ranges(snap):
        add_row(
            table,
            f"v{row['version']}",
            f"[{row['covers'][0]}, {row['covers'][1]})",
            str(row["from_id"] or "-"),
            str(row["to_id"] or "-"),
            "yes" if row["current"] else "",
            row["text"] if full else short(row["text"]),
        )
    return table


def audit_table(audit: list[dict[str, Any]]) -> Table:
    """One row per audit record; request rows say tokens against the limit."""
    table = Table(title="audit records")
    for name in ("#", "kind", "turn", "tokens / limit", "sent", "dropped", "detail"):
        table.add_column(name)
    for index, record in enumerate(audit):
        kind = str(record.get("kind", "?"))
        add_row(table, str(index), kind, *_audit_cells(kind, record))
    return table


def _audit_cells(kind: str, record: dict[str, Any]) -> tuple[str, str, str, str, str]:
    if kind == "request":
        budget = f"{record.get('tokens')} + {record.get('reserved_output')} / {record.get('limit')}"
        decisions = ", ".join(str(d.get("policy")) for d in record.get("decisions") or [])
        dropped = format_ranges(dropped_ranges(record))
        sent = str(sent_count(record))
        return str(record.get("turn")), budget, sent, dropped or "-", decisions
    if kind == "usage":
        detail = f"server prompt_tokens={record.get('prompt_tokens')} drift={record.get('drift')}"
        return str(record.get("of_turn", "-")), str(record.get("estimated", "-")), "", "", detail
    if kind == "retract":
        ids = [str(i) for i in record.get("ids") or []]
        shown = ", ".join(ids[:5]) + (f" (+{len(ids) - 5} more)" if len(ids) > 5 else "")
        detail = f"removed {record.get('count', len(ids))} newest message(s): {shown or '-'}"
        return "-", "", "", "", detail
    if kind == "replace":
        ids = [str(i) for i in record.get("ids") or []]
        shown = ", ".join(ids[:5]) + (f" (+{len(ids) - 5} more)" if len(ids) > 5 else "")
        stored = len(record.get("stored") or [])
        detail = (
            f"replaced {record.get('count', len(ids))} message(s) from position "
            f"{record.get('start', '?')}: {shown or '-'}; stored {stored}"
        )
        return "-", "", "", "", detail
    if kind == "repair":
        changes = "; ".join(str(c) for c in record.get("changes") or []) or "nothing to change"
        return "-", "", "", "", f"repaired: {changes}"
    if kind in ("summary", "summary_failed"):
        covers = f"[{record.get('covers_from')}, {record.get('covers_to')})"
        state = "committed" if record.get("committed") else "not committed"
        if kind == "summary_failed":
            state = f"failed: {record.get('error') or '?'}"
        detail = f"v{record.get('version', '?')} covers {covers} {state}"
        return "-", "", "", "", detail
    keys = ", ".join(sorted(k for k in record if k != "kind"))
    return "-", "", "", "", f"fields: {keys}" if keys else ""


def counter_spec(snap: Snapshot) -> str | None:
    """The spec (``approx``, ``tiktoken:cl100k_base``...) behind the session's counter
    fingerprint, from the newest request record made with it."""
    for record in reversed(snap.requests):
        if record.get("counter") == snap.info.counter and isinstance(
            record.get("counter_spec"), str
        ):
            return str(record["counter_spec"])
    return None
