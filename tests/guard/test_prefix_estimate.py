"""Request records carry the prefix-cache model's reused / prefilled estimate (opt-in)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from ctxguard import AsyncGuard, ConfigError, Guard
from ctxguard.guard.prefix_estimate import PrefixEstimates, chain, reused_tokens
from ctxguard.kv.prefix import PrefixCache
from ctxguard.messages import Message
from ctxguard.tokens import load_counter
from ctxguard.tokens.prompt_ids import prompt_ids, reply_ids
from tests.conftest import private_memory_url, recorded_ids

COUNTER = "tiktoken:cl100k_base"


def requests(audit: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in audit if r["kind"] == "request"]


def question(turn: int) -> dict[str, str]:
    return {
        "role": "user",
        "content": f"Turn {turn} asks " + " ".join(f"q{turn}w{i}" for i in range(40)),
    }


def answer(turn: int) -> str:
    return " ".join(f"a{turn}z{i}" for i in range(25))


def chat(guard: Guard, session: str, turns: int, first: int = 0) -> None:
    for turn in range(first, first + turns):
        req = guard.prepare(session, [question(turn)])
        guard.complete(session, {"role": "assistant", "content": answer(turn)}, prepared=req)


# -- the estimate on hand-worked ids (block size 4) --------------------------------


def test_reuse_counts_leading_full_blocks_of_prompt_and_reply() -> None:
    previous = chain([1, 2, 3, 4, 5, 6], 4)  # one full block, tail (5, 6)
    previous = chain([7, 8, 9], 4, previous)  # reply 7 8 9 99: 99 is never fed back
    assert len(previous.hashes) == 2 and previous.tail == (9,)
    # the next prompt repeats prompt + reply and adds 3 tokens: 2 blocks reused
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9, 99, 10, 11]
    assert reused_tokens(previous, chain(prompt, 4), len(prompt), 4) == 8
    # a change in the second block leaves only the first
    changed = [1, 2, 3, 4, 5, 0, 7, 8, 9, 99, 10, 11]
    assert reused_tokens(previous, chain(changed, 4), len(changed), 4) == 4
    # a change in the first block breaks the chain: nothing after it is reused
    first = [0, 2, 3, 4, 5, 6, 7, 8, 9, 99, 10, 11]
    assert reused_tokens(previous, chain(first, 4), len(first), 4) == 0


def test_the_last_prompt_token_is_recomputed() -> None:
    previous = chain([1, 2, 3, 4, 5, 6, 7, 8], 4)
    same = [1, 2, 3, 4, 5, 6, 7, 8]  # ends on a block boundary: its last block recomputed
    assert reused_tokens(previous, chain(same, 4), 8, 4) == 4
    longer = [*same, 9]
    assert reused_tokens(previous, chain(longer, 4), 9, 4) == 8


# -- records written by the guard ---------------------------------------------------


def test_records_carry_the_models_numbers_from_the_second_request_on() -> None:
    guard = Guard(
        f"memory://{uuid.uuid4().hex}",
        counter=COUNTER,
        limit=900,
        max_tokens=100,
        prefix_block_size=16,
    )
    guard.append("s", [{"role": "system", "content": "You are terse. " * 5}])
    chat(guard, "s", 10)
    records = requests(guard.store.read_audit("s"))
    assert "reused" not in records[0] and "prefilled" not in records[0]  # nothing before it
    assert any(r.get("dropped") for r in records)  # the sliding window re-prefilled
    # the same requests through the full model, replies as generated
    counter = load_counter(COUNTER)
    stored = {s.message.id: s.message for s in guard.store.read("s")}
    cache = PrefixCache(16)
    for index, record in enumerate(records):
        messages = [stored[i] for i in recorded_ids(guard.store, "s", record) or ()]
        ids = prompt_ids(counter, messages)
        assert ids is not None and len(ids) == record["tokens"]
        reply = reply_ids(counter, answer(index)) or []
        use = cache.request(ids, reply)
        if index:
            assert (record["reused"], record["prefilled"]) == (use.reused, use.prefilled)
    assert sum(r.get("reused", 0) for r in records) > 0


def test_no_estimate_without_the_setting_or_without_token_ids() -> None:
    for counter, block in ((COUNTER, None), ("approx", 16)):
        guard = Guard(
            f"memory://{uuid.uuid4().hex}",
            counter=counter,
            limit=900,
            max_tokens=100,
            prefix_block_size=block,
        )
        chat(guard, "s", 3)
        assert not any("reused" in r for r in requests(guard.store.read_audit("s")))


def test_a_guard_that_did_not_see_the_previous_request_leaves_the_fields_out() -> None:
    url = f"memory://{uuid.uuid4().hex}"
    settings: dict[str, Any] = {"counter": COUNTER, "limit": 2000, "prefix_block_size": 16}
    first = Guard(url, **settings)
    chat(first, "s", 2)
    second = Guard(first.store, **settings)
    chat(second, "s", 2, first=2)
    records = requests(first.store.read_audit("s"))
    assert ["reused" in r for r in records] == [False, True, False, True]


def test_async_guard_writes_the_same_numbers() -> None:
    async def run() -> list[dict[str, Any]]:
        guard = AsyncGuard(
            f"memory://{uuid.uuid4().hex}", counter=COUNTER, limit=900, prefix_block_size=16
        )
        for turn in range(4):
            req = await guard.prepare("s", [question(turn)], max_tokens=100)
            await guard.complete("s", {"role": "assistant", "content": answer(turn)}, prepared=req)
        return requests(await guard.store.read_audit("s"))

    sync = Guard(f"memory://{uuid.uuid4().hex}", counter=COUNTER, limit=900, prefix_block_size=16)
    for turn in range(4):
        req = sync.prepare("s", [question(turn)], max_tokens=100)
        sync.complete("s", {"role": "assistant", "content": answer(turn)}, prepared=req)
    numbers = [(r.get("reused"), r.get("prefilled")) for r in requests(sync.store.read_audit("s"))]
    assert numbers[1][0] is not None
    assert [(r.get("reused"), r.get("prefilled")) for r in asyncio.run(run())] == numbers


# -- the per-session state --------------------------------------------------------


def _estimate(estimates: PrefixEstimates, session: str, rid: str, text: str) -> Any:
    counter = load_counter(COUNTER)
    return estimates.estimate(session, rid, counter, [Message(role="user", content=text)], None)


def test_only_a_committed_request_becomes_the_previous_one() -> None:
    estimates = PrefixEstimates(16, capacity=8)
    long = "word " * 100
    assert _estimate(estimates, "s", "r1", long) is None
    estimates.committed("s", "r1")
    # planned but never stored (another writer came first): it must not count as sent
    assert _estimate(estimates, "s", "r2", "other " * 100)[0] == 0
    assert _estimate(estimates, "s", "r3", long + "more")[0] > 0  # still against r1
    estimates.committed("s", "r2")  # not the request estimated last: unknown from now on
    assert _estimate(estimates, "s", "r4", long) is None


def test_the_state_is_bounded_by_sessions_and_bytes() -> None:
    estimates = PrefixEstimates(16, capacity=3)
    for index in range(10):
        _estimate(estimates, f"s{index}", "r", "word " * 200)
        estimates.committed(f"s{index}", "r")
    assert len(estimates) == 3
    small = PrefixEstimates(16, capacity=100, max_bytes=400)
    for index in range(10):
        _estimate(small, f"s{index}", "r", "word " * 200)
        small.committed(f"s{index}", "r")
    assert small.bytes <= 400 and len(small) <= 2


@pytest.mark.parametrize("bad", [0, -16, 1.5, True, "16"])
def test_a_bad_block_size_is_refused(bad: object) -> None:
    with pytest.raises(ConfigError, match="prefix_block_size"):
        Guard(private_memory_url(), counter=COUNTER, limit=900, prefix_block_size=bad)


def test_estimates_do_not_need_the_window_cache() -> None:
    guard = Guard(
        f"memory://{uuid.uuid4().hex}",
        counter=COUNTER,
        limit=2000,
        prefix_block_size=16,
        window_cache_size=0,
    )
    chat(guard, "s", 3)
    records = requests(guard.store.read_audit("s"))
    assert [r.get("reused", -1) > 0 for r in records] == [False, True, True]


def test_the_encoding_memo_gives_the_same_ids_and_sees_changed_content() -> None:
    counter = load_counter(COUNTER)
    first = [Message(role="user", content=f"m{i} " * 20, id=f"m{i}") for i in range(4)]
    memo: dict[str, Any] = {}
    assert prompt_ids(counter, first, None, memo) == prompt_ids(counter, first)
    assert set(memo) == {"m0", "m1", "m2", "m3"}
    # the same id with other content (a degraded tool result, a shrunk message)
    second = [*first[1:3], Message(role="user", content="shorter", id="m3"), first[0]]
    assert prompt_ids(counter, second, None, memo) == prompt_ids(counter, second)
    assert set(memo) == {"m0", "m1", "m2", "m3"}
    assert prompt_ids(counter, first[:1], None, memo) == prompt_ids(counter, first[:1])
    assert set(memo) == {"m0"}  # only this request's messages are kept
