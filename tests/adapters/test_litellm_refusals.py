"""Every request the LiteLLM guardrail refuses changes nothing stored (one ``refused``
audit record at most: tests/store_diff.py compares every key), is a
:class:`GuardrailRefusal` (a ``CtxGuardError`` and LiteLLM's ``GuardrailRaisedException``)
with a one-line message, and leaves no turn for ``post_call`` to store."""

from __future__ import annotations

import os
from typing import Any

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no cost-map download
litellm = pytest.importorskip("litellm")

from litellm.exceptions import GuardrailRaisedException  # noqa: E402

from ctxguard.adapters.litellm import CtxGuardGuardrail, GuardrailRefusal  # noqa: E402
from ctxguard.errors import CtxGuardError  # noqa: E402
from tests import store_diff  # noqa: E402
from tests.guard.test_refusal_matrix import MidBatchCounter  # noqa: E402

from .conftest import LIMIT, RESERVE  # noqa: E402
from .test_litellm import call_model, from_config, post_call, pre_call, request  # noqa: E402

SID = "s1"


class BrokenFrom(MidBatchCounter):
    """Fails on the ``fail_at``-th message it counts and every one after (the gateway
    counts a failed turn once more: one failure alone is retried)."""

    def count_message(self, message: Any) -> int:
        if self.armed and self.seen + 1 >= self.fail_at:
            self.seen += 1
            raise RuntimeError("counter broke on this message")
        return super().count_message(message)


def users(n: int) -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"new {i}"} for i in range(n)]


def bad_third() -> list[dict[str, Any]]:
    batch = users(5)
    batch[2] = {"role": "bogus", "content": "x"}
    return batch


# name -> the new messages of a refused request (and its extra body fields)
CASES: dict[str, tuple[list[dict[str, Any]], dict[str, Any]]] = {
    "bad-3rd-of-5": (bad_third(), {}),
    "bad-content-3rd-of-5": ([*users(2), {"role": "user", "content": 7}, *users(2)], {}),
    "over-budget": ([{"role": "user", "content": "word " * 6000}], {}),
    "over-budget-output": (users(1), {"max_tokens": LIMIT * 2}),
    "orphan-tool-result": ([{"role": "tool", "tool_call_id": "nope", "content": "42"}], {}),
    "audio-part": (
        [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "AA"}}]}],
        {},
    ),
    "n-over-one": (users(1), {"n": 2}),
}


async def seeded(store_url: str, namespace: str) -> tuple[CtxGuardGuardrail, Any]:
    g = from_config(
        url=store_url, namespace=namespace, counter="approx", limit=LIMIT, max_tokens=RESERVE
    )
    data = await pre_call(g, request([{"role": "user", "content": "hello"}], header=SID))
    await post_call(g, data, await call_model(data, reply="hi"))
    return g, g.gateway.guard(None).store


def snap(store: Any, store_url: str) -> store_diff.Snapshot:
    return store_diff.take(store, None if store_url.startswith("memory") else store_url)


def assert_one_line_refusal(exc: BaseException) -> None:
    assert isinstance(exc, GuardrailRefusal)
    assert isinstance(exc, CtxGuardError) and isinstance(exc, GuardrailRaisedException)
    assert "\n" not in str(exc) and str(exc)
    assert 400 <= exc.status_code < 600


@pytest.mark.parametrize("case", list(CASES))
async def test_a_refused_request_stores_nothing(store_url: str, namespace: str, case: str) -> None:
    g, store = await seeded(store_url, namespace)
    try:
        messages, extra = CASES[case]
        before = snap(store, store_url)
        data = request(messages, header=SID, **extra)
        with pytest.raises(GuardrailRefusal) as info:
            await pre_call(g, data)
        assert_one_line_refusal(info.value)
        assert info.value.status_code == 400
        store_diff.assert_refused_only(before, snap(store, store_url), refused=True)
        # the proxy still runs the failure hook: it finds no turn and stores nothing
        await g.async_post_call_failure_hook(data, info.value, None)
        store_diff.assert_refused_only(before, snap(store, store_url), refused=True)
    finally:
        await g.aclose()


@pytest.mark.parametrize("fail_at", [1, 3, 5])
async def test_a_counter_failing_mid_batch_stores_nothing(
    store_url: str, namespace: str, fail_at: int
) -> None:
    g, store = await seeded(store_url, namespace)
    try:
        counter = BrokenFrom(fail_at)
        g.gateway._counter = counter
        g.gateway._guards.clear()  # (the seeded guard holds the approx counter)
        store = g.gateway.guard(None).store
        before = snap(store, store_url)
        counter.armed = True
        with pytest.raises(GuardrailRefusal) as info:
            await pre_call(g, request(users(5), header=SID))
        assert_one_line_refusal(info.value)
        store_diff.assert_refused_only(before, snap(store, store_url), refused=True)
    finally:
        await g.aclose()


async def test_a_closed_guardrail_refuses_with_a_typed_error(
    store_url: str, namespace: str
) -> None:
    g, store = await seeded(store_url, namespace)
    before = snap(store, store_url)
    await g.aclose()
    with pytest.raises(CtxGuardError) as info:
        await pre_call(g, request(users(1), header=SID))
    assert "\n" not in str(info.value)
    assert isinstance(info.value, GuardrailRaisedException)
    store_diff.assert_refused_only(before, snap(store, store_url), refused=True)
