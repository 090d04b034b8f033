"""What one turn of each system does: the floors and the ctxguard rows.

Every system has ``load`` (untimed pre-load of a session), ``turn`` or ``aturn``
(one timed turn: append the user message, build the request under the prompt
budget with the system message pinned, append the reply) and ``cleanup``.

At ~500 lines it stays whole: one small class per row, so that the rows read side by
side (the peers are apart, in ``peers.py``).
"""

from __future__ import annotations

import json
from typing import Any

import redis
import redis.asyncio as aredis

from _turn.workload import (
    FLOOR_FETCH,
    PROMPT_BUDGET,
    REPLY_PRIMING,
    RESERVED_OUTPUT,
    Cl100k,
    Outcome,
    SizeData,
)
from ctxguard.guard import AsyncGuard, Guard
from ctxguard.stores import open_store

MIN_MESSAGE_TOKENS = 4  # cookbook rule: 3 + 1 role token + 0 content tokens


class System:
    name = ""
    is_async = False

    def load(self, data: SizeData, session: str) -> None:
        raise NotImplementedError

    def turn(self, session: str, user: dict[str, str], reply: dict[str, str]) -> Any:
        raise NotImplementedError

    async def aturn(self, session: str, user: dict[str, str], reply: dict[str, str]) -> Any:
        raise NotImplementedError

    def outcome(self, result: Any) -> Outcome:
        """What the turn sent, from what ``turn`` returned (called after the timing)."""
        return result  # type: ignore[no-any-return]

    def cleanup(self) -> None:
        pass

    async def aclose(self) -> None:
        pass


# -- the minimal floor (issue 16) ------------------------------------------------


def min_record(tokens: int, role: str, content: str) -> str:
    """The minimal floor's list element: ``tokens|role|content``."""
    return f"{tokens}|{role}|{content}"


def take_newest(recent: list[bytes], room: int) -> tuple[list[tuple[int, bytes]], int, bool]:
    """Walk back from the newest element while the stored counts fit ``room``.

    Returns the taken (tokens, element) newest first, the tokens they use, and
    whether the budget was filled (an element did not fit).
    """
    taken: list[tuple[int, bytes]] = []
    used = 0
    for raw in reversed(recent):
        tokens = int(raw[: raw.index(b"|")])
        if used + tokens > room:
            return taken, used, True
        used += tokens
        taken.append((tokens, raw))
    return taken, used, False


def min_window(system_raw: bytes, taken: list[tuple[int, bytes]], used: int) -> Outcome:
    """The request: the system message, then the taken elements oldest first, from a user turn."""
    sys_tokens, _, sys_content = system_raw.split(b"|", 2)
    window = taken[::-1]
    start = 0
    while start < len(window) and window[start][1].split(b"|", 2)[1] != b"user":
        used -= window[start][0]
        start += 1
    sent = [("system", sys_content.decode())]
    for _, raw in window[start:]:
        _, role, content = raw.split(b"|", 2)
        sent.append((role.decode(), content.decode()))
    return Outcome(sent, REPLY_PRIMING + int(sys_tokens) + used, 0, PROMPT_BUDGET)


def older_range(fetched: int, room_left: int) -> tuple[int, int]:
    """LRANGE bounds of the older elements that could still fit (each costs >= 4 tokens)."""
    need = room_left // MIN_MESSAGE_TOKENS + 1
    return -(fetched + need), -(fetched + 1)


