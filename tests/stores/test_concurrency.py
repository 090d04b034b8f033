"""Many writers, one session, a real server: nothing lost, nothing doubled, one order.

8 threads (sync store) and 8 asyncio tasks (async store) append 500 messages
each to the same session at the same time; every 50th append is sent twice,
as a client retrying after a lost reply would.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections import defaultdict
from collections.abc import Callable

import pytest

from ctxguard.messages import Message
from ctxguard.stores import NewMessage, StoredMessage, open_async_store, open_store

pytestmark = [pytest.mark.redis, pytest.mark.timeout(180)]

WRITERS = 8
PER_WRITER = 500
SESSION = "shared"


@pytest.fixture(params=["redis", pytest.param("cluster", marks=pytest.mark.cluster)])
def server_url(request: pytest.FixtureRequest, purge_after: Callable[[str], None]) -> str:
    url: str = request.getfixturevalue(f"{request.param}_url")
    purge_after(url)
    return url


def _message(writer: str, i: int) -> NewMessage:
    meta = {"writer": writer, "i": i}
    return NewMessage(Message(role="user", content=f"{writer} #{i}", metadata=meta))


def _is_retry(i: int) -> bool:
    return i % 50 == 0


async def test_threads_and_tasks_append_to_one_session(server_url: str, namespace: str) -> None:
    sync_store = open_store(server_url, namespace=namespace)
    async_store = open_async_store(server_url, namespace=namespace)
    go = threading.Event()
    stop = threading.Event()  # set when the test fails early: threads end before the test does
    sent: dict[str, list[str]] = defaultdict(list)
    errors: list[BaseException] = []
    duplicates_seen: list[str] = []

    def record(writer: str, new: NewMessage, dups: tuple[str, ...]) -> None:
        sent[writer].append(new.message.id)
        duplicates_seen.extend(dups)

    def thread_writer(writer: str) -> None:
        try:
            go.wait(10)
            for i in range(PER_WRITER):
                if stop.is_set():
                    return
                new = _message(writer, i)
                sync_store.append(SESSION, [new])
                retried = sync_store.append(SESSION, [new]) if _is_retry(i) else None
                record(writer, new, retried.duplicates if retried else ())
        except BaseException as exc:
            errors.append(exc)

    async def task_writer(writer: str) -> None:
        for i in range(PER_WRITER):
            new = _message(writer, i)
            await async_store.append(SESSION, [new])
            retried = await async_store.append(SESSION, [new]) if _is_retry(i) else None
            record(writer, new, retried.duplicates if retried else ())

    threads = [
        threading.Thread(target=thread_writer, args=(f"thread-{n}",), daemon=True)
        for n in range(WRITERS)
    ]
    for thread in threads:
        thread.start()
    go.set()
    try:
        await asyncio.gather(*(task_writer(f"task-{n}") for n in range(WRITERS)))
    except BaseException:
        # Never leave writer threads running past a failed test: a daemon thread
        # still inside the client at interpreter exit can crash the interpreter.
        stop.set()
        raise
    finally:
        for thread in threads:
            await asyncio.to_thread(thread.join, 120)
    assert not errors, errors
    assert not any(thread.is_alive() for thread in threads)

    total = 2 * WRITERS * PER_WRITER
    retries = 2 * WRITERS * sum(1 for i in range(PER_WRITER) if _is_retry(i))
    assert len(duplicates_seen) == retries

    reader_sync = open_store(server_url, namespace=namespace)
    reader_async = open_async_store(server_url, namespace=namespace)
    try:
        first = reader_sync.read(SESSION)
        second = await reader_async.read(SESSION)
        info = await reader_async.info(SESSION)
    finally:
        for store in (sync_store, reader_sync):
            store.close()
        for astore in (async_store, reader_async):
            await astore.close()

    ids = [s.message.id for s in first]
    assert ids == [s.message.id for s in second], "two readers saw different orders"
    assert len(ids) == total and len(set(ids)) == total
    assert set(ids) == {i for writer_ids in sent.values() for i in writer_ids}
    assert [s.seq for s in first] == list(range(total))
    assert info is not None and info.message_count == total
    _assert_each_writer_kept_its_order(first, sent)
    _assert_writers_interleaved(first)


def _assert_each_writer_kept_its_order(
    stored: list[StoredMessage], sent: dict[str, list[str]]
) -> None:
    by_writer: dict[str, list[str]] = defaultdict(list)
    for s in stored:
        by_writer[s.message.metadata["writer"]].append(s.message.id)
    assert len(by_writer) == 2 * WRITERS
    for writer, ids in by_writer.items():
        assert ids == sent[writer], f"{writer}'s messages are out of order"


def _assert_writers_interleaved(stored: list[StoredMessage]) -> None:
    kinds = [s.message.metadata["writer"].split("-")[0] for s in stored]
    switches = sum(1 for a, b in itertools.pairwise(kinds) if a != b)
    assert switches > 1, "threads and tasks did not run at the same time"


@pytest.mark.cluster
async def test_first_concurrent_calls_on_a_new_cluster_store_go_to_the_right_node(
    cluster_url: str, namespace: str, purge_after: Callable[[str], None]
) -> None:
    """redis-py routes a keyed command it sends before it knows the cluster to a
    random node: many tasks starting at once then meet MOVED, and its 5th MOVED
    closes every connection, under the feet of the other tasks (the writelines
    AttributeError of issue 12). The store learns the slot map first."""
    purge_after(cluster_url)
    store = open_async_store(cluster_url, namespace=namespace)
    client = store.client  # type: ignore[attr-defined]
    resets: list[int] = []
    close = client.aclose

    async def counting_close() -> None:
        resets.append(1)
        await close()

    client.aclose = counting_close
    try:
        await asyncio.gather(
            *(store.append(SESSION, [_message(f"task-{n}", 0)]) for n in range(2 * WRITERS))
        )
        assert client.reinitialize_counter == 0, "calls were sent to a node not serving the slot"
        assert not resets, "the client closed its connections under the running tasks"
        assert len(await store.read(SESSION)) == 2 * WRITERS
    finally:
        client.aclose = close
        await store.close()
