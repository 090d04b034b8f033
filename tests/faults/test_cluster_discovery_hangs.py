"""A ``redis+cluster://`` startup node that stalls, drips or drops while the client
learns the cluster (``CLUSTER SLOTS`` and the handshake before it) gives a typed
StoreConnectionError from every entry point, within a small multiple of the timeouts.

The sync cluster client connects when it is made: its connections must be the ones
whose whole reply is read under one deadline (``stores/redis_deadline.py``), else a
node sending its reply a byte every 0.1 s keeps the discovery waiting for ever.
"""

from __future__ import annotations

import time

import pytest

from ctxguard.errors import StoreConnectionError

from .fake_servers import Behaviour, fake_server
from .test_restart_and_timeouts import ENTRY_POINTS, EXPECTED, FAST

pytestmark = [pytest.mark.timeout(60)]


@pytest.mark.parametrize("behaviour", list(EXPECTED))
@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
def test_a_misbehaving_startup_node_is_a_typed_connect_error(
    behaviour: Behaviour, entry: str
) -> None:
    with fake_server(behaviour) as server:
        url = f"redis+cluster://127.0.0.1:{server.port}?{FAST}"
        started = time.monotonic()
        with pytest.raises(StoreConnectionError) as info:
            ENTRY_POINTS[entry](url)
        took = time.monotonic() - started
    text = str(info.value)
    assert info.value.phase == "connect" and info.value.never_reached, text
    assert "\n" not in text and f"127.0.0.1:{server.port}" in text
    assert took < 30, took  # a generous bound: the timeouts are 0.3 s, a hang is for ever
