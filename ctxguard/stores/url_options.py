"""The values of a store URL's TLS and client options, checked when the URL is parsed.

redis-py reads these only when it opens a connection, so a bad one failed at the first
call (and at each retry) as something else: ``ssl_cert_reqs=NONE`` as a bare
``RedisError``, ``ssl_min_version=5`` as a connection lost mid-call, ``ssl_ciphers=bogus``
as an ``AttributeError``, a missing ``ssl_ca_certs`` file as "is this a TLS port?",
``client_name=a b`` as a refused handshake, ``ssl_keyfile`` without ``ssl_certfile`` as
a ``TypeError`` inside redis-py. Every message names the option and what it takes, never
its text (an unencoded ``&`` in a password can make a piece of it look like a value).
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Callable

from ctxguard.errors import ConfigError

# redis-py's words for SSLContext.verify_mode (its CERT_REQS table; any other text,
# "NONE" too, is its RedisError "Invalid SSL Certificate Requirements Flag")
CERT_REQS = ("none", "optional", "required")
# redis-py reads ssl_min_version with int() and sets SSLContext.minimum_version to it
TLS_VERSIONS = {str(int(v)): v.name for v in ssl.TLSVersion}
_FILES = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile")
# the options a redis+cluster:// URL may carry: what redis-py's cluster client takes (it has no
# ssl_ca_path and no ssl_password; with one, every open failed)
CLUSTER_PARAMS = (
    "username",
    "password",
    "client_name",
    "socket_connect_timeout",
    "socket_timeout",
    "health_check_interval",
    "ssl_ca_certs",
    "ssl_cert_reqs",
    "ssl_certfile",
    "ssl_keyfile",
    "ssl_check_hostname",
    "ssl_min_version",
    "ssl_ciphers",
    "socket_keepalive",
    "max_connections",
)


def check_option_values(params: list[tuple[str, str]]) -> None:
    """A ConfigError for the first TLS or client option whose value redis-py would read
    wrongly or fail on when it connects."""
    names = {name for name, _ in params}
    for name, text in params:
        if name == "ssl_cert_reqs" and text not in CERT_REQS:
            raise ConfigError(
                "ssl_cert_reqs in the store URL must be none, optional or required (lower case)"
            )
        if name == "ssl_min_version" and text not in TLS_VERSIONS:
            raise ConfigError(
                "ssl_min_version in the store URL must be an ssl.TLSVersion number: "
                "771 (TLS 1.2), 772 (TLS 1.3); also 769, 770, -2 (lowest), -1 (highest)"
            )
        if name == "ssl_ciphers" and not _ciphers_work(text):
            raise ConfigError(
                "ssl_ciphers in the store URL selects no cipher this OpenSSL knows; "
                "write an OpenSSL cipher list (as in ECDHE+AESGCM:!aNULL)"
            )
        if name in _FILES and not _readable(text, os.path.isfile):
            raise ConfigError(
                f"{name} in the store URL names no file this process can read; "
                "give the path of a PEM file"
            )
        if name == "ssl_ca_path" and not _readable(text, os.path.isdir):
            raise ConfigError(
                "ssl_ca_path in the store URL names no directory this process can read; "
                "give a directory of hashed CA certificates (or use ssl_ca_certs)"
            )
        if name == "client_name" and not all("!" <= c <= "~" for c in text):
            raise ConfigError(
                "client_name in the store URL may hold only visible ASCII characters "
                "(Redis refuses spaces and others in CLIENT SETNAME)"
            )
    if "ssl_keyfile" in names and "ssl_certfile" not in names:
        raise ConfigError(
            "ssl_keyfile in the store URL needs ssl_certfile, the client certificate it "
            "belongs to (alone it failed inside redis-py at every connect)"
        )


def check_cluster_options(params: list[tuple[str, str]]) -> None:
    """A ConfigError for options redis-py's cluster client does not take (they were refused
    only when the store was opened, after `ctxguard serve` had taken its config, say)."""
    lacking = [k for k, _ in params if k not in (*CLUSTER_PARAMS, "namespace", "tenant", "db")]
    if lacking:
        raise ConfigError(
            f"{', '.join(dict.fromkeys(lacking))} cannot be set on a cluster URL (redis-py's "
            "cluster client lacks it); drop it"
            + (", and give ssl_ca_certs instead" if "ssl_ca_path" in lacking else "")
        )


def _ciphers_work(text: str) -> bool:
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).set_ciphers(text)
    except (ssl.SSLError, ValueError):  # (ValueError: a NUL in the text)
        return False
    return True


def _readable(path: str, kind: Callable[[str], bool]) -> bool:
    try:
        return bool(path) and kind(path) and os.access(path, os.R_OK)
    except (OSError, ValueError):  # (ValueError: a NUL in the path)
        return False
