"""Which fields of an audit record its ``sent`` ranges rebuild (no I/O), for
:mod:`~ctxguard.stores.audit_compact`: the marker that stands for them on write
(:func:`derivation`; :func:`guard_derivation` for the guard's own request records, in
straight-line code and type for type), and the fields a marker stands for on read
(:func:`derived`). The marker's values are drawn in ``audit_compact``'s docstring.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

MAX_SKIPPED = 4096  # a user_start skip rebuilt from the marker at most (longer: kept)

_WINDOW = ("dropped", "decisions")
_WINDOW_KEYS = list(_WINDOW)
_NOTHING: tuple[Any, tuple[str, ...], dict[str, Any]] = (-1, (), {})


def derivation(record: Mapping[str, Any]) -> tuple[Any, tuple[str, ...], dict[str, Any]]:
    """The marker, the fields it stands for (in order) and their values as the ``sent``
    ranges rebuild them (:func:`derived`); ``(-1, (), {})``: none. The candidates, in
    order: the count and the window, the window only, the count only; the first whose
    values are ``==`` the record's is the one (``audit_compact._proven`` asks for more)."""
    has_count = "message_count" in record
    if not has_count and "dropped" not in record:
        return _NOTHING
    ranges = _ranges(record.get("sent"))
    if ranges is None:
        return _NOTHING
    window: tuple[int, int] | None = None  # (h, skipped): dropped + decisions, together
    count = has_count
    if "dropped" in record:
        keys = list(record)
        at = keys.index("dropped")
        if keys[at + 1 : at + 2] == ["decisions"]:
            window = _window_of(record)
        if has_count and window is not None:
            at = keys.index("message_count")
            count = keys[at + 1 : at + 3] == list(_WINDOW)
    end = ranges[-1][1]
    count_equal = count and record["message_count"] == end
    if window is not None and (rebuilt := _window(ranges, *window)) is not None:
        dropped, decisions = rebuilt
        if record["dropped"] == dropped and record["decisions"] == decisions:
            h, skipped = window
            if count_equal:
                both = {"message_count": end, "dropped": dropped, "decisions": decisions}
                return ([h, skipped] if skipped else h), ("message_count", *_WINDOW), both
            return [h, skipped, 0], _WINDOW, {"dropped": dropped, "decisions": decisions}
    if count_equal:
        return -2, ("message_count",), {"message_count": end}
    return _NOTHING


def guard_derivation(record: Mapping[str, Any]) -> tuple[Any, tuple[str, ...]] | None:
    """:func:`derivation`'s marker and fields for the request records the guard writes,
    told apart in straight-line code, each field left out type for type what the ranges
    rebuild (as ``audit_compact._proven`` asks); None: another shape (the general
    derivation)."""
    if "dropped" not in record:
        if "message_count" not in record:
            return -1, ()
        ranges = _int_ranges(record.get("sent"))
        count = record["message_count"]
        if ranges is None or type(count) is not int:
            return None
        return (-2, ("message_count",)) if count == ranges[-1][1] else (-1, ())
    ranges = _int_ranges(record.get("sent"))
    dropped, decisions = record["dropped"], record.get("decisions")
    if ranges is None or type(dropped) is not list or len(dropped) != 1:
        return None
    pair = dropped[0]
    if type(pair) is not list or len(pair) != 2 or type(decisions) is not list:
        return None
    h, start = pair
    if (
        type(h) is not int
        or type(start) is not int
        or start != ranges[-1][0]
        or not 0 <= h <= start
    ):
        return None
    skipped = 0
    if len(decisions) == 2:  # user_start's skip, then the window
        first = decisions[0]
        if type(first) is not dict or len(first) != 2:
            return None
        name, other = first  # the keys, in order
        if type(name) is not str or name != "policy" or type(other) is not str:
            return None
        if other != "skipped" or (policy := first["policy"]) != "user_start":
            return None
        seqs = first["skipped"]
        if type(policy) is not str or type(seqs) is not list:
            return None
        skipped = len(seqs)
        if not 0 < skipped <= min(start, MAX_SKIPPED) or seqs != list(
            range(start - skipped, start)
        ):
            return None
        for seq in seqs:
            if type(seq) is not int:
                return None
    elif len(decisions) != 1:
        return None
    window = decisions[-1]
    if type(window) is not dict or len(window) != 3:
        return None
    name, other, third = window
    if type(name) is not str or type(other) is not str or type(third) is not str:
        return None
    if name != "policy" or other != "first_seq" or third != "dropped_messages":
        return None
    policy, first_seq, left = window["policy"], window["first_seq"], window["dropped_messages"]
    if type(policy) is not str or policy != "window" or type(first_seq) is not int:
        return None
    if first_seq != start or type(left) is not int:
        return None
    kept = 0
    for a, b in ranges:
        if b > h and a < start:
            kept += min(b, start) - max(a, h)
    if left != start - h - kept:
        return None
    keys = list(record)
    at = keys.index("dropped")
    if keys[at + 1 : at + 2] != ["decisions"]:
        return None
    if "message_count" in record:
        at = keys.index("message_count")
        if keys[at + 1 : at + 3] == _WINDOW_KEYS:
            count = record["message_count"]
            if type(count) is not int:
                return None
            if count == ranges[-1][1]:
                return ([h, skipped] if skipped else h), ("message_count", *_WINDOW)
    return [h, skipped, 0], _WINDOW


