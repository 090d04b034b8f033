"""``ctxguard replay``: re-run context preparation over a stored session (the what-if tool).

Nothing is written: replay rebuilds each recorded request from the stored
history and runs the policies again, with the recorded settings or with the
ones given on the command line.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any, Literal

import click
from rich.table import Table
from rich.text import Text

from ctxguard._secrets import redact_urls
from ctxguard.cli.common import (
    EXIT_BAD_INPUT,
    EXIT_CODES_HELP,
    EXIT_TOKENIZER,
    EXIT_VIOLATION,
    NON_NEGATIVE_INT,
    POSITIVE_INT,
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
from ctxguard.cli.quoting import shown_id
from ctxguard.cli.snapshot import Snapshot, require_snapshot
from ctxguard.errors import CtxGuardError
from ctxguard.guard.replay import (
    ReplayedTurn,
    ReplayOverrides,
    core_for_record,
    replay_turn,
    with_prefix_estimates,
)
from ctxguard.tokens import TokenCounter, load_counter, prefix_probes

REQUIRED = frozenset(
    {"message_count", "limit", "reserved_output", "safety_margin", "overhead", "tokens"}
)

_EPILOG = f"""\b
Examples:
  ctxguard replay chat-123                       # recorded settings: every turn 'same'
  ctxguard replay chat-123 --limit 32768         # what would a 32k limit have kept?
  ctxguard replay chat-123 --counter tiktoken:cl100k_base --max-tokens 2048
  ctxguard replay chat-123 --no-summaries --json
  ctxguard replay chat-123 --start-on-user       # windows opened on a user turn?
  ctxguard replay chat-123 --policy stable --low-water 0.5   # keep the prefix cache warm
  ctxguard replay chat-123 --check               # exit 1 if any turn differs (CI)

