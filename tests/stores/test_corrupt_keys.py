"""A damaged key of a session (written by something other than ctxguard) makes every
script that reads or writes it refuse before its first write, with CorruptRecordError
naming the key.

Run on real Redis and Redis Cluster (no fakeredis): each derived key is corrupted
in turn, and prepare (fetching, and on a cached window), append and complete
must raise CorruptRecordError while the message list stays as it was, or, when the
call neither reads nor writes that key (LEFT_TO_THE_NEXT_READ), store its message;
the next fetching prepare names the key either way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from ctxguard import Guard
from ctxguard.errors import CorruptRecordError
from ctxguard.messages import Message
from ctxguard.stores import open_store
from ctxguard.stores.keys import SUFFIXES, KeySpace
from tests.conftest import raw_client

Corruption = Callable[[Any, dict[str, str]], None]


def _wrong_type(suffix: str) -> Corruption:
    def corrupt(client: Any, keys: dict[str, str]) -> None:
        client.delete(keys[suffix])
        if suffix in ("sum", "ids", "meta", "rids"):  # a string or hash key made a list
            client.rpush(keys[suffix], "x")
        else:
            client.set(keys[suffix], "x")

    return corrupt


def _meta_field(field: str) -> Corruption:
    return lambda client, keys: client.hset(keys["meta"], field, "abc")


CORRUPTIONS: list[Any] = [
    pytest.param(lambda c, k: c.rpush(k["pins"], "x"), "pins", id="pins-not-a-number"),
    pytest.param(lambda c, k: c.rpush(k["pins"], 99), "pins", id="pins-beyond-history"),
    pytest.param(lambda c, k: c.rpush(k["toks"], 5), "toks", id="toks-longer-than-msgs"),
    pytest.param(lambda c, k: c.rpop(k["toks"]), "toks", id="toks-shorter-than-msgs"),
    *(pytest.param(_meta_field(f), "meta", id=f"meta-{f}") for f in ("count", "tokens", "turns")),
    pytest.param(_meta_field("ver"), "meta", id="meta-ver"),
    pytest.param(_meta_field("created"), "meta", id="meta-created"),
    # a session without its state token's epoch (a write stored, then failed on it)
    pytest.param(lambda c, k: c.hdel(k["meta"], "epoch"), "meta", id="meta-epoch-missing"),
    *(
        pytest.param(_wrong_type(s), s, id=f"{s}-wrong-type")
        for s in ("meta", "toks", "ids", "pins", "sum", "audit", "rids")
    ),
]


@pytest.fixture(
    params=[
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("cluster", marks=pytest.mark.cluster),
    ]
)
def server(request: pytest.FixtureRequest) -> Iterator[str]:
    yield request.getfixturevalue(f"{request.param}_url")


def said(text: str, role: str = "user") -> Message:
    return Message(role=role, content=text)


# The writes that neither read nor write the damaged key: they go through (a script
# validates what it reads and writes; sum, and pins without a pinned message, are
# neither; audit and rids neither without an audit record), and the damage is found
# by the next read that touches it: a fetch, the next write that does (the ones not
# listed), `ctxguard audit`.
_NO_PIN = {"prepare on a cached window", "append", "complete", "complete with usage"}
LEFT_TO_THE_NEXT_READ: dict[str, set[str]] = {
    "sum": _NO_PIN | {"append a pinned message"},
    "pins": _NO_PIN,
    "audit": {"append", "append a pinned message", "complete"},
    "rids": {"append", "append a pinned message", "complete"},
}


@pytest.mark.parametrize(("corrupt", "suffix"), CORRUPTIONS)
def test_every_write_refuses_a_corrupt_key_and_writes_nothing(
    server: str,
    namespace: str,
    purge_after: Callable[[str], None],
    corrupt: Corruption,
    suffix: str,
) -> None:
    purge_after(server)
    guard = Guard(open_store(server, namespace=namespace), counter="approx", limit=4000)
    fresh = Guard(open_store(server, namespace=namespace), counter="approx", limit=4000)
    guard.append("s", [said("be brief", "system")])
    guard.prepare("s", [said("hello")])
    guard.complete("s", said("hi", "assistant"))
    keys = dict(zip(SUFFIXES, KeySpace(namespace, "default").session_keys("s"), strict=True))
    client = raw_client(server)
    try:
        corrupt(client, keys)
        msgs = client.lrange(keys["msgs"], 0, -1)
        calls = {
            "prepare on a cached window": lambda: guard.prepare("s", [said("next")]),
            "prepare with a fetch": lambda: fresh.prepare("s", [said("next")]),
            "append": lambda: guard.append("s", [said("more")]),
            "append a pinned message": lambda: guard.append("s", [said("rule", "system")]),
            "complete": lambda: guard.complete("s", said("reply", "assistant")),
            "complete with usage": lambda: guard.complete(
                "s", said("reply", "assistant"), usage={"prompt_tokens": 3}
            ),
        }
        left = LEFT_TO_THE_NEXT_READ.get(suffix, set())
        for name, call in calls.items():
            if name in left:  # the damage is not this write's: it is stored
                call()
                stored = client.lrange(keys["msgs"], 0, -1)
                assert len(stored) == len(msgs) + 1 and stored[: len(msgs)] == msgs, name
                msgs = stored
                continue
            with pytest.raises(CorruptRecordError) as caught:
                call()
            assert caught.value.key == keys[suffix], name
            assert caught.value.session_id == "s"
            assert keys[suffix] in str(caught.value) and "\n" not in str(caught.value)
            assert client.lrange(keys["msgs"], 0, -1) == msgs, f"{name} wrote a message"
        # whatever went through, the next prepare that reads or writes the key names it
        with pytest.raises(CorruptRecordError) as caught:
            Guard(open_store(server, namespace=namespace), counter="approx", limit=4000).prepare(
                "s", [said("last")]
            )
        assert caught.value.key == keys[suffix]
        assert client.lrange(keys["msgs"], 0, -1) == msgs
    finally:
        client.close()
        guard.close()
        fresh.close()


def test_wrongtype_from_a_plain_command_names_the_key(
    server: str, namespace: str, purge_after: Callable[[str], None]
) -> None:
    purge_after(server)
    store = open_store(server, namespace=namespace)
    guard = Guard(store, counter="approx", limit=4000)
    guard.prepare("s", [said("hello")])
    keys = KeySpace(namespace, "default").session_keys("s")
    client = raw_client(server)
    try:
        client.delete(keys[6])
        client.set(keys[6], "not a list")
        with pytest.raises(CorruptRecordError) as caught:
            store.read_audit("s")
        assert caught.value.key == keys[6]
        with pytest.raises(CorruptRecordError) as caught:
            store.info("s")
        assert caught.value.key == keys[6]
        client.delete(keys[5])
        client.rpush(keys[5], "x")
        with pytest.raises(CorruptRecordError) as caught:
            store.get_summary("s")
        assert caught.value.key == keys[5]
    finally:
        client.close()
        guard.close()


# -- every store write, every damage: a refusal writes nothing ------------------------

_FIELDS = ("created", "updated", "count", "tokens", "sumver", "turns", "ver", "counter")
_FIELDS += ("epoch", "stamp", "ctx")


_HUGE = "99999999999999999999"  # an integer, but past what Lua's double holds exactly


def _damages() -> list[Any]:
    out: list[Any] = []
    for name in _FIELDS:
        out.append(pytest.param(lambda c, k, f=name: c.hdel(k["meta"], f), id=f"no-{name}"))
        out.append(pytest.param(lambda c, k, f=name: c.hset(k["meta"], f, "x"), id=f"x-{name}"))
        out.append(pytest.param(lambda c, k, f=name: c.hset(k["meta"], f, ""), id=f"empty-{name}"))
        out.append(
            pytest.param(lambda c, k, f=name: c.hset(k["meta"], f, _HUGE), id=f"huge-{name}")
        )
    out += [pytest.param(_wrong_type(s), id=f"{s}-wrong-type") for s in SUFFIXES]
    out.append(pytest.param(lambda c, k: c.rpush(k["pins"], 99), id="pins-beyond-history"))
    out.append(pytest.param(lambda c, k: c.rpop(k["toks"]), id="toks-shorter-than-msgs"))
    out.append(pytest.param(lambda c, k: c.lset(k["toks"], 0, "x"), id="toks-holds-a-word"))
    for count in ("99999999999999999999", "1.5", "-7"):
        out.append(pytest.param(lambda c, k, n=count: c.lset(k["toks"], 0, n), id=f"toks-{count}"))
    return out


@pytest.mark.parametrize("corrupt", _damages())
def test_every_store_write_that_refuses_a_damaged_session_wrote_nothing(
    server: str, namespace: str, purge_after: Callable[[str], None], corrupt: Corruption
) -> None:
    """Each store operation that writes, on a session with one damage: it either goes
    through or raises CorruptRecordError, and then every key is as it was (a meta
    without its epoch, a non-integer sumver before a restore, and counts written with an
    audit record by two scripts, and a message appended with recounts and a record by
    two, each wrote first and failed after)."""
    from ctxguard.stores.base import RecordWrite, Summary

    purge_after(server)
    guard = Guard(open_store(server, namespace=namespace), counter="approx", limit=4000)
    guard.append("s", [said("be brief", "system")])
    request = guard.prepare("s", [said("hello")])
    guard.complete("s", said("hi", "assistant"), usage={"prompt_tokens": 3}, prepared=request)
    keys = dict(zip(SUFFIXES, KeySpace(namespace, "default").session_keys("s"), strict=True))
    store, core = guard.store, guard.core
    fingerprint = core.counter.fingerprint
    summary = Summary(version=1, text="so far", covers_to=1)

    def new(text: str) -> Any:
        return core.encode_new([said(text)])

    writes: dict[str, Callable[[], Any]] = {
        "append": lambda: store.append("s", new("a"), core.write_options),
        "append with audit": lambda: store.append_with_audit(
            "s", new("b"), core.write_options, core.write({}, {"kind": "note"})
        ),
        "append with counts and a record": lambda: store.append_with_audit(
            "s",
            new("d"),
            core.write_options,
            RecordWrite(fingerprint, {0: 4}, {"kind": "note"}, 100),
        ),
        "commit on a cached window": lambda: guard.prepare("s", [said("c")]),
        "set counts": lambda: store.set_token_counts("s", fingerprint, {0: 5}),
        "counts and a record": lambda: store.record(
            "s", RecordWrite(fingerprint, {0: 4}, {"kind": "note"}, 100)
        ),
        "a record": lambda: store.add_audit("s", {"kind": "note", "n": 1}, 100),
        "retract": lambda: store.retract("s", 1),
        "restore": lambda: store.restore("s", 50, summary),
        "commit a summary": lambda: store.commit_summary("s", summary, 0),
    }
    client = raw_client(server)
    try:
        corrupt(client, keys)
        for name, write in writes.items():
            before = {k: client.dump(v) for k, v in keys.items()}
            try:
                write()
            except CorruptRecordError as exc:
                assert exc.session_id == "s" and "\n" not in str(exc), name
                after = {k: client.dump(v) for k, v in keys.items()}
                changed = [k for k in keys if after[k] != before[k]]
                assert not changed, f"{name} refused ({exc}) but wrote {changed}"
    finally:
        client.close()
        guard.close()


# -- a prepare that folds a summary in: the summary is a write too ---------------------


def _folding_guard(url: str, namespace: str) -> Guard:
    """A session whose next prepare commits a summary inline, then its request."""
    guard = Guard(
        open_store(url, namespace=namespace),
        counter="approx",
        limit=300,
        max_tokens=50,
        summarizer=lambda previous, messages: "the story so far",
        summarize_after=2,
    )
    guard.append("s", [said("be brief", "system")])
    for i in range(5):
        guard.prepare("s", [said(f"question {i} " + "word " * 30)])
        guard.complete("s", said(f"answer {i} " + "word " * 30, "assistant"))
    return guard


def _the_folding_prepare(guard: Guard) -> Any:
    return guard.prepare("s", [said("more " * 40)])


def test_the_folding_prepare_commits_a_summary_on_a_sound_session(
    redis_url: str, namespace: str, purge_after: Callable[[str], None]
) -> None:
    """The path the next test damages: this prepare commits a summary, then its request."""
    purge_after(redis_url)
    guard = _folding_guard(redis_url, namespace)
    try:
        before = guard.store.info("s")
        assert before is not None
        request = _the_folding_prepare(guard)
        after = guard.store.info("s")
        assert after is not None and after.summary_version == before.summary_version + 1
        assert request.summary_version == after.summary_version
    finally:
        guard.close()


@pytest.mark.parametrize("corrupt", _damages())
def test_a_prepare_that_folds_a_summary_into_a_damaged_session_writes_nothing(
    server: str, namespace: str, purge_after: Callable[[str], None], corrupt: Corruption
) -> None:
    """It goes through, or it raises a CtxGuardError and every key is as it was (a
    ``refused`` audit record at most): the summary it would have folded in included.
    (It committed the summary and then refused: a trail or rid index of the wrong type
    refused the summary's record; a count that is not an integer, read as unknown by
    the fetch, refused the request's recount; a short ``toks`` refused the summary and
    left a ``summary_failed`` record.)"""
    from ctxguard.errors import CtxGuardError

    purge_after(server)
    guard = _folding_guard(server, namespace)
    keys = dict(zip(SUFFIXES, KeySpace(namespace, "default").session_keys("s"), strict=True))
    client = raw_client(server)
    try:
        corrupt(client, keys)
        before = {k: client.dump(v) for k, v in keys.items()}
        try:
            _the_folding_prepare(guard)
        except CtxGuardError as exc:
            assert "\n" not in str(exc)
            after = {k: client.dump(v) for k, v in keys.items()}
            changed = [k for k in keys if after[k] != before[k]]
            if changed:  # only a record of the refusal
                assert set(changed) <= {"audit", "rids"}, f"refused ({exc}) but wrote {changed}"
                newest = guard.store.read_audit("s")[-1]
                assert newest["kind"] == "refused", f"refused ({exc}) but wrote {newest}"
    finally:
        client.close()
        guard.close()


def test_a_summary_refused_by_a_damaged_session_raises_and_records_nothing(
    redis_url: str, namespace: str, purge_after: Callable[[str], None]
) -> None:
    """``Guard.summarize`` on a session the summary's commit refuses (fewer counts than
    messages): CorruptRecordError, and no ``summary_failed`` record goes into the damaged
    session (it was written, and the failure returned as an outcome)."""
    from ctxguard.guard.plan import SummaryRequest

    purge_after(redis_url)
    guard = Guard(
        open_store(redis_url, namespace=namespace),
        counter="approx",
        limit=4000,
        summarizer=lambda previous, messages: "the story so far",
    )
    keys = dict(zip(SUFFIXES, KeySpace(namespace, "default").session_keys("s"), strict=True))
    client = raw_client(redis_url)
    try:
        guard.append("s", [said(f"message {i}") for i in range(6)])
        client.rpop(keys["toks"])
        before = {k: client.dump(v) for k, v in keys.items()}
        with pytest.raises(CorruptRecordError) as caught:
            guard.summarize("s", SummaryRequest(None, 0, 0, 4))
        assert caught.value.key == keys["toks"]
        assert {k: client.dump(v) for k, v in keys.items()} == before
    finally:
        client.close()
        guard.close()
