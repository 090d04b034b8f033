"""``ctxguard audit``: did every recorded request stay within its limit and stay valid?

Made for CI and monitoring: it exits 1 when it finds a violation, prints a
summary table (or --json), and treats damaged data as a finding, not a crash.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import click
from rich.console import Group
from rich.table import Table
from rich.text import Text

from ctxguard.cli.common import (
    EXIT_BAD_INPUT,
    EXIT_CODES_HELP,
    EXIT_VIOLATION,
    NON_NEGATIVE_INT,
    POSITIVE_INT,
    add_row,
    emit_json,
    fail,
    handles_errors,
    json_option,
    opened_store,
    stdout,
    store_options,
)
from ctxguard.cli.quoting import shown_id
from ctxguard.cli.snapshot import Snapshot, load_snapshot, require_snapshot, summary_version_of
from ctxguard.guard.policies import tool_problems
from ctxguard.guard.sent import seen_by
from ctxguard.messages import Message
from ctxguard.stores.audit_context import CONTEXT_KEY
from ctxguard.stores.base import SessionStore

_EPILOG = f"""\b
Examples:
  ctxguard audit chat-123 --url redis://localhost:6379/0
  ctxguard audit --all --max-drift 64 --json > audit.json
  ctxguard audit --all --max-message-tokens 8000

\b
Checks: over_limit (tokens + reserved_output + safety_margin > limit),
invalid_request (tool calls without results, results without calls),
missing_newest (a request sent without the newest message or the newest
user message of its time), summary_beyond_history (a summary covering
messages the session does not hold), unknown_sent_id, long_message,
corrupt_record, damaged_key (a key of the session that its scripts cannot
use: repair it with `ctxguard repair SESSION`), missing_context (a request
record whose stored context was deleted), drift (with --max-drift).

{EXIT_CODES_HELP}
"""


@dataclass(frozen=True)
class Violation:
    """One finding: which session, which check, where in the session, and the numbers."""

    session: str
    check: str
    where: str
    detail: str


@dataclass
class SessionAudit:
    """The outcome for one session: counts, drift statistics and its violations."""

    session: str
    requests: int = 0
    usage_records: int = 0
    drift_p50: float | None = None
    drift_max: int | None = None
    violations: list[Violation] = field(default_factory=list)


@click.command("audit", epilog=_EPILOG)
@click.argument("session", required=False)
@click.option("--all", "all_sessions", is_flag=True, help="Audit every session in the store.")
@click.option(
    "--max-message-tokens",
    type=POSITIVE_INT,
    help="Report stored messages over this.",
)
@click.option(
    "--max-drift",
    type=NON_NEGATIVE_INT,
    help="Report turns whose server-reported prompt tokens differ from the estimate by more.",
)
@store_options
@json_option
@handles_errors
def audit_command(
    session: str | None,
    all_sessions: bool,
    max_message_tokens: int | None,
    max_drift: int | None,
    url: str,
    namespace: str | None,
    tenant: str | None,
    as_json: bool,
) -> None:
    """Check recorded requests (limits, provider validity), messages, records and drift."""
    if bool(session) == all_sessions:
        fail("give one SESSION or --all", EXIT_BAD_INPUT)
    with opened_store(url, namespace, tenant) as store:
        snaps = [require_snapshot(store, session)] if session else list(_all(store))
    results = [audit_snapshot(s, max_message_tokens, max_drift) for s in snaps]
    violations = [v for r in results for v in r.violations]
    if as_json:
        emit_json(
            {
                "ok": not violations,
                "sessions": [_result_json(r) for r in results],
                "violations": [asdict(v) for v in violations],
            }
        )
    else:
        stdout().print(Group(_summary_table(results), _violations_table(violations)))
    if violations:
        click.get_current_context().exit(EXIT_VIOLATION)


def _all(store: SessionStore) -> Iterable[Snapshot]:
    for session_id in sorted(store.list_sessions("")):
        snap = load_snapshot(store, session_id)
        if snap is not None:  # expired between listing and reading
            yield snap


def audit_snapshot(
    snap: Snapshot, max_message_tokens: int | None, max_drift: int | None
) -> SessionAudit:
    result = SessionAudit(snap.session_id, len(snap.requests), len(snap.usages))
    result.violations += _corrupt(snap)
    result.violations += [
        Violation(snap.session_id, "damaged_key", f"key {p.key}", p.detail)
        for p in snap.damaged_keys
    ]
    result.violations += _summary_range(snap)
    retract_after = _retract_positions(snap)
    for index, record in enumerate(snap.audit):
        if "kind" not in record and isinstance(record.get(CONTEXT_KEY), str):
            result.violations.append(_missing_context(snap.session_id, record))
            continue
        if record.get("kind") != "request":
            continue
        result.violations += _limit(snap.session_id, record)
        result.violations += _validity(snap, record)
        if not any(r > index for r in retract_after):
            result.violations += _newest_sent(snap, record)
    if max_message_tokens is not None:
        result.violations += _long_messages(snap, max_message_tokens)
    result.drift_p50, result.drift_max, found = _drift(snap, max_drift)
    result.violations += found
    return result


def _missing_context(session: str, record: dict[str, Any]) -> Violation:
    """A request record whose context (stores/audit_context.py) is no longer stored: only
    outside damage to the session's ``ctx`` key does this; the record cannot be checked."""
    detail = (
        f"its request context {record[CONTEXT_KEY]} is not in the session's ctx key "
        "(deleted or damaged outside ctxguard): its limit and counter are unknown"
    )
    return Violation(session, "missing_context", f"turn {record.get('turn')}", detail)