class FloorMin(System):
    """Issue 16's minimal client: one list element per message, ``tokens|role|content``.

    One pipelined round trip (RPUSH user, LRANGE the newest 64, GET system), trim
    on the client by the stored counts (a second LRANGE only when 64 elements do
    not fill the budget), then RPUSH the reply: two round trips, four commands.
    The user message and the reply are counted in the turn, as ctxguard counts them.
    """

    name = "floor-min"

    def __init__(self, url: str, prefix: str, tok: Cl100k) -> None:
        self.client = redis.Redis.from_url(url)
        self.prefix = f"{prefix}:{self.name}"
        self.tok = tok

    def keys(self, session: str) -> tuple[str, str]:
        return f"{self.prefix}:{session}:msgs", f"{self.prefix}:{session}:system"

    def record(self, role: str, content: str) -> str:
        return min_record(self.tok.message(role, content), role, content)

    def load(self, data: SizeData, session: str) -> None:
        msgs, sys_key = self.keys(session)
        system, *rest = data.history
        pipe = self.client.pipeline(transaction=False)
        pipe.set(sys_key, min_record(data.counts[0], "system", system["content"]))
        batch = [
            min_record(c, m["role"], m["content"])
            for m, c in zip(rest, data.counts[1:], strict=True)
        ]
        for i in range(0, len(batch), 1000):
            pipe.rpush(msgs, *batch[i : i + 1000])
        pipe.execute()

    def turn(self, session: str, user: dict[str, str], reply: dict[str, str]) -> Outcome:
        msgs, sys_key = self.keys(session)
        pipe = self.client.pipeline(transaction=False)
        pipe.rpush(msgs, self.record("user", user["content"]))
        pipe.lrange(msgs, -FLOOR_FETCH, -1)
        pipe.get(sys_key)
        length, recent, system_raw = pipe.execute()
        room = PROMPT_BUDGET - REPLY_PRIMING - int(system_raw[: system_raw.index(b"|")])
        taken, used, full = take_newest(recent, room)
        if not full and len(recent) < length:  # 64 elements did not fill the budget
            older = self.client.lrange(msgs, *older_range(len(recent), room - used))
            more, used_more, _ = take_newest(older, room - used)
            taken, used = taken + more, used + used_more
        out = min_window(system_raw, taken, used)
        self.client.rpush(msgs, self.record("assistant", reply["content"]))
        return out

    def cleanup(self) -> None:
        delete_prefix(self.client, self.prefix)
        self.client.close()


class FloorMinAsync(FloorMin):
    """The minimal floor on ``redis.asyncio`` (one client, sequential turns)."""

    name = "floor-min-async"
    is_async = True

    def __init__(self, url: str, prefix: str, tok: Cl100k) -> None:
        super().__init__(url, prefix, tok)
        self.aclient = aredis.Redis.from_url(url)

    async def aturn(self, session: str, user: dict[str, str], reply: dict[str, str]) -> Outcome:
        msgs, sys_key = self.keys(session)
        pipe = self.aclient.pipeline(transaction=False)
        pipe.rpush(msgs, self.record("user", user["content"]))
        pipe.lrange(msgs, -FLOOR_FETCH, -1)
        pipe.get(sys_key)
        length, recent, system_raw = await pipe.execute()
        room = PROMPT_BUDGET - REPLY_PRIMING - int(system_raw[: system_raw.index(b"|")])
        taken, used, full = take_newest(recent, room)
        if not full and len(recent) < length:
            older = await self.aclient.lrange(msgs, *older_range(len(recent), room - used))
            more, used_more, _ = take_newest(older, room - used)
            taken, used = taken + more, used + used_more
        out = min_window(system_raw, taken, used)
        await self.aclient.rpush(msgs, self.record("assistant", reply["content"]))
        return out

    async def aclose(self) -> None:
        await self.aclient.aclose()


# -- the earlier floor (JSON records) ------------------------------------------------


class Floor(System):
    """The earlier floor (peers.md §5): JSON records, decoded on the client."""

    name = "floor"

    def __init__(self, url: str, prefix: str, tok: Cl100k) -> None:
        self.client = redis.Redis.from_url(url)
        self.prefix = f"{prefix}:floor"
        self.tok = tok

    def _keys(self, session: str) -> tuple[str, str]:
        return f"{self.prefix}:{session}:msgs", f"{self.prefix}:{session}:system"

    def load(self, data: SizeData, session: str) -> None:
        msgs, sys_key = self._keys(session)
        system, *rest = data.history
        pipe = self.client.pipeline(transaction=False)
        pipe.set(sys_key, json.dumps({**system, "tokens": data.counts[0]}))
        batch = [
            json.dumps({**m, "tokens": c}, ensure_ascii=False)
            for m, c in zip(rest, data.counts[1:], strict=True)
        ]
        for i in range(0, len(batch), 1000):
            pipe.rpush(msgs, *batch[i : i + 1000])
        pipe.execute()

    def turn(self, session: str, user: dict[str, str], reply: dict[str, str]) -> Outcome:
        msgs, sys_key = self._keys(session)
        record = self._record("user", user)
        pipe = self.client.pipeline(transaction=False)
        pipe.rpush(msgs, record)
        pipe.lrange(msgs, -FLOOR_FETCH, -1)
        pipe.get(sys_key)
        _, recent, system_raw = pipe.execute()
        out = self._trim(recent, system_raw)
        self.client.rpush(msgs, self._record("assistant", reply))
        return out

    def _record(self, role: str, message: dict[str, str]) -> str:
        """The stored record: the message with its cookbook count (tokenized in the turn)."""
        tokens = self.tok.message(role, message["content"])
        return json.dumps({**message, "tokens": tokens}, ensure_ascii=False)

    def _trim(self, recent: list[bytes], system_raw: bytes) -> Outcome:
        """Walk back from the newest record to the budget; start the window on a user turn."""
        system = json.loads(system_raw)
        room = PROMPT_BUDGET - REPLY_PRIMING - system["tokens"]
        window: list[dict[str, Any]] = []
        used = 0
        for raw in reversed(recent):
            m = json.loads(raw)
            if used + m["tokens"] > room:
                break
            used += m["tokens"]
            window.append(m)
        window.reverse()
        if window and window[0]["role"] != "user":  # a window starts on a user turn
            used -= window.pop(0)["tokens"]
        sent = [system, *window]
        tokens = REPLY_PRIMING + system["tokens"] + used
        return Outcome([(m["role"], m["content"]) for m in sent], tokens, 0, PROMPT_BUDGET)

    def cleanup(self) -> None:
        delete_prefix(self.client, self.prefix)
        self.client.close()


