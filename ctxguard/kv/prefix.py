"""A model of vLLM's automatic prefix caching: which prompt tokens a request reuses.

Pure and deterministic: feed it the token ids of one session's requests in order
(optionally each reply's ids as the server generated them) and it answers, per
request, how many prompt tokens came from the cache and how many were prefilled.
It models one session alone on the server (other traffic would only evict more).

The rules, as vLLM's V1 engine applies them (``vllm/v1/core/kv_cache_manager.py``
``get_computed_blocks``, ``kv_cache_utils.py`` ``hash_block_tokens`` /
``FreeKVCacheBlockQueue``, ``block_pool.py`` ``get_new_blocks`` / ``free_blocks`` /
``cache_full_blocks``; see also /work/shared/facts/prefix-cache.md):

1. **Paged blocks.** The KV cache is a pool of ``capacity`` blocks of ``block_size``
   tokens (16 by default on GPUs). A sequence of ``n`` tokens occupies
   ``ceil(n / block_size)`` blocks.
2. **Full blocks only.** Only a full block gets a hash; a partial last block is
   never reused (``hash_request_tokens`` stops at the last full block).
3. **Hash chain from the first block.** A block's hash covers the hash of the
   block before it and its own token ids (the first block chains from a fixed
   seed), so a block is reusable only if every block before it is identical
   too. Extra keys (LoRA, multimodal hashes, ``cache_salt``) are not modelled:
   one session, one model. Hash collisions are ignored (vLLM's builtin-hash mode
   ignores them too).
4. **Longest leading hit.** A request reuses the longest run of leading full
   blocks whose hashes are cached (``find_longest_cache_hit``).
5. **The last prompt token is recomputed.** The hit is capped at
   ``prompt_length - 1`` tokens (``max_cache_hit_length = request.num_tokens - 1``)
   and kept block-aligned, so a prompt that ends exactly on a block boundary
   recomputes its whole last block even when it is cached.
6. **Outputs are cached too.** Reply tokens fill blocks; a block becomes cached
   once full of computed tokens. The last sampled token is never fed back (its
   KV is never computed), so the cacheable sequence is ``prompt + reply[:-1]``.
   The next prompt reuses those blocks only if the template renders the reply
   to the same ids.
7. **LRU eviction of unused blocks.** A finished request's blocks stay cached
   with reference count 0 in a free queue; a freed request appends its blocks in
   reverse order (tail first), so its tail is evicted before its head. New
   blocks are taken from the head of that queue (never-used blocks first, as
   they start there), evicting the cached hash they held. A cached block that
   a new request hits leaves the queue while in use.

A block whose hash is already cached (the block recomputed by rule 5) is kept
uncached, as vLLM keeps the first copy for lookups.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ctxguard._validate import show
from ctxguard.errors import InvalidInputError

DEFAULT_BLOCK_SIZE = 16
_SEED = 0x5EED


@dataclass(frozen=True, slots=True)
class PrefixUse:
    """One request's prompt: its length, the tokens served from cache, the tokens prefilled."""

    tokens: int
    reused: int
    prefilled: int


def block_hashes(ids: Sequence[int], block_size: int) -> list[int]:
    """The chained hash of every full block of ``ids`` (rules 2 and 3)."""
    out: list[int] = []
    parent = _SEED
    for start in range(0, len(ids) - block_size + 1, block_size):
        parent = hash((parent, tuple(ids[start : start + block_size])))
        out.append(parent)
    return out


class PrefixCache:
    """One server's block pool as one session's requests see it (see the module rules)."""

    def __init__(self, block_size: int = DEFAULT_BLOCK_SIZE, capacity: int | None = None) -> None:
        if not isinstance(block_size, int) or isinstance(block_size, bool) or block_size < 1:
            raise InvalidInputError(f"block_size must be a positive int, got {show(block_size)}")
        if capacity is not None and (
            not isinstance(capacity, int) or isinstance(capacity, bool) or capacity < 1
        ):
            what = show(capacity)
            raise InvalidInputError(f"capacity must be a positive int or None, got {what}")
        self.block_size = block_size
        self.capacity = capacity
        self._slot_of: dict[int, int] = {}  # cached hash -> block slot
        self._hash_in: dict[int, int] = {}  # block slot -> the cached hash it holds
        self._free: OrderedDict[int, None] = OrderedDict()  # LRU first
        self._next_slot = 0  # slots never used yet (they sit at the queue head)

    @property
    def cached_blocks(self) -> int:
        return len(self._slot_of)

    def request(self, prompt: Sequence[int], reply: Sequence[int] = ()) -> PrefixUse:
        """Run one request through the cache and return its prompt's reuse."""
        _check_ids(prompt, "prompt")
        _check_ids(reply, "reply")
        if not prompt:
            raise InvalidInputError("a request needs at least one prompt token")
        size = self.block_size
        hashes = block_hashes(list(prompt) + list(reply[:-1]), size)
        hit = 0
        for h in hashes[: (len(prompt) - 1) // size]:  # rules 4 and 5
            if h not in self._slot_of:
                break
            hit += 1
        length = len(prompt) + max(0, len(reply) - 1)
        needed = -(-length // size) - hit
        if self.capacity is not None and needed + hit > self.capacity:
            # refused before any block is taken: a refused request leaves the pool as it
            # was (its hit blocks taken out of the free queue were never put back, so the
            # pool shrank until a later request found the queue empty: KeyError)
            raise InvalidInputError(
                f"a request of {length} tokens needs {needed + hit} blocks, "
                f"the cache holds {self.capacity}; give a larger capacity or a shorter request"
            )
        used = [self._slot_of[h] for h in hashes[:hit]]
        for slot in used:
            self._free.pop(slot, None)
        fresh = [self._take() for _ in range(needed)]
        for slot, h in zip(fresh, hashes[hit:], strict=False):  # rule 6: full blocks cached
            if h not in self._slot_of:
                self._slot_of[h] = slot
                self._hash_in[slot] = h
        for slot in reversed(used + fresh):  # rule 7: freed tail first
            self._free[slot] = None
        reused = hit * size
        return PrefixUse(len(prompt), reused, len(prompt) - reused)

    def _take(self) -> int:
        """A block for new tokens: a never-used one, else the LRU free one (evicting its hash)."""
        if self.capacity is None or self._next_slot < self.capacity:
            self._next_slot += 1
            return self._next_slot - 1
        slot, _ = self._free.popitem(last=False)
        old = self._hash_in.pop(slot, None)
        if old is not None:
            del self._slot_of[old]
        return slot


def _check_ids(ids: object, name: str) -> None:
    """Token ids: a list or tuple of ints (a str is a sequence too, of characters)."""
    if not isinstance(ids, list | tuple | range) or not all(
        isinstance(i, int) and not isinstance(i, bool) for i in ids
    ):
        raise InvalidInputError(
            f"{name} must be a list of token ids (ints), got {show(ids)}; pass the ids the "
            "tokenizer gave"
        )


def simulate(
    requests: Iterable[tuple[Sequence[int], Sequence[int]]],
    block_size: int = DEFAULT_BLOCK_SIZE,
    capacity: int | None = None,
) -> list[PrefixUse]:
    """:class:`PrefixCache` over a session's ``(prompt ids, reply ids)`` in order."""
    cache = PrefixCache(block_size, capacity)
    out = []
    for request in requests:
        if not isinstance(request, tuple | list) or len(request) != 2:
            raise InvalidInputError(
                f"each request must be a (prompt ids, reply ids) pair, got {show(request)}"
            )
        out.append(cache.request(*request))
    return out
