"""A client that gives its messages their own ``id`` and reuses one with other content:
a 400 ``message_id_reused`` (not a 409, which the OpenAI SDKs retry: only a new id helps),
nothing stored, nothing sent upstream. The same id with the same message is a resend:
answered, stored once."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from .test_request_edges import post, refused
from .upstream import FakeVLLM

pytestmark = pytest.mark.redis


def user(content: str, msg_id: str = "c-1") -> dict[str, Any]:
    return {"role": "user", "content": content, "id": msg_id}


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_id_reused_with_other_content_is_a_400_and_nothing_is_stored_or_sent(
    gateway: str, vllm: FakeVLLM, snapshot: Callable[[str], Any], stream: bool
) -> None:
    first = post(gateway, {"model": "m", "messages": [user("hello")]})
    assert first.status_code == 200, first.text
    (messages, counts, audit), sent = snapshot("s1"), len(vllm.requests)
    body = {"model": "m", "messages": [user("new", "c-2"), user("changed")], "stream": stream}
    error = refused(post(gateway, body), 400, "message_id_reused")
    assert "'c-1'" in error["message"] and "new id" in error["message"]
    assert error["param"] == "messages"
    after = snapshot("s1")
    assert after[:2] == (messages, counts) and len(vllm.requests) == sent
    # what every refused request writes (docs/turn.md): one `refused` record, no content
    assert [r["kind"] for r in after[2][len(audit) :]] == ["refused"]
    assert "changed" not in str(after[2])


def test_the_same_client_id_with_the_same_message_is_a_resend(
    gateway: str, vllm: FakeVLLM, stored: Callable[..., list[dict[str, Any]]]
) -> None:
    assert post(gateway, {"model": "m", "messages": [user("hello")]}).status_code == 200
    again = post(gateway, {"model": "m", "messages": [user("hello")]})
    assert again.status_code == 200, again.text
    ids = [m["id"] for m in stored("s1")]
    assert ids.count("c-1") == 1 and len(ids) == 3  # hello, and a reply to each request
