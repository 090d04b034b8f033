"""An ``Idempotency-Key`` in flight, across every worker and gateway process on one store.

The first request with a key takes a lease on it in the session's store
(``acquire_lease``: on Redis one key in the session's hash slot, with a TTL; see
:mod:`ctxguard.stores.leases`) and renews it while it runs. A request with the same
key that finds the lease held polls, with a growing jittered pause, until the
recorded reply is there (it is answered from the history) or the lease is free: the
holder failed before storing a reply and released it, or died and stopped renewing
it so it expired. Then it takes the lease and runs the request itself (the derived
message ids store the user message once). Waiting stops after ``upstream_timeout +
idempotency_lease`` seconds with a 409 that says the first request is still running.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
import uuid
from typing import TYPE_CHECKING

from ctxguard import Guard
from ctxguard.errors import CtxGuardError
from ctxguard.messages import Message
from ctxguard.serve.openai_errors import ApiError

if TYPE_CHECKING:
    from ctxguard.serve.gateway import Gateway

log = logging.getLogger("ctxguard.serve")
KEY_FIELD = "idempotency_key"  # in a keyed reply's metadata
FIRST_PAUSE, LONGEST_PAUSE = 0.01, 0.25


class KeyLease:
    """This request's hold on its key: taken, renewed every third of the lease, let go."""

    def __init__(self, gw: Gateway, guard: Guard, session_id: str, key: str) -> None:
        self.gw, self.store, self.session_id, self.key = gw, guard.store, session_id, key
        self.holder = uuid.uuid4().hex
        self.seconds = gw.config.idempotency_lease
        self._renewing: asyncio.Task[None] | None = None

    async def take(self) -> bool:
        acquire = self.store.acquire_lease
        return bool(
            await self.gw.run(acquire, self.session_id, self.key, self.holder, self.seconds)
        )

    def hold(self) -> None:
        self._renewing = asyncio.get_running_loop().create_task(self._renew())

    async def _renew(self) -> None:
        while True:
            await asyncio.sleep(self.seconds / 3)
            try:
                if not await self.take():
                    log.warning("an Idempotency-Key lease expired while its request ran")
                    return
            except CtxGuardError as exc:  # the store is down: retry at the next beat
                log.warning("renewing an Idempotency-Key lease failed (%s)", type(exc).__name__)

    def release(self) -> None:
        """Stop renewing and give the lease back (in the background: a release that fails
        or never runs lets the lease expire)."""
        if self._renewing is not None:
            self._renewing.cancel()
        self.gw.background(self._give_back())

    async def _give_back(self) -> None:
        release = self.store.release_lease
        with contextlib.suppress(CtxGuardError):
            await self.gw.run(release, self.session_id, self.key, self.holder)


async def wait_for_key(
    gw: Gateway, guard: Guard, session_id: str, key: str, reply_id: str
) -> tuple[KeyLease | None, Message | None]:
    """(the lease, None) to run the request, or (None, the recorded reply) to replay it."""
    lease = KeyLease(gw, guard, session_id, key)
    deadline = time.monotonic() + gw.config.upstream_timeout + lease.seconds
    pause = FIRST_PAUSE
    while True:
        held = await lease.take()
        try:
            reply = await gw.run(
                recorded_reply, guard, session_id, reply_id, gw.config.idempotency_window, key
            )
        except BaseException:
            if held:
                lease.release()
            raise
        if reply is not None:
            if held:
                lease.release()
            return None, reply
        if held:
            lease.hold()
            return lease, None
        if time.monotonic() > deadline:
            raise ApiError(
                409,
                "a request with this Idempotency-Key is still running; retry it later",
                param="Idempotency-Key",
                code="idempotency_key_in_use",
            )
        await asyncio.sleep(pause * random.uniform(0.5, 1.0))
        pause = min(pause * 2, LONGEST_PAUSE)


def recorded_reply(
    guard: Guard, session_id: str, reply_id: str, window: int, key: str | None = None
) -> Message | None:
    """The stored reply with ``reply_id`` among the newest ``window`` messages; a 422
    when a reply there was made for ``key`` from another request body (the reply id is
    derived from the key and the messages: another id, another body)."""
    for item in guard.store.read_last(session_id, window):
        message = item.message
        if message.id == reply_id:
            return message
        if key is not None and message.metadata.get(KEY_FIELD) == key:
            raise ApiError(
                422,
                "this Idempotency-Key was used in this session for a request with other "
                "messages; send a new key with a new request",
                param="Idempotency-Key",
                code="idempotency_key_reused",
            )
    return None
