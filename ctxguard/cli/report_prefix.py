"""The report's prefix-cache columns: per turn, what the recorded policy and the other one
send, reuse from the server's prefix cache and prefill.

The recorded numbers are the request record's own (``reused`` / ``prefilled``, written
with ``prefix_block_size``) when it has them, else the prefix-cache model's over the
recorded requests; the alternative ("stable" for a sliding session, "sliding" for a
stable one) is a replay (:mod:`ctxguard.cli.replay`). Both need a counter with
token ids: the recorded counter spec, or ``--counter``; without one the columns say
"-" and the report says why.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ctxguard._secrets import redact_urls
from ctxguard.cli.replay import replay_snapshot
from ctxguard.cli.snapshot import Snapshot
from ctxguard.errors import CtxGuardError
from ctxguard.guard.replay import ReplayOverrides
from ctxguard.tokens import load_counter

Policy = Literal["sliding", "stable"]


@dataclass(frozen=True)
class PrefixRow:
    """One turn's prefix-cache numbers (None: unknown) for the recorded policy and the other."""

    reused: int | None
    prefilled: int | None
    alt_tokens: int | None
    alt_reused: int | None
    alt_prefilled: int | None
    from_record: bool


@dataclass(frozen=True)
class PrefixColumns:
    recorded: Policy
    alternative: Policy
    rows: list[PrefixRow]
    why_missing: str | None = None


def recorded_policy(snap: Snapshot) -> Policy:
    """The window policy of the newest request (sliding for records that predate it)."""
    newest = snap.requests[-1] if snap.requests else {}
    policy = newest.get("policy")
    stable = isinstance(policy, dict) and policy.get("window_policy") == "stable"
    return "stable" if stable else "sliding"


def prefix_columns(snap: Snapshot, counter_spec: str | None) -> PrefixColumns:
    """Per request record, in order: its row (numbers missing where unknown)."""
    recorded = recorded_policy(snap)
    alternative: Policy = "sliding" if recorded == "stable" else "stable"
    from_records = [_record_row(r) for r in snap.requests]
    specs = {str(r["counter_spec"]) for r in snap.requests if r.get("counter_spec")}
    spec = counter_spec or (specs.pop() if len(specs) == 1 else None)
    if spec is None:
        why = "no single recorded counter spec; pass --counter for the alternative policy"
        return PrefixColumns(recorded, alternative, from_records, why)
    try:
        counter = load_counter(spec)
    except CtxGuardError as exc:
        shown = redact_urls(spec)
        why = f"counter {shown!r} does not load here ({type(exc).__name__}); pass --counter"
        return PrefixColumns(recorded, alternative, from_records, why)
    try:
        turns = replay_snapshot(snap, counter, ReplayOverrides(window_policy=alternative))
    except CtxGuardError as exc:
        why = f"the replay under {alternative} failed ({type(exc).__name__})"
        return PrefixColumns(recorded, alternative, from_records, why)
    rows = [
        PrefixRow(
            t.recorded_reused,
            t.recorded_prefilled,
            t.replayed_tokens if t.error is None else None,
            t.replayed_reused,
            t.replayed_prefilled,
            t.prefix_recorded,
        )
        for t in turns
    ]
    known = any(r.prefilled is not None for r in rows)
    return PrefixColumns(recorded, alternative, rows, None if known else f"{spec} has no token ids")


def _record_row(record: dict[str, object]) -> PrefixRow:
    reused, prefilled = record.get("reused"), record.get("prefilled")
    if isinstance(reused, int) and isinstance(prefilled, int):
        return PrefixRow(reused, prefilled, None, None, None, True)
    return PrefixRow(None, None, None, None, None, False)
