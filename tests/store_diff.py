"""A store's whole contents before and after a call, and the one change a refusal may make.

``take(store)`` reads every key a store holds under its namespace: on Redis and Redis
Cluster each key's type, value and TTL (whole seconds: -1 none); on ``memory://``
every session's fields as ``raw_session`` lays them out, plus its audit trail and
expiry, and every live lease. ``assert_refused_only(before, after)`` passes when
nothing changed, or when ``refused=True`` and the only change is ONE new ``refused``
audit record at the end of one session's trail (with its rid and the TTL refresh that
write makes: see ``add_audit`` in docs/redis-keys.md and ``flows._refused``).
"""

from __future__ import annotations

import json
import time
from typing import Any

from ctxguard.stores.memory_session import raw_session

Snapshot = dict[str, tuple[str, Any, int]]


def _inner(store: Any) -> Any:
    """The sync store behind an async memory store (``memory_async`` wraps one)."""
    return getattr(store, "sync", store)


def take(store: Any, url: str | None = None) -> Snapshot:
    """Every key of ``store``'s namespace: ``{key: (type, value, ttl seconds)}``."""
    inner = _inner(store)
    if hasattr(inner, "_sessions"):
        return _memory(inner)
    from tests.conftest import raw_client

    assert url is not None, "a Redis store's snapshot needs its URL"
    client = raw_client(url)
    try:
        return _redis(client, f"{store.namespace}:*")
    finally:
        client.close()


def _memory(store: Any) -> Snapshot:
    found: Snapshot = {}
    with store._lock:
        for sid, session in sorted(store._sessions.items()):
            raw = raw_session(session)
            ttl = -1 if session.expires_at is None else 1
            meta = {k: v for k, v in raw.meta.items() if k != "updated"}
            found[f"{sid}:meta"] = ("hash", sorted(meta.items()), ttl)
            found[f"{sid}:updated"] = ("string", raw.meta["updated"], ttl)
            for name in ("records", "toks", "pins"):
                value = getattr(raw, name)
                if value:
                    found[f"{sid}:{name}"] = ("list", list(value), ttl)
            if raw.ids:
                found[f"{sid}:ids"] = ("hash", sorted(raw.ids.items()), ttl)
            if raw.summary is not None:
                found[f"{sid}:sum"] = ("string", raw.summary, ttl)
            if session.audit:
                found[f"{sid}:audit"] = ("list", list(session.audit), ttl)
            if session.audit_rids:
                found[f"{sid}:rids"] = ("hash", sorted(session.audit_rids.items()), ttl)
    with store._leases._lock:  # (live ones: an expired lease is free, as on Redis)
        now = time.monotonic()
        for (sid, name), (holder, until) in sorted(store._leases._held.items()):
            if until > now:
                found[f"{sid}:lease:{name}"] = ("string", holder, 1)
    return found


def _redis(client: Any, pattern: str) -> Snapshot:
    from redis.cluster import RedisCluster

    if isinstance(client, RedisCluster):
        keys = client.scan_iter(match=pattern, count=1000, target_nodes=RedisCluster.PRIMARIES)
    else:
        keys = client.scan_iter(match=pattern, count=1000)
    found: Snapshot = {}
    for key in sorted(set(keys)):
        kind = client.type(key).decode()
        if kind == "none":
            continue  # (gone since the scan: a lease released meanwhile)
        if kind == "hash":
            value: Any = sorted(client.hgetall(key).items())
        elif kind == "list":
            value = client.lrange(key, 0, -1)
        elif kind == "string":
            value = client.get(key)
        elif kind == "set":
            value = sorted(client.smembers(key))
        elif kind == "zset":
            value = client.zrange(key, 0, -1, withscores=True)
        else:
            value = None
        pttl = client.pttl(key)
        found[key.decode()] = (kind, value, -1 if pttl < 0 else 1)
    return found


def changes(before: Snapshot, after: Snapshot) -> list[str]:
    """What differs, one line per key (for a readable assertion)."""
    lines = []
    for key in sorted(before.keys() | after.keys()):
        if before.get(key) != after.get(key):
            lines.append(f"{key}: {str(before.get(key))[:300]} -> {str(after.get(key))[:300]}")
    return lines


