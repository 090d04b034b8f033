"""Text that other code wrote never carries a secret into a record, an event or a log.

A summarizer is the user's code: what it raises becomes the ``summary_failed``
record's ``error`` and the observer's :class:`SummaryEvent` ``error``; a background
summary that raises (a user's store that fails, a damaged session) is logged, since
nobody awaits it. Each of those texts goes through :func:`ctxguard._secrets.redact_text`:
every store URL form of ``test_secret_property`` (passwords from every URL-special
character, raw and encoded, in the userinfo and the query, cluster URLs) in every way a
message wraps a URL, and bearer credentials, leave no piece of the secret.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import Any
from urllib.parse import quote

import pytest
from hypothesis import given
from hypothesis import strategies as st
from local_http import JsonServer

from ctxguard import CtxGuardError, Message, OperationEvent, StoreConnectionError, load_counter
from ctxguard._secrets import describe, forget_in_chain, redact_text
from ctxguard.guard import AsyncGuard, Guard
from ctxguard.stores.base import RecordWrite
from ctxguard.stores.memory import AsyncMemoryStore, MemoryStore
from security.test_secret_property import SETTINGS, every_text, leaks, passwords, url_forms

WRAPS = [
    "cannot reach {}",
    "ConnectionError('{}')",
    'error: "{}", retrying',
    "url={}, attempt 2",
    "(see {})",
    "{}.",
    "first {} then {}",  # two URLs on one line
    "line one\n{}\nline three",
    "glued{}",
]


def wrapped(wrap: str, url: str) -> str:
    return wrap.format(*[url] * wrap.count("{}"))


@SETTINGS
@given(password=passwords, form=st.integers(0, 9), wrap=st.sampled_from(WRAPS))
def test_no_piece_of_a_url_password_survives_redaction(password: str, form: int, wrap: str) -> None:
    text = wrapped(wrap, url_forms(password, "10.0.0.7:6380")[form])
    shown = redact_text(text)
    assert not leaks(shown, password), (text, shown)
    assert "10.0.0.7" in shown or "@" in text.split("10.0.0.7")[-1]  # the host is kept


@pytest.mark.parametrize(
    "text",
    [
        "Authorization: Bearer QJsk-ZXW0123456789",
        "HTTP 401 (bearer QJsk-ZXW0123456789)",
        "Authorization: Basic QJdXNlcjpwZXW=",
        "https://user:QJ-secret-ZXW@api.example.com/v1/chat?x=1",
        "https://api.example.com/v1?api_key=QJ-secret-ZXW&model=m",
        "unix://:QJ-secret-ZXW@/var/run/redis.sock",
        "HTTPS://USER:QJ-secret-ZXW@API.EXAMPLE.COM",
        "averyveryveryverylongwordredis://:QJ-secret-ZXW@h:1",
        # named secrets: headers, dict entries, keywords, a scheme-less URL's query
        "Max retries exceeded with url: /v1beta/models/g:generateContent?key=QJ-ZXW (Caused by",
        "{'api_key': 'QJ-secret-ZXW', 'model': 'm'}",
        '{"password": "QJ-secret-ZXW"}',
        "x-api-key: QJ-secret-ZXW",
        "Authorization: Token QJ-secret ZXW",
        "Proxy-Authorization: Digest QJ-secret, ZXW",
        "access_token=QJ-secret-ZXW&scope=x",
        "client(secret='QJ-secret-ZXW')",
        # a name that goes on after a word that always means a secret
        "secret_key: QJ-secret-ZXW",
        "aws_secret_access_key=QJ-secret-ZXW",
        "{'private_key_pem': 'QJ-secret-ZXW'}",
        "SMTP_PASSWORD_FILE_CONTENTS: QJ-secret-ZXW",
    ],
)
def test_credentials_in_other_forms_are_hidden(text: str) -> None:
    shown = redact_text(text)
    assert "QJ" not in shown and "ZXW" not in shown, shown


def test_text_without_a_secret_is_kept() -> None:
    text = "see https://docs.example.com/errors#limit (redis://127.0.0.1:6380/0 is down)"
    assert redact_text(text) == text
    kept = [
        "max_tokens: 512",
        "tokens: 4096",
        "completion_tokens=12",
        "the primary key: id",
        "tiktoken:cl100k_base",
        "hf:/m/token:x",
        "secrets_manager:aws",
    ]
    for plain in kept:
        assert redact_text(plain) == plain
    assert redact_text("x" * 1000, limit=10) == "x" * 9 + "…"
    assert describe(RuntimeError("model overloaded")) == "RuntimeError: model overloaded"


@SETTINGS
@given(password=passwords, form=st.integers(0, 9), into=st.integers(1, 50))
def test_a_cut_never_shows_a_piece_of_a_password(password: str, form: int, into: int) -> None:
    """The text is cut before it is redacted (the work bounded: 4,096 characters here),
    and the cut may fall inside a URL whose "@" lies past it. Its line comes into view
    when a long credential before it shrinks to ``***``: no piece of the password shows."""
    url = url_forms(password, "10.0.0.7:6380")[form]
    first = "a://u:" + "z" * 4036 + "@h\n"  # 4,045 characters, shown as a://***@h
    text = first + "y" * (51 - into) + f" {url} more"  # the cut: `into` characters in
    shown = redact_text(text, limit=512)
    assert shown.startswith("a://***@h\n")
    assert not leaks(shown, password), shown


@pytest.mark.timeout(30)
def test_redaction_is_linear_in_the_text() -> None:
    """50,000 URLs, then 20 MB more of their line with no "@": each line's last "@" is
    looked for once (looking again from every URL scans a terabyte)."""
    text = "redis://:pw@h:1 " + "a://b " * 50_000 + "." * 20_000_000
    shown = redact_text(text)
    assert shown.startswith("redis://:***@h:1 ") and shown.count("a://b") == 50_000


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text")


def test_an_exception_whose_text_fails_is_still_described() -> None:
    assert describe(Unprintable()) == "Unprintable: <its text could not be made>"


SECRET = "QJpw:/@ZXW"
LEAKY = f"upstream refused: redis://:{SECRET}@10.0.0.7:6380/0 (Authorization: Bearer {SECRET})"


def leaky(_: str | None, __: Sequence[Message]) -> str:
    raise RuntimeError(LEAKY + " " + "padding " * 20_000)


def settings(summarizer: Any, mode: str = "inline") -> dict[str, Any]:
    return dict(
        counter="approx",
        limit=400,
        max_tokens=50,
        summarizer=summarizer,
        summarize_after=4,
        summary_mode=mode,
        summary_timeout=5.0,
    )


def turn(i: int) -> tuple[list[dict[str, str]], dict[str, str]]:
    ask = [{"role": "user", "content": f"question {i} " + "about things " * 8}]
    return ask, {"role": "assistant", "content": f"answer {i} " + "it depends " * 8}


def test_a_known_secret_leaves_every_exception_of_a_chain() -> None:
    """``forget_in_chain``: causes and contexts (a cycle too) lose the secret, in every
    form given; an exception without it, or whose text fails, is left as it was."""

    class Unprintable(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no")

    top, cause, context, plain = (
        RuntimeError("top pw%3A1"),
        ValueError("AUTH `pw:1`"),
        OSError(5, "pw:1 refused"),
        KeyError("nothing here"),
    )
    odd = Unprintable("pw:1")
    top.__cause__, cause.__context__, context.__context__ = cause, context, odd
    odd.__context__ = plain
    plain.__context__ = top  # a cycle: it ends
    forget_in_chain(top, ("pw%3A1", "pw:1"))
    assert [str(e) for e in (top, cause, context, plain)] == [
        "top ***",
        "AUTH `***`",
        "[Errno 5] *** refused",
        "'nothing here'",
    ]
    assert plain.args == ("nothing here",) and odd.args == ("***",)


def test_a_summarizers_error_is_recorded_and_reported_redacted_and_cut() -> None:
    events: list[OperationEvent] = []
    guard = Guard(f"memory://{uuid.uuid4().hex}", observer=events.append, **settings(leaky))
    for i in range(8):
        ask, answer = turn(i)
        guard.prepare("s", ask)
        guard.complete("s", answer)
    failed = [r for r in guard.store.read_audit("s") if r["kind"] == "summary_failed"]
    reported = [s.error or "" for e in events for s in e.summaries if s.outcome == "failed"]
    assert failed and reported
    for text in [r["error"] for r in failed] + reported:
        assert text.startswith("RuntimeError: upstream refused: redis://")
        assert not leaks(text, SECRET), text[:300]
        assert len(text) <= 520  # 160 KB raised; the record keeps a line's worth
    guard.close()


class FailingRecords(MemoryStore):
    """A user's store whose summary records cannot be written, with a secret in the error."""

    def record(self, session_id: str, write: RecordWrite) -> int:
        if write.audit is not None and str(write.audit.get("kind")).startswith("summary"):
            raise StoreConnectionError(LEAKY)
        return super().record(session_id, write)


