"""Leases: one holder at a time runs the work named ``name`` in a session.

A lease is a holder token with a time to live. ``acquire`` takes a free (or expired)
lease, or renews the caller's own; ``release`` gives it back only if the caller still
holds it. A holder that dies stops renewing and its lease expires, so another can take
over. The gateway holds one per ``Idempotency-Key`` in flight, so a retry that lands on
another worker or gateway process waits for the first request instead of calling the
model again.

On Redis a lease is one key beside the session's (``KeySpace.lease_key``: same hash
slot, so one script call runs on a cluster) handled by ``lua/lease.lua``; both
operations are safe to repeat after a lost reply. Its name is also kept in the session's
``leases`` SET (``KeySpace.lease_names_key``) so ``delete`` (``lua/delete.lua``) removes
the session's leases in the same step as its keys: a key SCAN would be neither atomic nor
one slot's work, and the names are the client's (Idempotency-Keys), so no fixed pattern
derives them. ``memory://`` keeps them in the
store's process (:class:`MemoryLeases`).
"""

from __future__ import annotations

import math
import threading
import time
from typing import TYPE_CHECKING

from ctxguard._validate import MAX_SECONDS, show
from ctxguard.errors import ConfigError
from ctxguard.ids import validate_id
from ctxguard.stores.keys import KeySpace

if TYPE_CHECKING:
    from ctxguard.stores.redis_protocol import Call

MAX_HOLDER = 128


def check_lease(holder: str, seconds: float | None = None, *, acquire: bool = False) -> None:
    """A holder token is a non-empty string; a lease lasts a positive finite time (an
    acquire must say how long: None would be a release in :func:`lease_call`)."""
    if not isinstance(holder, str) or not 0 < len(holder) <= MAX_HOLDER:
        raise ConfigError(f"a lease holder is a string of 1 to {MAX_HOLDER} characters")
    if (seconds is not None or acquire) and (
        isinstance(seconds, bool)
        or not isinstance(seconds, int | float)
        or not math.isfinite(seconds)
        or not 0.001 <= seconds <= MAX_SECONDS
    ):
        raise ConfigError(
            f"a lease lasts from 0.001 to {MAX_SECONDS:,} seconds, got {show(seconds)}"
        )


def lease_call(
    keyspace: KeySpace, session_id: str, name: str, holder: str, seconds: float | None
) -> Call:
    """The ``lease.lua`` call: acquire (or renew) for ``seconds``, or release if None."""
    from ctxguard.stores.redis_protocol import Call

    check_lease(holder, seconds)
    key = keyspace.lease_key(session_id, name)
    keys = [key, keyspace.lease_names_key(session_id)]
    named = key.rpartition(":lease:")[2]
    if seconds is None:
        return Call("lease", keys, ["release", holder, 0, named])
    return Call("lease", keys, ["acquire", holder, max(1, round(seconds * 1000)), named])


class MemoryLeases:
    """The same in one process (``memory://``), on the monotonic clock."""

    def __init__(self) -> None:
        self._held: dict[tuple[str, str], tuple[str, float]] = {}
        self._lock = threading.Lock()

    def acquire(self, session_id: str, name: str, holder: str, seconds: float) -> bool:
        validate_id(session_id, "session id")
        validate_id(name, "lease name")
        check_lease(holder, seconds, acquire=True)
        now = time.monotonic()
        with self._lock:
            for key in [k for k, (_, until) in self._held.items() if until <= now]:
                del self._held[key]
            current = self._held.get((session_id, name))
            if current is not None and current[0] != holder:
                return False
            self._held[(session_id, name)] = (holder, now + seconds)
            return True

    def release(self, session_id: str, name: str, holder: str) -> bool:
        validate_id(session_id, "session id")
        validate_id(name, "lease name")
        check_lease(holder)
        with self._lock:
            current = self._held.get((session_id, name))
            if current is None or current[0] != holder or current[1] <= time.monotonic():
                return False
            del self._held[(session_id, name)]
            return True

    def drop(self, session_id: str) -> None:
        """Forget every lease of the session (its ``delete``)."""
        with self._lock:
            for key in [k for k in self._held if k[0] == session_id]:
                del self._held[key]
