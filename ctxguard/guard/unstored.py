"""``commit="with_reply"``: a prepare that stores nothing, a complete that stores the turn.

The prepare plans as always (on the cached window, or on a fetch, which never
writes) and hands its request back with what it did not store
(:class:`~ctxguard.guard.prepared.Unstored`). :func:`complete` then stores the new
messages, the reply and the request record (with the server's usage) in one
``commit_if_unchanged``. On a cached window the prepare first reads the session's state
token (one plain read, no script): if another writer came first, it plans on a fetch, so
the request it returns holds that writer's messages; a warm turn is that read and one
script call.

The request has been sent by then, so it cannot be planned again when another
writer changed the session in between. The store answers such a commit with the
session as it is; the messages then go after what the other writer stored, and the
record names the window *as it was sent*: the same ids and digest, the new messages
at the positions they land on, and ``unseen``, the positions of the messages the
request did not see (``[from, to)``), which replay leaves out. A history changed
under the request by a retraction or a replace is not repaired: the record's digest
no longer matches and readers say so (``guard/sent.py``).
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ctxguard.errors import ConflictError, CtxGuardError, SessionFullError
from ctxguard.guard.ops import FRESH_REPLANS, MAX_COMMITS, Flow, StoreCall, backoff
from ctxguard.guard.prepared import PreparedRequest, Unstored
from ctxguard.guard.sent import sent_seqs, seq_ranges
from ctxguard.guard.window_cache import extend
from ctxguard.stores.contract import AppendResult, NewMessage, WindowFetch, WindowHit

if TYPE_CHECKING:
    from ctxguard.guard.core import GuardCore, Speculation, Tools
    from ctxguard.guard.plan import Budget


def speculate(
    core: GuardCore,
    session_id: str,
    new: Sequence[NewMessage],
    budget: Budget,
    tools: Tools | None,
) -> Flow[tuple[Speculation | None, bool]]:
    """The request planned on the cached window if the session is still in its state,
    and whether a copy was found stale (then dropped: the caller fetches).

    Nothing is written before the request is sent, so no commit can say a copy is
    stale: the session's state token is read (one plain read). Where the store can send
    it ahead (``send_state_token``: the plain Redis client), it is sent before the plan
    and its reply taken after, so the round trip overlaps the plan's Python.
    """
    sent: Any = None
    if core.token_read == "send" and core.cache.get(session_id) is not None:
        sent = yield StoreCall("send_state_token", (session_id,))
    try:
        fast = core.speculate(session_id, new, budget, tools)
    except BaseException:
        if sent is not None:  # (its connection back; the plan's error is the answer)
            with contextlib.suppress(Exception):
                yield StoreCall("state_token_reply", (sent, session_id))
        raise
    if fast is None:
        if sent is not None:  # (a fetch plans: what the read says, it says again)
            with contextlib.suppress(CtxGuardError):
                yield StoreCall("state_token_reply", (sent, session_id))
        return None, False
    if core.token_read == "send":
        token: str = yield StoreCall("state_token_reply", (sent, session_id))
    elif core.token_read == "state_token":
        token = yield StoreCall("state_token", (session_id,))
    else:  # (a store the caller wrote: the contract's read, of nothing, with its token)
        token = (yield StoreCall("read_with_token", (session_id, 0, 0)))[1]
    if token == fast.fetch.token:
        return fast, False
    core.cache.evict(session_id)
    return None, True


def prepared(
    core: GuardCore,
    session_id: str,
    planned: Speculation,
    budget: Budget,
    tools: Tools | None,
    new: Sequence[NewMessage],
    counts: Mapping[int, int] | None = None,
    keep: bool = True,
) -> PreparedRequest:
    """The request planned on ``planned`` (the cached window, or a fetch), nothing stored.

    ``new``: the batch as given (the fetch says which of it a commit would store);
    ``keep``: whether the window cache may move on to the state the commit leaves.
    """
    fetch = planned.fetch
    fresh = core.fresh(fetch, new)
    cap = core.write_options.max_messages
    held = fetch.info.message_count - len(fresh)
    if cap and held + len(fresh) + 1 > cap:  # the turn's messages and its reply must fit:
        raise SessionFullError(session_id, held, len(fresh) + 1, cap)  # before the model call
    later = Unstored(
        tuple(fresh),
        len(new),
        budget.prompt,
        fetch,
        planned.record,
        dict(counts) if counts else {},
        tuple(planned.items) if keep and planned.items else None,
        keep and bool(planned.plan.plain),
        keep,
    )
    plan, sent, total = planned.plan, planned.sent, planned.total
    return core.prepared(session_id, 0, plan, sent, total, budget, tools, unstored=later)


def complete(
    core: GuardCore,
    session_id: str,
    reply: NewMessage,
    request: PreparedRequest,
    usage: Mapping[str, Any] | None,
) -> Flow[AppendResult]:
    """Store the request's new messages, ``reply`` and its record in one atomic step."""
    later = request.unstored
    assert later is not None
    record = core.with_usage(later.record, usage)
    record["rid"] = turn_rid(str(later.record["rid"]), reply.message.id)
    # counts made by this guard's counter only: a request another guard prepared (copied,
    # pickled) by another counter stores its messages with their counts unknown (counted
    # lazily by the next prepare that needs them) and writes none of its recounts
    same = request.counter == core.counter.fingerprint
    new = later.new if same else [NewMessage(n.message, None, n.record) for n in later.new]
    batch = [*new, reply]
    options = core.write_options
    token = later.fetch.token or ""
    write = core.write(later.counts if same else {}, record)
    todo: Sequence[NewMessage] = batch
    fetch: WindowFetch | None = None
    for attempt in range(MAX_COMMITS):
        if fetch is not None:
            if attempt >= FRESH_REPLANS:  # others keep writing: let them through, read afresh
                yield backoff(attempt)
                fetch = yield StoreCall(
                    "fetch_window", (session_id, later.prompt, options, batch, len(batch))
                )
                assert fetch is not None
            todo = core.fresh(fetch, batch)
            moved = as_sent(record, later, fetch, reply)
            write = core.write({}, moved)  # (recounted positions may have moved: not written)
            token = fetch.token or ""
            if not todo:  # every message is stored (by this request's earlier attempt)
                yield StoreCall("record", (session_id, write))
                core.cache.evict(session_id)
                ids = tuple(n.message.id for n in batch)
                return AppendResult((), ids, fetch.info.message_count, None, None)
        outcome: WindowHit | WindowFetch = yield StoreCall(
            "commit_if_unchanged",
            (session_id, token, later.prompt, options, todo, len(batch), write),
        )
        if isinstance(outcome, WindowHit):
            if fetch is None and later.keep:
                _cache(core, session_id, later, reply, outcome)
            else:
                core.cache.evict(session_id)
            core.prefix.committed(session_id, str(later.record["rid"]))
            core.replied(session_id, reply.message, outcome.appended)
            return outcome.appended
        fetch = outcome  # another writer came between: store after it, as sent
    raise ConflictError(
        f"session {session_id!r} changed under {MAX_COMMITS} attempts to store this turn "
        "(other writers); nothing was stored: retry the complete"
    )


