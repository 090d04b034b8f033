"""A request record's context, stored once per session on Redis (no I/O).

Most of a request record is the same on every request of a session: its kind,
the session, the counter and its spec, the limit and where it came from, the
output reserve, the margin, the tools' overhead and count, the policy settings
(``CONTEXT_FIELDS``). Redis
stores that part once per distinct value, in the session's ``ctx`` hash under a
digest of its JSON, and the record in ``audit`` carries ``"ctx": <digest>`` in
its place. :func:`audit_arg` builds the script argument (the record, then after a
newline the digest and the context JSON: JSON holds no raw newline);
``with_context`` in ``_lib.lua`` stores the context (once: the meta field ``ctx``
names the last one stored, so a record whose context is that one costs no
command) or, when it cannot (the hash is full or damaged, or the digest is taken),
writes the record whole. :func:`resolve` puts the fields back when reading, in
their place, so every reader sees the record as it was written. The rest of the
record is stored smaller by :mod:`~ctxguard.stores.audit_compact` (short key names,
``at`` as an integer, derivable fields left out), undone before :func:`resolve`.

Only records whose context fields stand together (as the guard writes them)
are split, so a resolved record is the written one key for key, in order. The
hash is never trimmed: a record keeps resolving however long ago its context was
stored, while the trail itself stays capped.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from ctxguard.errors import InvalidInputError
from ctxguard.stores.audit_compact import compact_json
from ctxguard.stores.records import encode_audit, refuse_non_finite, with_rid

CONTEXT_FIELDS = frozenset(
    {
        "kind",
        "session",
        "exact",
        "additive",
        "counter",
        "counter_spec",
        "limit",
        "limit_source",
        "reserved_output",
        "safety_margin",
        "overhead",
        "tools",
        "policy",
    }
)
CONTEXT_KEY = "ctx"
DIGEST_CHARS = 16  # hex: blake2b-64 over the context JSON


def split(record: Mapping[str, Any]) -> tuple[dict[str, Any], str, str] | None:
    """``(record with "ctx": digest in its context's place, digest, context JSON)``,
    or None when the record is stored whole (not a request, or its context fields
    do not stand together, or it holds a ``ctx`` field of its own)."""
    if record.get("kind") != "request" or CONTEXT_KEY in record:
        return None
    out: dict[str, Any] = {}
    context: dict[str, Any] = {}
    after = False  # past the context fields
    for key, value in record.items():  # one pass: this runs on every request
        if key in CONTEXT_FIELDS:
            if after:
                return None
            if not context:
                out[CONTEXT_KEY] = ""  # its place, filled in below
            context[key] = value
        else:
            after = after or bool(context)
            out[key] = value
    encoded = encode_audit(context)
    digest = hashlib.blake2b(encoded.encode(), digest_size=DIGEST_CHARS // 2).hexdigest()
    out[CONTEXT_KEY] = digest
    return out, digest, encoded


def audit_arg(record: Mapping[str, Any]) -> str:
    """The audit record argument of a script: the record's JSON (compacted:
    ``stores.audit_compact``), and for a request record ``"\\n" + digest + context
    JSON`` after it (see ``with_context`` in _lib.lua)."""
    record = with_rid(record)
    try:
        parts = split(record)
        if parts is None:
            return compact_json(record)
        rest, digest, context = parts
        return f"{compact_json(rest)}\n{digest}{context}"
    except InvalidInputError:  # a NaN (encode_audit): named by the caller's field names,
        refuse_non_finite(record)  # not the stored (compacted) ones
        raise


def resolve(records: Sequence[dict[str, Any]], contexts: Mapping[str, str]) -> list[dict[str, Any]]:
    """The records with each stored context back in its place (a record whose
    digest is not in ``contexts`` is left as stored)."""
    out = []
    for record in records:
        digest = record.get(CONTEXT_KEY)
        if not isinstance(digest, str) or "kind" in record:
            out.append(record)
            continue
        context = _context(contexts.get(digest))  # decoded per record: no shared values
        if context is None:
            out.append(record)
            continue
        whole: dict[str, Any] = {}
        for key, value in record.items():
            if key == CONTEXT_KEY:
                whole.update(context)
            else:
                whole[key] = value
        out.append(whole)
    return out


def _context(raw: str | None) -> dict[str, Any] | None:
    if raw is None:
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