def _int_ranges(sent: Any) -> list[list[int]] | None:
    """``sent`` if :func:`_ranges` takes it and it is plain JSON (lists, ints), else None."""
    if type(sent) is not list or not sent:
        return None
    for pair in sent:
        if type(pair) is not list or len(pair) != 2:
            return None
        a, b = pair
        if type(a) is not int or type(b) is not int or a > b:
            return None
    return sent


def _window_of(record: Mapping[str, Any]) -> tuple[int, int] | None:
    dropped, decisions = record["dropped"], record["decisions"]
    if not (isinstance(dropped, list) and len(dropped) == 1 and isinstance(dropped[0], list)):
        return None
    if len(dropped[0]) != 2 or type(dropped[0][0]) is not int or dropped[0][0] < 0:
        return None
    if not isinstance(decisions, list) or not decisions:
        return None
    first = decisions[0]
    skipped = 0
    if isinstance(first, dict) and first.get("policy") == "user_start":
        value = first.get("skipped")
        skipped = len(value) if isinstance(value, list) else 0
    return dropped[0][0], skipped


def derived(sent: Any, marker: Any) -> dict[str, Any] | None:
    """The fields ``marker`` stands for, as the last sent range says (None: damaged)."""
    count, h, skipped = True, -1, 0
    if isinstance(marker, list):
        if not 2 <= len(marker) <= 3 or not all(type(v) is int and v >= 0 for v in marker):
            return None
        h, skipped = marker[0], marker[1]
        if len(marker) == 3:
            if marker[2] != 0:
                return None
            count = False
    elif type(marker) is int and marker >= 0:
        h = marker
    elif type(marker) is not int or marker != -2:
        return None
    ranges = _ranges(sent)
    if ranges is None:
        return None
    out: dict[str, Any] = {}
    if count:
        out["message_count"] = ranges[-1][1]
    if h < 0:
        return out
    rebuilt = _window(ranges, h, skipped)
    if rebuilt is None:
        return None
    out["dropped"], out["decisions"] = rebuilt
    return out


def _ranges(sent: Any) -> list[tuple[int, int]] | None:
    """The ``sent`` ranges, if they are ``[[a, b], ...]`` of ints, ``a <= b``, not empty."""
    if not isinstance(sent, list) or not sent:
        return None
    ranges: list[tuple[int, int]] = []
    for pair in sent:
        if not (isinstance(pair, list) and len(pair) == 2):
            return None
        a, b = pair
        if type(a) is not int or type(b) is not int or a > b:
            return None
        ranges.append((a, b))
    return ranges


def _window(ranges: list[tuple[int, int]], h: int, skipped: int) -> tuple[Any, Any] | None:
    """``dropped`` and ``decisions`` of a window from ``h`` that starts at the last range
    (``skipped``: a user_start skip before it); None when no window says that."""
    start = ranges[-1][0]
    if start < h or skipped > min(start, MAX_SKIPPED):
        return None  # (a damaged marker must not make a reader allocate without bound)
    kept = sum(max(0, min(b, start) - max(a, h)) for a, b in ranges)
    decisions: list[Any] = []
    if skipped:
        decisions.append({"policy": "user_start", "skipped": list(range(start - skipped, start))})
    decisions.append({"policy": "window", "first_seq": start, "dropped_messages": start - h - kept})
    return [[h, start]], decisions