class AsyncFailingRecords(AsyncMemoryStore):
    async def record(self, session_id: str, write: RecordWrite) -> int:
        if write.audit is not None and str(write.audit.get("kind")).startswith("summary"):
            raise StoreConnectionError(LEAKY)
        return await super().record(session_id, write)


def background_warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.name == "ctxguard.guard" and "background summary" in r.getMessage()
    ]


def assert_logged_once_redacted(caplog: pytest.LogCaptureFixture) -> None:
    (warning,) = background_warnings(caplog)  # one summary ran, one line
    text = warning.getMessage()
    assert warning.levelno == logging.WARNING
    assert text.startswith("background summary of session 's' failed: StoreConnectionError:")
    assert "\n" not in text and not leaks(caplog.text, SECRET), caplog.text


def test_a_background_summary_that_raises_is_logged_redacted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    guard = Guard(FailingRecords(), **settings(lambda _p, _m: "short summary", "background"))
    for i in range(6):  # the first summary is asked for by the 6th prepare
        ask, answer = turn(i)
        guard.prepare("s", ask)
        guard.complete("s", answer)
    guard.wait_for_summaries(timeout=10)
    deadline = time.monotonic() + 10  # (a future's callbacks run just after its waiters wake)
    while not background_warnings(caplog) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert_logged_once_redacted(caplog)
    guard.close()


