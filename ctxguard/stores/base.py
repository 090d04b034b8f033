"""The store contract and the helpers every backend shares, under one import path.

``contract.py`` holds the contract (the :class:`SessionStore` /
:class:`AsyncSessionStore` protocols and the data they exchange), ``records.py``
how records are encoded and decoded, ``walk.py`` the window walk. Import them
from here.
"""

from __future__ import annotations

from ctxguard.stores.contract import (
    UNKNOWN_TOKENS,
    AppendResult,
    AsyncSessionStore,
    NewMessage,
    RecordWrite,
    ReplaceResult,
    SessionInfo,
    SessionStore,
    StoredMessage,
    Summary,
    WindowFetch,
    WindowHit,
    WriteOptions,
    stored_before,
)
from ctxguard.stores.records import (
    REQUEST_RECORD_HEAD,
    RID_PATTERN,
    audit_rid,
    decode_audit,
    decode_audits,
    decode_message,
    decode_record,
    decode_summary,
    encode_audit,
    ms_to_datetime,
    tokens_or_none,
    with_rid,
)
from ctxguard.stores.walk import (
    RECORD_SKELETON_BYTES,
    check_summary,
    check_window_args,
    estimate_unknown_tokens,
    virtual_window,
    walk_back,
)

__all__ = [
    "RECORD_SKELETON_BYTES",
    "REQUEST_RECORD_HEAD",
    "RID_PATTERN",
    "UNKNOWN_TOKENS",
    "AppendResult",
    "AsyncSessionStore",
    "NewMessage",
    "RecordWrite",
    "ReplaceResult",
    "SessionInfo",
    "SessionStore",
    "StoredMessage",
    "Summary",
    "WindowFetch",
    "WindowHit",
    "WriteOptions",
    "audit_rid",
    "check_summary",
    "check_window_args",
    "decode_audit",
    "decode_audits",
    "decode_message",
    "decode_record",
    "decode_summary",
    "encode_audit",
    "estimate_unknown_tokens",
    "ms_to_datetime",
    "stored_before",
    "tokens_or_none",
    "virtual_window",
    "walk_back",
    "with_rid",
]