def _corrupt(snap: Snapshot) -> list[Violation]:
    return [
        Violation(snap.session_id, "corrupt_record", f"record {c.position}", c.detail)
        for c in snap.corrupt
    ]


def _limit(session: str, record: dict[str, Any]) -> list[Violation]:
    where = f"turn {record.get('turn')}"
    numbers = [record.get(k, 0) for k in ("tokens", "reserved_output", "safety_margin", "limit")]
    if not all(isinstance(n, int) for n in numbers) or "tokens" not in record:
        return [Violation(session, "malformed_record", where, "tokens/limit fields missing")]
    tokens, reserved, margin, limit = numbers
    if tokens + reserved + margin <= limit:
        return []
    detail = (
        f"{tokens} prompt + {reserved} reserved + {margin} margin = "
        f"{tokens + reserved + margin} > limit {limit} ({record.get('limit_source', '?')})"
    )
    return [Violation(session, "over_limit", where, detail)]


def _validity(snap: Snapshot, record: dict[str, Any]) -> list[Violation]:
    """Rebuild what was sent from its ids and the stored history; check provider rules."""
    where = f"turn {record.get('turn')}"
    by_id = {s.message.id: s.message for s in snap.messages}
    role = "user" if (record.get("policy") or {}).get("summary_role") == "user" else "system"
    sent: list[Message] = []
    missing: list[str] = []
    ids = snap.sent_ids(record)
    if ids is None:
        detail = "the history at the recorded positions is not what was sent (changed since)"
        return [Violation(snap.session_id, "unknown_sent_id", where, detail)]
    for message_id in ids:
        if summary_version_of(message_id) is not None:
            sent.append(Message(role=role, content="(summary)", id=message_id))
        elif message_id in by_id:
            sent.append(by_id[message_id])
        else:
            missing.append(message_id)
    found = [Violation(snap.session_id, "invalid_request", where, p) for p in tool_problems(sent)]
    if missing:
        detail = f"sent ids not in the stored history: {', '.join(missing[:5])}"
        found.append(Violation(snap.session_id, "unknown_sent_id", where, detail))
    return found


def _summary_range(snap: Snapshot) -> list[Violation]:
    """A summary stands for messages [0, covers_to): they must all be stored."""
    held = len(snap.messages) + len(snap.corrupt_messages)
    summary = snap.summary
    if summary is None or 0 <= summary.covers_to <= held:
        return []
    detail = f"summary v{summary.version} covers [0, {summary.covers_to}) but {held} are stored"
    return [Violation(snap.session_id, "summary_beyond_history", "summary", detail)]