def _strip_refused(before: Snapshot, after: Snapshot) -> tuple[Snapshot, list[str]]:
    """``after`` without one refused record added to a trail (and its rid, and the
    ``updated`` time a memory store's audit write moves); the problems seen."""
    problems: list[str] = []
    grown = [
        key
        for key, (kind, value, _) in after.items()
        if key.endswith(":audit")
        and kind == "list"
        and (before.get(key) or ("list", [], -1))[1] == value[:-1]
        and before.get(key, (None, None))[1] != value
    ]
    if len(grown) != 1:
        return after, [f"expected one trail grown by one record, got {grown}"]
    key = grown[0]
    record = json.loads(after[key][1][-1])
    if record.get("kind", record.get("k")) != "refused":  # (Redis keeps it compacted)
        problems.append(f"the new audit record is not a refused one: {record}")
    out = dict(after)
    if key in before:
        out[key] = (before[key][0], before[key][1], before[key][2])
    else:
        del out[key]
    prefix = key[: -len("audit")]
    rids = prefix + "rids"
    if rids in after and after.get(rids) != before.get(rids):
        old = dict(before[rids][1]) if rids in before else {}
        new = dict(after[rids][1])
        added = set(new) - set(old)
        if len(added) > 1 or any(old[k] != new[k] for k in old):
            problems.append(f"rids changed beyond one new entry: {old} -> {new}")
        if rids in before:
            out[rids] = before[rids]
        else:
            del out[rids]
    for name in ("updated",):  # a memory store's audit write touches the session
        if prefix + name in out and prefix + name in before:
            out[prefix + name] = before[prefix + name]
    return out, problems


def assert_refused_only(before: Snapshot, after: Snapshot, refused: bool = False) -> None:
    """Nothing changed, or (``refused``) only one refused audit record was added."""
    if before == after:
        return
    if refused:
        stripped, problems = _strip_refused(before, after)
        diff = changes(before, stripped)
        assert not problems and not diff, "\n".join(problems + diff)
        return
    raise AssertionError("a refused call changed the store:\n" + "\n".join(changes(before, after)))


def refused_added(before: Snapshot, after: Snapshot) -> bool:
    """Whether ``after`` holds one more refused record than ``before`` (and nothing else)."""
    if before == after:
        return False
    _, problems = _strip_refused(before, after)
    return not problems


def _unversioned(snap: Snapshot, requests: bool = False) -> Snapshot:
    """``snap`` without what any write moves: the session's state token (its version and
    stamp) and update time (and with ``requests``, what a window's request record moves:
    the turn counter, and on Redis the request context it names, ``ctx``)."""
    drop = {"ver", "stamp", "updated"} | ({"turns", "ctx"} if requests else set())
    out: Snapshot = {}
    for key, (kind, value, ttl) in snap.items():
        if key.endswith(":updated") or (requests and key.endswith(":ctx")):
            continue
        if key.endswith(":meta") and kind == "hash":
            value = [(k, v) for k, v in value if _text(k) not in drop]
        out[key] = (kind, value, ttl)
    return out


def _kind(raw: Any) -> str:
    """An audit record's kind, as stored or compacted (Redis keeps a record smaller: a
    request record's kind, with the rest of its context, lives in the context key)."""
    from ctxguard.stores.audit_compact import MARKER, expand

    record = json.loads(raw)
    if MARKER in record:
        record = expand(record)
        if "kind" not in record and "turn" in record and "ctx" in record:
            return "request"
    return str(record.get("kind"))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def assert_taken_back(before: Snapshot, after: Snapshot, also: tuple[str, ...] = ()) -> None:
    """What a refused request's framework stored was taken back (``store.retract``): the
    messages, ids, counts, pins and summary are as before; the only changes are
    ``retract`` records at the end of one session's audit trail, with records of the
    kinds in ``also`` (the guard's one ``refused`` record; the ``request`` records of
    windows that fitted before a later call of the request was refused, and the turns
    they numbered) and their rids, and the session's state token and update time, which
    every write moves (a reader holding the old token sees the session changed)."""
    trails = [k for k in after if k.endswith(":audit") and before.get(k) != after[k]]
    assert len(trails) == 1, f"expected one audit trail grown, got {trails}"
    key = trails[0]
    old = list((before.get(key) or ("list", [], -1))[1])
    new = list(after[key][1])
    assert new[: len(old)] == old and len(new) > len(old), "the audit trail was rewritten"
    kinds = [_kind(r) for r in new[len(old) :]]
    assert sorted(set(kinds)) == sorted({"retract", *also}), f"records added: {kinds}"
    assert kinds.count("refused") <= 1, f"records added: {kinds}"
    stripped = dict(after)
    rids = key[: -len("audit")] + "rids"
    for name in (key, rids):
        if name in before:
            stripped[name] = before[name]
        else:
            stripped.pop(name, None)
    if rids in after:
        was = dict(before[rids][1]) if rids in before else {}
        now = dict(after[rids][1])
        assert all(now.get(k) == v for k, v in was.items()), "a rid changed"
        others = len(kinds) - kinds.count("retract")
        assert len(now) - len(was) <= others, "rids beyond the records allowed"
    requests = "request" in also
    diff = changes(_unversioned(before, requests), _unversioned(stripped, requests))
    assert not diff, "a taken-back write changed the store:\n" + "\n".join(diff)
