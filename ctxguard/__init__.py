"""ctxguard: keep LLM chat requests inside the memory the model server really has.

The public API, all importable from here::

    from ctxguard import Guard, AsyncGuard, ModelLimit, load_counter

    guard = Guard("redis://localhost:6379/0", counter="tiktoken:cl100k_base", limit=8192)
    request = guard.prepare("session-1", [{"role": "user", "content": "Hi!"}], max_tokens=512)
    reply = client.chat.completions.create(model=..., **request.request_kwargs())
    guard.complete("session-1", reply.choices[0].message.model_dump(), prepared=request,
                   usage=reply.usage.model_dump())

Stores are chosen by URL (``memory://``, ``redis://``, ``rediss://``,
``redis+cluster://``); counters by spec (``approx``, ``tiktoken:…``, ``hf:/path``,
``mistral:…``); limits are an int, a :class:`ContextLimit`, or a source that derives
one (:class:`ModelLimit` from the KV cache, :class:`ServerLimit` from a running vLLM).
Framework adapters live in :mod:`ctxguard.adapters` and load only when imported;
``observer=`` gets one :class:`OperationEvent` per operation (Prometheus and
OpenTelemetry observers in :mod:`ctxguard.observe`, loaded only when imported).
"""

from ctxguard.errors import (
    BudgetError,
    ConfigError,
    ConflictError,
    CorruptRecordError,
    CtxGuardError,
    GuardClosedError,
    InvalidIdError,
    InvalidInputError,
    InvalidMessageError,
    MessageIdReusedError,
    MessageTooLongError,
    MissingDependencyError,
    NotCopyableError,
    OutputReserveError,
    ServerAuthError,
    ServerBusyError,
    SessionFullError,
    StoreConnectionError,
    StoreError,
    SummarizerError,
    TemplateRefusedError,
    TenantBudgetError,
    TokenizerAuthError,
    TokenizerError,
    UncountableContentError,
    UpstreamAuthError,
)
from ctxguard.guard import (
    AsyncGuard,
    ExtractiveSummarizer,
    Guard,
    GuardConfig,
    OpenAISummarizer,
    PreparedRequest,
)
from ctxguard.guard.events import OperationEvent
from ctxguard.kv import ContextLimit, LimitSource, ModelLimit, ServerLimit, StaticLimit
from ctxguard.messages import Message, ToolCall
from ctxguard.stores import open_async_store, open_store
from ctxguard.tokens import TokenCounter, load_counter

__all__ = [
    "AsyncGuard",
    "BudgetError",
    "ConfigError",
    "ConflictError",
    "ContextLimit",
    "CorruptRecordError",
    "CtxGuardError",
    "ExtractiveSummarizer",
    "Guard",
    "GuardClosedError",
    "GuardConfig",
    "InvalidIdError",
    "InvalidInputError",
    "InvalidMessageError",
    "LimitSource",
    "Message",
    "MessageIdReusedError",
    "MessageTooLongError",
    "MissingDependencyError",
    "ModelLimit",
    "NotCopyableError",
    "OpenAISummarizer",
    "OperationEvent",
    "OutputReserveError",
    "PreparedRequest",
    "ServerAuthError",
    "ServerBusyError",
    "ServerLimit",
    "SessionFullError",
    "StaticLimit",
    "StoreConnectionError",
    "StoreError",
    "SummarizerError",
    "TemplateRefusedError",
    "TenantBudgetError",
    "TokenCounter",
    "TokenizerAuthError",
    "TokenizerError",
    "ToolCall",
    "UncountableContentError",
    "UpstreamAuthError",
    "load_counter",
    "open_async_store",
    "open_store",
]
