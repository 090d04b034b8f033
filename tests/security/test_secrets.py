"""A password in a store URL never shows: not in logs, errors, reprs or CLI output.

Runs a private redis-server with ``--requirepass`` and an ACL user: the right
credentials in the URL work; wrong ones give a typed error without the secret.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from faults.servers import RedisServer

from ctxguard.cli import cli
from ctxguard.errors import CtxGuardError, StoreConnectionError
from ctxguard.guard import Guard
from ctxguard.messages import Message
from ctxguard.stores import NewMessage, WriteOptions, open_async_store, open_store

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]
ADMIN_PW = "s3cret-admin-Pw-7781"
ALICE_PW = "alice-Pw-92311"
WRONG_PW = "wrong-Pw-55120"
SECRETS = (ADMIN_PW, ALICE_PW, WRONG_PW)


@pytest.fixture(scope="module")
def auth_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(
        tmp_path_factory.mktemp("auth"),
        ["--requirepass", ADMIN_PW, "--user", "alice", "on", f">{ALICE_PW}", "~*", "&*", "+@all"],
    ).start()
    yield server
    server.stop(kill=True)


def every_text(exc: BaseException) -> str:
    """The error, its repr and its whole cause/context chain, as text."""
    parts = []
    seen: BaseException | None = exc
    while seen is not None:
        parts += [str(seen), repr(seen), str(seen.args)]
        seen = seen.__cause__ or seen.__context__
    return "\n".join(parts)


def assert_no_secret(text: str) -> None:
    for secret in SECRETS:
        assert secret not in text


def test_credentials_in_the_url_work(auth_server: RedisServer, namespace: str) -> None:
    for creds in (f":{ADMIN_PW}", f"alice:{ALICE_PW}"):
        store = open_store(f"redis://{creds}@127.0.0.1:{auth_server.port}/0", namespace=namespace)
        store.append("s", [NewMessage(Message(role="user", content="hi"))], WriteOptions())
        assert len(store.read("s")) >= 1
        assert_no_secret(repr(store) + str(store.url) + repr(store.url) + store.where)
        store.close()


@pytest.mark.parametrize("user", ["", "alice", "nobody"])
def test_wrong_password_is_typed_and_secret_free(
    auth_server: RedisServer, user: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    url = f"redis://{user}:{WRONG_PW}@127.0.0.1:{auth_server.port}/0"
    store = open_store(url)
    with pytest.raises(StoreConnectionError) as info:
        store.read("s")
    assert "refused the credentials" in str(info.value)
    assert_no_secret(every_text(info.value) + repr(store) + caplog.text)
    guard = Guard(url, counter="approx", limit=1000)
    with pytest.raises(CtxGuardError) as guard_info:
        guard.prepare("s", [{"role": "user", "content": "x"}])
    assert_no_secret(every_text(guard_info.value) + repr(guard) + caplog.text)


async def test_async_wrong_password_is_typed_and_secret_free(
    auth_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    store = open_async_store(f"redis://alice:{WRONG_PW}@127.0.0.1:{auth_server.port}/0")
    with pytest.raises(StoreConnectionError) as info:
        await store.read("s")
    assert_no_secret(every_text(info.value) + repr(store) + caplog.text)
    await store.close()


@pytest.mark.parametrize(
    "url",
    [
        f"redis://user:{WRONG_PW}@127.0.0.1:1/0",
        f"rediss://user:{WRONG_PW}@127.0.0.1:1/0",
        f"redis+cluster://user:{WRONG_PW}@127.0.0.1:1,127.0.0.1:2",
        f"redis://user:{WRONG_PW}@127.0.0.1:1/0?socket_timeout=nonsense",
        f"redis+cluster://user:{WRONG_PW}@127.0.0.1:1?socket_timeout=nonsense",
        f"redis://user:{WRONG_PW}@127.0.0.1:notaport/0",
        f"ftp://user:{WRONG_PW}@127.0.0.1:1/0",
    ],
)
def test_unreachable_or_bad_urls_never_print_the_password(
    url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    with pytest.raises(CtxGuardError) as info:
        store = open_store(url)
        store.read("s")
    assert_no_secret(every_text(info.value) + caplog.text)


@pytest.mark.parametrize(
    "url",
    [
        "redis://user:pw@127.0.0.1:1/0",
        f"redis+cluster://user:{WRONG_PW}@127.0.0.1:1,127.0.0.1:2",
    ],
)
def test_cli_fails_without_printing_the_password(url: str) -> None:
    result = CliRunner().invoke(cli, ["sessions", "--url", url])
    assert result.exit_code != 0
    out = result.output + (result.stderr if result.stderr_bytes is not None else "")
    assert "pw" not in out.replace("***", "") and WRONG_PW not in out
    assert "***" in out  # the URL is still shown, redacted


def test_cli_with_wrong_password_on_a_live_server(auth_server: RedisServer) -> None:
    url = f"redis://alice:{WRONG_PW}@127.0.0.1:{auth_server.port}/0"
    result = CliRunner().invoke(cli, ["sessions", "--url", url])
    assert result.exit_code != 0
    assert WRONG_PW not in result.output and "refused the credentials" in result.output


def test_cli_lists_with_right_password(auth_server: RedisServer, tmp_path: Path) -> None:
    url = f"redis://alice:{ALICE_PW}@127.0.0.1:{auth_server.port}/0"
    store = open_store(url, namespace="cli-auth")
    store.append("visible", [NewMessage(Message(role="user", content="x"))], WriteOptions())
    result = CliRunner().invoke(cli, ["sessions", "--url", url, "--namespace", "cli-auth"])
    assert result.exit_code == 0, result.output
    assert "visible" in result.output and ALICE_PW not in result.output
    store.close()