async def test_a_background_summary_that_raises_is_logged_and_retrieved(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    unhandled: list[dict[str, Any]] = []
    asyncio.get_running_loop().set_exception_handler(lambda _loop, ctx: unhandled.append(ctx))
    guard = AsyncGuard(
        AsyncFailingRecords(), **settings(lambda _p, _m: "short summary", "background")
    )
    for i in range(6):
        ask, answer = turn(i)
        await guard.prepare("s", ask)
        await guard.complete("s", answer)
    # not wait_for_summaries: its gather would retrieve the error; nobody awaits the task
    deadline = time.monotonic() + 10
    while not background_warnings(caplog) and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0)
    gc.collect()  # a task whose error nobody retrieved complains when it is collected
    assert [c.get("message") for c in unhandled] == []
    assert_logged_once_redacted(caplog)
    await guard.aclose()


KEY = "sk-QJ-upstream-ZXW"


@pytest.fixture
def refusing_vllm() -> Iterator[tuple[JsonServer, dict[str, Any]]]:
    """A /tokenize that counts (for the counter's probes) until told to refuse, then
    echoes what it was sent, as servers and proxies do in their errors."""
    mode: dict[str, Any] = {"status": 200, "shape": "error"}

    def answer(path: str, body: Any, headers: Mapping[str, str]) -> tuple[int, Any]:
        if mode["status"] == 200:
            return 200, {"count": 7 * len(body.get("messages", [])) + 3}
        echo = (
            f"invalid key {KEY} in {headers.get('Authorization')} for "
            f"https://user:{SECRET}@proxy.example/v1 (x-api-key: {SECRET})"
        )
        return mode["status"], {"error": {"message": echo}} if mode["shape"] == "error" else echo

    server = JsonServer(answer)
    yield server, mode
    server.close()


@pytest.mark.parametrize("status", [400, 401, 500])
@pytest.mark.parametrize("shape", ["error", "text"])
def test_a_model_servers_refusal_is_shown_without_credentials(
    refusing_vllm: tuple[JsonServer, dict[str, Any]], status: int, shape: str
) -> None:
    server, mode = refusing_vllm
    counter = load_counter(f"vllm:{server.url}", headers={"Authorization": f"Bearer {KEY}"})
    mode.update(status=status, shape=shape)
    with pytest.raises(CtxGuardError) as caught:
        counter.count_request([Message(role="user", content="hi")])
    text = every_text(caught.value)
    assert "invalid key" in text  # the server's reason is shown
    assert not leaks(text, SECRET) and "QJ-upstream" not in text, text


@pytest.mark.parametrize("status", [400, 502])
def test_a_model_servers_many_line_refusal_is_shown_on_one_line(status: int) -> None:
    """(a proxy's HTML error page came through line for line: an error of four lines)"""
    mode = {"status": 200}
    page = "<html>\r\n<body>\n  <h1>502 Bad Gateway</h1>\r\n</body>\n</html>\n"

    def answer(path: str, body: Any, headers: Mapping[str, str]) -> tuple[int, Any]:
        if mode["status"] == 200:
            return 200, {"count": 7 * len(body.get("messages", [])) + 3}
        return mode["status"], page

    server = JsonServer(answer)
    try:
        counter = load_counter(f"vllm:{server.url}")
        mode["status"] = status
        with pytest.raises(CtxGuardError) as caught:
            counter.count_request([Message(role="user", content="hi")])
    finally:
        server.close()
    message = str(caught.value)
    assert "\n" not in message and "\r" not in message, message
    assert "<html> <body> <h1>502 Bad Gateway</h1> </body> </html>" in message


def test_a_counter_spec_is_recorded_without_its_credentials(
    refusing_vllm: tuple[JsonServer, dict[str, Any]],
) -> None:
    server, _ = refusing_vllm
    host = server.url.removeprefix("http://")
    password = quote(SECRET, safe="")  # as a URL must carry it
    guard = Guard(
        f"memory://{uuid.uuid4().hex}", counter=f"vllm:http://user:{password}@{host}", limit=1000
    )
    guard.prepare("s", [{"role": "user", "content": "hi"}], max_tokens=10)
    (record,) = guard.store.read_audit("s")
    assert record["counter_spec"] == f"vllm:http://***@{host}"
    guard.close()
