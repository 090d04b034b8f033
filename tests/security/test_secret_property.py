"""No piece of a store password shows anywhere, whatever characters it holds.

Passwords are drawn from every URL-special character (``: / ? # @ [ ] % + & ,``
and spaces) around marker letters, and written into URLs every way a user
might: raw or percent-encoded in the userinfo, as ``?password=`` (with and
without ``?username=``), per node of a cluster URL, on ``redis://``,
``rediss://`` and ``redis+cluster://``. Every entry point is driven (open
stores, guards and a failing operation against a closed port, the CLI with
``--url`` and ``CTXGUARD_URL``, ``str``/``repr``) with DEBUG logging of
``ctxguard`` and ``redis`` captured; on a live server with that password, the
audit records, ``show``, ``audit``, ``export`` and ``report`` output too. A
leak is the password, its encoded forms, or any 4-character piece of it that
holds two marker letters.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote, quote_plus

import pytest
from click.testing import CliRunner
from faults.fake_servers import FakeServer, fake_server
from faults.servers import RedisServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxguard.cli import cli
from ctxguard.errors import CtxGuardError, StoreConnectionError
from ctxguard.guard import AsyncGuard, Guard
from ctxguard.stores import open_async_store, open_store
from ctxguard.stores.redis import RetryPolicy

pytestmark = [pytest.mark.timeout(600)]
MARKERS = "QJZXW"
SPECIAL = ":/?#@[]%+&,= "
ONE_TRY = RetryPolicy(attempts=1)
passwords = st.builds(
    lambda a, b: f"QJ{a}ZX{b}W",
    st.text(alphabet=SPECIAL + MARKERS, max_size=8),
    st.text(alphabet=SPECIAL + MARKERS, min_size=1, max_size=8),
)
SETTINGS = settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def url_forms(password: str, host: str) -> list[str]:
    enc = quote(password, safe="")
    return [
        f"redis://:{password}@{host}/0",
        f"redis://admin:{password}@{host}/0",
        f"redis://admin:{enc}@{host}/0",
        f"rediss://:{enc}@{host}/0",
        f"redis://{host}/0?password={enc}",
        f"redis://{host}/0?username=admin&password={enc}",
        f"rediss://{host}/0?password={enc}&socket_timeout=1",
        f"redis+cluster://:{password}@{host},127.0.0.1:2",
        f"redis+cluster://admin:{enc}@{host},admin:{enc}@127.0.0.1:2",
        f"rediss+cluster://{host},127.0.0.1:2?password={enc}",
    ]


# A ULID (message ids, rids: 26 characters of Crockford's base 32, which holds every
# marker) is random text: one of its 4-character runs can equal a piece of the password
# by chance (about 1 in 10^4 an example; a 10x run met one). Masked before the search.
_ULID = re.compile(r"(?<![0-9A-Z])[0-9A-HJKMNP-TV-Z]{26}(?![0-9A-Z])")


def leaks(text: str, password: str) -> list[str]:
    """The forms or pieces of ``password`` found in ``text`` (ULIDs masked)."""
    text = _ULID.sub("<ulid>", text)
    found = [
        form
        for form in {password, quote(password, safe=""), quote_plus(password, safe="")}
        if form in text
    ]
    pieces = {password[i : i + 4] for i in range(len(password) - 3)}
    found += [p for p in pieces if sum(c in MARKERS for c in p) >= 2 and p in text]
    return found


def every_text(exc: BaseException) -> str:
    parts: list[str] = []
    seen: BaseException | None = exc
    while seen is not None:
        parts += [str(seen), repr(seen), str(seen.args)]
        seen = seen.__cause__ or seen.__context__
    return "\n".join(parts)


def cli_text(args: list[str], env: dict[str, str] | None = None) -> str:
    result = CliRunner().invoke(cli, args, env=env)
    text = result.output + (result.stderr if result.stderr_bytes is not None else "")
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        text += every_text(result.exception)
    return text


@pytest.fixture
def debug_logs(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    for name in ("ctxguard", "redis"):
        caplog.set_level(logging.DEBUG, logger=name)
    caplog.set_level(logging.DEBUG)
    yield caplog


def drive_closed_port(url: str) -> str:
    """Every entry point against a port nobody listens on; everything they print."""
    out: list[str] = []
    try:
        store = open_store(url, retry=ONE_TRY)
        out += [str(store), repr(store), str(store.url), repr(store.url)]  # type: ignore[attr-defined]
        store.read("s")
    except CtxGuardError as exc:
        out.append(every_text(exc))
    try:
        guard = Guard(url, counter="approx", limit=1000, max_tokens=10)
        out += [str(guard), repr(guard), repr(guard.store)]
        guard.prepare("s", [{"role": "user", "content": "x"}])
    except CtxGuardError as exc:
        out.append(every_text(exc))

    async def run_async() -> None:
        try:
            astore = open_async_store(url, retry=ONE_TRY)
            out.extend([repr(astore), str(astore.url)])  # type: ignore[attr-defined]
            try:
                await astore.info("s")
            finally:
                await astore.close()
        except CtxGuardError as exc:
            out.append(every_text(exc))
        try:
            aguard = AsyncGuard(url, counter="approx", limit=1000, max_tokens=10)
            out.append(repr(aguard))
            try:
                await aguard.prepare("s", [{"role": "user", "content": "x"}])
            finally:
                await aguard.aclose()
        except CtxGuardError as exc:
            out.append(every_text(exc))

    asyncio.run(run_async())
    out.append(cli_text(["sessions", "--url", url]))
    out.append(cli_text(["show", "s", "--url", url]))
    out.append(cli_text(["sessions"], env={"CTXGUARD_URL": url}))
    return "\n".join(out)


@SETTINGS
@given(password=passwords, form=st.integers(0, 9))
def test_no_piece_of_the_password_on_any_error_path(
    password: str, form: int, debug_logs: pytest.LogCaptureFixture
) -> None:
    debug_logs.clear()
    url = url_forms(password, "127.0.0.1:1")[form]
    text = drive_closed_port(url) + debug_logs.text
    assert not leaks(text, password), (url, leaks(text, password), text[:2000])


@pytest.fixture(scope="module")
def echoing_server() -> Iterator[FakeServer]:
    with fake_server("echoing") as server:
        yield server


@SETTINGS
@given(password=passwords, form=st.sampled_from([0, 1, 2, 4, 5, 7, 8]))  # (no TLS: it has
def test_no_piece_of_the_password_when_the_server_sends_it_back(  # no handshake to answer)
    password: str, form: int, echoing_server: FakeServer, debug_logs: pytest.LogCaptureFixture
) -> None:
    """A server or proxy that knows no ``AUTH`` answers it, as Redis 5 answers any command
    it does not know, with the password quoted: every entry point, the exception chain
    under each error (what a traceback or an error tracker shows) and the logs too."""
    debug_logs.clear()
    url = url_forms(password, f"127.0.0.1:{echoing_server.port}")[form]
    text = drive_closed_port(url) + debug_logs.text
    assert "`***`" in text or "cluster" in url  # it was sent back, and hidden
    assert not leaks(text, password), (url, leaks(text, password), text[:2000])


@pytest.mark.parametrize("asynchronous", [False, True])
def test_a_refused_handshake_is_a_typed_connection_error(
    asynchronous: bool, echoing_server: FakeServer
) -> None:
    """What a server that refuses AUTH (or SELECT) is: never reached, retrying is safe,
    and the one line says which server and what to check."""
    url = f"redis://:QJ%3AZXW@127.0.0.1:{echoing_server.port}/0"

    async def read_async() -> None:
        store = open_async_store(url, retry=ONE_TRY)
        try:
            await store.info("s")
        finally:
            await store.close()

    with pytest.raises(StoreConnectionError) as info:
        if asynchronous:
            asyncio.run(read_async())
        else:
            open_store(url, retry=ONE_TRY).info("s")
    error = info.value
    assert error.phase == "connect" and error.never_reached
    text = str(error)
    assert "\n" not in text and "refused the connection handshake" in text
    assert f"127.0.0.1:{echoing_server.port}" in text and "safe to retry" in text
    assert not leaks(every_text(error), "QJ:ZXW")


@SETTINGS
@given(password=passwords)
def test_bad_urls_with_the_password_name_the_part_not_the_text(
    password: str, debug_logs: pytest.LogCaptureFixture
) -> None:
    """Broken ports, hosts, paths and parameters around a raw password: no echo."""
    debug_logs.clear()
    bad = [
        f"redis://:{password}@127.0.0.1:notaport/0",
        f"redis://:{password}@127.0.0.1:99999/0",
        f"redis://:{password}@/0",
        f"redis://:{password}@127.0.0.1:1/x{password}",
        f"redis://127.0.0.1:1/0?password={password}&bogus{password}=1",
        f"redis+cluster://:{password}@127.0.0.1:1,{password}",
        f"redis://:{password}@127.0.0.1:1/0?socket_timeout={password}",
        f"ftp://:{password}@127.0.0.1:1/0",
        f"{password}://127.0.0.1:1",
        f"redis:/{password}",
    ]
    out = []
    for url in bad:
        out.append(drive_closed_port(url))
    text = "\n".join(out) + debug_logs.text
    assert not leaks(text, password), leaks(text, password)


@pytest.fixture(scope="module")
def acl_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("acl")).start()
    yield server
    server.stop(kill=True)


@pytest.mark.redis
@SETTINGS
@given(password=passwords, form=st.integers(0, 2))
def test_a_working_password_never_shows_in_records_or_reports(
    password: str,
    form: int,
    acl_server: RedisServer,
    tmp_path_factory: pytest.TempPathFactory,
    debug_logs: pytest.LogCaptureFixture,
) -> None:
    debug_logs.clear()
    admin = acl_server.client()
    admin.execute_command("ACL", "SETUSER", "admin", "reset", "on", f">{password}", "~*", "+@all")
    admin.close()
    host = f"127.0.0.1:{acl_server.port}"
    enc = quote(password, safe="")
    url = [
        f"redis://admin:{password}@{host}/0",
        f"redis://admin:{enc}@{host}/0",
        f"redis://{host}/0?username=admin&password={enc}",
    ][form]
    guard = Guard(url, namespace="hyp", counter="approx", limit=1000, max_tokens=10)
    req = guard.prepare("s", [{"role": "user", "content": "hello"}])
    guard.complete("s", {"role": "assistant", "content": "hi"}, prepared=req)
    out = [repr(guard), repr(guard.store), str(guard.store.read_audit("s"))]
    guard.close()
    html = tmp_path_factory.mktemp("report") / "r.html"
    for args in (
        ["sessions"],
        ["show", "s"],
        ["audit", "s"],
        ["export", "s"],
        ["report", "s", "--html", str(html)],
    ):
        out.append(cli_text([*args, "--url", url, "--namespace", "hyp"]))
        out.append(cli_text([*args, "--namespace", "hyp"], env={"CTXGUARD_URL": url}))
    out.append(html.read_text(encoding="utf-8"))
    text = "\n".join(out) + debug_logs.text
    assert "hello" in text  # the commands did run
    assert not leaks(text, password), leaks(text, password)


def test_the_leak_finder_finds_leaks() -> None:
    """The detector itself: a raw, an encoded and a partial password are all found."""
    password = "QJ:/?ZX#@W"
    assert leaks(f"x {password} y", password)
    assert leaks(quote(password, safe=""), password)
    assert leaks("Port could not be cast to integer value as 'QJ:/'", password)
    assert not leaks("redis://admin:***@127.0.0.1:1/0", password)
    assert re.search("QJ", password)


def test_closed_port_errors_are_typed() -> None:
    with pytest.raises(StoreConnectionError) as info:
        open_store("redis://:QJ/ZX@W@127.0.0.1:1/0", retry=ONE_TRY).read("s")
    assert info.value.never_reached and "***" in str(info.value)


def test_unparseable_cli_url_is_hidden(tmp_path: Path) -> None:
    text = cli_text(["sessions", "--url", "redis://:QJ:/ZXW@127.0.0.1:x/0"])
    assert "QJ" not in text and "ZXW" not in text
