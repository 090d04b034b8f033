"""The gateway's shared state: one Guard per tenant, the counter, the limit, the upstream.

Guards are the library's public :class:`~ctxguard.Guard` (blocking), run in worker
threads so the event loop only moves bytes: its counter (the upstream's ``/tokenize``
by default) and its store calls block. The counter and the limit source are made once
and shared by every tenant's guard. Nothing here holds request state (an
Idempotency-Key in flight is a lease in the store: :mod:`ctxguard.serve.idempotency`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Coroutine
from typing import Any, ParamSpec, TypeVar

import anyio.to_thread
import httpx

from ctxguard import (
    ContextLimit,
    Guard,
    LimitSource,
    PreparedRequest,
    ServerLimit,
    StaticLimit,
    TokenCounter,
    load_counter,
    open_store,
)
from ctxguard._http import KEEPALIVE_EXPIRY, known_secrets, without_userinfo
from ctxguard._secrets import redact_text
from ctxguard.errors import (
    ConfigError,
    ConflictError,
    CtxGuardError,
    TemplateRefusedError,
    TokenizerError,
    UpstreamAuthError,
)
from ctxguard.messages import Message
from ctxguard.serve import identity
from ctxguard.serve.config import ServeConfig
from ctxguard.serve.metrics import make_metrics
from ctxguard.serve.openai_errors import ApiError, from_ctxguard
from ctxguard.serve.outcomes import (
    LogThrottle,
    upstream_api_error,
    upstream_auth,
    upstream_failure,
    usable_usage,
)
from ctxguard.stores import MemoryStore, SessionStore
from ctxguard.stores.urls import redact_url

P = ParamSpec("P")
log = logging.getLogger("ctxguard.serve")
T = TypeVar("T")
PREPARE_ATTEMPTS = 4
STATELESS_TENANT = "stateless"  # the private store of requests without a session


class Gateway:
    """What every request handler shares (one per worker process)."""

    def __init__(self, config: ServeConfig) -> None:
        self.config = config
        self.upstream = config.upstream.rstrip("/")
        if self.upstream.endswith("/v1"):
            self.upstream = self.upstream[:-3]
        self.shown_upstream = redact_url(self.upstream)
        # the user and password of the upstream's URL go as Basic auth (what httpx sends for
        # them), never in a request's URL: httpx logs each one's URL at INFO
        bare, auth = without_userinfo(self.upstream)
        # what the upstream must not echo into an error a client or the log sees: the key
        # and the URL's password (raw, decoded, as the Basic credential it goes as), each
        # also JSON-escaped (an error body quotes them so); longest first
        key = config.upstream_api_key
        keys = {key, json.dumps(key)[1:-1]} if key else set()
        self._secrets = sorted({*known_secrets(self.upstream, None), *keys}, key=len, reverse=True)
        self._lock = threading.Lock()
        self._counter: TokenCounter | None = None
        self._guards: dict[str | None, Guard] = {}
        self._stateless: Guard | None = None
        self._health: SessionStore | None = None
        self.log_throttle = LogThrottle()  # log lines a flood of failures would repeat
        self.limit_source: LimitSource = (
            StaticLimit(config.limit)
            if config.limit is not None
            else UpstreamLimit(
                ServerLimit(
                    self.upstream,
                    model=config.model,
                    timeout=config.connect_timeout,
                    headers=self.upstream_headers(),
                ),
                self.refused,
            )
        )
        self.client = httpx.AsyncClient(
            timeout=httpx.Timeout(config.upstream_timeout, connect=config.connect_timeout),
            limits=httpx.Limits(
                max_connections=1024,
                max_keepalive_connections=256,
                keepalive_expiry=KEEPALIVE_EXPIRY,  # under the upstream's keep-alive
            ),
            headers=self.upstream_headers(),
            auth=auth,
        )
        self.upstream = bare
        self._background: set[asyncio.Task[None]] = set()
        self.metrics = make_metrics(config.metrics)
        self.observer = None if self.metrics is None else self.metrics.observer
        self._session_locks: weakref.WeakValueDictionary[tuple[int, str], asyncio.Lock] = (
            weakref.WeakValueDictionary()
        )

    def session_lock(self, store: object, session_id: str) -> asyncio.Lock:
        """One lock per (store, session) in this worker, dropped when no request holds it."""
        key = (id(store), session_id)
        lock = self._session_locks.get(key)
        if lock is None:
            lock = asyncio.Lock()
            self._session_locks[key] = lock
        return lock

    def background(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` on the event loop without waiting for it (kept until it ends)."""
        task = asyncio.get_running_loop().create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def observe_upstream(self, outcome: str, started: float) -> None:
        """One upstream request's time (``time.perf_counter()`` at the start) by outcome."""
        if self.metrics is not None:
            self.metrics.upstream.labels(outcome).observe(time.perf_counter() - started)

    def refused(self, exc: UpstreamAuthError) -> ApiError:
        """The answer when the model server refused the gateway's credentials on a call
        of its own (the limit lookup's /v1/models, the ``vllm:`` counter's /tokenize): the
        same 502 ``upstream_auth`` and throttled ERROR line as on a forwarded request."""
        what = f"{exc.path} ({'limit lookup' if exc.path == '/v1/models' else 'token counter'})"
        return upstream_auth(exc.status, self.shown_upstream, what, self.log_throttle)

    def answer(self, exc: CtxGuardError, **how: Any) -> ApiError:
        """The HTTP answer for an error the Guard (or the store, counter, limit) raised:
        :func:`from_ctxguard`'s, but :meth:`refused` for the upstream refusing the
        gateway's credentials (``how``: from_ctxguard's keywords)."""
        if isinstance(exc, UpstreamAuthError):
            return self.refused(exc)
        return from_ctxguard(exc, **how)

    def failed(self, exc: Exception) -> ApiError:
        """The answer for an httpx failure talking to the upstream, scrubbed."""
        status, message, code = upstream_failure(exc, self.shown_upstream)
        return upstream_api_error(status, self.scrub(message), code)

    def scrub(self, text: str) -> str:
        """``text`` (anything the upstream said) without the upstream API key or the
        upstream URL's password, raw or JSON-escaped, any bearer credential or any URL's
        password."""
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return redact_text(text)

    def upstream_headers(self) -> dict[str, str]:
        key = self.config.upstream_api_key
        return {"Authorization": f"Bearer {key}"} if key else {}

    # -- guards -----------------------------------------------------------------------

    def counter(self) -> TokenCounter:
        """The counter, loaded on first use (the upstream may start after the gateway)."""
        with self._lock:
            if self._counter is None:
                spec = self.config.counter_spec
                options: dict[str, Any] = {}
                if spec.startswith("vllm:"):
                    options = {
                        "model": self.config.model,
                        "timeout": self.config.connect_timeout * 2,
                        "headers": self.upstream_headers(),
                    }
                self._counter = load_counter(spec, **options)
            return self._counter

    def guard(self, tenant: str | None) -> Guard:
        """The tenant's guard (blocking: call it in a thread)."""
        counter = self.counter()
        with self._lock:
            guard = self._guards.get(tenant)
            if guard is None:
                guard = Guard(
                    self.config.url,
                    counter=counter,
                    limit=self.limit_source,
                    namespace=self.config.namespace,
                    tenant=tenant,
                    max_tokens=self.config.max_tokens,
                    safety_margin=self.config.safety_margin,
                    ttl_seconds=self.config.ttl_seconds,
                    commit=self.config.commit,
                    observer=self.observer,
                )
                self._guards[tenant] = guard
            return guard

    async def guard_async(self, tenant: str | None) -> Guard:
        """:meth:`guard`, without a thread hop once the tenant's guard exists."""
        guard = self._guards.get(tenant)
        return guard if guard is not None else await self.run(self.guard, tenant)

    async def stateless_guard_async(self) -> Guard:
        guard = self._stateless
        return guard if guard is not None else await self.run(self.stateless_guard)

    def stateless_guard(self) -> Guard:
        """The guard of requests without a session: on an in-process store of its own,
        which no URL opens (``memory://`` would be the process's shared store: with
        ``url=memory://`` its ``stateless-*`` sessions listed under the default tenant,
        readable by every other client of the process while their request ran)."""
        counter = self.counter()
        with self._lock:
            if self._stateless is None:
                self._stateless = Guard(
                    MemoryStore(tenant=STATELESS_TENANT),
                    counter=counter,
                    limit=self.limit_source,
                    max_tokens=self.config.max_tokens,
                    safety_margin=self.config.safety_margin,
                    window_cache_size=0,
                    observer=self.observer,
                )
            return self._stateless

    @staticmethod
    def stateless_session() -> str:
        return "stateless-" + uuid.uuid4().hex

    async def run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run a blocking call in a worker thread."""
        return await anyio.to_thread.run_sync(lambda: fn(*args, **kwargs))

    # -- one turn, as every front end (chat, responses, the LiteLLM guardrail) runs it ---

    async def prepare(
        self,
        guard: Guard,
        session_id: str,
        messages: list[Message],
        max_tokens: int | None,
        tools: list[dict[str, Any]] | None,
    ) -> PreparedRequest:
        """``Guard.prepare`` for one turn (see :meth:`prepare_with`)."""
        return await self.prepare_with(
            guard.store,
            session_id,
            lambda: guard.prepare(session_id, messages, max_tokens=max_tokens, tools=tools),
        )

    async def prepare_with(self, store: object, session_id: str, blocking: Callable[[], T]) -> T:
        """Run a turn's blocking prepare (one worker-thread call), serialised per session
        within this worker (fewer lost races), and again after a lost race or a failed
        count (nothing was stored; derived message ids make it safe anyway)."""
        lock = self.session_lock(store, session_id)
        for attempt in range(PREPARE_ATTEMPTS):
            try:
                async with lock:
                    return await self.run(blocking)
            except ConflictError:
                if attempt + 1 == PREPARE_ATTEMPTS:
                    raise
                await asyncio.sleep(random.uniform(0.005, 0.05) * (attempt + 1))
            except TemplateRefusedError:
                raise
            except TokenizerError:
                # the upstream's /tokenize dropped a kept-alive connection: counting comes
                # before any write, so one more try is safe
                if attempt > 0:
                    raise
        raise AssertionError("unreachable")

    async def anchor(self, guard: Guard, session_id: str) -> str:
        """The anchor of new message ids (:func:`identity.anchor_of`): the newest stored
        reply's id (a few messages read; the idempotency window only if none is there)."""
        window = self.config.idempotency_window
        return await self.run(stored_anchor, guard, session_id, window)

    async def complete(
        self,
        guard: Guard,
        session_id: str,
        reply: dict[str, Any],
        reply_id: str,
        prepared: PreparedRequest | None,
        usage: dict[str, Any] | None,
        metadata: dict[str, Any] | None = None,
    ) -> None:
        """Store the model's reply (an OpenAI assistant message) with its usage."""
        message = Message.from_openai(reply, id=reply_id, metadata=metadata)
        usage = usable_usage(usage)
        await self.complete_with(
            lambda: guard.complete(session_id, message, prepared=prepared, usage=usage)
        )

    async def complete_with(self, blocking: Callable[[], object]) -> None:
        """Run a turn's blocking complete (one worker-thread call), once more if counting
        the reply failed (before anything was written; the reply's id makes a repeated
        complete store nothing twice anyway)."""
        for attempt in (0, 1):
            try:
                await self.run(blocking)
                return
            except TemplateRefusedError:
                raise
            except TokenizerError:
                if attempt:
                    raise

    async def limit_tokens(self) -> int:
        resolve = getattr(self.limit_source, "aresolve", None)
        if resolve is not None:
            limit = await resolve()
        else:
            limit = await self.run(self.limit_source.resolve)
        return int(limit.tokens)

    def health_store(self) -> SessionStore:
        """A store for /health's probe, opened once (blocking: call it in a thread); it
        needs no counter, so a model server that is down does not fail the probe."""
        with self._lock:
            if self._health is None:
                self._health = open_store(self.config.url, namespace=self.config.namespace)
            return self._health

    async def aclose(self) -> None:
        if self._background:
            await asyncio.wait(list(self._background), timeout=self.config.connect_timeout)
        await self.client.aclose()
        for guard in [*self._guards.values(), self._stateless]:
            if guard is not None:
                await self.run(guard.close)
        if self._health is not None:
            await self.run(self._health.close)
        if self.metrics is not None:
            self.metrics.close()


