"""Every Redis key ctxguard writes, in one place.

Layout (``<ns>`` namespace, ``<tenant>`` tenant, ``<sid>`` the session id
percent-encoded so it holds no ``{ } * ? [ ] :`` or control characters)::

    <ns>:<tenant>:{<sid>}:meta    HASH  created, updated (ms), count, tokens, counter, sumver,
                                        turns, epoch, ver, ctx (the last context stored)
    <ns>:<tenant>:{<sid>}:msgs    LIST  JSON message records, append order (seq = index)
    <ns>:<tenant>:{<sid>}:toks    LIST  token count per record (-1 = unknown), same order
    <ns>:<tenant>:{<sid>}:ids     HASH  message id -> seq (idempotent appends)
    <ns>:<tenant>:{<sid>}:pins    LIST  seqs of system/developer messages
    <ns>:<tenant>:{<sid>}:sum     STRING JSON rolling summary (version, covers_to, text)
    <ns>:<tenant>:{<sid>}:audit   LIST  JSON audit records, newest last, capped
    <ns>:<tenant>:{<sid>}:rids    HASH  audit record id -> turn (0 = not a request), for the
                                        records in ``audit`` (idempotent audit writes)
    <ns>:<tenant>:{<sid>}:ctx     HASH  digest -> JSON: the request records' context, once
                                        per distinct value (stores.audit_context)

Beside them, short-lived and never read by a session script (not in ``SUFFIXES``)::

    <ns>:<tenant>:{<sid>}:lease:<name>  STRING  holder token, with a TTL (PX): who runs
                                        the request named ``<name>`` (percent-encoded)
                                        now; the gateway's Idempotency-Key in flight
    <ns>:<tenant>:{<sid>}:leases  SET   the ``<name>`` of each lease taken, its TTL the
                                        longest lease's: how ``delete`` finds them

The ``{<sid>}`` hash tag puts all keys of a session in one cluster slot, so the
same Lua scripts run unchanged on Redis Cluster.

Outside the sessions (never matched by a session pattern: no ``{`` after the prefix)::

    <ns>:<tenant>:~budget:tokens  HASH  time bucket (ms) -> tokens spent in it, for the
                                        tenant's token budget over a sliding window
                                        (ctxguard.observe.tenant_budget; one key, one slot)
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from urllib.parse import quote, unquote

from ctxguard.ids import validate_id, validate_name

SUFFIXES = ("meta", "msgs", "toks", "ids", "pins", "sum", "audit", "rids", "ctx")


def encode_session_id(session_id: str) -> str:
    """Percent-encode everything but ``A-Z a-z 0-9 _ . - ~``: no glob, tag or separator chars."""
    return quote(session_id, safe="")


@dataclass(frozen=True, slots=True)
class KeySpace:
    """Key names for one namespace and tenant."""

    namespace: str = "ctxg"
    tenant: str = "default"

    def __post_init__(self) -> None:
        validate_name(self.namespace, "namespace")
        validate_name(self.tenant, "tenant")

    @property
    def prefix(self) -> str:
        return f"{self.namespace}:{self.tenant}:"

    def session_keys(self, session_id: str, *, stored: bool = False) -> list[str]:
        """The nine keys of a session, in the order every script expects them.

        ``stored``: for a read or a delete of what is stored, the id held to the rule an
        older version wrote under (a format character or U+2028/U+2029 allowed, see
        :func:`~ctxguard.ids.validate_id`), so such a session can still be read, shown,
        exported and deleted; every write derives its keys without it and refuses."""
        if not isinstance(session_id, str):  # (unhashable ones too: the typed error first)
            validate_id(session_id, "session id")
        if stored:
            return list(_stored_session_keys(f"{self.namespace}:{self.tenant}:", session_id))
        return list(_session_keys(f"{self.namespace}:{self.tenant}:", session_id))

    def lease_key(self, session_id: str, name: str) -> str:
        """A lease on ``name`` within the session (same hash slot as its keys)."""
        validate_id(name, "lease name")
        return f"{self.session_keys(session_id)[0][:-4]}lease:{encode_session_id(name)}"

    def lease_names_key(self, session_id: str, *, stored: bool = False) -> str:
        """The SET of the session's lease names (as in their keys), which ``delete``
        reads to remove them with the session (``stored``: see :meth:`session_keys`)."""
        return f"{self.session_keys(session_id, stored=stored)[0][:-4]}leases"

    def tenant_budget_key(self) -> str:
        """The tenant's token-budget key (a single key: any script on it is cluster-safe)."""
        return f"{self.prefix}~budget:tokens"

    def meta_pattern(self, session_prefix: str = "") -> str:
        """SCAN MATCH pattern for the meta keys of sessions starting with a prefix.

        The encoded prefix holds no glob characters, so a session id of ``*``
        matches only itself.
        """
        return f"{self.prefix}{{{encode_session_id(session_prefix)}*}}:meta"

    def session_id_from_meta_key(self, key: str) -> str | None:
        head = self.prefix + "{"
        tail = "}:meta"
        if not (key.startswith(head) and key.endswith(tail)):
            return None
        return unquote(key[len(head) : -len(tail)])

    def session_id_from_key(self, key: str) -> tuple[str, str] | None:
        """(session id, suffix) of any key of a session in this key space, else None."""
        head = self.prefix + "{"
        if not key.startswith(head) or "}:" not in key:
            return None
        encoded, _, suffix = key[len(head) :].rpartition("}:")
        if suffix not in SUFFIXES or "}" in encoded:
            return None
        return unquote(encoded), suffix


@lru_cache(maxsize=4096)
def _session_keys(prefix: str, session_id: str) -> tuple[str, ...]:
    """Made once per session (every script call of a turn needs them; an id that
    fails validation raises, and nothing is kept for it)."""
    validate_id(session_id, "session id")
    return _keys_of(prefix, session_id)


@lru_cache(maxsize=256)
def _stored_session_keys(prefix: str, session_id: str) -> tuple[str, ...]:
    """:func:`_session_keys` for reads and deletes, under the older id rule. A cache of
    its own: an id it takes is never in ``_session_keys``'s, so a write still refuses."""
    validate_id(session_id, "session id", stored=True)
    return _keys_of(prefix, session_id)


def _keys_of(prefix: str, session_id: str) -> tuple[str, ...]:
    base = f"{prefix}{{{encode_session_id(session_id)}}}:"
    return tuple(base + suffix for suffix in SUFFIXES)
