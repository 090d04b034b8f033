"""TLS and client options of a store URL are checked when the URL is parsed, on every door.

redis-py reads them only when it connects: ``ssl_cert_reqs=NONE`` failed at the first call
as a bare ``RedisError`` quoting the value, ``ssl_min_version=5`` as a connection lost
mid-call, ``ssl_ciphers=bogus`` as an ``AttributeError`` from our own error wrapping, a
missing CA file as "is this a TLS port?" after four tries, ``client_name=a b`` as a refused
handshake, ``ssl_keyfile`` without ``ssl_certfile`` as a ``TypeError`` inside redis-py.
"""

from __future__ import annotations

import ssl
import traceback
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import redis
from click.testing import CliRunner

from ctxguard import AsyncGuard, Guard, open_store
from ctxguard.cli import cli
from ctxguard.errors import ConfigError
from ctxguard.stores import open_async_store
from ctxguard.stores.redis_errors import wrap_error
from ctxguard.stores.urls import parse_store_url

SECRET = "s3cretPW"
BASES = [
    f"rediss://:{SECRET}@127.0.0.1:1/0",
    f"rediss+cluster://:{SECRET}@127.0.0.1:1,127.0.0.1:2",
]
BAD = [
    ("ssl_cert_reqs=maybe", "ssl_cert_reqs in the store URL must be none, optional or required"),
    ("ssl_cert_reqs=NONE", "ssl_cert_reqs in the store URL must be none, optional or required"),
    ("ssl_cert_reqs=", "ssl_cert_reqs in the store URL must be none, optional or required"),
    ("ssl_min_version=5", "ssl_min_version in the store URL must be an ssl.TLSVersion"),
    ("ssl_min_version=TLSv1_2", "ssl_min_version in the store URL must be an ssl.TLSVersion"),
    ("ssl_min_version=%20771", "ssl_min_version in the store URL must be an ssl.TLSVersion"),
    ("ssl_ciphers=bogus", "ssl_ciphers in the store URL selects no cipher"),
    ("ssl_ciphers=", "ssl_ciphers in the store URL selects no cipher"),
    ("ssl_ca_certs=/no/such/ca.pem", "ssl_ca_certs in the store URL names no file"),
    ("ssl_ca_certs=/", "ssl_ca_certs in the store URL names no file"),
    ("ssl_certfile=/no/such/c.pem", "ssl_certfile in the store URL names no file"),
    ("ssl_ca_path=/no/such/dir", "ssl_ca_path in the store URL names no directory"),
    ("client_name=a%20b", "client_name in the store URL may hold only visible ASCII"),
    ("ssl_keyfile=/", "ssl_keyfile in the store URL names no file"),
    (f"ssl_keyfile={quote(__file__, safe='')}", "ssl_keyfile in the store URL needs ssl_certfile"),
]


def _everything_printed(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc)) + repr(exc) + str(exc)


def _serve_config(url: str) -> Any:
    pytest.importorskip("starlette")
    from ctxguard.serve.config import ServeConfig

    return ServeConfig(upstream="http://127.0.0.1:1", url=url)


@pytest.mark.parametrize(("option", "says"), BAD)
@pytest.mark.parametrize("base", BASES)
def test_a_bad_tls_or_client_option_is_a_one_line_config_error_on_every_door(
    base: str, option: str, says: str
) -> None:
    url = f"{base}?{option}"
    for door in (
        lambda: parse_store_url(url),
        lambda: open_store(url),
        lambda: open_async_store(url),
        lambda: Guard(url, counter="approx", limit=4096),
        lambda: AsyncGuard(url, counter="approx", limit=4096),
        lambda: _serve_config(url),
    ):
        with pytest.raises(ConfigError) as info:
            door()
        text = str(info.value)
        assert says in text and "\n" not in text
        assert SECRET not in _everything_printed(info.value) and "Pw9" not in text
    result = CliRunner().invoke(cli, ["sessions"], env={"CTXGUARD_URL": url})
    assert result.exit_code == 2, result.output
    assert result.stderr.count("\n") == 1 and says in result.stderr
    assert SECRET not in result.output + result.stderr


def test_a_key_file_with_its_certificate_is_taken(tmp_path: Path) -> None:
    cert, key = tmp_path / "c.pem", tmp_path / "k.pem"
    cert.write_text("x")
    key.write_text("x")
    url = parse_store_url(
        f"rediss://h:1?ssl_certfile={cert}&ssl_keyfile={key}&ssl_password=Pw9&ssl_ca_path={tmp_path}"
    )
    assert url.tls and dict(url.secret_options) == {"ssl_password": "Pw9"}


@pytest.mark.parametrize(
    ("word", "mode"),
    [("none", ssl.CERT_NONE), ("optional", ssl.CERT_OPTIONAL), ("required", ssl.CERT_REQUIRED)],
)
@pytest.mark.parametrize(
    ("version", "meant"), [("771", ssl.TLSVersion.TLSv1_2), ("772", ssl.TLSVersion.TLSv1_3)]
)
def test_the_taken_values_reach_redis_py_as_meant(
    word: str, mode: ssl.VerifyMode, version: str, meant: int
) -> None:
    url = parse_store_url(
        f"rediss://h:1?ssl_cert_reqs={word}&ssl_min_version={version}"
        "&ssl_ciphers=ECDHE%2BAESGCM&client_name=ctxg-1"
    )
    client = redis.Redis.from_url(url.redis_url())
    connection = client.connection_pool.make_connection()
    assert connection.cert_reqs == mode
    context = connection._build_ssl_context()  # what the handshake would use
    assert context.verify_mode == mode and context.minimum_version == meant
    client.close()


def test_an_ssl_error_without_a_reason_is_still_a_typed_error() -> None:
    """(an SSLError SSLContext raises itself, set_ciphers' say, has no .reason: reading it
    made an AttributeError out of the connection error)"""
    error = redis.ConnectionError("Error No cipher can be selected. connecting to h:1.")
    error.__cause__ = ssl.SSLError("No cipher can be selected.")
    wrapped = wrap_error(error, "read", "h:1", parse_store_url("rediss://h:1"))
    assert "TLS handshake with h:1 failed" in str(wrapped)
