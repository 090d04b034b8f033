"""What a turn costs Redis: round trips, top-level commands, INFO commandstats deltas.

:class:`RoundTrips` wraps redis-py's ``send_packed_command`` (sync and asyncio) and
``AsyncRedisStore``'s own send (``redis_clients.asend``, which writes on the transport
itself): one call is one packet sent, i.e. one round trip (a pipeline is one). While active it
keeps a reference to each packet; the command names in it are parsed after the
turn, outside the timed region.

:func:`commandstats` reads ``INFO commandstats`` (calls and usec per command).
Redis counts the commands a Lua script runs (calls and usec) under their own names
*and* inside the EVALSHA's usec, so summing usec over every command would count
script work twice. The server time of a turn is therefore the usec of the commands
the client itself sent (EVALSHA, RPUSH, ...): :class:`TurnCost` takes the names from
the packets, and everything else in the delta is work done inside scripts. (If a
client sent a command by name that its scripts also run, the script's share would be
counted twice: ctxguard's cold rows do since their fetch is plain reads (HMGET, LLEN,
LRANGE, GET, TTL, LINDEX) and the commit script runs HMGET, LLEN and LRANGE too, so
their server time is a little high; ``bench_server_instr.py`` has no such overlap.)
"""

from __future__ import annotations

import contextvars
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

# commands whose commandstats name carries the subcommand (``config|resetstat``)
CONTAINERS = frozenset(
    {"client", "config", "script", "memory", "object", "cluster", "command", "function"}
    | {"xinfo", "acl", "slowlog", "latency", "module", "pubsub"}
)


_IN_ASEND: contextvars.ContextVar[bool] = contextvars.ContextVar("in_asend", default=False)


class RoundTrips:
    """Counts packets sent to Redis (one per command, one per pipeline) while active."""

    def __init__(self) -> None:
        self.packets: list[Any] = []
        self.active = False
        self._patched: list[tuple[Any, str, Any]] = []

    def install(self) -> None:
        import redis.asyncio.connection as aconn
        import redis.connection as conn

        import ctxguard.stores.redis_async as redis_async

        meter = self
        sync_orig = conn.AbstractConnection.send_packed_command
        async_orig = aconn.AbstractConnection.send_packed_command
        asend_orig = getattr(redis_async, "asend", None)  # AsyncRedisStore's own send

        def sync_send(self: Any, command: Any, check_health: bool = True) -> Any:
            if meter.active:
                meter.packets.append(command)
            return sync_orig(self, command, check_health)

        async def async_send(self: Any, command: Any, check_health: bool = True) -> Any:
            if meter.active and not _IN_ASEND.get():
                meter.packets.append(command)
            return await async_orig(self, command, check_health)

        async def asend(connection: Any, packed: Any) -> None:
            token = _IN_ASEND.set(True)  # (it may finish through send_packed_command)
            try:
                if meter.active:
                    meter.packets.append(packed)
                await asend_orig(connection, packed)  # type: ignore[misc]
            finally:
                _IN_ASEND.reset(token)

        conn.AbstractConnection.send_packed_command = sync_send  # type: ignore[method-assign]
        aconn.AbstractConnection.send_packed_command = async_send  # type: ignore[method-assign]
        self._patched = [
            (conn.AbstractConnection, "send_packed_command", sync_orig),
            (aconn.AbstractConnection, "send_packed_command", async_orig),
        ]
        if asend_orig is not None:
            redis_async.asend = asend  # type: ignore[attr-defined]
            self._patched.append((redis_async, "asend", asend_orig))

    def uninstall(self) -> None:
        for owner, name, orig in self._patched:
            setattr(owner, name, orig)
        self._patched = []

    def take(self) -> list[Any]:
        """The packets sent since the last take."""
        packets, self.packets = self.packets, []
        return packets


def command_names(packet: Any) -> list[str]:
    """The commands (commandstats names) in one packed packet of RESP arrays."""
    if isinstance(packet, str):
        data = packet.encode()
    elif isinstance(packet, bytes | bytearray | memoryview):
        data = bytes(packet)
    else:
        data = b"".join(packet)
    names: list[str] = []
    pos = 0
    while pos < len(data):
        if data[pos : pos + 1] != b"*":
            raise ValueError(f"not a RESP array at byte {pos}")
        end = data.index(b"\r\n", pos)
        count = int(data[pos + 1 : end])
        pos = end + 2
        head: list[bytes] = []
        for i in range(count):
            end = data.index(b"\r\n", pos)
            length = int(data[pos + 1 : end])
            pos = end + 2
            if i < 2:
                head.append(data[pos : pos + length])
            pos += length + 2
        name = head[0].decode().lower()
        if name in CONTAINERS and len(head) > 1:
            name = f"{name}|{head[1].decode().lower()}"
        names.append(name)
    return names


def commandstats(client: Any) -> dict[str, tuple[int, int]]:
    """(calls, usec) per command, INFO itself left out."""
    return {
        k.removeprefix("cmdstat_"): (int(v["calls"]), int(v["usec"]))
        for k, v in client.info("commandstats").items()
        if k != "cmdstat_info"
    }


@dataclass
class TurnCost:
    """Redis cost of a series of turns of one (system, size)."""

    turns: int = 0
    round_trips: int = 0
    server_us: list[int] = field(default_factory=list)  # per turn: top-level usec
    script_us: int = 0  # usec of commands run inside scripts (part of server_us)
    calls: Counter[str] = field(default_factory=Counter)  # every command, scripts' included
    sent: Counter[str] = field(default_factory=Counter)  # what the client sent

    def add(
        self,
        packets: list[Any],
        before: dict[str, tuple[int, int]],
        after: dict[str, tuple[int, int]],
    ) -> None:
        names = [n for p in packets for n in command_names(p)]
        top = set(names)
        server = 0
        for command, (calls, usec) in after.items():
            c0, u0 = before.get(command, (0, 0))
            if calls == c0:
                continue
            self.calls[command] += calls - c0
            if command in top:
                server += usec - u0
            else:
                self.script_us += usec - u0
        self.turns += 1
        self.round_trips += len(packets)
        self.server_us.append(server)
        self.sent.update(names)

    def summary(self) -> dict[str, Any]:
        n = max(1, self.turns)
        server = sorted(self.server_us)
        return {
            "turns": self.turns,
            "round_trips_per_turn": self.round_trips / n,
            "commands_per_turn": sum(self.calls.values()) / n,
            "sent_per_turn": sum(self.sent.values()) / n,
            "server_us_per_turn": sum(server) / n,
            "server_us_p50": server[len(server) // 2] if server else 0,
            "script_inner_us_per_turn": self.script_us / n,
            "calls_per_turn": {c: v / n for c, v in sorted(self.calls.items())},
            "sent_commands_per_turn": {c: v / n for c, v in sorted(self.sent.items())},
        }
