"""``ctxguard repair``: rebuild a session's derived keys from its message list, audited.

A key written by something other than ctxguard (``RPUSH <ns>:<tenant>:{s}:pins x``)
makes every script on the session refuse with ``CorruptRecordError``. The
message list is the source of truth: token counts, the id index, the pinned
positions and the meta counts are rebuilt from it, an invalid summary is
dropped, and an audit record ``{"kind": "repair", ...}`` says what changed.
The write happens atomically and only if nothing changed the session since it
was read. A message list that does not decode cannot be rebuilt from anything:
export what decodes (``ctxguard show --json``) and delete the session.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import click

from ctxguard.cli.common import (
    EXIT_BAD_INPUT,
    EXIT_CODES_HELP,
    EXIT_NOT_FOUND,
    emit_json,
    fail,
    handles_errors,
    json_option,
    note,
    opened_store,
    store_options,
)
from ctxguard.cli.quoting import suggest
from ctxguard.errors import ConflictError, CorruptRecordError
from ctxguard.ids import validate_id
from ctxguard.stores.base import SessionStore
from ctxguard.stores.integrity import RawSession, plan_repair

_EPILOG = f"""\b
Examples:
  ctxguard audit --all                         # lists damaged_key findings
  ctxguard repair chat-123 --dry-run           # what would change
  ctxguard repair chat-123 --url redis://localhost:6379/0

\b
Rebuilds toks, ids, pins and the meta counts from the message list, drops a
summary that does not decode or covers more than the history, and records
{{"kind": "repair", "changes": [...]}} in the audit trail. Refuses (exit 2)
when the message list itself does not decode: export or delete the session.

{EXIT_CODES_HELP}
"""


def inspect_session(store: SessionStore, session_id: str) -> RawSession | None:
    """The session's raw keys, or None (a store that cannot inspect, or no session)."""
    inspect = getattr(store, "inspect", None)
    if inspect is None:
        return None
    raw: RawSession | None = inspect(session_id)
    return raw


@click.command("repair", epilog=_EPILOG)
@click.argument("session")
@click.option("--dry-run", is_flag=True, help="Say what would change; write nothing.")
@store_options
@json_option
@handles_errors
def repair_command(
    session: str,
    dry_run: bool,
    url: str,
    namespace: str | None,
    tenant: str | None,
    as_json: bool,
) -> None:
    """Rebuild a session's derived keys (counts, ids, pins, meta) from its messages."""
    # a write: an id the rule refuses now (a session an older version stored under a
    # format character) is refused before anything is read, --dry-run too (show, export
    # and delete still take it)
    validate_id(session, "session id")
    with opened_store(url, namespace, tenant) as store:
        if getattr(store, "repair", None) is None:
            fail(f"this store ({type(store).__name__}) cannot repair sessions", EXIT_BAD_INPUT)
        raw = inspect_session(store, session)
        if raw is None:
            fail(f"session {session!r} not found in this namespace/tenant", EXIT_NOT_FOUND)
        try:
            plan = plan_repair(session, raw, time.time_ns() // 1_000_000, _max_turn(store, session))
        except CorruptRecordError as exc:
            fail(
                f"session {session!r}: the message list cannot be rebuilt from "
                f"(record {exc.position} does not decode); nothing changed: save what decodes "
                f"with `{suggest('show --json', session)}` and delete the session with "
                f"`{suggest('delete', session)}`",
                EXIT_BAD_INPUT,
            )
        applied = False
        if plan.changes and not dry_run:
            record: dict[str, Any] = {
                "kind": "repair",
                "at": datetime.now(UTC).isoformat(),
                "changes": plan.changes,
                "message_count": len(plan.ids),
            }
            applied = bool(store.repair(session, plan, record))  # type: ignore[attr-defined]
            if not applied:
                raise ConflictError(
                    f"session {session!r} changed while it was being repaired; run repair again"
                )
    if as_json:
        emit_json({"session": session, "changes": plan.changes, "applied": applied})
        return
    if not plan.changes:
        note(f"session {session!r}: nothing to repair")
        return
    verb = "would change" if dry_run else "repaired"
    note(f"session {session!r}: {verb}:")
    for change in plan.changes:
        note(f"  {change}")


def _max_turn(store: SessionStore, session: str) -> int:
    """The highest request turn in the audit trail, so the turn counter never goes back."""
    damaged: list[CorruptRecordError] = []
    try:
        audit = store.read_audit(session, damaged=damaged)
    except CorruptRecordError:
        return 0
    for exc in damaged:
        note(
            f"warning: session {session!r}: record {exc.position} does not decode; repair "
            "leaves the audit trail as it is (see `ctxguard audit`)"
        )
    turns = [r.get("turn") for r in audit if r.get("kind") == "request"]
    return max((t for t in turns if isinstance(t, int)), default=0)
