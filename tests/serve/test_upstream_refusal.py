"""An upstream 4xx that says the request itself is wrong (400, 404, 413, 415, 422 ...) takes
back what the request stored, by one checked ``store.retract`` against the state token the
request's own write left; a transient one (408, 409, 429, 5xx) keeps it stored once, as a
retry needs (tests/store_diff.py compares every key of the namespace, leases included)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from ctxguard.messages import Message
from ctxguard.stores import open_store
from ctxguard.stores.contract import NewMessage
from tests import store_diff

from .conftest import Start
from .test_refusal_matrix import CHAT, RESPONSES, _body, _post, _seeded, _settled
from .upstream import FakeVLLM

pytestmark = pytest.mark.redis

NEXT = [{"role": "user", "content": "next"}]
CASES = [
    pytest.param(CHAT, False, id="chat"),
    pytest.param(CHAT, True, id="chat-stream"),
    pytest.param(RESPONSES, False, id="responses"),
]


def _refused(
    vllm: FakeVLLM, status: int, gateway: str, path: str, body: Any, key: str | None
) -> httpx.Response:
    vllm.fail_status = status
    try:
        return _post(gateway, path, body, key)
    finally:
        vllm.fail_status = None


@pytest.mark.parametrize("status", [400, 404, 413, 415, 422])
@pytest.mark.parametrize("key", [None, "k-1"], ids=["no-key", "key"])
@pytest.mark.parametrize(("path", "stream"), CASES)
def test_a_request_the_upstream_refuses_is_taken_back(
    start_gateway: Start,
    vllm: FakeVLLM,
    redis_url: str,
    namespace: str,
    path: str,
    stream: bool,
    key: str | None,
    status: int,
) -> None:
    """The client gets the upstream's 4xx; the session is as before but for the request's
    record (it was sent), one ``retract`` record and the moved state token; no lease is
    left, so a corrected retry with a new key works."""
    with _seeded(start_gateway, redis_url, namespace, path) as (gateway, store):
        before = _settled(store, redis_url)
        sent = len(vllm.requests)
        body = _body(path, NEXT, {}, stream)
        answer = _refused(vllm, status, gateway, path, body, key)
        assert answer.status_code == status, answer.text
        assert answer.json()["error"]["code"] == "upstream_rejected"
        assert len(vllm.requests) == sent + 1
        after = _settled(store, redis_url)
        store_diff.assert_taken_back(before, after, also=("request",))
        trail = store.read_audit("s1")
        assert trail[-1]["kind"] == "retract" and len(trail[-1]["ids"]) == 1
        if key:  # the same key and body again: sent again, refused again, taken back again
            again = _refused(vllm, status, gateway, path, body, key)
            assert again.status_code == status, again.text
            assert len(vllm.requests) == sent + 2
            store_diff.assert_taken_back(before, _settled(store, redis_url), also=("request",))
        fixed = _post(gateway, path, _body(path, NEXT, {}, False), key and "k-2")
        assert fixed.status_code == 200, fixed.text
        roles = [(s.message.role, s.message.text) for s in store.read("s1")]
        assert roles[-2:] == [("user", "next"), ("assistant", "echo: next")]
        assert len(roles) == 4


@pytest.mark.parametrize("status", [408, 409, 429, 500, 503])
@pytest.mark.parametrize(("path", "stream"), CASES)
def test_a_transient_upstream_failure_keeps_the_message_stored_once(
    start_gateway: Start,
    vllm: FakeVLLM,
    redis_url: str,
    namespace: str,
    path: str,
    stream: bool,
    status: int,
) -> None:
    with _seeded(start_gateway, redis_url, namespace, path) as (gateway, store):
        seeded = [s.message.role for s in store.read("s1")]
        body = _body(path, NEXT, {}, stream)
        answer = _refused(vllm, status, gateway, path, body, None)
        assert answer.status_code >= 400, answer.text
        assert [s.message.role for s in store.read("s1")] == [*seeded, "user"]
        assert all(r["kind"] != "retract" for r in store.read_audit("s1"))
        if path == CHAT:  # a retry stores nothing twice (ids derived from the anchor)
            assert _post(gateway, path, body, None).status_code == 200
            assert [s.message.role for s in store.read("s1")] == [*seeded, "user", "assistant"]


@pytest.mark.parametrize(("path", "stream"), CASES)
def test_a_write_between_store_and_refusal_makes_the_take_back_skip(
    start_gateway: Start,
    vllm: FakeVLLM,
    redis_url: str,
    namespace: str,
    path: str,
    stream: bool,
) -> None:
    """Another writer appends to the session while the upstream holds the request: the
    checked retract is refused (the token moved), nothing is taken back, its message and
    the request's stay."""
    with _seeded(start_gateway, redis_url, namespace, path) as (gateway, store):
        seeded = [s.message.text for s in store.read("s1")]
        other = open_store(redis_url, namespace=namespace)

        def write(_: dict[str, Any]) -> None:
            other.append(
                "s1", [NewMessage(Message(role="user", content="another writer", id="other-1"))]
            )

        vllm.on_request = write
        try:
            answer = _refused(vllm, 400, gateway, path, _body(path, NEXT, {}, stream), None)
        finally:
            vllm.on_request = None
            other.close()
        assert answer.status_code == 400, answer.text
        texts = [s.message.text for s in store.read("s1")]
        assert texts == [*seeded, "next", "another writer"]
        assert all(r["kind"] != "retract" for r in store.read_audit("s1"))
