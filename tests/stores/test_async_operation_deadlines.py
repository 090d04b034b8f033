"""stores/redis_async_deadline.OperationDeadlines: one timer for a store's operations, each
cut at its own deadline (operations here are sleeps; the store's are in
tests/faults/test_operation_deadline.py). Which operations are cut is asserted, never
how long anything took."""

from __future__ import annotations

import asyncio
import time

import pytest

from ctxguard.stores.redis_async_deadline import OperationDeadlines

pytestmark = [pytest.mark.timeout(60)]


async def _op(deadlines: OperationDeadlines, seconds: float, limit: float) -> str:
    """As AsyncRedisStore._io uses the queue: ``seconds`` of work, ``limit`` allowed."""
    entry = deadlines.start(time.monotonic() + limit)
    try:
        await asyncio.sleep(seconds)
        return "done"
    except asyncio.CancelledError:
        if not deadlines.cut(entry):
            raise
        return "cut"
    finally:
        deadlines.end(entry)


def test_each_operation_is_cut_at_its_own_deadline_and_only_past_it() -> None:
    async def run() -> list[str]:
        deadlines = OperationDeadlines(asyncio.get_running_loop())
        limit = 2.0
        slow_first = asyncio.create_task(_op(deadlines, 30, limit))
        await asyncio.sleep(0.1)
        quick = asyncio.create_task(_op(deadlines, 0.05, limit))  # ends behind the head
        await asyncio.sleep(0.9)
        # under way when the first is cut (at 2 s), done 0.5 s before its own deadline
        medium = asyncio.create_task(_op(deadlines, 1.5, limit))
        slow_second = asyncio.create_task(_op(deadlines, 30, limit))
        late_quick = asyncio.create_task(_op(deadlines, 0, limit))
        outcomes = await asyncio.gather(slow_first, quick, medium, slow_second, late_quick)
        # the same task, after the cuts: not left cancelled, and a later operation runs whole
        outcomes.append(await _op(deadlines, 0, limit))
        task = asyncio.current_task()
        assert task is not None and task.cancelling() == 0
        return outcomes

    assert asyncio.run(run()) == ["cut", "done", "done", "cut", "done", "done"]


def test_a_cut_operation_leaves_its_task_usable_for_asyncio_timeouts() -> None:
    async def run() -> tuple[str, int, bool]:
        deadlines = OperationDeadlines(asyncio.get_running_loop())
        limit = 0.2
        first = await _op(deadlines, 30, limit)
        task = asyncio.current_task()
        assert task is not None
        try:
            async with asyncio.timeout(0.1):
                await asyncio.sleep(30)
        except TimeoutError:
            timed_out = True
        else:
            timed_out = False
        return first, task.cancelling(), timed_out

    assert asyncio.run(run()) == ("cut", 0, True)


def test_the_callers_cancellation_goes_on_as_a_cancellation() -> None:
    async def run() -> str:
        deadlines = OperationDeadlines(asyncio.get_running_loop())
        limit = 30
        task = asyncio.create_task(_op(deadlines, 30, limit))
        await asyncio.sleep(0.1)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            return "cancelled"
        return "not cancelled"

    assert asyncio.run(run()) == "cancelled"


def test_a_cancellation_meeting_the_deadline_goes_on_as_a_cancellation() -> None:
    async def run() -> tuple[str, int]:
        deadlines = OperationDeadlines(asyncio.get_running_loop())
        limit = 0.2
        task = asyncio.create_task(_op(deadlines, 30, limit))
        await asyncio.sleep(0.1)
        loop = asyncio.get_running_loop()
        # the caller cancels in the same loop pass as the deadline fires (after it)
        loop.call_at(loop.time() + deadlines._queue[0][0] - time.monotonic(), task.cancel)
        try:
            await task
        except asyncio.CancelledError:
            return "cancelled", task.cancelling()
        return "not cancelled", task.cancelling()

    outcome, cancelling = asyncio.run(run())
    assert outcome == "cancelled"
    assert cancelling == 1  # the caller's request stands; the deadline's was taken back


def test_outside_a_task_there_is_no_deadline() -> None:
    async def run() -> object:
        deadlines = OperationDeadlines(asyncio.get_running_loop())
        result: list[object] = []
        asyncio.get_running_loop().call_soon(
            lambda: result.append(deadlines.start(time.monotonic() + 0.1))
        )
        await asyncio.sleep(0)
        return result[0]

    assert asyncio.run(run()) is None
