"""A password in an HTTP URL (vLLM's /tokenize, /v1/models, a summarizer, /metrics) is
sent as Basic auth and never appears in a log line or an exception of the chain.

(httpx logs every request's URL at INFO, and each of its exceptions keeps the request:
``http://admin:pw@host`` reached the log as it was, and the exception a typed error was
raised from held it.) Every caller of ctxguard's HTTP helper, sync and async, against a
server that answers 500 (the request is made and logged) and a port nobody listens on.
"""

from __future__ import annotations

import asyncio
import base64
import logging
from collections.abc import Callable, Iterator
from urllib.parse import quote

import pytest
from faults.servers import free_port
from local_http import QuietHandler, Serving

from ctxguard import ConfigError, CtxGuardError, Message, ServerLimit, load_counter
from ctxguard.guard.summarizers import OpenAISummarizer
from ctxguard.observe.pressure import PressureMonitor
from security.test_secret_property import every_text, leaks

SECRET = "pw:S3cr@t/&%"
USER = "admin"


class Seen:
    def __init__(self) -> None:
        self.authorizations: list[str | None] = []


@pytest.fixture
def server() -> Iterator[tuple[str, Seen]]:
    """Answers every GET and POST with HTTP 500, keeping the Authorization it was sent."""
    seen = Seen()

    class Handler(QuietHandler):
        def do_GET(self) -> None:
            seen.authorizations.append(self.headers.get("Authorization"))
            self.send(500, b"{}", "application/json")

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            self.do_GET()

    serving = Serving(Handler)
    yield serving.url.removeprefix("http://"), seen
    serving.close()


def _vllm(url: str) -> Callable[[], object]:
    # loading asks the server already (its template, its limit)
    hi = [Message(role="user", content="hi")]
    return lambda: load_counter(f"vllm:{url}", timeout=3).count_request(hi)


def _summarizer(url: str, run_async: bool) -> Callable[[], object]:
    summarize = OpenAISummarizer(url + "/v1", "m", timeout=3)
    messages = [Message(role="user", content="hi")]
    if run_async:
        return lambda: asyncio.run(summarize.acall(None, messages))
    return lambda: summarize(None, messages)


def _limit(url: str, run_async: bool) -> Callable[[], object]:
    limit = ServerLimit(url, timeout=3)
    return (lambda: asyncio.run(limit.aresolve())) if run_async else limit.resolve


def _metrics(url: str, run_async: bool) -> Callable[[], object]:
    monitor = PressureMonitor(url + "/metrics", interval=0, timeout=3)

    def run() -> object:
        if run_async:
            asyncio.run(monitor.asample())
        else:
            monitor.sample()
        raise ConfigError(f"(the monitor keeps its error as a name: {monitor.error})")

    return run


CALLERS: dict[str, Callable[[str], Callable[[], object]]] = {
    "vllm counter": _vllm,
    "summarizer": lambda url: _summarizer(url, False),
    "summarizer async": lambda url: _summarizer(url, True),
    "ServerLimit": lambda url: _limit(url, False),
    "ServerLimit async": lambda url: _limit(url, True),
    "PressureMonitor": lambda url: _metrics(url, False),
    "PressureMonitor async": lambda url: _metrics(url, True),
}


def _chain_text(exc: BaseException) -> str:
    """Every exception's text, args and request (httpx keeps one on its errors)."""
    parts = [every_text(exc)]
    seen: BaseException | None = exc
    while seen is not None:
        request = getattr(seen, "_request", None)
        if request is not None:
            parts += [repr(request), str(request.url)]
        seen = seen.__cause__ or seen.__context__
    return "\n".join(parts)


def _run(call: Callable[[], object]) -> str:
    try:
        call()
    except CtxGuardError as exc:
        return _chain_text(exc)
    raise AssertionError("the call did not fail")


@pytest.mark.parametrize("caller", sorted(CALLERS))
def test_a_url_password_goes_as_basic_auth_and_into_no_log_line(
    server: tuple[str, Seen], caller: str, caplog: pytest.LogCaptureFixture
) -> None:
    host, seen = server
    caplog.set_level(logging.DEBUG)
    caplog.set_level(logging.DEBUG, logger="httpx")  # whatever an earlier test set it to
    url = f"http://{USER}:{quote(SECRET, safe='')}@{host}"
    text = _run(CALLERS[caller](url))
    expected = "Basic " + base64.b64encode(f"{USER}:{SECRET}".encode()).decode()
    assert seen.authorizations and set(seen.authorizations) == {expected}
    assert "HTTP Request" in caplog.text  # httpx logged the request ...
    assert not leaks(caplog.text, SECRET), caplog.text  # ... without the password
    assert not leaks(text, SECRET), text


@pytest.mark.parametrize("caller", sorted(CALLERS))
def test_a_url_password_is_in_no_exception_of_a_failed_connection(
    caller: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    url = f"http://{USER}:{quote(SECRET, safe='')}@127.0.0.1:{free_port()}"
    text = _run(CALLERS[caller](url))
    assert not leaks(text, SECRET), text
    assert not leaks(caplog.text, SECRET), caplog.text


@pytest.mark.parametrize(
    "make",
    [
        lambda url: load_counter(f"vllm:{url}"),
        lambda url: ServerLimit(url),
        lambda url: OpenAISummarizer(url, "m"),
    ],
)
@pytest.mark.parametrize("tail", ["/?api_key=sk-QJ-secret-ZXW", "/v1?key=sk-QJ-secret-ZXW", "#x"])
def test_a_query_string_in_a_server_url_is_refused_without_showing_it(
    make: Callable[[str], object], tail: str
) -> None:
    """(a key in the query was logged with every call, and ServerLimit asked
    ``http://h/?api_key=K/v1/models``: the path inside the query)"""
    with pytest.raises(ConfigError) as caught:
        make("http://127.0.0.1:8000" + tail)
    message = str(caught.value)
    assert "leave out the query string" in message and "\n" not in message
    assert "QJ-secret" not in message