class FloorAsync(Floor):
    """The earlier floor's work on ``redis.asyncio``, under its own prefix."""

    name = "floor-async"
    is_async = True

    def __init__(self, url: str, prefix: str, tok: Cl100k) -> None:
        super().__init__(url, prefix, tok)
        self.prefix = f"{prefix}:floor-async"
        self.aclient = aredis.Redis.from_url(url)

    async def aturn(self, session: str, user: dict[str, str], reply: dict[str, str]) -> Outcome:
        msgs, sys_key = self._keys(session)
        record = self._record("user", user)
        pipe = self.aclient.pipeline(transaction=False)
        pipe.rpush(msgs, record)
        pipe.lrange(msgs, -FLOOR_FETCH, -1)
        pipe.get(sys_key)
        _, recent, system_raw = await pipe.execute()
        out = self._trim(recent, system_raw)
        await self.aclient.rpush(msgs, self._record("assistant", reply))
        return out

    async def aclose(self) -> None:
        await self.aclient.aclose()


# -- ctxguard ---------------------------------------------------------------------------


class CtxGuardSync(System):
    name = "ctxguard"

    def __init__(self, url: str, namespace: str, audit_mode: str = "sync", **settings: Any) -> None:
        self.url, self.namespace = url, namespace
        self.guard = Guard(
            url,
            namespace=namespace,
            counter="tiktoken:cl100k_base",
            limit=PROMPT_BUDGET + RESERVED_OUTPUT,
            max_tokens=RESERVED_OUTPUT,
            audit_mode=audit_mode,
            **settings,
        )
        self.loader = open_store(url, namespace=namespace)

    def load(self, data: SizeData, session: str) -> None:
        options = self.guard.core.write_options
        for i in range(0, len(data.new_messages), 2000):
            self.loader.append(session, data.new_messages[i : i + 2000], options)

    def turn(self, session: str, user: dict[str, str], reply: dict[str, str]) -> Any:
        req = self.guard.prepare(session, [user], max_tokens=RESERVED_OUTPUT)
        self.guard.complete(session, reply, prepared=req)
        return req  # made into an Outcome after the timing

    def outcome(self, result: Any) -> Outcome:
        return outcome(result)

    def cleanup(self) -> None:
        for sid in list(self.loader.list_sessions()):
            self.loader.delete(sid)
        self.loader.close()
        self.guard.close()


class CtxGuardCold(CtxGuardSync):
    """The sync guard with its window cache off: every prepare fetches the window."""

    name = "ctxguard-cold"

    def __init__(self, url: str, namespace: str) -> None:
        super().__init__(url, namespace, window_cache_size=0)


class CtxGuardObserved(CtxGuardSync):
    """The sync guard reporting to Prometheus metrics and OpenTelemetry tracing (issue 15:
    the ratio against the floor with them on), delivered by ``background(...)`` (off the
    request path, flushed after each turn, untimed; ``inline``: ``fan_out(...)`` on the
    caller's thread). Tracing on an SDK
    provider with a ``BatchSpanProcessor``, sampling ``ratio`` of traces (1.0: every
    operation and store call a span)."""

    name = "ctxguard-observed"
    ratio = 0.01
    inline = False

    def __init__(self, url: str, namespace: str) -> None:
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
        from prometheus_client import CollectorRegistry

        from ctxguard.observe import background, fan_out
        from ctxguard.observe.metrics import PrometheusObserver
        from ctxguard.observe.tracing import TracingObserver

        self.exporter = InMemorySpanExporter()
        provider = TracerProvider(sampler=ParentBased(TraceIdRatioBased(self.ratio)))
        provider.add_span_processor(BatchSpanProcessor(self.exporter))
        observers = (PrometheusObserver(CollectorRegistry()), TracingObserver(provider))
        self.background = None if self.inline else background(*observers)
        observer = fan_out(*observers) if self.background is None else self.background
        self.turns = 0
        super().__init__(url, namespace, observer=observer)

    def turn(self, session: str, user: dict[str, str], reply: dict[str, str]) -> Any:
        result = super().turn(session, user, reply)
        self.turns += 1
        if self.turns % 2_000 == 0:  # a count, not len(get_finished_spans()): that copies them
            self.exporter.clear()
        return result

    def outcome(self, result: Any) -> Outcome:
        # untimed, right after the turn: the background deliverer's events delivered now,
        # in the idle time a server has after a turn (the model's call), so that its work
        # does not land on the next turn, another system's (bench_turn interleaves them
        # turn by turn). bench_observe measures the other bound: back-to-back turns.
        if self.background is not None:
            self.background.flush(10)
        return super().outcome(result)


