"""Each request's prefix-cache estimate for its audit record (``reused`` / ``prefilled``).

Opt-in (``GuardConfig(prefix_block_size=16)``): it costs a turn the block hashes
of the sent window and the encoding of its messages not seen in the previous request
(tiktoken rule, memo kept per session) or one render (``hf:``); see benchmarks/README.md.
The guard keeps, per session and in this process only, what the next estimate needs
from the previous request (an LRU of ``window_cache_size`` sessions, 1,024 when that
cache is off, and 16 MiB): the chained hashes of its full blocks (8 bytes each, as
:func:`ctxguard.kv.prefix.block_hashes`) and its last partial block, extended by the
reply's ids at ``complete``, and its messages' ids (4 bytes a token, the encoding
memo). The next request reuses the longest run of its leading blocks found there,
capped so its last token is recomputed (rules 2 to 6 of :mod:`ctxguard.kv.prefix`).

What it does not know, it leaves out: the first request of a session in this
process, a counter without token ids, a request after another process wrote to
the session (its request is not seen). It models one request back: the server may
still hold older blocks, which a window never returns to except after a
retraction. Eviction is not modelled (a busy server may have evicted more).
Nothing here does I/O.
"""

from __future__ import annotations

import threading
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from ctxguard.kv.prefix import _SEED
from ctxguard.messages import Message
from ctxguard.tokens._protocol import TokenCounter, Tools
from ctxguard.tokens.prompt_ids import Memo, prompt_ids, reply_ids

MAX_BYTES = 16 << 20  # all sessions' block hashes together


@dataclass(frozen=True, slots=True)
class Chain:
    """A request's cacheable tokens: full-block hashes, then the partial tail's ids."""

    hashes: array[int]
    tail: tuple[int, ...]

    @property
    def weight(self) -> int:
        return 8 * len(self.hashes) + 8 * len(self.tail) + 100


@dataclass(frozen=True, slots=True)
class Kept:
    """A session's previous request: its chain, and its messages' ids (see ``prompt_ids``)."""

    chain: Chain
    memo: Memo

    @property
    def weight(self) -> int:
        return self.chain.weight + sum([120 + 4 * len(ids) for _, ids in self.memo.values()])


def chain(ids: Sequence[int], block_size: int, start: Chain | None = None) -> Chain:
    """``start`` extended by ``ids`` (a fresh chain without ``start``)."""
    hashes = array("q", start.hashes if start else ())
    pending = [*(start.tail if start else ()), *ids]
    parent = hashes[-1] if hashes else _SEED
    full = len(pending) - len(pending) % block_size
    for at in range(0, full, block_size):
        parent = hash((parent, tuple(pending[at : at + block_size])))
        hashes.append(parent)
    return Chain(hashes, tuple(pending[full:]))


def reused_tokens(previous: Chain, prompt: Chain, length: int, block_size: int) -> int:
    """Tokens of ``prompt`` (``length`` long) served from ``previous``'s blocks."""
    cap = (length - 1) // block_size
    hit = 0
    for a, b in zip(previous.hashes, prompt.hashes[:cap], strict=False):
        if a != b:
            break
        hit += 1
    return hit * block_size


class PrefixEstimates:
    """The per-session chains, an LRU bounded by sessions and bytes (thread-safe)."""

    def __init__(self, block_size: int | None, capacity: int, max_bytes: int = MAX_BYTES) -> None:
        self.block_size = block_size
        self.capacity = capacity
        self.max_bytes = max_bytes
        self.bytes = 0
        self._kept: OrderedDict[str, Kept] = OrderedDict()
        self._candidates: dict[str, tuple[str, Kept]] = {}  # session -> (rid, request)
        self._lock = threading.Lock()

    def estimate(
        self,
        session_id: str,
        rid: str,
        counter: TokenCounter,
        messages: Sequence[Message],
        tools: Tools | None,
    ) -> tuple[int, int] | None:
        """(reused, prefilled) for a request about to be recorded under ``rid``; None if
        unknown. Its chain becomes the session's once :meth:`committed` says so."""
        size = self.block_size
        if size is None or self.capacity <= 0:
            return None
        with self._lock:
            previous = self._kept.get(session_id)
        memo = dict(previous.memo) if previous is not None else {}
        ids = prompt_ids(counter, messages, tools, memo)
        if not ids:
            return None
        made = chain(ids, size)
        with self._lock:
            self._candidates.pop(session_id, None)
            self._candidates[session_id] = (rid, Kept(made, memo))
            while len(self._candidates) > self.capacity:  # prepares that never committed
                del self._candidates[next(iter(self._candidates))]
        if previous is None:
            return None
        reused = reused_tokens(previous.chain, made, len(ids), size)
        return reused, len(ids) - reused

    def committed(self, session_id: str, rid: object) -> None:
        """The request recorded under ``rid`` was stored: it is the session's previous now."""
        with self._lock:
            candidate = self._candidates.pop(session_id, None)
            if candidate is None or candidate[0] != rid:
                self._drop(session_id)  # not the request estimated last: unknown
                return
            self._put(session_id, candidate[1])

    def replied(self, session_id: str, counter: TokenCounter, text: str) -> None:
        """The reply to the session's previous request, as generated, extends its chain."""
        size = self.block_size
        if size is None:
            return
        with self._lock:
            previous = self._kept.get(session_id)
        if previous is None:
            return
        ids = reply_ids(counter, text)
        if ids is None:
            return
        extended = chain(ids[:-1], size, previous.chain)  # the last sampled token: never fed back
        with self._lock:
            if self._kept.get(session_id) is previous:
                self._put(session_id, Kept(extended, previous.memo))

    def forget(self, session_id: str) -> None:
        with self._lock:
            self._candidates.pop(session_id, None)
            self._drop(session_id)

    def _put(self, session_id: str, made: Kept) -> None:
        self._drop(session_id)
        if made.weight > self.max_bytes:
            return
        self._kept[session_id] = made
        self.bytes += made.weight
        while len(self._kept) > self.capacity or self.bytes > self.max_bytes:
            self.bytes -= self._kept.popitem(last=False)[1].weight

    def _drop(self, session_id: str) -> None:
        old = self._kept.pop(session_id, None)
        if old is not None:
            self.bytes -= old.weight

    def __len__(self) -> int:
        return len(self._kept)
