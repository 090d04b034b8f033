"""OpenAISummarizer against a local OpenAI-compatible endpoint (real HTTP, no network)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from local_http import JsonServer

from ctxguard import ConfigError, Guard, Message, OpenAISummarizer, SummarizerError
from tests.conftest import private_memory_url


class Endpoint:
    """A /v1/chat/completions endpoint that records requests and answers as told."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.status = 200
        self.body: Any = {"choices": [{"message": {"role": "assistant", "content": "SUMMARY"}}]}
        self.server = JsonServer(self.answer)
        self.url = f"{self.server.url}/v1"

    def answer(self, path: str, body: Any, headers: Mapping[str, str]) -> tuple[int, Any]:
        self.requests.append({"path": path, "auth": headers.get("Authorization"), "json": body})
        return self.status, self.body


@pytest.fixture
def endpoint() -> Iterator[Endpoint]:
    server = Endpoint()
    yield server
    server.server.close()


MESSAGES = [
    Message(role="user", content="Where is order 1138?"),
    Message(role="assistant", content="In Lyon."),
]


def test_summarizer_posts_the_transcript_with_the_key_from_the_environment(
    endpoint: Endpoint, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SUMMARY_KEY", "sk-local")
    summarize = OpenAISummarizer(endpoint.url, "small-model", api_key_env="SUMMARY_KEY")
    assert summarize("earlier: a refund", MESSAGES) == "SUMMARY"
    sent = endpoint.requests[0]
    assert sent["path"] == "/v1/chat/completions" and sent["auth"] == "Bearer sk-local"
    assert sent["json"]["model"] == "small-model"
    transcript = sent["json"]["messages"][-1]["content"]
    assert "earlier: a refund" in transcript and "user: Where is order 1138?" in transcript


async def test_async_summarizer_uses_the_same_request(endpoint: Endpoint) -> None:
    summarize = OpenAISummarizer(endpoint.url, "small-model")
    assert await summarize.acall(None, MESSAGES) == "SUMMARY"
    assert endpoint.requests[0]["auth"] is None  # no key in the environment, none sent


@pytest.mark.parametrize(
    ("status", "body", "needle"),
    [(500, {"error": "overloaded"}, "HTTP 500"), (200, {"choices": []}, "unexpected body")],
)
def test_endpoint_failures_are_summarizer_errors(
    endpoint: Endpoint, status: int, body: Any, needle: str
) -> None:
    endpoint.status, endpoint.body = status, body
    with pytest.raises(SummarizerError, match=needle):
        OpenAISummarizer(endpoint.url, "m")(None, MESSAGES)


def test_unreachable_endpoint_is_a_summarizer_error() -> None:
    with pytest.raises(SummarizerError):
        OpenAISummarizer("http://127.0.0.1:9/v1", "m", timeout=1)(None, MESSAGES)
    with pytest.raises(ConfigError):
        OpenAISummarizer("localhost:8000", "m")


SECRET = "Summ3rySecret"


@pytest.mark.parametrize(
    "base_url",
    [f"http://user:{SECRET}@127.0.0.1:9/v1", f"http://:{SECRET}@127.0.0.1:9/v1"],
)
async def test_credentials_in_the_endpoint_url_never_reach_errors_or_the_audit_trail(
    base_url: str,
) -> None:
    summarizer = OpenAISummarizer(base_url, "m", timeout=1)
    with pytest.raises(SummarizerError) as sync_error:
        summarizer(None, MESSAGES)
    with pytest.raises(SummarizerError) as async_error:
        await summarizer.acall(None, MESSAGES)
    for caught in (sync_error, async_error):
        assert SECRET not in str(caught.value) and "127.0.0.1:9" in str(caught.value)
    with pytest.raises(ConfigError) as bad_scheme:
        OpenAISummarizer(base_url.replace("http", "ftp", 1), "m")
    assert SECRET not in str(bad_scheme.value)
    guard = Guard(
        private_memory_url(),
        counter="approx",
        limit=300,
        max_tokens=40,
        summarizer=summarizer,
        summarize_after=1,
    )
    for i in range(6):
        guard.prepare("s", [{"role": "user", "content": f"question {i} " + "words " * 12}])
        guard.complete("s", {"role": "assistant", "content": "answer " * 10})
    records = guard.store.read_audit("s")
    assert any(r["kind"] == "summary_failed" for r in records)
    assert SECRET not in repr(records)


def test_guard_uses_the_endpoint_for_its_rolling_summary(endpoint: Endpoint) -> None:
    guard = Guard(
        private_memory_url(),
        counter="approx",
        limit=300,
        max_tokens=40,
        summarizer=OpenAISummarizer(endpoint.url, "m"),
        summarize_after=3,
    )
    for i in range(12):
        req = guard.prepare("s", [{"role": "user", "content": f"question {i} " + "words " * 12}])
        guard.complete("s", {"role": "assistant", "content": "answer " * 10})
    assert req.summary_version >= 1 and "SUMMARY" in req.messages[0].text
    assert endpoint.requests and req.tokens + req.reserved_output <= req.limit


@pytest.mark.timeout(30)
@pytest.mark.parametrize("mode", ["headers", "body"])
async def test_a_drip_feeding_endpoint_cannot_hold_the_summarizer(mode: str) -> None:
    from drip_server import drip_server

    with drip_server(mode) as server:
        summarizer = OpenAISummarizer(f"{server.url}/v1", "m", timeout=1)
        expected = f"no complete answer from {server.url}/v1/chat/completions within 1 s (deadline)"
        with pytest.raises(SummarizerError) as info:
            summarizer(None, MESSAGES)
        assert str(info.value) == expected
        with pytest.raises(SummarizerError) as info:
            await summarizer.acall(None, MESSAGES)
        assert str(info.value) == expected


@pytest.mark.timeout(30)
async def test_an_endless_fast_body_is_cut_at_the_size_cap() -> None:
    from drip_server import drip_server

    with drip_server("flood") as server:
        summarizer = OpenAISummarizer(f"{server.url}/v1", "m", timeout=60)
        with pytest.raises(SummarizerError, match="more than 16 MiB"):
            summarizer(None, MESSAGES)
        with pytest.raises(SummarizerError, match="more than 16 MiB"):
            await summarizer.acall(None, MESSAGES)
