"""``fetch_server_info`` (``ServerLimit``) has one deadline for all its GETs: each of
the (up to three) GETs had the whole ``timeout``, so a slow server held it three times
as long. A server that answers each GET in 0.5 s, with a timeout of 1.2 s: the third GET
finds no time left (before, the probe succeeded after 1.5 s)."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from ctxguard.errors import ConfigError
from ctxguard.kv.server import afetch_server_info, fetch_server_info
from tests.local_http import QuietHandler, Serving

CARD = {"data": [{"id": "m", "max_model_len": 4096}]}


class SlowServer(Serving):
    def __init__(self, delay: float) -> None:
        self.paths: list[str] = []
        paths = self.paths

        class Handler(QuietHandler):
            def do_GET(self) -> None:
                paths.append(self.path)
                time.sleep(delay)
                if self.path == "/v1/models":
                    self.send(200, json.dumps(CARD).encode(), "application/json")
                else:
                    self.send(404, b"{}", "application/json")

        super().__init__(Handler)


@pytest.mark.parametrize("asynchronous", [False, True])
def test_the_probes_gets_share_one_deadline(asynchronous: bool) -> None:
    server = SlowServer(0.5)
    try:
        with pytest.raises(ConfigError, match=r"within 1.2 s \(deadline\)") as info:
            if asynchronous:
                asyncio.run(afetch_server_info(server.url, timeout=1.2))
            else:
                fetch_server_info(server.url, timeout=1.2)
    finally:
        server.close()
    assert "\n" not in str(info.value)
    assert server.paths[:2] == ["/v1/models", "/metrics"]  # the GETs it needs, cut short
