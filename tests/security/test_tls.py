"""rediss:// against a local TLS redis-server with a throwaway CA made by openssl.

Skipped only when the redis-server binary was built without TLS (the server
refuses ``--tls-port``) or openssl is missing.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from faults.servers import RedisServer

from ctxguard.errors import StoreConnectionError
from ctxguard.guard import AsyncGuard, Guard
from ctxguard.stores import open_store

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=30)


def make_ca_and_cert(d: Path, name: str = "ca") -> tuple[Path, Path, Path]:
    """A CA and a server certificate for 127.0.0.1 signed by it: (ca, cert, key)."""
    openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "1",
        "-subj",
        f"/CN=ctxguard-test-{name}",
        # a CA's own extensions: Python 3.13's default context verifies X.509 strictly
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
        "-keyout",
        f"{name}.key",
        "-out",
        f"{name}.crt",
        cwd=d,
    )
    openssl(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=127.0.0.1",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        cwd=d,
    )
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    openssl(
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        f"{name}.crt",
        "-CAkey",
        f"{name}.key",
        "-CAcreateserial",
        "-days",
        "1",
        "-extfile",
        "san.ext",
        "-out",
        "server.crt",
        cwd=d,
    )
    return d / f"{name}.crt", d / "server.crt", d / "server.key"  # fmt: skip


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RedisServer, Path]]:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    certs = tmp_path_factory.mktemp("certs")
    ca, cert, key = make_ca_and_cert(certs)
    args = ["--tls-cert-file", str(cert), "--tls-key-file", str(key),
            "--tls-ca-cert-file", str(ca), "--tls-auth-clients", "no"]  # fmt: skip
    server = RedisServer(tmp_path_factory.mktemp("tls"), args, tls=True)
    try:
        server.start()
    except RuntimeError as exc:
        if "tls" in str(exc).lower() and "not" in str(exc).lower():
            pytest.skip(f"redis-server was built without TLS: {str(exc)[-200:]}")
        raise
    yield server, ca
    server.stop(kill=True)


def test_rediss_url_with_ca_works(tls_server: tuple[RedisServer, Path], namespace: str) -> None:
    server, ca = tls_server
    url = f"rediss://127.0.0.1:{server.port}/0?ssl_ca_certs={ca}&ssl_cert_reqs=required"
    guard = Guard(url, namespace=namespace, counter="approx", limit=4096, max_tokens=64)
    req = guard.prepare("tls", [{"role": "user", "content": "over TLS"}])
    guard.complete("tls", {"role": "assistant", "content": "yes"}, prepared=req)
    assert [m.message.text for m in guard.store.read("tls")] == ["over TLS", "yes"]
    guard.close()


async def test_async_rediss_url_with_ca_works(
    tls_server: tuple[RedisServer, Path], namespace: str
) -> None:
    server, ca = tls_server
    url = f"rediss://127.0.0.1:{server.port}/0?ssl_ca_certs={ca}"
    guard = AsyncGuard(url, namespace=namespace, counter="approx", limit=4096, max_tokens=64)
    await guard.prepare("tls", [{"role": "user", "content": "async over TLS"}])
    assert [m.message.text for m in await guard.store.read("tls")] == ["async over TLS"]
    await guard.aclose()


def test_untrusted_certificate_is_a_typed_error(
    tls_server: tuple[RedisServer, Path], tmp_path: Path
) -> None:
    server, _ = tls_server
    other_ca, _, _ = make_ca_and_cert(tmp_path, "other")
    url = f"rediss://127.0.0.1:{server.port}/0?ssl_ca_certs={other_ca}&ssl_cert_reqs=required"
    store = open_store(url)
    with pytest.raises(StoreConnectionError):
        store.read("s")
    store.close()


def test_plain_redis_to_a_tls_port_is_a_typed_error(tls_server: tuple[RedisServer, Path]) -> None:
    server, _ = tls_server
    store = open_store(f"redis://127.0.0.1:{server.port}/0?socket_timeout=1")
    with pytest.raises(StoreConnectionError):
        store.read("s")
    store.close()


def test_a_closed_loops_tls_sockets_are_closed_when_the_next_loop_takes_over(
    tls_server: tuple[RedisServer, Path], namespace: str
) -> None:
    """(the TLS transport and the socket under it were left to the garbage collector:
    "unclosed transport" ResourceWarnings under ``python -X dev``)"""
    import asyncio
    import gc
    import warnings

    server, ca = tls_server
    url = f"rediss://127.0.0.1:{server.port}/0?ssl_ca_certs={ca}"
    guard = AsyncGuard(url, namespace=namespace, counter="approx", limit=4096, max_tokens=64)

    async def turn(tag: str) -> None:
        await guard.prepare(tag, [{"role": "user", "content": tag}])

    asyncio.run(turn("first"))
    gc.collect()  # (what earlier tests left)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        asyncio.run(turn("second"))  # takes the store over from the closed loop
        gc.collect()
    said = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
    assert said == []
    asyncio.run(guard.aclose())
