"""``ctxguard sessions``: which sessions a store holds, how big and how fresh they are."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn
from rich.table import Table

from ctxguard.cli.common import (
    EXIT_CODES_HELP,
    add_row,
    emit_json,
    handles_errors,
    json_option,
    opened_store,
    stderr,
    stdout,
    store_options,
)
from ctxguard.cli.quoting import shown_id
from ctxguard.stores.base import SessionInfo, SessionStore

_EPILOG = f"""\b
Examples:
  ctxguard sessions --url redis://localhost:6379/0
  ctxguard sessions --prefix user-42- --json
  CTXGUARD_URL=rediss://:secret@redis.internal:6380/0 ctxguard sessions --namespace chat

{EXIT_CODES_HELP}
"""


@click.command("sessions", epilog=_EPILOG)
@click.option("--prefix", default="", help="Only sessions whose id starts with this (literal).")
@store_options
@json_option
@handles_errors
def sessions_command(
    prefix: str, url: str, namespace: str | None, tenant: str | None, as_json: bool
) -> None:
    """List sessions with message count, stored tokens, last activity and TTL.

    Uses the store's SCAN listing (never KEYS); glob characters in --prefix
    match only themselves.
    """
    with opened_store(url, namespace, tenant) as store:
        infos = _collect(store, prefix, show_progress=not as_json)
    if as_json:
        emit_json([info_json(i) for i in infos])
        return
    stdout().print(_table(infos))


def _collect(store: SessionStore, prefix: str, show_progress: bool) -> list[SessionInfo]:
    """SCAN for ids, then read each session's metadata, with progress on stderr."""
    console = stderr()
    enabled = show_progress and console.is_terminal
    spinner = console.status("scanning sessions…") if enabled else contextlib.nullcontext()
    with spinner:
        ids = sorted(store.list_sessions(prefix))
    columns = (SpinnerColumn(), TextColumn("reading"), BarColumn(), MofNCompleteColumn())
    with Progress(*columns, console=console, transient=True, disable=not enabled) as progress:
        task = progress.add_task("sessions", total=len(ids))
        infos: list[SessionInfo] = []
        for session_id in ids:
            info = store.info(session_id)
            if info is not None:  # expired between SCAN and read
                infos.append(info)
            progress.advance(task)
    return infos


def info_json(info: SessionInfo) -> dict[str, Any]:
    return {
        "session_id": info.session_id,
        "message_count": info.message_count,
        "token_total": info.token_total,
        "counter": info.counter,
        "created_at": info.created_at.isoformat(),
        "updated_at": info.updated_at.isoformat(),
        "ttl_seconds": info.ttl_seconds,
        "summary_version": info.summary_version,
        "audit_count": info.audit_count,
    }


def _table(infos: Iterable[SessionInfo]) -> Table:
    table = Table(title="sessions")
    for name in ("session", "messages", "tokens", "counter", "last activity", "TTL", "summary"):
        table.add_column(name, justify="right" if name in ("messages", "tokens") else "left")
    for info in infos:
        add_row(
            table,
            shown_id(info.session_id),
            str(info.message_count),
            str(info.token_total),
            info.counter or "-",
            ago(info.updated_at),
            "none" if info.ttl_seconds is None else f"{int(info.ttl_seconds)}s",
            f"v{info.summary_version}" if info.summary_version else "-",
        )
    return table


def ago(when: datetime) -> str:
    """An absolute UTC time plus how long ago, which is what an operator asks first."""
    seconds = max(0, int((datetime.now(UTC) - when).total_seconds()))
    if seconds < 120:
        rel = f"{seconds}s ago"
    elif seconds < 7200:
        rel = f"{seconds // 60}m ago"
    elif seconds < 172800:
        rel = f"{seconds // 3600}h ago"
    else:
        rel = f"{seconds // 86400}d ago"
    return f"{when.strftime('%Y-%m-%d %H:%M:%S')}Z ({rel})"
