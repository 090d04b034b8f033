"""``ctxguard serve --commit with_reply``: a turn's new messages are stored with the reply,
in one step (``GuardConfig(commit="with_reply")``), so a request that gets no whole reply
leaves the store as it was: an upstream refusal (4xx: nothing to take back, no
``retract`` record), an upstream failure, a timeout, a stream cut short or a client that
goes away (no ``partial_reply`` record either). A good request stores the user's message,
the reply and one request record (with the server's usage). On /v1/chat/completions
(plain and streamed) and /v1/responses, with and without a session, with and without an
Idempotency-Key, on ``memory://``, Redis and Redis Cluster (tests/store_diff.py compares
every key of the namespace, leases included). The setting's doors: flag, variable, TOML
file."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from ctxguard.cli import cli
from ctxguard.errors import ConfigError
from ctxguard.serve.config import ServeConfig, load_config
from ctxguard.stores import open_store
from tests import store_diff
from tests.conftest import private_memory_url

from .conftest import Start
from .test_refusal_matrix import CHAT, RESPONSES, _body, _post, _settled
from .upstream import FakeVLLM

pytestmark = pytest.mark.timeout(180)

CASES = [
    pytest.param(CHAT, False, id="chat"),
    pytest.param(CHAT, True, id="chat-stream"),
    pytest.param(RESPONSES, False, id="responses"),
]


class Backend:
    """A gateway with ``commit="with_reply"`` on one store, its session ``s1`` holding one
    done turn, and a store open on the same namespace to snapshot."""

    def __init__(self, start: Start, url: str, namespace: str | None, path: str) -> None:
        self.start, self.url, self.namespace = start, url, namespace
        self.gateway = self.open()
        self.store = open_store(url, namespace=namespace)
        seed = _body(path, [{"role": "user", "content": "hello", "id": "c-1"}], {}, False)
        answer = _post(self.gateway, path, seed, "seed")
        assert answer.status_code == 200, answer.text

    def open(self, **settings: Any) -> str:
        return self.start(
            url=self.url,
            namespace=self.namespace,
            max_tokens=256,
            commit="with_reply",
            **settings,
        )

    def snapshot(self) -> store_diff.Snapshot:
        return _settled(self.store, self.url)

    def assert_unchanged(self, before: store_diff.Snapshot, seconds: float = 0.0) -> None:
        """Nothing stored (and, for ``seconds``, nothing arrives late: a finish callback
        runs after the client has its answer)."""
        deadline = time.monotonic() + seconds
        while True:
            after = self.snapshot()
            assert after == before, "\n".join(store_diff.changes(before, after))
            if time.monotonic() >= deadline:
                return
            time.sleep(0.05)

    def turns(self) -> list[tuple[str, str]]:
        return [(s.message.role, s.message.text) for s in self.store.read("s1")]

    def kinds(self) -> list[str]:
        return [str(r.get("kind")) for r in self.store.read_audit("s1")]


@pytest.fixture(
    params=[
        "memory",
        pytest.param("redis_url", marks=pytest.mark.redis, id="redis"),
        pytest.param("cluster_url", marks=pytest.mark.cluster, id="cluster"),
    ]
)
def store_at(request: pytest.FixtureRequest, namespace: str) -> tuple[str, str | None]:
    """(store URL, namespace): a private memory:// store, or the run's Redis or Redis
    Cluster (the suite's private servers; the namespace is purged afterwards)."""
    if request.param == "memory":
        return private_memory_url(), None
    url: str = request.getfixturevalue(request.param)
    return url, namespace


@pytest.fixture
def seeded(
    start_gateway: Start, store_at: tuple[str, str | None]
) -> Iterator[Callable[[str], Backend]]:
    made: list[Backend] = []

    def make(path: str) -> Backend:
        backend = Backend(start_gateway, store_at[0], store_at[1], path)
        made.append(backend)
        return backend

    yield make
    for backend in made:
        backend.store.close()


def _refused(
    vllm: FakeVLLM, status: int, gateway: str, path: str, body: Any, key: str | None
) -> httpx.Response:
    vllm.fail_status = status
    try:
        return _post(gateway, path, body, key)
    finally:
        vllm.fail_status = None


NEXT = [{"role": "user", "content": "next"}]


@pytest.mark.parametrize("status", [400, 422, 429, 500, 503])
@pytest.mark.parametrize("key", [None, "k-1"], ids=["no-key", "key"])
@pytest.mark.parametrize(("path", "stream"), CASES)
def test_a_request_the_upstream_refuses_or_fails_stores_nothing(
    seeded: Callable[[str], Backend],
    vllm: FakeVLLM,
    path: str,
    stream: bool,
    key: str | None,
    status: int,
) -> None:
    """A 4xx the request itself earned (400, 422), a transient one (429) or a failure
    (5xx): the store is as before, not one record more (no retract: nothing to take
    back); the same request again, answered, stores the turn once."""
    backend = seeded(path)
    before = backend.snapshot()
    seeded_turns = backend.turns()
    sent = len(vllm.requests)
    answer = _refused(vllm, status, backend.gateway, path, _body(path, NEXT, {}, stream), key)
    assert answer.status_code >= 400, answer.text
    assert len(vllm.requests) == sent + 1
    backend.assert_unchanged(before)
    fixed = _post(backend.gateway, path, _body(path, NEXT, {}, stream), key)
    assert fixed.status_code == 200, fixed.text
    assert backend.turns() == [*seeded_turns, ("user", "next"), ("assistant", "echo: next")]
    assert "retract" not in backend.kinds()


@pytest.mark.parametrize("key", [None, "k-1"], ids=["no-key", "key"])
@pytest.mark.parametrize(("path", "stream"), CASES)
def test_a_good_request_stores_the_turn_and_one_record(
    seeded: Callable[[str], Backend], vllm: FakeVLLM, path: str, stream: bool, key: str | None
) -> None:
    """The user's message, the reply and ONE request record (completed, with the usage
    the server reported) arrive together; a replayed key stores nothing more."""
    backend = seeded(path)
    turns, kinds = backend.turns(), backend.kinds()
    answer = _post(backend.gateway, path, _body(path, NEXT, {}, stream), key)
    assert answer.status_code == 200, answer.text
    assert backend.turns() == [*turns, ("user", "next"), ("assistant", "echo: next")]
    assert backend.kinds() == [*kinds, "request"]
    record = backend.store.read_audit("s1")[-1]
    assert record["completed"] is True and record["prompt_tokens"] == vllm.prompt_tokens[-1]
    if key:
        before = backend.snapshot()
        again = _post(backend.gateway, path, _body(path, NEXT, {}, stream), key)
        assert again.status_code == 200, again.text
        assert again.headers.get("idempotent-replayed") == "true" or path == RESPONSES
        backend.assert_unchanged(before)


def test_a_client_that_goes_away_mid_stream_leaves_nothing(
    seeded: Callable[[str], Backend], vllm: FakeVLLM
) -> None:
    backend = seeded(CHAT)
    before = backend.snapshot()
    body = _body(CHAT, [{"role": "user", "content": "STALL here"}], {}, True)
    with (
        httpx.Client(timeout=30) as client,
        client.stream(
            "POST", backend.gateway + CHAT, json=body, headers={"X-Session-Id": "s1"}
        ) as response,
    ):
        assert response.status_code == 200
        first = next(line for line in response.iter_lines() if line.startswith("data: "))
        assert "assistant" in first
        assert vllm.stall_started.wait(20)
    deadline = time.monotonic() + 20
    while vllm.cancelled < 1:  # the relay saw the client go: the upstream is cancelled
        assert time.monotonic() < deadline, "the upstream request was never cancelled"
        time.sleep(0.02)
    backend.assert_unchanged(before, seconds=1.0)  # (no partial_reply record, even late)


@pytest.mark.parametrize(
    ("text", "stream"),
    [("CUT here", True), ("ERRSTREAM here", True), ("STALL here", True), ("SLOW here", False)],
    ids=["cut", "error-event", "stream-timeout", "timeout"],
)
def test_a_reply_that_never_finishes_leaves_nothing(
    seeded: Callable[[str], Backend], vllm: FakeVLLM, text: str, stream: bool
) -> None:
    """The upstream ends the stream early, puts an error in it, or goes quiet past
    ``upstream_timeout`` (streamed or not): the client is told, nothing is stored."""
    backend = seeded(CHAT)
    gateway = backend.open(upstream_timeout=0.5)
    before = backend.snapshot()
    answer = _post(
        gateway, CHAT, _body(CHAT, [{"role": "user", "content": text}], {}, stream), None
    )
    if stream:
        assert answer.status_code == 200 and "[DONE]" not in answer.text
    else:
        assert answer.status_code == 504, answer.text
    backend.assert_unchanged(before, seconds=0.5)


@pytest.mark.parametrize(("path", "stream"), CASES)
def test_a_turn_another_gateway_stored_is_in_the_next_prompt(
    seeded: Callable[[str], Backend], vllm: FakeVLLM, path: str, stream: bool
) -> None:
    """Gateway A's window of ``s1`` is cached (the seed went through it); gateway B, on the
    same store, stores a turn. A's next request reads the session's state token, finds
    its copy stale and plans afresh: the upstream sees B's turn, and A's record names
    no ``unseen`` positions (on the cluster the token is a plain read, not sent ahead)."""
    backend = seeded(path)
    other = backend.open()
    by_b = _post(other, path, _body(path, [{"role": "user", "content": "from b"}], {}, False), None)
    assert by_b.status_code == 200, by_b.text
    answer = _post(backend.gateway, path, _body(path, NEXT, {}, stream), None)
    assert answer.status_code == 200, answer.text
    texts = ["hello", "echo: hello", "from b", "echo: from b", "next"]
    sent = vllm.requests[-1]["messages"]
    assert [m["content"] for m in sent if m["role"] != "system"] == texts
    assert [text for _, text in backend.turns()] == [*texts, "echo: next"]
    assert "unseen" not in backend.store.read_audit("s1")[-1]


@pytest.mark.parametrize(("path", "stream"), CASES)
def test_without_a_session_nothing_is_stored(
    seeded: Callable[[str], Backend], vllm: FakeVLLM, path: str, stream: bool
) -> None:
    backend = seeded(path)
    before = backend.snapshot()
    if path == CHAT:
        body: dict[str, Any] = {"model": "m", "messages": NEXT, "stream": stream}
    else:
        body = {"model": "m", "input": "next", "store": False}
    good = httpx.post(backend.gateway + path, json=body, timeout=30)
    assert good.status_code == 200, good.text
    vllm.fail_status = 400
    try:
        refused = httpx.post(backend.gateway + path, json=body, timeout=30)
    finally:
        vllm.fail_status = None
    assert refused.status_code == 400, refused.text
    backend.assert_unchanged(before)


# -- the setting ------------------------------------------------------------------------------


def test_the_setting_at_every_door(tmp_path: Path) -> None:
    assert ServeConfig(upstream="http://x").commit == "prepare"  # the default
    env = {"CTXGUARD_SERVE_UPSTREAM": "http://x", "CTXGUARD_SERVE_COMMIT": "with_reply"}
    assert load_config({}, environ=env).commit == "with_reply"
    assert load_config({"commit": "prepare"}, environ=env).commit == "prepare"  # flag wins
    file = tmp_path / "gateway.toml"
    file.write_text('[serve]\nupstream = "http://x"\ncommit = "with_reply"\n')
    assert load_config({}, config_file=file, environ={}).commit == "with_reply"
    assert '"commit": "with_reply"' in load_config({}, config_file=file, environ={}).to_json()

    match = r"^commit must be one of prepare, with_reply\b.*got 'later'$"
    with pytest.raises(ConfigError, match=match):
        ServeConfig(upstream="http://x", commit="later")
    with pytest.raises(ConfigError, match=match):
        load_config({}, environ={**env, "CTXGUARD_SERVE_COMMIT": "later"})
    file.write_text('upstream = "http://x"\ncommit = "later"\n')
    with pytest.raises(ConfigError, match=match):
        load_config({}, config_file=file, environ={})
    result = CliRunner().invoke(  # (an address it cannot listen on, should the check go)
        cli,
        ["serve", "--upstream", "http://x", "--commit", "later", "--host", "256.0.0.1"],
        env={},
    )
    assert result.exit_code == 2, result.output
    assert len(result.output.strip().splitlines()) == 1
    assert "commit must be one of prepare, with_reply" in result.output
    help_text = " ".join(CliRunner().invoke(cli, ["serve", "--help"]).output.split())
    assert "--commit TEXT When a turn is stored: prepare" in help_text
