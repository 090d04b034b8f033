"""A slow /metrics holds only the caller reading it: the others take the last reading.

(before: every sync resolve of the process waited on the monitor's lock while one
reading was in flight, so a slow or hung server held every request up to ``timeout``
each ``interval``)"""

from __future__ import annotations

import math
import threading
import uuid
from collections.abc import Iterator

import pytest

from ctxguard.observe.pressure import PressureLimit, describe
from tests.local_http import QuietHandler, Serving

from .metrics_server import vllm_text


class HeldServer:
    """Answers the first scrape at once, then holds each one until ``release`` is set."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.holding = threading.Event()  # a scrape is being held
        self.scrapes = 0
        outer = self

        class Handler(QuietHandler):
            def do_GET(self) -> None:
                outer.scrapes += 1
                if outer.scrapes > 1:
                    outer.holding.set()
                    outer.release.wait(60)
                self.send(200, vllm_text(0.9, 0).encode(), "text/plain; version=0.0.4")

        self.serving = Serving(Handler)
        self.url = f"{self.serving.url}/metrics?t={uuid.uuid4().hex}"

    def close(self) -> None:
        self.release.set()
        self.serving.close()


@pytest.fixture
def held() -> Iterator[HeldServer]:
    server = HeldServer()
    yield server
    server.close()


def test_a_reading_in_flight_does_not_hold_the_other_callers(held: HeldServer) -> None:
    limit = PressureLimit(4000, held.url, interval=3600, timeout=30)
    assert limit.resolve().tokens == 2000  # the first reading: kv 0.9, lowered
    limit.monitor._checked = -math.inf  # the interval has passed: the next caller reads
    reader_got: list[object] = []
    reader = threading.Thread(target=lambda: reader_got.append(describe(limit.resolve())))
    reader.start()
    assert held.holding.wait(30)  # the reader's scrape is in flight, held by the server
    # other callers, while it is: the last reading, without waiting for the one in flight
    others = [limit.resolve() for _ in range(3)]
    still_held = not held.release.is_set()
    held.release.set()
    reader.join(30)
    assert still_held and [o.tokens for o in others] == [2000, 2000, 2000]
    assert held.scrapes == 2
    assert reader_got and reader_got[0] is not None
    assert reader_got[0]["error"] is None  # the held reading answered, it did not time out
