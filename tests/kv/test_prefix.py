"""The prefix-cache model against hand-worked sequences (block size 4 throughout)."""

from __future__ import annotations

import pytest

from ctxguard.errors import InvalidInputError
from ctxguard.kv.prefix import PrefixCache, PrefixUse, block_hashes, simulate


def ids(low: int, high: int) -> list[int]:
    return list(range(low, high + 1))


def test_first_request_prefills_everything_and_a_repeat_reuses_full_blocks() -> None:
    cache = PrefixCache(block_size=4)
    assert cache.request(ids(1, 10)) == PrefixUse(10, 0, 10)
    assert cache.cached_blocks == 2  # [1-4] [5-8]; the partial [9, 10] is never cached
    assert cache.request(ids(1, 10)) == PrefixUse(10, 8, 2)


def test_a_prompt_ending_on_a_block_boundary_recomputes_its_last_block() -> None:
    cache = PrefixCache(block_size=4)
    cache.request(ids(1, 8))
    # both blocks are cached, but the last token must be computed: hit capped at 7 -> 1 block
    assert cache.request(ids(1, 8)) == PrefixUse(8, 4, 4)
    assert cache.request(ids(1, 9)) == PrefixUse(9, 8, 1)


def test_the_chain_breaks_at_the_first_changed_token() -> None:
    cache = PrefixCache(block_size=4)
    cache.request(ids(1, 12))
    changed = ids(1, 12)
    changed[5] = 99  # second block differs: the third cannot be reused either
    assert cache.request([*changed, 13]) == PrefixUse(13, 4, 9)
    shifted = [0, *ids(1, 12)]  # one token in front: nothing matches
    assert cache.request(shifted) == PrefixUse(13, 0, 13)


def test_reply_blocks_are_cached_except_the_last_sampled_token() -> None:
    cache = PrefixCache(block_size=4)
    cache.request(ids(1, 6), reply=[7, 8, 9, 10, 11])  # cacheable: 1..10 -> [1-4] [5-8]
    assert cache.request(ids(1, 13)) == PrefixUse(13, 8, 5)
    cache = PrefixCache(block_size=4)
    cache.request(ids(1, 6), reply=[7, 8, 9])  # cacheable 1..8: the reply's 9 is not fed back
    assert cache.request(ids(1, 9)) == PrefixUse(9, 8, 1)
    cache = PrefixCache(block_size=4)
    cache.request(ids(1, 6), reply=[7, 8])  # cacheable 1..7: the second block is partial
    assert cache.request(ids(1, 9)) == PrefixUse(9, 4, 5)


def test_lru_eviction_takes_unused_blocks_first_then_a_sequence_tail_before_its_head() -> None:
    cache = PrefixCache(block_size=4, capacity=3)
    assert cache.request(ids(1, 8)) == PrefixUse(8, 0, 8)  # slots 0, 1; freed 1 then 0
    # two new blocks: the never-used slot 2, then the LRU free one, A's tail (slot 1)
    assert cache.request(ids(20, 27)) == PrefixUse(8, 0, 8)
    assert cache.cached_blocks == 3
    # A's head survived, its tail did not
    assert cache.request(ids(1, 9)) == PrefixUse(9, 4, 5)


def test_a_hit_block_in_use_is_not_evicted_by_the_same_request() -> None:
    cache = PrefixCache(block_size=4, capacity=3)
    cache.request([*ids(1, 4), 50])  # slots 0 (cached [1-4]), 1 (partial)
    # hit [1-4] (slot 0 in use), two new blocks: slot 2 then slot 1; slot 0 survives
    assert cache.request(ids(1, 12)) == PrefixUse(12, 4, 8)
    assert cache.request(ids(1, 12)) == PrefixUse(12, 8, 4)


def test_unlimited_capacity_never_evicts() -> None:
    uses = simulate([(ids(1, 40), []), (ids(100, 140), []), (ids(1, 41), [])], block_size=4)
    assert uses[-1] == PrefixUse(41, 40, 1)


def test_block_hashes_chain_and_bad_input() -> None:
    assert len(block_hashes(ids(1, 9), 4)) == 2
    assert block_hashes([5, 6, 7, 8, 1, 2, 3, 4], 4)[1] != block_hashes(ids(1, 4), 4)[0]
    with pytest.raises(InvalidInputError):
        PrefixCache(block_size=0)
    with pytest.raises(InvalidInputError):
        PrefixCache(capacity=0)
    with pytest.raises(InvalidInputError):
        PrefixCache().request([])
    with pytest.raises(InvalidInputError, match="needs 3 blocks"):
        PrefixCache(block_size=4, capacity=2).request(ids(1, 9))


def test_a_refused_request_leaves_the_pool_as_it_was() -> None:
    """A request too long for the pool, whose prefix was cached, is refused without
    taking its hit blocks out of the free queue: the pool keeps every block, and the
    cache answers as one that never saw the refused request."""
    cache, twin = PrefixCache(block_size=1, capacity=4), PrefixCache(block_size=1, capacity=4)
    for pool in (cache, twin):
        pool.request([1, 2, 3])
    with pytest.raises(InvalidInputError, match="needs 6 blocks, the cache holds 4"):
        cache.request([1, 2, 3, 4, 5, 6])
    for prompt in ([9], [8, 7], [6, 5, 4, 3], [1, 2, 3, 4]):
        assert cache.request(prompt) == twin.request(prompt)
    assert cache.cached_blocks == twin.cached_blocks


@pytest.mark.parametrize(
    ("prompt", "reply"),
    [
        ("abc", ()),
        ([1, None], ()),
        ([1, [2]], ()),
        ([1, True], ()),
        ([1, 2], 5),
        ([1], "xy"),
        (None, ()),
    ],
)
def test_ids_that_are_no_token_ids_are_an_invalid_input_error(
    prompt: object, reply: object
) -> None:
    """(before: a str was read as its characters, and a list in the ids, an int reply
    or None came out as a bare TypeError)"""
    with pytest.raises(InvalidInputError, match="must be a list of token ids") as err:
        PrefixCache(1).request(prompt, reply)  # type: ignore[arg-type]
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("requests", [[([1, 2],)], [[1, 2, 3]], [([1], (), ())]])
def test_a_request_that_is_no_pair_is_an_invalid_input_error(requests: object) -> None:
    with pytest.raises(InvalidInputError, match=r"\(prompt ids, reply ids\) pair"):
        simulate(requests)  # type: ignore[arg-type]
