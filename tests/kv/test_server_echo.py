"""A server that echoes our credentials into the model ids it lists: no error of
ServerLimit / fetch_server_info shows them.

Before, the ids a server listed went into the errors as it wrote them: one that put
the request's Authorization value (the API key header, or the URL's password as the
Basic credential) into a model id had it shown in "does not serve 'x'; it serves ...",
"serves models with different limits (...)" and "did not report max_model_len for
...". Now each id is shown less the headers' values and the URL's password (raw and
as the Basic credential), redacted by form, at most 100 characters, at most 10 ids.
"""

from __future__ import annotations

import base64
from typing import Any

import pytest

from ctxguard import ConfigError, ServerLimit
from ctxguard.kv.server import fetch_server_info
from tests.kv.conftest import FakeServer

KEY = "sk-live-0123456789abcdef"
PASSWORD = "pw-9876543210"
BASIC = base64.b64encode(f"admin:{PASSWORD}".encode()).decode()
ECHOES = {
    "the raw key": KEY,
    "the Authorization value": f"Bearer {KEY}",
    "the Basic credential alone": BASIC,
    "the URL's password": PASSWORD,
}


def _card(model_id: str, length: Any) -> dict[str, Any]:
    return {"id": model_id, "object": "model", "max_model_len": length}


def _with_password(url: str) -> str:
    return url.replace("http://", f"http://admin:{PASSWORD}@")


def _limit(fake: FakeServer, **kwargs: Any) -> ServerLimit:
    headers = {"X-Api-Key": KEY, "Authorization": f"Bearer {KEY}"}
    return ServerLimit(_with_password(fake.url), timeout=5, headers=headers, **kwargs)


def _leaks(text: str) -> list[str]:
    return [s for s in (KEY, PASSWORD, BASIC) if s in text]


@pytest.mark.parametrize("echo", ECHOES.values(), ids=list(ECHOES))
def test_no_error_shows_an_echoed_credential(fake_vllm: FakeServer, echo: str) -> None:
    fake_vllm.json("/v1/models", {"data": [_card(f"model {echo}", None)]})
    with pytest.raises(ConfigError, match="did not report max_model_len") as no_length:
        _limit(fake_vllm).resolve()
    fake_vllm.json("/v1/models", {"data": [_card(f"a {echo}", 10), _card(f"b {echo}", 20)]})
    with pytest.raises(ConfigError, match="different limits") as mixed:
        _limit(fake_vllm).resolve()
    with pytest.raises(ConfigError, match="does not serve") as absent:
        _limit(fake_vllm, model="other").resolve()
    for caught in (no_length, mixed, absent):
        assert _leaks(str(caught.value)) == [], str(caught.value)


async def test_the_async_reader_shows_none_either(fake_vllm: FakeServer) -> None:
    fake_vllm.json("/v1/models", {"data": [_card(f"model {KEY} {BASIC}", None)]})
    with pytest.raises(ConfigError, match="did not report max_model_len") as caught:
        await _limit(fake_vllm).aresolve()
    assert _leaks(str(caught.value)) == []


def test_a_served_model_id_keeps_no_credential(fake_vllm: FakeServer) -> None:
    fake_vllm.json("/v1/models", {"data": [_card(f"echo {KEY}", 4096)]})
    info = fetch_server_info(_with_password(fake_vllm.url), headers={"X-Api-Key": KEY})
    assert info.max_model_len == 4096 and _leaks(info.model) == []


def test_a_thousand_ids_make_one_short_line(fake_vllm: FakeServer) -> None:
    fake_vllm.json("/v1/models", {"data": [_card("m" * 500 + str(i), 10) for i in range(1000)]})
    with pytest.raises(ConfigError, match="does not serve") as caught:
        ServerLimit(fake_vllm.url, model="other").resolve()
    text = str(caught.value)
    assert "\n" not in text and len(text) < 2000 and "990 more" in text
