"""Sessions written by the real Guard on a real Redis, for the CLI tests.

``redis_url`` and ``redis_namespace`` (a random namespace purged afterwards)
come from ``tests/conftest.py``. ``Cli`` runs the installed click group with
the store options already filled in.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import redis
from click.testing import CliRunner, Result

from ctxguard.cli import cli
from ctxguard.guard import ExtractiveSummarizer, Guard
from ctxguard.stores import open_store
from ctxguard.stores.base import SessionStore
from ctxguard.stores.keys import KeySpace

LIMIT = 900
CHAT = "chat/1 [main]*"  # glob and separator characters on purpose
TOOLS = "tools-1"
CORRUPT = "corrupt-1"
VIOLATION = "violation-1"


@dataclass
class Cli:
    """Invokes ``ctxguard`` against the test's store."""

    url: str
    namespace: str

    def __call__(self, *args: str, input: str | None = None) -> Result:  # noqa: A002
        env = {"CTXGUARD_URL": self.url, "CTXGUARD_NAMESPACE": self.namespace}
        return CliRunner().invoke(cli, list(args), env=env, input=input, catch_exceptions=False)

    def json(self, *args: str) -> Any:
        result = self(*args, "--json")
        assert result.exit_code in (0, 1), result.output + result.stderr
        return json.loads(result.stdout)


EXISTING = "already-there"


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
def target(  # the in-process store and the private Redis
    request: pytest.FixtureRequest, namespace: str
) -> Iterator[tuple[Cli, SessionStore]]:
    if request.param == "memory":
        url = f"memory://{namespace}"
    else:
        url = request.getfixturevalue("redis_url")
        request.getfixturevalue("redis_namespace")  # purges the namespace afterwards
    store = open_store(url, namespace=namespace)
    yield Cli(url, namespace), store
    for session in list(store.list_sessions()):
        store.delete(session)
    store.close()


@pytest.fixture
def run(redis_url: str, redis_namespace: str) -> Cli:
    return Cli(redis_url, redis_namespace)


@pytest.fixture
def store(redis_url: str, redis_namespace: str) -> Iterator[SessionStore]:
    opened = open_store(redis_url, namespace=redis_namespace)
    yield opened
    opened.close()


def long_text(turn: int, words: int = 60) -> str:
    return f"Turn {turn} question. " + " ".join(f"word{turn}x{i}" for i in range(words))


def chat_session(guard: Guard, session: str, turns: int) -> None:
    """A conversation long enough that the window drops messages and summaries get made."""
    guard.prepare(session, [{"role": "system", "content": "You are terse."}], max_tokens=100)
    for turn in range(turns):
        req = guard.prepare(session, [{"role": "user", "content": long_text(turn)}])
        usage = {"prompt_tokens": req.tokens + (turn % 3) * 4, "completion_tokens": 20}
        guard.complete(
            session,
            {"role": "assistant", "content": long_text(turn, 30)},
            prepared=req,
            usage=usage,
        )


def tool_session(guard: Guard, session: str, turns: int) -> None:
    """Turns with tool calls and results, so provider validity has something to check."""
    for turn in range(turns):
        guard.prepare(session, [{"role": "user", "content": f"weather {turn}?"}])
        call = {
            "id": f"call{turn}",
            "type": "function",
            "function": {"name": "weather", "arguments": json.dumps({"day": turn})},
        }
        guard.append(session, [{"role": "assistant", "content": None, "tool_calls": [call]}])
        req = guard.prepare(
            session, [{"role": "tool", "tool_call_id": f"call{turn}", "content": long_text(turn)}]
        )
        guard.complete(
            session,
            {"role": "assistant", "content": f"sunny {turn}"},
            prepared=req,
            usage={"prompt_tokens": req.tokens + 2},
        )


@pytest.fixture
def guard(redis_url: str, redis_namespace: str) -> Iterator[Guard]:
    g = Guard(
        redis_url,
        counter="approx",
        limit=LIMIT,
        namespace=redis_namespace,
        max_tokens=100,
        safety_margin=10,
        summarizer=ExtractiveSummarizer(max_chars=240, per_message_chars=40),
        summarize_after=4,
    )
    yield g
    g.close()


@pytest.fixture
def sessions(guard: Guard, store: SessionStore, redis_url: str, redis_namespace: str) -> None:
    """The four sessions the CLI tests read: chat, tools, one corrupt, one with a violation."""
    chat_session(guard, CHAT, 10)
    tool_session(guard, TOOLS, 5)
    chat_session(guard, CORRUPT, 2)
    plant_garbage(redis_url, redis_namespace, CORRUPT)
    chat_session(guard, VIOLATION, 2)
    plant_violation(store, VIOLATION)


def plant_garbage(url: str, namespace: str, session: str) -> None:
    """RPUSH a record that is not a message onto the session's message list."""
    key = KeySpace(namespace).session_keys(session)[1]
    client = redis.Redis.from_url(url)
    try:
        client.rpush(key, b"\xff{not json")
    finally:
        client.close()


def plant_violation(store: SessionStore, session: str) -> None:
    """A request record that says more was sent than the limit allowed."""
    record = {
        "turn": 0,
        "kind": "request",
        "sent_ids": [],
        "tokens": 5000,
        "limit": 1000,
        "limit_source": "planted",
        "reserved_output": 100,
        "safety_margin": 0,
        "overhead": 3,
        "message_count": 0,
        "dropped": [],
        "decisions": [],
        "policy": {},
        "summary_version": 0,
    }
    store.add_audit(session, record, retention=0)
