"""``now_iso``: the audit record's ``at`` made from one clock read, as
``datetime.now(UTC).isoformat()`` writes it, and read back to its µs without parsing."""

from __future__ import annotations

import importlib
import random
import types
from datetime import UTC, datetime, timedelta

import pytest

from ctxguard import _record_time
from ctxguard.stores import audit_compact

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _at(micros: int, monkeypatch: pytest.MonkeyPatch) -> str:
    clock = types.SimpleNamespace(time_ns=lambda: micros * 1000 + 999)  # floored to µs
    monkeypatch.setattr(_record_time, "time", clock)
    return _record_time.now_iso()


def _cases() -> list[int]:
    rng = random.Random(16)
    now = 1_796_000_000_000_000  # December 2026, in µs
    whole = [now - now % 1_000_000, 0, 951_782_400_000_000]  # a whole second, 1970, a leap day
    edges = [now - now % 60_000_000 + d for d in (-1, 0, 1, 59_999_999, 60_000_000)]
    return whole + edges + [rng.randrange(0, 4_102_444_800_000_000) for _ in range(300)]


def test_now_iso_is_isoformat_of_the_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    for micros in _cases():
        text = _at(micros, monkeypatch)
        assert text == (EPOCH + timedelta(microseconds=micros)).isoformat()
        assert _record_time.made_micros(text) == micros


def test_compaction_reads_the_made_text_as_it_parses_it(monkeypatch: pytest.MonkeyPatch) -> None:
    for micros in _cases():
        text = _at(micros, monkeypatch)
        assert audit_compact._micros(text) == micros  # known: no parse
        monkeypatch.setattr(_record_time, "_made", (None, 0))
        assert audit_compact._micros(text) == micros  # parsed, the same


def test_only_the_last_text_made_is_known(monkeypatch: pytest.MonkeyPatch) -> None:
    first = _at(1_796_000_000_123_456, monkeypatch)
    second = _at(1_796_000_000_654_321, monkeypatch)
    assert _record_time.made_micros(first) is None
    assert _record_time.made_micros(second) == 1_796_000_000_654_321
    assert _record_time.made_micros(second[:-6] + "+01:00") is None


def test_nothing_is_known_before_a_text_is_made() -> None:
    importlib.reload(_record_time)  # (in the same module dict: its state as at import)
    assert _record_time.made_micros("") is None
    assert audit_compact._micros("") is None