def stored_anchor(guard: Guard, session_id: str, window: int) -> str:
    """The newest stored reply's id (a few messages read; ``window`` only if none is there).

    After a turn that finished, the reply is the newest message, so two are read first (the
    newest assistant among the last two is the newest one there is)."""
    for count in (min(2, window), min(8, window), window):
        stored = guard.store.read_last(session_id, count)
        anchor = identity.anchor_of([(s.message.id, s.message.role) for s in stored], count)
        if not anchor.startswith("o:") or count == window:
            return anchor
    raise AssertionError("unreachable")


class UpstreamLimit:
    """The upstream's ``/v1/models`` limit; an upstream that cannot say is a 502 (the
    gateway's fault would be a 500), raised before anything is stored; one that refuses
    the gateway's credentials is ``refused``'s answer (``Gateway.refused``)."""

    def __init__(
        self, inner: ServerLimit, refused: Callable[[UpstreamAuthError], ApiError]
    ) -> None:
        self.inner = inner
        self.refused = refused

    def resolve(self) -> ContextLimit:
        try:
            return self.inner.resolve()
        except ConfigError as exc:
            raise self._unknown(exc) from None

    async def aresolve(self) -> ContextLimit:
        try:
            return await self.inner.aresolve()
        except ConfigError as exc:
            raise self._unknown(exc) from None

    def _unknown(self, exc: ConfigError) -> ApiError:
        return self.refused(exc) if isinstance(exc, UpstreamAuthError) else _limit_unknown(exc)


def _limit_unknown(exc: ConfigError) -> ApiError:
    return upstream_api_error(
        502,
        f"cannot read the model's context limit from the upstream: {exc}",
        "upstream_unavailable",
    )
