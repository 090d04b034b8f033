"""A window fetch on Redis as plain reads in one MULTI/EXEC (sans-I/O).

``window.lua`` in fetch mode walks the counts in Lua, copies the window's records
into Lua tables and hands them back: every record crosses Lua twice, the most
expensive script call of a turn. This reads the same keys with plain commands in
one transaction (one round trip, one consistent snapshot: every key shares the
session's hash tag, so it runs on Redis Cluster too) and walks on the client with
:func:`~ctxguard.stores.walk.walk_back`, exactly as the script does; the answer is
composed by the very reply parser of the script (``RedisProtocol.parse_window``).

What the script would answer differently is never guessed here: a session that
is not exactly as ctxguard writes it (a key of another type, a meta field or a
count or a pinned position that is not an integer, a pin outside the history,
one count per record broken, a number too large for Lua's doubles), and a new message
whose id is stored (the script compares the two messages: ``_reuse.lua``), makes the
read answer :data:`SCRIPT`, and the store asks the script, whose answer (or
``CORRUPT <key>`` error) is the reference. A read whose rows did not cover the
budget (or a pinned message older than them) answers :class:`ReadMore`: one more
transaction, sized from what this one saw, and then the script.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import hiredis

from ctxguard.stores.contract import NewMessage, WindowFetch, WindowHit, WriteOptions
from ctxguard.stores.records import STORED_INTEGER
from ctxguard.stores.walk import check_window_args, estimate_unknown_tokens, walk_back

if TYPE_CHECKING:
    from ctxguard.stores.redis_protocol import RedisProtocol
# the meta fields window.lua's fetch reads and returns, in _lib.lua's META_FIELDS order
META_FIELDS: Final = (
    b"created",
    b"updated",
    b"count",
    b"tokens",
    b"sumver",
    b"turns",
    b"ver",
    b"counter",
    b"epoch",
    b"stamp",
    b"ctx",
)
_INTEGER_FIELDS: Final = frozenset(
    {b"created", b"updated", b"count", b"tokens", b"sumver", b"turns", b"ver"}
)
# _lib.lua's is_integer (records.STORED_INTEGER), one value or a comma-joined run of them
_INTEGER: Final = re.compile(STORED_INTEGER.encode())
_INTEGERS: Final = re.compile(f"{STORED_INTEGER}(?:,{STORED_INTEGER})*".encode())
FIRST_ROWS: Final = 64  # the newest records a read takes before it has seen a window
MAX_ROWS: Final = 100_000  # beyond this a window is the script's to walk
ROUNDS: Final = 2  # transactions before the script


Commands = list[tuple[Any, ...]]


class _Script:
    """The answer "ask window.lua": the session is not as ctxguard writes it, or the
    reads did not cover the window twice (a singleton, :data:`SCRIPT`)."""

    __slots__ = ()


SCRIPT: Final = _Script()


@dataclass(frozen=True, slots=True)
class ReadMore:
    """The rows read did not cover the window: read again, these many, and these
    positions (pinned messages older than the rows)."""

    rows: int
    heads: tuple[int, ...]


@dataclass(slots=True)
class RowsHint:
    """How many of the newest records the first read takes: the budget over the tokens
    per message of the windows seen so far (one running average per store), with
    margin. Racy by design (a float another thread may overwrite): only a size."""

    per_row: float = 0.0

    def rows(self, budget: int, min_messages: int) -> int:
        if self.per_row <= 0:
            return max(FIRST_ROWS, min_messages + 8)
        wanted = math.ceil(budget / self.per_row * 1.3) + 8
        return min(MAX_ROWS, max(wanted, min_messages + 8, 16))

    def saw(self, tokens: int, messages: int) -> None:
        if messages >= 4:  # a window of a few messages says little about the next one
            seen = max(1.0, tokens / messages)
            self.per_row = seen if self.per_row <= 0 else 0.8 * self.per_row + 0.2 * seen


def read_commands(
    keys: Sequence[str], new: Sequence[NewMessage], rows: int, heads: Sequence[int] = (0,)
) -> list[tuple[Any, ...]]:
    """The reads of one fetch, to send between MULTI and EXEC (see :func:`parse_reads`)."""
    meta, msgs, toks, ids, pins, summary = keys[0], keys[1], keys[2], keys[3], keys[4], keys[5]
    commands: list[tuple[Any, ...]] = [
        ("HMGET", meta, *META_FIELDS),
        ("LLEN", msgs),
        ("LLEN", toks),
        ("LRANGE", toks, -rows, -1),
        ("LRANGE", msgs, -rows, -1),
        ("LRANGE", pins, 0, -1),
        ("GET", summary),
        ("TTL", meta),
    ]
    for seq in heads:
        commands += [("LINDEX", msgs, seq), ("LINDEX", toks, seq)]
    if new:
        commands.append(("HMGET", ids, *[n.message.id for n in new]))
    return commands


def pack_reads(commands: Commands) -> list[bytes]:
    """MULTI, the commands, EXEC as one RESP buffer (hiredis packs each command:
    redis-py's asyncio packer would encode every argument in Python, ~3 us a command);
    one buffer, so that the sync send is one ``sendall``, not one per command."""
    return [b"".join([_MULTI, *[hiredis.pack_command(c) for c in commands], _EXEC])]


def _resp(command: tuple[Any, ...]) -> bytes:
    out = [b"*%d\r\n" % len(command)]
    for arg in command:
        data = arg if isinstance(arg, bytes) else str(arg).encode()
        out.append(b"$%d\r\n%b\r\n" % (len(data), data))
    return b"".join(out)


_MULTI: Final = _resp(("MULTI",))
_EXEC: Final = _resp(("EXEC",))


def _integer(value: Any) -> int | None:
    """A stored integer as _lib.lua's is_integer accepts it (bytes or str), else None."""
    if isinstance(value, str):
        value = value.encode()
    if isinstance(value, bytes) and _INTEGER.fullmatch(value):
        return int(value)
    return None


def _text(value: Any) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


def parse_reads(
    new: Sequence[NewMessage],
    replies: Sequence[Any],
    budget: int,
    options: WriteOptions,
    min_messages: int,
    rows: int,
    heads: Sequence[int] = (0,),
) -> list[Any] | ReadMore | _Script:
    """The reply ``window.lua`` would give a fetch with these arguments, from the
    transaction's ``replies`` (one per :func:`read_commands` command); or
    :class:`ReadMore` / :data:`SCRIPT` (see the module's docstring)."""
    if replies is None or any(isinstance(r, Exception) for r in replies):
        return SCRIPT  # a key of another type (WRONGTYPE): the script names it
    meta_values, length_m, length_t, toks, recs, pins_raw, summary, ttl = replies[:8]
    meta: dict[bytes, bytes] = {}
    numbers: list[bytes] = []
    for name, value in zip(META_FIELDS, meta_values, strict=True):
        if value is None:
            continue
        if type(value) is not bytes:
            value = _text(value)
        if name in _INTEGER_FIELDS:
            numbers.append(value)
        meta[name] = value
    if numbers:  # one match for every integer field (a comma inside one is no integer)
        joined = b",".join(numbers)
        if joined.count(b",") != len(numbers) - 1 or not _INTEGERS.fullmatch(joined):
            return SCRIPT  # CORRUPT meta field <name> is not an integer
    if b"created" in meta and b"epoch" not in meta:
        return SCRIPT  # CORRUPT meta field epoch is missing
    stored = int(length_m)
    counter = options.counter or ""
    same_counter = counter == "" or meta.get(b"counter") == counter.encode()
    if int(length_t) != stored or len(recs) != len(toks) or len(recs) > stored:
        return SCRIPT  # not one count per record: the script walks what it finds
    try:  # one regex over the joined counts: what ctxguard writes is '-1' or digits
        if toks and not _INTEGERS.fullmatch(b",".join(toks)):
            return SCRIPT
    except TypeError:
        return SCRIPT
    counts = [int(c) for c in toks] if same_counter else [-1] * len(toks)
    pins: list[int] = []
    for raw in pins_raw:
        seq = _integer(raw)
        if seq is None or not 0 <= seq < stored:
            return SCRIPT  # CORRUPT pins holds a position that is not one of the messages
        pins.append(seq)
    head_replies = replies[8 : 8 + 2 * len(heads)]
    flags: list[int] = []
    if new:
        seen: set[str] = set()
        for n, known in zip(new, replies[8 + 2 * len(heads)], strict=True):
            if known is not None:
                return SCRIPT  # a stored id: the script compares the messages (_reuse.lua)
            flags.append(1 if n.message.id not in seen else 0)
            seen.add(n.message.id)
        cap = options.max_messages or 0
        if cap > 0 and stored + sum(flags) > cap:
            return [[-1, stored]]  # window.lua's answer past the cap (SessionFullError)
    fresh = [n for n, f in zip(new, flags, strict=True) if f]
    lo = stored - len(recs)  # the first position read

    def new_count(n: NewMessage) -> int:
        return -1 if not counter or n.tokens is None else int(n.tokens)

    def costs() -> Iterator[tuple[int, int]]:
        for j in range(len(fresh) - 1, -1, -1):
            c = new_count(fresh[j])
            size = len(fresh[j].encoded().encode())
            yield stored + j, c if c >= 0 else estimate_unknown_tokens(size)
        estimate = estimate_unknown_tokens
        row_costs = [c if c >= 0 else estimate(len(r)) for c, r in zip(counts, recs, strict=True)]
        yield from zip(range(stored - 1, lo - 1, -1), reversed(row_costs), strict=True)

    length = stored + len(fresh)
    first, stopped = walk_back(costs(), length, budget, min_messages)
    if not stopped and lo > 0:
        return _more(rows, stored, pins)
    stop_count = -1
    if stopped:
        at = first - 1
        stop_count = new_count(fresh[at - stored]) if at >= stored else counts[at - lo]
    head_at = {seq: i for i, seq in enumerate(heads)}
    p_seqs: list[int] = []
    p_recs: list[Any] = []
    p_counts: list[int] = []
    for seq in pins:
        if seq >= first:
            continue
        if seq >= lo:
            record, count = recs[seq - lo], counts[seq - lo]
        elif seq in head_at:
            record, raw = head_replies[2 * head_at[seq]], head_replies[2 * head_at[seq] + 1]
            value = _integer(raw)
            if record is None or value is None:
                return SCRIPT
            count = value if same_counter else -1
        else:
            return _more(rows, stored, pins)
        p_seqs.append(seq)
        p_recs.append(record)
        p_counts.append(count)
    r_out = list(recs[first - lo :]) if first < stored else []
    c_out = counts[first - lo :] if first < stored else []
    flat: list[bytes] = [x for name, value in meta.items() for x in (name, value)]
    token = b""
    if b"epoch" in meta:
        token = b":".join([meta[b"epoch"], meta.get(b"ver", b"0"), meta.get(b"stamp", b"")])
    return [
        flags,
        flat,
        summary,
        first,
        r_out,
        c_out,
        p_seqs,
        p_recs,
        p_counts,
        int(ttl),
        token,
        stop_count,
        stored,
    ]


def _more(rows: int, stored: int, pins: Sequence[int]) -> ReadMore:
    """A second read: twice the rows at least, and the pinned positions below them."""
    wanted = min(stored, max(2 * rows, rows + 64))
    start = stored - wanted
    return ReadMore(wanted, tuple(sorted({s for s in pins if s < start})) or (0,))


def learned(hint: RowsHint, fetch: WindowFetch | WindowHit) -> None:
    """Let the hint see the window just fetched (its stored counts, where known)."""
    if isinstance(fetch, WindowFetch):
        known = [m.tokens for m in fetch.recent if m.tokens is not None]
        if known:
            hint.saw(sum(known), len(known))


def fetch_flow(
    protocol: RedisProtocol,
    hint: RowsHint,
    session_id: str,
    budget: int,
    options: WriteOptions,
    new: Sequence[NewMessage],
    min_messages: int,
) -> Generator[Commands, Sequence[Any], WindowFetch | None]:
    """A fetch as transactions: yields the commands of one MULTI/EXEC, is sent their
    replies; returns the fetch, or None when the script must answer (see SCRIPT)."""
    check_window_args(budget, min_messages)
    keys = protocol.keys(session_id)
    rows = hint.rows(budget, min_messages)
    heads: tuple[int, ...] = (0,)
    for _ in range(ROUNDS):
        replies = yield read_commands(keys, new, rows, heads)
        shaped = parse_reads(new, replies, budget, options, min_messages, rows, heads)
        if isinstance(shaped, _Script):
            return None
        if isinstance(shaped, ReadMore):
            rows, heads = shaped.rows, shaped.heads
            continue
        fetch = protocol.parse_window(session_id, new, shaped, options)
        if not isinstance(fetch, WindowFetch):
            return None  # not a reply a fetch gets: the script's own answer decides
        learned(hint, fetch)
        return fetch
    return None


def run_flow(
    flow: Generator[Commands, Sequence[Any], WindowFetch | None],
    send: Callable[[Commands], Sequence[Any]],
) -> WindowFetch | None:
    """Run :func:`fetch_flow` with a blocking ``send`` (the async store awaits in place)."""
    try:
        commands = next(flow)
        while True:
            commands = flow.send(send(commands))
    except StopIteration as done:
        result: WindowFetch | None = done.value
        return result


__all__ = [
    "META_FIELDS",
    "ROUNDS",
    "SCRIPT",
    "Commands",
    "ReadMore",
    "RowsHint",
    "fetch_flow",
    "learned",
    "pack_reads",
    "parse_reads",
    "read_commands",
    "run_flow",
]
