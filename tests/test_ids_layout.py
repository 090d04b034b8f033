"""Generated ids are the ULID layout exactly: 26 Crockford digits of (ms << 80 | random),
random + 1 within one millisecond (or when the clock goes back), fresh random after.
The time's digits are made once per millisecond (``ids._last_prefix``): checked here
against the whole 130-bit value written out digit by digit."""

from __future__ import annotations

import itertools

import pytest

from ctxguard import ids

CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def ulid(ms: int, rand: int) -> str:
    value = (ms << 80) | rand
    return "".join(CROCKFORD[(value >> (5 * k)) & 31] for k in range(25, -1, -1))


def test_ids_are_the_ulid_of_time_and_random(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter([5_000, 5_000, 5_000, 4_999, 123_456_789_012, 123_456_789_013, (1 << 48) - 1])
    monkeypatch.setattr(ids.time, "time_ns", lambda: next(clock) * 1_000_000)
    randoms = itertools.count(0x1234_5678_9ABC_DEF0_1357 << 1, 2)  # >> 1: first, first + 1 ...
    monkeypatch.setattr(ids.os, "urandom", lambda n: (next(randoms)).to_bytes(n, "big"))
    monkeypatch.setattr(ids, "_last_ms", -1)
    first = 0x1234_5678_9ABC_DEF0_1357
    expected = [
        ulid(5_000, first),
        ulid(5_000, first + 1),
        ulid(5_000, first + 2),
        ulid(5_000, first + 3),  # the clock went back: same millisecond, still increasing
        ulid(123_456_789_012, first + 1),  # a new millisecond: fresh random bits
        ulid(123_456_789_013, first + 2),
        ulid((1 << 48) - 1, first + 3),
    ]
    got = [ids.new_message_id() for _ in expected]
    assert got == expected
    assert got == sorted(got)
    assert all(len(i) == 26 for i in got)