class CtxGuardObservedAll(CtxGuardObserved):
    """:class:`CtxGuardObserved` tracing every operation (no sampling)."""

    name = "ctxguard-observed-all"
    ratio = 1.0


class CtxGuardObservedInline(CtxGuardObserved):
    """:class:`CtxGuardObserved` with the observers called inline (``fan_out``)."""

    name = "ctxguard-observed-inline"
    inline = True


class CtxGuardPrefix(CtxGuardSync):
    """The sync guard with the prefix-cache estimate in each record (issue 17)."""

    name = "ctxguard-prefix"

    def __init__(self, url: str, namespace: str) -> None:
        super().__init__(url, namespace, prefix_block_size=16)


class CtxGuardWithReply(CtxGuardSync):
    name = "ctxguard-with-reply"

    def __init__(self, url: str, namespace: str) -> None:
        super().__init__(url, namespace, audit_mode="with_reply")


class CtxGuardAsync(CtxGuardSync):
    name = "ctxguard-async"
    is_async = True

    def __init__(self, url: str, namespace: str, **settings: Any) -> None:
        super().__init__(url, namespace)
        self.aguard = AsyncGuard(
            url,
            namespace=namespace,
            counter="tiktoken:cl100k_base",
            limit=PROMPT_BUDGET + RESERVED_OUTPUT,
            max_tokens=RESERVED_OUTPUT,
            **settings,
        )

    async def aturn(self, session: str, user: dict[str, str], reply: dict[str, str]) -> Any:
        req = await self.aguard.prepare(session, [user], max_tokens=RESERVED_OUTPUT)
        await self.aguard.complete(session, reply, prepared=req)
        return req

    async def aclose(self) -> None:
        await self.aguard.aclose()


class CtxGuardAsyncCold(CtxGuardAsync):
    """AsyncGuard with its window cache off."""

    name = "ctxguard-async-cold"

    def __init__(self, url: str, namespace: str) -> None:
        super().__init__(url, namespace, window_cache_size=0)


# -- one script call per turn: commit="with_reply" ----------------------------------------
# prepare stores nothing; complete(prepared=) stores the user message, the reply and the
# request record in one commit_if_unchanged (a warm turn: one round trip).


class CtxGuardOne(CtxGuardSync):
    """The sync guard with ``commit="with_reply"``, window cache on."""

    name = "ctxguard-one"

    def __init__(self, url: str, namespace: str, **settings: Any) -> None:
        super().__init__(url, namespace, commit="with_reply", **settings)


class CtxGuardOneCold(CtxGuardOne):
    """``commit="with_reply"`` with the window cache off: a fetch, then the one commit."""

    name = "ctxguard-one-cold"

    def __init__(self, url: str, namespace: str) -> None:
        super().__init__(url, namespace, window_cache_size=0)


class CtxGuardOneAsync(CtxGuardAsync):
    """AsyncGuard with ``commit="with_reply"``, window cache on."""

    name = "ctxguard-one-async"

    def __init__(self, url: str, namespace: str) -> None:
        super().__init__(url, namespace, commit="with_reply")


def outcome(req: Any) -> Outcome:
    return Outcome(
        [(m.role, m.text) for m in req.messages],
        req.tokens,
        req.reserved_output + req.safety_margin,
        req.limit,
    )


def delete_prefix(client: Any, prefix: str) -> None:
    batch = []
    for key in client.scan_iter(match=f"{prefix}:*", count=1000):
        batch.append(key)
        if len(batch) >= 500:
            client.delete(*batch)
            batch = []
    if batch:
        client.delete(*batch)
