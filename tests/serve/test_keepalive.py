"""The gateway's upstream connections are not kept as long as the upstream keeps them.

uvicorn (vLLM, SGLang) closes a connection idle for 5 s, and httpx's pool keeps one
for 5 s by default: a chat request sent on it in the instant the upstream closes it
gets no reply, and a chat completion is not safe to send twice, so the client would
see a 502 although the upstream is fine. The gateway closes a connection idle for
``KEEPALIVE_EXPIRY`` (2 s) instead. The upstream here hangs up on the second request
of its first connection, as the idle close does, whatever the timing.
"""

from __future__ import annotations

import time

from hangup_server import HangUpOnce

from ctxguard._http import KEEPALIVE_EXPIRY
from ctxguard.serve import create_app
from ctxguard.serve.config import ServeConfig
from tests.conftest import private_memory_url

from .test_chat import chat
from .upstream import serve_in_thread, stop_server


def test_a_chat_after_an_idle_spell_goes_out_on_a_new_connection(hangup: HangUpOnce) -> None:
    config = ServeConfig(
        upstream=hangup.url, url=private_memory_url(), limit=4096, counter="approx"
    )
    server, gateway = serve_in_thread(create_app(config))
    try:
        first = chat(gateway, "hello")
        assert first.status_code == 200, first.text
        time.sleep(KEEPALIVE_EXPIRY + 0.5)
        second = chat(gateway, "hello again")
        assert second.status_code == 200, second.text
        assert second.json()["choices"][0]["message"]["content"] == "ok"
    finally:
        stop_server(server)
    assert (hangup.requests, hangup.connections) == (2, 2)
