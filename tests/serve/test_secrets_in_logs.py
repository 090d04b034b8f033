"""The gateway's secrets (the upstream URL's password, the upstream API key, the store
password) in no log line of any logger at any level, no answer and no /metrics line.

(httpx logs every request's URL at INFO: the gateway's own client posted to
``http://admin:pw@vllm:8000/v1/chat/completions`` as given, and the password was in the
log line of every chat request.)
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Iterator
from urllib.parse import quote

import httpx
import pytest
from faults.servers import RedisServer
from security.test_secret_property import leaks

from .conftest import Start
from .upstream import FakeVLLM

pytestmark = [pytest.mark.redis, pytest.mark.timeout(120)]
UPSTREAM_PW = "QJ:up/@ZX#W"  # (the leak finder's marker letters around URL-special ones)
STORE_PW = "QJstore@ZXW"
KEY = "sk-QJkeyZXW"
LOGGERS = ("", "httpx", "httpcore", "uvicorn", "uvicorn.access", "uvicorn.error", "redis")


@pytest.fixture(scope="module")
def auth_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("gw-auth"), ["--requirepass", STORE_PW]).start()
    yield server
    server.stop(kill=True)


def test_no_secret_of_the_gateway_in_any_log_line_answer_or_metric(
    start_gateway: Start,
    vllm: FakeVLLM,
    auth_redis: RedisServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    for name in LOGGERS:
        caplog.set_level(logging.DEBUG, logger=name)
    host = vllm.url.removeprefix("http://")
    gateway = start_gateway(
        upstream=f"http://admin:{quote(UPSTREAM_PW, safe='')}@{host}",
        url=f"redis://:{quote(STORE_PW, safe='')}@127.0.0.1:{auth_redis.port}/0",
        upstream_api_key=KEY,
        namespace="gw-secrets",
        max_tokens=64,
    )
    out: list[str] = []
    for stream in (False, True):
        for content in ("hi", "FAIL500", "ERRSTREAM"):
            body = {"model": "m", "messages": [{"role": "user", "content": content}]}
            response = httpx.post(
                gateway + "/v1/chat/completions",
                json={**body, "stream": stream},
                headers={"X-Session-Id": "s1"},
                timeout=30,
            )
            out += [response.text, str(response.headers)]
    for path in ("/health", "/metrics", "/v1/models"):
        response = httpx.get(gateway + path, timeout=30)
        out += [response.text, str(response.headers)]
    out.append(httpx.post(gateway + "/tokenize", json={"prompt": "hi"}, timeout=30).text)
    response = httpx.post(gateway + "/v1/responses", json={"model": "m", "input": "hi"}, timeout=30)
    out.append(response.text)
    assert response.status_code == 200, response.text  # the store and the upstream answered
    basic = "Basic " + base64.b64encode(f"admin:{UPSTREAM_PW}".encode()).decode()
    assert vllm.authorizations and set(vllm.authorizations) == {basic}  # still sent
    assert "/v1/chat/completions" in caplog.text  # httpx logged the requests ...
    text = "\n".join(out) + caplog.text
    for secret in (UPSTREAM_PW, STORE_PW, KEY):
        assert not leaks(text, secret), (secret, leaks(text, secret))  # ... without them
    assert base64.b64encode(f"admin:{UPSTREAM_PW}".encode()).decode() not in text
