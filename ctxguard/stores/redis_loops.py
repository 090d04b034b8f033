"""An async Redis store's connections belong to the event loop that opened them.

``redis.asyncio`` connections are asyncio streams: their reads wait on futures of the
loop that made them, and closing one schedules a callback on that loop. Shared by event
loops running at the same time in several threads, a store's connections were taken by
one loop while the other still had them (a hang in ``select()``, or "lost its connection
(RuntimeError inside redis-py)"); closed from a later ``asyncio.run``, ``aclose()`` raised
a bare ``RuntimeError: Event loop is closed``.

:class:`LoopBinding` is the store's answer, checked once per call (one identity check
of the running loop): the first loop to use the store owns it; a call from another
running loop while that one is running too is a :class:`~ctxguard.errors.ConfigError`,
raised before any connection is touched. Once the owning loop has closed, or stopped
(an ``asyncio.run`` that returned; the loop a thread keeps for ``run_sync`` between two
runs: no code of it runs, so none of it is using a connection), the next loop takes the
store over and the store opens a new client there (``asyncio.run`` after ``asyncio.run``
keeps working), after :func:`abandon` has dropped the old client's connections without
their loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from typing import Any

from ctxguard._validate import one_line
from ctxguard.errors import ConfigError


class LoopBinding:
    """Which event loop a store's connections belong to (None: not used yet)."""

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()  # two threads' loops may meet a store first at once

    def claim(self, where: str) -> bool:
        """Make the running loop the store's (call it when ``self.loop`` is not that loop).

        True when it takes over from a loop that has closed or stopped: the store's
        connections belong to that loop and must be replaced. Another loop that is
        running too is a ConfigError (nothing was sent)."""
        loop = asyncio.get_running_loop()
        with self._lock:
            first = self.loop
            if first is loop:
                return False
            if first is not None and first.is_running():  # (is_running: False once closed)
                raise ConfigError(
                    one_line(
                        "this async Redis store is in use by another event loop running in "
                        "another thread (its connections belong to that loop): open one "
                        "AsyncGuard or async store per event loop (as "
                        f"ctxguard.adapters._loops.PerLoop does) ({where})"
                    )
                )
            self.loop = loop
            return first is not None


def abandon(client: Any) -> None:
    """Drop ``client``'s connections without their loop (closed or stopped: nothing can
    be awaited on it): each socket is shut down, so the server sees the connection end,
    and forgotten by its connection; the file descriptor goes with the transport.
    What redis-py does not lay out as expected is left to the garbage collector."""
    for conn in _connections(client):
        writer = getattr(conn, "_writer", None)
        if writer is None:
            continue
        with contextlib.suppress(Exception):  # (best effort: the loop and maybe the peer are gone)
            sock = writer.transport.get_extra_info("socket")
            if sock is not None:
                sock.shutdown(socket.SHUT_RDWR)
            _close_on_closed_loop(writer.transport)
        conn._reader = conn._writer = None  # as redis-py's own disconnect leaves it
    manager = getattr(client, "nodes_manager", None)
    if manager is not None and hasattr(manager, "default_node"):
        manager.default_node = None  # closed: its finalizer has no "unclosed client" to log


def _close_on_closed_loop(transport: Any) -> None:
    """Close a transport whose loop has closed, and its socket, now.

    asyncio closes a socket in a callback of the transport's loop; a closed loop runs
    none (its ``call_soon`` raises), so each socket of an ``asyncio.run`` that returned
    stayed open until the garbage collector found its transport (a file descriptor per
    connection per run meanwhile, and under ``python -X dev`` a ResourceWarning for the
    socket, the transport and the stream: "unclosed transport", "loop is closed"). Marked
    closing here, the stream and transport have nothing to warn about. A TLS transport's
    socket is its inner transport's. A loop only stopped may run again and close them
    itself: they are left to it.
    """
    loop = getattr(transport, "_loop", None)
    if loop is None or not loop.is_closed():
        return
    with contextlib.suppress(RuntimeError):  # (its close asks the closed loop to call back)
        transport.close()
    raw = getattr(transport, "_sock", None)
    if isinstance(raw, socket.socket) and transport.is_closing():
        transport._sock = None  # what asyncio's own callback would have done
        raw.close()
    inner = getattr(getattr(transport, "_ssl_protocol", None), "_transport", None)
    if inner is not None and inner is not transport:
        _close_on_closed_loop(inner)


def _connections(client: Any) -> list[Any]:
    manager = getattr(client, "nodes_manager", None)
    if manager is not None:  # a cluster: each node holds its own connections
        nodes = [
            node
            for name in ("nodes_cache", "startup_nodes")
            for node in (getattr(manager, name, None) or {}).values()
        ]
        return [c for node in nodes for c in getattr(node, "_connections", ())]
    pool = getattr(client, "connection_pool", None)
    idle = getattr(pool, "_available_connections", None)
    busy = getattr(pool, "_in_use_connections", None)
    if not isinstance(idle, list) or not isinstance(busy, set):
        return []
    return [*idle, *busy]
