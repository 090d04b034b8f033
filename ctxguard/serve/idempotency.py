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

A key names one request: the body's digest (:func:`body_digest`) is kept with the keyed
reply (metadata ``idempotency_body``) and, while the request runs, as the holder of a
second lease (``body:<hash of the key>``). The same key with another body is a 422
``idempotency_key_reused`` (the Idempotency-Key draft's status; the OpenAI SDKs do not
retry a 422) before anything is stored or sent, whether the first is still in flight (the
body lease is held by another digest) or done (its reply carries another digest, or has
another id: other messages). The lease only refuses early; the stored digest decides.
A reply stored without a digest (an earlier release) replays as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import random
import time
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ctxguard import Guard
from ctxguard.errors import CtxGuardError
from ctxguard.messages import Message
from ctxguard.serve.openai_errors import ApiError

if TYPE_CHECKING:
    from ctxguard.serve.gateway import Gateway

log = logging.getLogger("ctxguard.serve")
KEY_FIELD = "idempotency_key"  # in a keyed reply's metadata
DIGEST_FIELD = "idempotency_body"  # and its request body's digest
# Fields a retry may change without being another request: how the reply is delivered
# (a stream retried as a plain request gets the same reply, replayed in the shape asked).
UNDIGESTED = frozenset({"stream", "stream_options"})
FIRST_PAUSE, LONGEST_PAUSE = 0.01, 0.25


def body_digest(path: str, body: Mapping[str, Any]) -> str:
    """SHA-256 of the route and the body as canonical JSON (keys sorted, no spaces),
    without :data:`UNDIGESTED`: the same request however its JSON was formatted."""
    kept = {name: value for name, value in body.items() if name not in UNDIGESTED}
    text = json.dumps(
        [path, kept], sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str
    )
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def key_reused() -> ApiError:
    return ApiError(
        422,
        "this Idempotency-Key was used in this session for a different request; "
        "send a new key with a new request (the same body replays the first reply)",
        param="Idempotency-Key",
        code="idempotency_key_reused",
    )


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def key_lease_name(key: str) -> str:
    """The name of the lease on ``key``: the key itself, unless it begins as a body
    lease's name (``body:``) or this hashed form (``key:``) does; then ``key:<sha256>``.
    So no Idempotency-Key takes (and holds up) another key's body lease."""
    return "key:" + _sha256(key) if key.startswith(("body:", "key:")) else key


class KeyLease:
    """This request's hold on its key: taken, renewed every third of the lease, let go;
    with the body lease (holder: the body's digest) beside it."""

    def __init__(self, gw: Gateway, guard: Guard, session_id: str, key: str, digest: str) -> None:
        self.gw, self.store, self.session_id, self.key = gw, guard.store, session_id, key
        self.holder = uuid.uuid4().hex
        self.digest = digest
        self.name = key_lease_name(key)
        self.body_name = "body:" + _sha256(key)
        self.seconds = gw.config.idempotency_lease
        self._renewing: asyncio.Task[None] | None = None

    async def take(self) -> bool:
        acquire = self.store.acquire_lease
        return bool(
            await self.gw.run(acquire, self.session_id, self.name, self.holder, self.seconds)
        )

    async def claim_body(self) -> bool:
        """False when a request with this key and another body holds the body lease. (Its
        holder is the digest, shared by every retry of the same body: a retry that claims
        it while the first runs renews it, which does no harm.)"""
        acquire = self.store.acquire_lease
        name, digest = self.body_name, self.digest
        return bool(await self.gw.run(acquire, self.session_id, name, digest, self.seconds))

    def hold(self) -> None:
        self._renewing = asyncio.get_running_loop().create_task(self._renew())

    async def _renew(self) -> None:
        while True:
            await asyncio.sleep(self.seconds / 3)
            try:
                if not await self.take():
                    log.warning("an Idempotency-Key lease expired while its request ran")
                    return
                await self.claim_body()
            except CtxGuardError as exc:  # the store is down: retry at the next beat
                log.warning("renewing an Idempotency-Key lease failed (%s)", type(exc).__name__)

    def release(self) -> None:
        """Stop renewing and give the lease back (in the background: a release that fails
        or never runs lets the lease expire)."""
        if self._renewing is not None:
            self._renewing.cancel()
        self.gw.background(self._give_back())

    async def _give_back(self) -> None:
        await self.give_back_body()
        release = self.store.release_lease
        with contextlib.suppress(CtxGuardError):
            await self.gw.run(release, self.session_id, self.name, self.holder)

    async def give_back_body(self) -> None:
        release = self.store.release_lease
        with contextlib.suppress(CtxGuardError):
            await self.gw.run(release, self.session_id, self.body_name, self.digest)


async def wait_for_key(
    gw: Gateway, guard: Guard, session_id: str, key: str, reply_id: str, digest: str
) -> tuple[KeyLease | None, Message | None]:
    """(the lease, None) to run the request, or (None, the recorded reply) to replay it;
    a 422 when the key is (or was) another request's (see the module's docstring)."""
    lease = KeyLease(gw, guard, session_id, key, digest)
    deadline = time.monotonic() + gw.config.upstream_timeout + lease.seconds
    pause = FIRST_PAUSE
    window = gw.config.idempotency_window
    while True:
        if not await lease.claim_body():
            raise key_reused()
        held = await lease.take()
        try:
            reply = await gw.run(recorded_reply, guard, session_id, reply_id, window, key, digest)
        except BaseException:
            if held:
                lease.release()
            else:
                gw.background(lease.give_back_body())
            raise
        if reply is not None:
            if held:
                lease.release()
            else:  # the first's is given back: this one's renewal, if any
                gw.background(lease.give_back_body())
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
    guard: Guard,
    session_id: str,
    reply_id: str,
    window: int,
    key: str | None = None,
    digest: str | None = None,
) -> Message | None:
    """The stored reply with ``reply_id`` among the newest ``window`` messages; a 422
    when a reply there was made for ``key`` from another request body: another id (the
    reply id is derived from the key and the messages) or another ``digest`` (the same
    messages with another model, temperature, tools...)."""
    for item in guard.store.read_last(session_id, window):
        message = item.message
        if message.id == reply_id:
            stored = message.metadata.get(DIGEST_FIELD)
            if digest is not None and isinstance(stored, str) and stored != digest:
                raise key_reused()
            return message
        if key is not None and message.metadata.get(KEY_FIELD) == key:
            raise key_reused()
    return None
