"""The counts an observer takes from a server's ``usage``, as ``Guard.complete`` takes them.

``Guard.complete`` refuses a ``prompt_tokens`` / ``completion_tokens`` that is not an int
from 0 to 2**63-1 (``True`` too: a bool is no count), and the gateway drops such a usage
(``serve.gateway.usable_usage``); the other counts (``total_tokens``,
``prompt_tokens_details.cached_tokens``) reach the observers as the server sent them. An
observer takes a count under the same rule, and a count past it (``10**30``, ``True``,
``-1``, ``"12"``) is left out with a WARNING on the ``ctxguard.observe`` logger (at most
one per observer and field each :data:`LOG_EVERY` seconds): it was a prefix-cache counter
of 1e30, a ``True`` counted as one token, 10**400 an ``OverflowError`` inside
prometheus_client, and a tenant charged (or counting as uncharged) 10**30 tokens.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Mapping
from typing import Any

from ctxguard._validate import MAX_INT, show

LOG_EVERY = 60.0  # seconds between two warnings of one observer about one field
log = logging.getLogger("ctxguard.observe")


class UsageCounts:
    """Reads the counts of each event's usage for one observer (``who`` names it)."""

    def __init__(self, who: str) -> None:
        self.who = who
        self._next_log: dict[str, float] = {}
        self._lock = threading.Lock()
        self._clock = time.monotonic

    def count(self, usage: Mapping[str, Any], key: str) -> int | None:
        """``usage[key]`` (``"a.b"``: ``usage["a"]["b"]``) when it is a count a server
        can report (an int from 0 to 2**63-1), else None; a value there that is no such
        count is logged."""
        value: Any = usage
        for part in key.split("."):
            value = value.get(part) if isinstance(value, Mapping) else None
        if value is None:
            return None
        if type(value) is int and 0 <= value <= MAX_INT:
            return value
        self.leave_out(key, value)
        return None

    def leave_out(self, key: str, value: object, why: str = "") -> None:
        """Log (at most once each LOG_EVERY seconds per field) that ``usage[key]`` is
        left out."""
        now = self._clock()
        with self._lock:
            if now < self._next_log.get(key, -math.inf):
                return
            self._next_log[key] = now + LOG_EVERY
        log.warning(
            "%s left out the server's usage %s = %s: %s (said at most once a minute)",
            self.who,
            key,
            show(value),
            why or "a count is an int from 0 to 2**63-1",
        )
