"""Every object that will call an HTTP server checks its URL when it is made.

A typo (``ftp://``, a missing scheme, a bad port, no host) is a ConfigError at once, one
line naming the argument, never a failure at the first request; and the error never shows
the credentials or the query string the URL carried.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from ctxguard import ConfigError, CtxGuardError, ServerLimit
from ctxguard.guard.summarizers import OpenAISummarizer
from ctxguard.observe.pressure import PressureLimit
from ctxguard.serve.config import ServeConfig
from ctxguard.tokens import load_counter
from ctxguard.tokens.vllm import VLLMRenderer

SECRET = "s3cr3t-pw"

MAKERS: dict[str, Callable[[Any], object]] = {
    "ServerLimit": lambda url: ServerLimit(url),
    "vllm counter": lambda url: VLLMRenderer(url),
    "vllm: counter spec": lambda url: load_counter(f"vllm:{url}"),
    "summarizer": lambda url: OpenAISummarizer(url, "m"),
    "PressureLimit": lambda url: PressureLimit(4096, url),
    "gateway upstream": lambda url: ServeConfig(upstream=url),
}

BAD = {
    "scheme": f"ftp://user:{SECRET}@host:8000/v1",
    "no scheme": "localhost:8000",
    "no host": f"http://user:{SECRET}@:8000/",
    "port not a number": f"http://user:{SECRET}@host:port/?api_key={SECRET}",
    "port out of range": "https://host:99999",
    "empty": "",
}


@pytest.mark.parametrize("maker", sorted(MAKERS))
@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_url_is_refused_when_the_object_is_made(maker: str, case: str) -> None:
    with pytest.raises(ConfigError) as info:
        MAKERS[maker](BAD[case])
    message = str(info.value)
    assert "http" in message and "\n" not in message
    assert SECRET not in message and SECRET not in repr(info.value)


@pytest.mark.parametrize("maker", ["ServerLimit", "summarizer", "PressureLimit"])
def test_a_url_that_is_not_text_is_a_typed_error(maker: str) -> None:
    with pytest.raises(CtxGuardError):
        MAKERS[maker](8000)


@pytest.mark.parametrize("maker", sorted(set(MAKERS) - {"vllm: counter spec"}))
@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:1", "https://vllm.internal/v1", f"http://u:{SECRET}@h:8000"]
)
def test_a_good_url_is_accepted_without_any_request(maker: str, url: str) -> None:
    # Port 1 answers nothing: the constructors must not call the server. (A ``vllm:``
    # counter spec is left out: loading it asks the server for its template, by design.)
    MAKERS[maker](url)
