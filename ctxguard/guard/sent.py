"""What a request record says was sent: seq ranges, the summary's place, a digest of the ids.

A request sends pinned messages, maybe the summary, then a contiguous window, so
its messages are a few runs of history positions. The record keeps them as
``"sent": [[a, b), ...]`` ranges (a few bytes, whatever the window's size), the
summary's index in the sent list as ``"summary_at"`` when one was sent, and
``"sent_digest"``: a hash of the sent ids in order. Readers rebuild the ids from the
history (``msgs`` is never trimmed) and check them against the digest, so a history
changed since (an explicit retraction) is seen, not misread.

Records written before ranges list ``sent_ids`` and ``sent_seqs``; every reader here
takes both forms. Pure functions, no I/O.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, TypeVar


class _Positioned(Protocol):
    @property
    def seq(self) -> int: ...


S = TypeVar("S", bound=_Positioned)

SUMMARY_ID_PREFIX = "ctxguard-summary-v"


def seq_ranges(seqs: Sequence[int]) -> list[list[int]]:
    """``[0, 968, 969, 970]`` -> ``[[0, 1], [968, 971]]`` (half-open runs, in order).

    A window is mostly one run (pinned messages, then consecutive history): at the
    first two positions where a range starts, the rest of a list of ints is compared
    with the run it would be, in one C comparison, and taken whole when it is one
    (the range it would have grown to, the same values); else one seq at a time.
    """
    out: list[list[int]] = []
    tries = 2 if type(seqs) is list else 0
    for index, seq in enumerate(seqs):
        if out and out[-1][1] == seq:
            out[-1][1] = seq + 1
        else:
            if tries and type(seq) is int:
                tries -= 1
                rest = len(seqs) - index
                if (
                    rest > 2
                    and seqs[-1] == seq + rest - 1  # (cheap: the run's end, first)
                    and seqs[index:] == list(range(seq, seq + rest))
                ):
                    out.append([seq, seqs[-1] + 1])
                    return out
            out.append([seq, seq + 1])
    return out


def ids_digest(ids: Sequence[str]) -> str:
    """16 hex digits over the ids in order (blake2b): enough to tell a changed history."""
    joined = "\n".join(ids).encode("utf-8", "surrogatepass")
    return hashlib.blake2b(joined, digest_size=8).hexdigest()


def sent_fields(seqs: Sequence[int], ids: Sequence[str], summary_at: int | None) -> dict[str, Any]:
    """The request record's fields for what was sent (``ids`` include the summary's)."""
    fields: dict[str, Any] = {"sent": seq_ranges(seqs), "sent_digest": ids_digest(ids)}
    if summary_at is not None:
        fields["summary_at"] = summary_at
    return fields


def _ints(value: Any) -> list[int] | None:
    if isinstance(value, list) and all(isinstance(v, int) and v >= 0 for v in value):
        return value
    return None


def sent_seqs(record: Mapping[str, Any]) -> list[int]:
    """The history positions a request sent, in order (either record form; [] if unreadable)."""
    ranges = record.get("sent")
    if isinstance(ranges, list):
        out: list[int] = []
        for pair in ranges:
            bounds = _ints(pair)
            if bounds is None or len(bounds) != 2 or bounds[0] > bounds[1]:
                return []
            if bounds[1] - bounds[0] > 1 << 24:
                return []  # a damaged record must not make a reader allocate without bound
            out.extend(range(bounds[0], bounds[1]))
        return out
    return _ints(record.get("sent_seqs")) or []


def sent_count(record: Mapping[str, Any]) -> int:
    """How many messages the request sent, the summary included."""
    if isinstance(record.get("sent_ids"), list):
        return len(record["sent_ids"])
    summary = 1 if isinstance(record.get("summary_at"), int) else 0
    return len(sent_seqs(record)) + summary


def sent_ids(record: Mapping[str, Any], id_at: Callable[[int], str | None]) -> list[str] | None:
    """The ids the request sent, in order, rebuilt through ``id_at(seq)`` (None: not stored).

    Returns None when they cannot be rebuilt as sent: a position no longer holds a
    message, or the ids found there do not match the record's digest (the history
    changed since). Records with ``sent_ids`` answer with those.
    """
    listed = record.get("sent_ids")
    if isinstance(listed, list):
        return [str(i) for i in listed]
    ids: list[str] = []
    for seq in sent_seqs(record):
        found = id_at(seq)
        if found is None:
            return None
        ids.append(found)
    at = record.get("summary_at")
    if isinstance(at, int) and 0 <= at <= len(ids):
        version = record.get("summary_version")
        ids.insert(at, f"{SUMMARY_ID_PREFIX}{version if isinstance(version, int) else 0}")
    if record.get("sent_digest") != ids_digest(ids):
        return None
    return ids


def unseen(record: Mapping[str, Any]) -> range:
    """The positions a request did not see (``commit="with_reply"``: another writer's
    messages stored between its prepare and its complete); empty when none."""
    bounds = _ints(record.get("unseen"))
    if bounds is None or len(bounds) != 2 or bounds[0] > bounds[1]:
        return range(0)
    return range(bounds[0], bounds[1])


def seen_by(record: Mapping[str, Any], history: Sequence[S]) -> list[S]:
    """The messages of ``history`` the request saw: before its ``message_count``, less
    :func:`unseen` (``history`` is in seq order)."""
    count = record.get("message_count")
    if not isinstance(count, int):
        return []
    hidden = unseen(record)
    return [s for s in history if s.seq < count and s.seq not in hidden]
