"""The in-process store and the Redis scripts implement one contract: same answers.

The window walk, counter switches, retract and capacity logic exist twice (Python
for ``memory://``, Lua for Redis). Random operation sequences run against both,
on a real Redis server, and every answer is compared.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxguard.errors import CtxGuardError
from ctxguard.messages import Message
from ctxguard.stores import NewMessage, WriteOptions, open_store
from ctxguard.stores.base import RecordWrite, WindowHit

ROLES = ["user", "assistant", "system"]
COUNTERS = ["c1", "c1", "c1", "", "c2"]  # mostly one counter, so counts are known

message = st.builds(
    lambda role, words, known, ident: NewMessage(
        Message(role=role, content="w " * words, id=f"m{ident}"), known
    ),
    st.sampled_from(ROLES),
    st.integers(0, 200),  # words: unknown counts are estimated from the record size
    st.one_of(st.none(), st.integers(0, 4)),  # small counts make budget boundaries common
    st.integers(0, 40),
)
options = st.builds(
    lambda counter, cap: WriteOptions(counter=counter or None, max_messages=cap),
    st.sampled_from(COUNTERS),
    st.one_of(st.none(), st.integers(1, 30)),
)
operation = st.one_of(
    st.tuples(st.just("append"), st.lists(message, max_size=4), options),
    st.tuples(
        st.just("window"),
        st.integers(0, 16),
        options,
        st.lists(message, max_size=3),
        st.integers(0, 3),
    ),
    st.tuples(
        st.just("counts"),
        st.sampled_from(COUNTERS[1:]),
        st.dictionaries(st.integers(0, 30), st.integers(0, 50), max_size=5),
    ),
    st.tuples(st.just("retract"), st.integers(0, 3)),
    st.tuples(st.just("read"), st.integers(-5, 10), st.one_of(st.none(), st.integers(-5, 20))),
    st.tuples(st.just("audit"), st.booleans()),
    st.tuples(
        st.just("commit"),
        st.integers(0, 16),
        options,
        st.lists(message, max_size=3),
        st.integers(0, 3),
        st.booleans(),  # with the session's current token (else a stale one)
        st.dictionaries(st.integers(0, 30), st.integers(0, 50), max_size=3),
    ),
)


def stored(items: Any) -> list[tuple[int, str, int | None]]:
    return [(s.seq, s.message.id, s.tokens) for s in items]


def apply(store: Any, op: tuple[Any, ...]) -> Any:
    """Run one operation and reduce its answer to comparable plain data."""
    kind = op[0]
    try:
        if kind == "append":
            r = store.append("s", op[1], op[2])
            return ("append", r.stored, r.duplicates, r.message_count)
        if kind == "window":
            w = store.fetch_window("s", op[1], op[2], op[3], op[4])
            appended = None if w.appended is None else (w.appended.stored, w.appended.duplicates)
            info = (w.info.message_count, w.info.token_total, w.info.counter)
            return ("window", stored(w.recent), stored(w.pinned), w.reached_start, appended, info)
        if kind == "commit":
            token = (store.fetch_window("s", 0).token or "") if op[5] else "stale"
            write = RecordWrite(counts=op[6], audit={"turn": 0, "kind": "request"})
            r = store.commit_if_unchanged("s", token, op[1], op[2], op[3], op[4], write)
            if isinstance(r, WindowHit):
                a = r.appended
                return (
                    "hit",
                    a.stored,
                    a.duplicates,
                    a.message_count,
                    r.turn,
                    stored(store.read("s")),
                )
            appended = None if r.appended is None else (r.appended.stored, r.appended.duplicates)
            info = (r.info.message_count, r.info.token_total, r.info.counter)
            return ("miss", stored(r.recent), stored(r.pinned), r.reached_start, appended, info)
        if kind == "counts":
            store.set_token_counts("s", op[1], op[2])
            i = store.info("s")
            return ("counts", None if i is None else (i.token_total, i.counter))
        if kind == "retract":
            return ("retract", stored(store.retract("s", op[1])))
        if kind == "read":
            return ("read", stored(store.read("s", op[1], op[2])))
        turn = store.record(
            "s", RecordWrite(audit={"turn": 0, "kind": "request"} if op[1] else {"kind": "usage"})
        )
        return ("audit", turn)
    except CtxGuardError as exc:
        return ("error", type(exc).__name__)


@pytest.mark.redis
@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(ops=st.lists(operation, min_size=1, max_size=25))
def test_memory_and_redis_answer_alike(redis_url: str, redis_namespace: str, ops: Any) -> None:
    name = uuid.uuid4().hex[:8]
    memory = open_store(f"memory://{name}", namespace=redis_namespace)
    redis_store = open_store(redis_url, namespace=redis_namespace, tenant=name)
    try:
        for op in ops:
            assert apply(memory, op) == apply(redis_store, op), op
    finally:
        redis_store.delete("s")
        redis_store.close()