def as_sent(
    record: Mapping[str, Any], later: Unstored, fetch: WindowFetch, reply: NewMessage
) -> dict[str, Any]:
    """``record`` with the new messages at the positions ``fetch`` says they land on.

    ``fetch`` answers as if the batch were appended: every new message is in its
    ``recent`` (the walk always takes them), at its position to be, or at its stored
    one. The messages between where the request planned them and where they land
    were written by another writer: the request did not see them (``unseen``).
    """
    at = {s.message.id: s.seq for s in fetch.recent}
    base = later.fetch.info.message_count - len(later.new)  # where the plan put them
    moved = {base + i: at.get(n.message.id, base + i) for i, n in enumerate(later.new)}
    seqs = [moved.get(seq, seq) for seq in sent_seqs(record)]
    out = {**record, "sent": seq_ranges(seqs)}
    reply_at = at.get(reply.message.id)
    count = out["message_count"] = reply_at if reply_at is not None else fetch.info.message_count
    end = base + len(later.new)
    # stored where planned (or no new message): another writer's messages came after them,
    # before the reply; else they were stored after another writer's, the reply with them
    stayed = all(moved[seq] == seq for seq in moved)
    hidden = [end, count] if stayed else [base, moved[base]]
    if hidden[1] > hidden[0]:
        out["unseen"] = hidden
    else:
        out.pop("unseen", None)
    return out


def turn_rid(rid: str, reply_id: str) -> str:
    """The rid of the record stored with ``reply``: the request's ULID time, and 16
    characters from both ids. A retried ``complete`` (the same reply) writes its record
    once; another reply to the same request (a second ``complete``) is a turn of its own,
    stored with its own record, as the default mode stores a second reply."""
    joined = f"{rid}\n{reply_id}".encode("utf-8", "surrogatepass")
    number = int.from_bytes(hashlib.blake2b(joined, digest_size=10).digest(), "big")
    return rid[:10] + "".join(_CROCKFORD[(number >> shift) & 31] for shift in _SHIFTS)


_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"  # (as ids.py: the rid stays a ULID)
_SHIFTS = tuple(range(75, -1, -5))


def _cache(
    core: GuardCore, session_id: str, later: Unstored, reply: NewMessage, hit: WindowHit
) -> None:
    """The window cache moves on to the state the commit left: the window planned on
    with the new messages, and the reply after them."""
    spec = later.fetch
    appended = hit.appended
    count = spec.info.message_count
    if (
        not hit.token  # a retried commit: the state after it is not known
        or appended.duplicates
        or appended.message_count != count + 1
    ):
        core.cache.evict(session_id)
        return
    planned = WindowFetch(
        spec.info,
        spec.pinned,
        spec.recent,
        spec.summary,
        spec.reached_start,
        None,
        spec.token,
        spec.stop_tokens,
    )
    result = AppendResult((reply.message.id,), (), count + 1, spec.token, hit.token)
    grown = extend(planned, [reply], result)
    if grown is None:
        core.cache.evict(session_id)
        return
    items = {i.seq: i for i in later.items} if later.items else None
    core.cache.put(session_id, grown, items, later.plain and not reply.message.tool_calls)
