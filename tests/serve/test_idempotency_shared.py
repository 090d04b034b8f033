"""One Idempotency-Key, two gateway processes on one store (Redis and the cluster).

The key's lease lives in the store, so a retry that lands on another gateway while the
first request runs waits for it (one model call, one stored copy, the same reply for
both), and a retry after the holder died takes over once the lease expires."""

from __future__ import annotations

import concurrent.futures
import hashlib
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from ctxguard import Guard

from .processes import CliGateway
from .test_chat import chat
from .test_retries import wait_until
from .upstream import FakeVLLM

LEASE = 1.5  # seconds a dead holder keeps its key


@pytest.fixture(params=["redis_url", "cluster_url"])
def store_url(request: pytest.FixtureRequest) -> str:
    return str(request.getfixturevalue(request.param))


@pytest.fixture
def two_gateways(
    store_url: str, namespace: str, vllm: FakeVLLM
) -> Iterator[tuple[CliGateway, CliGateway]]:
    args = ("--upstream", vllm.url, "--url", store_url, "--namespace", namespace)
    args += ("--idempotency-lease", str(LEASE), "--upstream-timeout", "20")
    first = CliGateway(*args)
    try:
        second = CliGateway(*args)
    except BaseException:
        first.stop()
        raise
    yield first, second
    first.stop()
    second.stop()


@pytest.fixture
def history(store_url: str, namespace: str) -> Iterator[Callable[[str], list[Any]]]:
    guard = Guard(store_url, limit=4096, namespace=namespace)
    yield lambda session: [(s.message.role, s.message.content) for s in guard.store.read(session)]
    guard.close()


def test_a_retry_on_another_gateway_waits_for_the_first(
    two_gateways: tuple[CliGateway, CliGateway],
    vllm: FakeVLLM,
    history: Callable[[str], list[Any]],
) -> None:
    a, b = two_gateways
    vllm.slow_seconds = 2.0
    key = {"Idempotency-Key": "shared-1"}
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        first = pool.submit(chat, a.url, "SLOW shared", headers=key)
        wait_until(lambda: len(vllm.requests) == 1, "the first request upstream")
        second = pool.submit(chat, b.url, "SLOW shared", headers=key)
        answers = [first.result(), second.result()]
    assert [r.status_code for r in answers] == [200, 200]
    assert len(vllm.requests) == 1  # one model call
    texts = [r.json()["choices"][0]["message"]["content"] for r in answers]
    assert texts == ["echo: SLOW shared"] * 2
    assert answers[1].headers["idempotent-replayed"] == "true"
    assert history("s1") == [("user", "SLOW shared"), ("assistant", "echo: SLOW shared")]


# SIGKILLs a gateway holding a lease: leaves a dead holder's state in the store, so it
# runs only on servers the suite started.
@pytest.mark.destructive
def test_a_retry_takes_over_from_a_gateway_that_died(
    two_gateways: tuple[CliGateway, CliGateway],
    vllm: FakeVLLM,
    history: Callable[[str], list[Any]],
) -> None:
    a, b = two_gateways
    vllm.slow_seconds = 30.0
    key = {"Idempotency-Key": "orphan-1"}
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        lost = pool.submit(chat, a.url, "SLOW orphan", headers=key)
        wait_until(lambda: len(vllm.requests) == 1, "the first request upstream")
        a.kill()  # holds the key's lease, and never releases it
        with pytest.raises(httpx.HTTPError):
            lost.result()
    assert history("s1") == [("user", "SLOW orphan")]  # stored by the dead gateway
    vllm.slow_seconds = 0.1
    retry = chat(b.url, "SLOW orphan", headers=key)
    assert retry.status_code == 200, retry.text
    assert "idempotent-replayed" not in retry.headers
    assert retry.json()["choices"][0]["message"]["content"] == "echo: SLOW orphan"
    assert len(vllm.requests) == 2  # the dead holder's call, and the retry's
    # the user message once (derived ids), then the reply
    assert history("s1") == [("user", "SLOW orphan"), ("assistant", "echo: SLOW orphan")]
    # and the key is answered from the history from now on, by either gateway
    again = chat(b.url, "SLOW orphan", headers=key)
    assert again.headers["idempotent-replayed"] == "true"
    assert len(vllm.requests) == 2


def test_memory_store_one_process_waits_too(
    start_gateway: Callable[..., str], vllm: FakeVLLM, namespace: str
) -> None:
    url = f"memory://{namespace}"
    gateway = start_gateway(url=url, max_tokens=256)
    vllm.slow_seconds = 1.0
    key = {"Idempotency-Key": "mem-1"}
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        first = pool.submit(chat, gateway, "SLOW memory", headers=key)
        wait_until(lambda: len(vllm.requests) == 1, "the first request upstream")
        second = pool.submit(chat, gateway, "SLOW memory", headers=key)
        answers = [first.result(), second.result()]
    assert [r.status_code for r in answers] == [200, 200]
    assert len(vllm.requests) == 1
    assert answers[1].headers["idempotent-replayed"] == "true"
    guard = Guard(url, limit=4096)
    contents = [s.message.content for s in guard.store.read("s1")]
    guard.close()
    assert contents == ["SLOW memory", "echo: SLOW memory"]


@pytest.mark.redis
def test_a_key_held_too_long_is_a_409_and_nothing_is_sent(
    start_gateway: Callable[..., str], vllm: FakeVLLM, redis_url: str, namespace: str
) -> None:
    gateway = start_gateway(
        url=redis_url, namespace=namespace, upstream_timeout=0.5, idempotency_lease=0.5
    )
    guard = Guard(redis_url, limit=4096, namespace=namespace)
    try:
        # another gateway holds the key and keeps renewing it
        assert guard.store.acquire_lease("s1", "busy-1", "elsewhere", 60)
        response = chat(gateway, "hello", headers={"Idempotency-Key": "busy-1"})
        assert response.status_code == 409
        assert response.json()["error"]["code"] == "idempotency_key_in_use"
        assert vllm.requests == []
        assert guard.store.read("s1") == []  # nothing stored
        assert guard.store.release_lease("s1", "busy-1", "elsewhere")
        again = chat(gateway, "hello", headers={"Idempotency-Key": "busy-1"})
        assert again.status_code == 200
        assert len(vllm.requests) == 1
    finally:
        guard.close()


@pytest.mark.redis
def test_a_key_written_as_a_body_lease_is_not_held_up_by_it(
    start_gateway: Callable[..., str], vllm: FakeVLLM, redis_url: str, namespace: str
) -> None:
    """An Idempotency-Key ``body:<sha256 of K>`` was the very lease name of K's body: a
    request with it waited for K's request, then was a 409, and held K's body lease (K's
    retries were a 422). Such a key now has a lease of its own (``key:<sha256>``)."""
    gateway = start_gateway(
        url=redis_url, namespace=namespace, upstream_timeout=0.5, idempotency_lease=0.5
    )
    guard = Guard(redis_url, limit=4096, namespace=namespace)
    body_lease = "body:" + hashlib.sha256(b"in-flight").hexdigest()
    try:
        # a request with the key "in-flight" runs elsewhere: it holds its body lease
        assert guard.store.acquire_lease("s1", body_lease, "its-body-digest", 60)
        response = chat(gateway, "hello", headers={"Idempotency-Key": body_lease})
        assert response.status_code == 200, response.text
        assert len(vllm.requests) == 1
        # the body lease is still the first request's alone
        assert not guard.store.acquire_lease("s1", body_lease, "another-digest", 60)
        assert guard.store.release_lease("s1", body_lease, "its-body-digest")
    finally:
        guard.close()