{EXIT_CODES_HELP}
"""


@click.command("replay", epilog=_EPILOG)
@click.argument("session")
@click.option(
    "--limit",
    type=POSITIVE_INT,
    help="Context limit instead of the recorded.",
)
@click.option("--max-tokens", type=NON_NEGATIVE_INT, help="Output reserve instead.")
@click.option("--safety-margin", type=NON_NEGATIVE_INT, help="Safety margin instead.")
@click.option("--counter", "counter_spec", help="Token counter spec (default: the recorded one).")
@click.option("--max-window-messages", type=POSITIVE_INT, help="Window message cap.")
@click.option("--no-summaries", is_flag=True, help="Replay as if no summary had been committed.")
@click.option(
    "--start-on-user/--no-start-on-user",
    default=None,
    help="Windows that leave messages out start on a user turn (default: as recorded).",
)
@click.option(
    "--policy",
    "window_policy",
    type=click.Choice(["sliding", "stable"]),
    help="Window policy instead of the recorded one.",
)
@click.option(
    "--low-water",
    type=str,
    help="Stable policy: tokens (int) or fraction of the prompt budget (0-1) left after a cut.",
)
@click.option("--check", is_flag=True, help="Exit 1 when any turn differs from what was sent.")
@store_options
@json_option
@handles_errors
def replay_command(
    session: str,
    limit: int | None,
    max_tokens: int | None,
    safety_margin: int | None,
    counter_spec: str | None,
    max_window_messages: int | None,
    no_summaries: bool,
    start_on_user: bool | None,
    window_policy: Literal["sliding", "stable"] | None,
    low_water: str | None,
    check: bool,
    url: str,
    namespace: str | None,
    tenant: str | None,
    as_json: bool,
) -> None:
    """For each recorded turn: the ids sent, the ids a replay sends, the difference, tokens."""
    overrides = ReplayOverrides(
        limit=limit,
        max_tokens=max_tokens,
        safety_margin=safety_margin,
        max_window_messages=max_window_messages,
        summaries=not no_summaries,
        start_on_user=start_on_user,
        window_policy=window_policy,
        low_water=_low_water(low_water),
    )
    with opened_store(url, namespace, tenant) as store:
        snap = require_snapshot(store, session)
    if snap.corrupt:
        note(f"warning: {len(snap.corrupt)} undecodable record(s) skipped")
    counter = pick_counter(snap, counter_spec)
    turns = replay_snapshot(snap, counter, overrides)
    if not as_json:
        _note_prefix_breaks(counter)
    if as_json:
        emit_json([turn_json(t) for t in turns])
    else:
        stdout().print(_table(session, turns))
    if check and not all(t.same for t in turns):
        click.get_current_context().exit(EXIT_VIOLATION)


def _low_water(text: str | None) -> int | float | None:
    """--low-water: an int is tokens, a number with a point a fraction in (0, 1)."""
    if text is None:
        return None
    try:
        value: int | float = float(text) if "." in text else int(text)
    except ValueError:
        fail(f"--low-water must be an int or a fraction, got {text!r}", EXIT_BAD_INPUT)
    if (isinstance(value, float) and not 0.0 < value < 1.0) or value < 0:
        fail(f"--low-water must be tokens >= 0 or a fraction in (0, 1), got {text}", EXIT_BAD_INPUT)
    return value


def pick_counter(snap: Snapshot, spec: str | None) -> TokenCounter:
    """--counter, else the spec the requests were counted with; never a silent guess."""
    if spec is None:
        specs = {str(r["counter_spec"]) for r in snap.requests if r.get("counter_spec")}
        if not specs:
            fail("no counter spec was recorded for this session; pass --counter", EXIT_BAD_INPUT)
        if len(specs) > 1:
            fail(
                f"requests were counted with {sorted(specs)}; pick one with --counter",
                EXIT_BAD_INPUT,
            )
        spec = str(specs.pop())
    try:
        return load_counter(spec)
    except CtxGuardError as exc:
        fail(
            f"cannot load counter {redact_urls(spec)!r} ({exc}); pass --counter with one "
            "that loads here",
            EXIT_TOKENIZER,
        )


def replay_snapshot(
    snap: Snapshot, counter: TokenCounter, overrides: ReplayOverrides
) -> list[ReplayedTurn]:
    """Replay each request under its own recorded policy settings (they may change over time)."""
    summaries = snap.summary_texts()
    turns = []
    core = None
    for record in snap.requests:
        version = int(record.get("summary_version") or 0)
        summary = summaries.get(version) if version else None
        missing = sorted(REQUIRED - set(record))
        if missing:
            turns.append(_malformed(snap, record, f"record lacks {', '.join(missing)}"))
            continue
        core = core_for_record(counter, record, overrides)
        turns.append(replay_turn(core, snap.messages, record, summary, overrides))
    if core is None:
        return turns
    return with_prefix_estimates(turns, snap.messages, summaries, core)


def _malformed(snap: Snapshot, record: dict[str, Any], why: str) -> ReplayedTurn:
    """A turn that cannot be replayed is shown with the reason, not a traceback."""
    sent = tuple(snap.sent_ids(record) or ())
    numbers = [record.get(k) for k in ("tokens", "limit", "reserved_output")]
    tokens, limit, reserved = (n if isinstance(n, int) else 0 for n in numbers)
    return ReplayedTurn(int(record.get("turn") or 0), sent, (), tokens, None, limit, reserved, why)


def turn_json(turn: ReplayedTurn) -> dict[str, Any]:
    data = asdict(turn)
    data.update(same=turn.same, added=list(turn.added), removed=list(turn.removed))
    return data


def _table(session: str, turns: list[ReplayedTurn]) -> Table:
    table = Table(title=Text(f"replay of {shown_id(session)}"))
    names = ("turn", "sent", "replayed", "same", "added", "removed", "tokens", "starts on", "limit")
    for name in (*names, "reused", "prefilled"):
        table.add_column(name)
    for t in turns:
        replayed = "error" if t.error else f"{len(t.replayed_ids)} msgs"
        tokens = f"{t.recorded_tokens} → {t.replayed_tokens if t.error is None else '-'}"
        add_row(
            table,
            str(t.turn),
            f"{len(t.recorded_ids)} msgs",
            replayed,
            Text("same", "green") if t.same else Text("differs", "red"),
            _ids(t.added),
            _ids(t.removed) if not t.error else t.error,
            tokens,
            _starts(t),
            f"{t.limit} (reserve {t.reserved_output})",
            _pair(t.recorded_reused, t.replayed_reused),
            _pair(t.recorded_prefilled, t.replayed_prefilled),
        )
    return table


def _starts(turn: ReplayedTurn) -> str:
    """The role the window opens with (after pinned messages and summary): sent → replayed."""
    before, after = turn.recorded_start or "-", turn.replayed_start or "-"
    return before if turn.error is None and before == after else f"{before} → {after}"


def _note_prefix_breaks(counter: TokenCounter) -> None:
    """Say when the template itself rewrites earlier turns (the model's numbers assume not)."""
    breaks = {k: v for k, v in prefix_probes(counter).items() if v.startswith("breaks")}
    if breaks:
        found = ", ".join(f"{k} ({v})" for k, v in breaks.items())
        note(f"note: this template rewrites earlier turns, which re-prefills them: {found}")


def _pair(recorded: int | None, replayed: int | None) -> str:
    """Prefix-cache model numbers, recorded → replayed ("-" when the counter has no ids)."""
    if recorded is None and replayed is None:
        return "-"
    return f"{'-' if recorded is None else recorded} → {'-' if replayed is None else replayed}"


def _ids(ids: tuple[str, ...]) -> str:
    if len(ids) <= 4:
        return " ".join(ids) or "-"
    return " ".join(ids[:3]) + f" … (+{len(ids) - 3})"
