"""Who is asking and which session: tenant, session id, and the ids of new messages.

Pure functions. A session id comes from, in this order: the ``X-Session-Id`` header,
``metadata.session_id`` in the body, the body's ``user`` field. None of them: stateless.

Message ids are derived, not random, so a retry stores nothing twice: a new message's id
hashes the session, an *anchor* and the message. The anchor is the ``Idempotency-Key``
when the client sends one, else the id of the newest stored assistant message: a request
re-sent after a failure (no reply stored since) gets the same ids, and the store's
idempotent append keeps one copy, while the same text sent after a reply is a new turn.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from ctxguard.errors import InvalidIdError
from ctxguard.ids import validate_id, validate_name
from ctxguard.serve.openai_errors import ApiError, bad_request, json_kind

SESSION_HEADER = "x-session-id"
TENANT_HEADER = "x-tenant"
IDEMPOTENCY_HEADER = "idempotency-key"


def header(headers: Mapping[str, str], name: str, shown: str) -> str | None:
    """A header's value as the client wrote it (UTF-8), or None when absent.

    ASGI servers hand header bytes to Python as Latin-1 (Starlette decodes them so), which
    turns ``séssion`` into ``sÃ©ssion``: the bytes are read again as UTF-8 here, and a
    value that is not UTF-8 is a 400. A value holding characters Latin-1 has not was
    decoded already (headers built in Python, as LiteLLM's tests do) and is kept."""
    value = headers.get(name)
    if value is None:
        return None
    try:
        raw = value.encode("latin-1")
    except UnicodeEncodeError:
        return value
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise bad_request(
            f"the {shown} header is not valid UTF-8; send it as UTF-8 text",
            param=shown,
            code="invalid_header",
        ) from None


def session_id_of(headers: Mapping[str, str], body: Mapping[str, Any]) -> tuple[str | None, str]:
    """The session id and where it came from (for error messages); (None, "") if stateless.

    Every source present is checked, even when a higher one wins. An ``X-Session-Id`` or
    ``metadata.session_id`` that is present but empty is a 400: a client that meant a
    session and sent none would otherwise lose its history without a word."""
    metadata = body.get("metadata")
    if metadata is not None and not isinstance(metadata, Mapping):
        raise bad_request("'metadata' must be an object of strings", param="metadata")
    named = header(headers, SESSION_HEADER, "X-Session-Id")
    given = (metadata or {}).get("session_id")
    for value, where in ((named, "X-Session-Id"), (given, "metadata.session_id")):
        if isinstance(value, str) and not value.strip():
            raise ApiError(
                400,
                f"{where} is empty; send a session id, or leave it out for a stateless request",
                param=where,
                code="invalid_session_id",
            )
    candidates: list[tuple[object, str]] = [
        (named, "X-Session-Id"),
        (given, "metadata.session_id"),
        (body.get("user"), "user"),
    ]
    return pick_session_id(candidates)


def pick_session_id(candidates: Sequence[tuple[object, str]]) -> tuple[str | None, str]:
    """The first present candidate (value, where it came from), every one checked; a bad
    id is a 400 naming where it came from. (None, "") when none is present."""
    found: tuple[str | None, str] = (None, "")
    for value, where in candidates:
        if value is None or value == "":
            continue
        if not isinstance(value, str):
            raise ApiError(
                400,
                f"the session id ({where}) must be a string, got {json_kind(value)}",
                param=where,
                code="invalid_session_id",
            )
        try:
            checked = validate_id(value, f"session id ({where})")
        except InvalidIdError as exc:
            raise ApiError(400, str(exc), param=where, code="invalid_session_id") from None
        if found[0] is None:
            found = (checked, where)
    return found


def tenant_of(
    headers: Mapping[str, str], api_keys: Mapping[str, str], default: str | None
) -> str | None:
    """The tenant: from the API-key map when one is configured (then a key is required),
    else the ``X-Tenant`` header, else the configured default."""
    if api_keys:
        auth = headers.get("authorization", "")
        key = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
        tenant = api_keys.get(key) if key else None
        if tenant is None:
            raise ApiError(
                401,
                "missing or unknown API key; send Authorization: Bearer <key>",
                code="invalid_api_key",
            )
        return tenant
    raw = header(headers, TENANT_HEADER, "X-Tenant")
    if raw is None:
        return default
    if not raw.strip():  # (it fell back to the default tenant: another tenant's sessions)
        raise ApiError(
            400,
            "X-Tenant is empty; send a tenant, or leave the header out for the default one",
            param="X-Tenant",
            code="invalid_tenant",
        )
    try:
        return validate_name(raw, "tenant (X-Tenant)")
    except InvalidIdError as exc:
        raise ApiError(400, str(exc), param="X-Tenant", code="invalid_tenant") from None


def idempotency_key_of(headers: Mapping[str, str]) -> str | None:
    raw = header(headers, IDEMPOTENCY_HEADER, "Idempotency-Key")
    if raw is None:
        return None
    if not raw.strip():  # (it was ignored: a retry the client thought safe stored twice)
        raise bad_request(
            "Idempotency-Key is empty; send a unique key, or leave the header out",
            param="Idempotency-Key",
            code="invalid_idempotency_key",
        )
    try:
        return validate_id(raw, "Idempotency-Key")
    except InvalidIdError as exc:
        raise bad_request(
            str(exc), param="Idempotency-Key", code="invalid_idempotency_key"
        ) from None


def _digest(*parts: str) -> str:
    h = hashlib.blake2b(digest_size=12)
    for part in parts:
        h.update(part.encode("utf-8", "surrogatepass"))
        h.update(b"\x00")
    return h.hexdigest()


def anchor_of(stored_ids_and_roles: Sequence[tuple[str, str]], window: int) -> str:
    """The newest stored assistant message's id (oldest first input); if none among the
    last ``window``, the oldest id read; an empty session anchors at ``""``."""
    for message_id, role in reversed(stored_ids_and_roles):
        if role == "assistant":
            return "a:" + message_id
    if len(stored_ids_and_roles) >= window:
        return "o:" + stored_ids_and_roles[0][0]
    return ""


def message_ids(
    tenant: str | None, session_id: str, anchor: str, messages: Sequence[Mapping[str, Any]]
) -> list[str]:
    """One derived id per message (a message that carries its own ``id`` keeps it)."""
    out: list[str] = []
    for index, message in enumerate(messages):
        own = message.get("id")
        if isinstance(own, str) and own:
            out.append(own)
            continue
        canonical = json.dumps(message, sort_keys=True, ensure_ascii=False, default=str)
        out.append("gw-" + _digest(tenant or "", session_id, anchor, str(index), canonical))
    return out


def reply_id(new_ids: Sequence[str], anchor: str) -> str:
    """The stored reply's id: the same for every retry of the same request."""
    return "gw-r-" + _digest(anchor, *new_ids)


def idempotency_anchor(key: str) -> str:
    return "k:" + key
