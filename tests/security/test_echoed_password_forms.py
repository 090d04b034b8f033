"""A password a server quotes back in another form than it was given never shows.

Redis (and the fake ``echoing`` server, in its words) answers a command it does not know
with its arguments quoted: CR and LF as spaces, and only the first 128 bytes of them all.
A password holding a line break (``%0A`` in the URL) came back as ``QJ ZX``, a long one
(or one after a long user name) came back cut: neither matched the password the store
takes out of the text, and both reached the error, its chain and the log.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from urllib.parse import quote

import pytest
from faults.fake_servers import FakeServer, fake_server

from ctxguard import Guard, StoreConnectionError, open_store
from ctxguard.stores.redis import RetryPolicy
from security.test_secret_property import every_text, leaks

pytestmark = [pytest.mark.timeout(120)]
LONG = "QJ" + "ab-" * 60 + "ZXW"  # 185 characters, cut at 128 bytes
CASES = [
    ("", "QJ\nZXW"),
    ("", "QJ\r\nZX W"),
    ("", LONG),
    ("admin", LONG),
]


@pytest.fixture(scope="module")
def echoing() -> Iterator[FakeServer]:
    with fake_server("echoing") as server:
        yield server


@pytest.mark.parametrize(("user", "password"), CASES, ids=["lf", "crlf", "long", "long-with-user"])
@pytest.mark.parametrize("form", ["userinfo", "query", "cluster"])
def test_a_password_quoted_back_changed_or_cut_never_shows(
    user: str,
    password: str,
    form: str,
    echoing: FakeServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    enc, host = quote(password, safe=""), f"127.0.0.1:{echoing.port}"
    url = {
        "userinfo": f"redis://{user}:{enc}@{host}/0",
        "query": f"redis://{host}/0?username={user or 'default'}&password={enc}",
        "cluster": f"redis+cluster://{user}:{enc}@{host}",
    }[form]
    out = []
    with pytest.raises(StoreConnectionError) as info:
        open_store(url, retry=RetryPolicy(attempts=1)).read("s")
    out.append(every_text(info.value))
    with pytest.raises(StoreConnectionError) as guard_info:
        Guard(url, counter="approx", limit=1000, max_tokens=10).prepare(
            "s", [{"role": "user", "content": "x"}]
        )
    out.append(every_text(guard_info.value))
    text = "\n".join(out) + caplog.text
    assert "AUTH" in text  # the server did answer the handshake with its quote
    echoed = password.replace("\r", " ").replace("\n", " ")
    for secret in (password, echoed):
        assert not leaks(text, secret), (url, leaks(text, secret))