def _retract_positions(snap: Snapshot) -> list[int]:
    return [i for i, r in enumerate(snap.audit) if r.get("kind") in ("retract", "replace")]


def _newest_sent(snap: Snapshot, record: dict[str, Any]) -> list[Violation]:
    """The newest message of the request's time, and its newest user message, were sent.

    The guard always sends the messages a prepare adds, so a request without
    them (for example only a summary that claims to cover them) is a violation.
    Requests followed by a retraction (or a replace) are skipped: their history is gone.
    So are requests whose sent ids cannot be rebuilt (reported as ``unknown_sent_id``):
    a ``commit="with_reply"`` record is written with the reply, after a retraction or a
    replace that came between may have changed the history it was sent from.
    """
    count = record.get("message_count")
    if not isinstance(count, int) or count <= 0:
        return []
    seen = seen_by(record, snap.messages)  # (less another writer's, it did not see)
    if not seen or seen[-1].seq != count - 1:
        return []  # the newest message of the time does not decode: reported as corrupt
    ids = snap.sent_ids(record)
    if ids is None:
        return []  # the history changed under it: _validity reports unknown_sent_id
    sent = set(ids)
    where = f"turn {record.get('turn')}"
    found = []
    users = [s for s in seen if s.message.role == "user"]
    newest = seen[-1]
    if newest.message.id not in sent:
        detail = f"newest message {newest.message.id!r} (seq {newest.seq}) was not sent"
        found.append(Violation(snap.session_id, "missing_newest", where, detail))
    elif users and users[-1].message.id not in sent:
        user = users[-1]
        detail = f"newest user message {user.message.id!r} (seq {user.seq}) was not sent"
        found.append(Violation(snap.session_id, "missing_newest", where, detail))
    return found


def _long_messages(snap: Snapshot, cap: int) -> list[Violation]:
    return [
        Violation(
            snap.session_id,
            "long_message",
            f"seq {s.seq}",
            f"{s.message.role} message {s.message.id!r} is {s.tokens} tokens (> {cap})",
        )
        for s in snap.messages
        if s.tokens is not None and s.tokens > cap
    ]


def _drift(
    snap: Snapshot, max_drift: int | None
) -> tuple[float | None, int | None, list[Violation]]:
    """Median and worst |server - estimate|; turns over --max-drift are violations."""
    pairs = [(u.get("of_turn"), u["drift"]) for u in snap.usages if isinstance(u.get("drift"), int)]
    pairs += [(r.get("turn"), r["drift"]) for r in snap.requests if isinstance(r.get("drift"), int)]
    if not pairs:
        return None, None, []
    sizes = [abs(d) for _, d in pairs]
    found = [
        Violation(snap.session_id, "drift", f"turn {turn}", f"server - estimate = {d:+d} tokens")
        for turn, d in pairs
        if max_drift is not None and abs(d) > max_drift
    ]
    return float(statistics.median(sizes)), max(sizes), found


def _result_json(result: SessionAudit) -> dict[str, Any]:
    data = asdict(result)
    data["violations"] = len(result.violations)
    return data


def _summary_table(results: list[SessionAudit]) -> Table:
    table = Table(title="audit")
    for name in ("session", "requests", "usage", "drift p50", "drift max", "violations"):
        table.add_column(name, justify="left" if name == "session" else "right")
    for r in results:
        count = len(r.violations)
        add_row(
            table,
            shown_id(r.session),
            str(r.requests),
            str(r.usage_records),
            "-" if r.drift_p50 is None else f"{r.drift_p50:g}",
            "-" if r.drift_max is None else str(r.drift_max),
            Text(str(count), "red" if count else "green"),
        )
    return table


def _violations_table(violations: list[Violation]) -> Table | str:
    if not violations:
        return "[green]no violations[/]"
    table = Table(title=f"{len(violations)} violation(s)", style="red")
    for name in ("session", "check", "where", "detail"):
        table.add_column(name)
    for v in violations:
        add_row(table, shown_id(v.session), v.check, v.where, v.detail)
    return table
