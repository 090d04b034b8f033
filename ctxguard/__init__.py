"""ctxguard: keep LLM chat requests inside the memory the model server really has."""

from ctxguard.errors import (
    BudgetError,
    ConfigError,
    ConflictError,
    CorruptRecordError,
    CtxGuardError,
    InvalidIdError,
    InvalidInputError,
    InvalidMessageError,
    MessageTooLongError,
    MissingDependencyError,
    StoreConnectionError,
    StoreError,
    SummarizerError,
    TemplateRefusedError,
    TokenizerError,
)
from ctxguard.messages import Message, ToolCall

__all__ = [
    "BudgetError",
    "ConfigError",
    "ConflictError",
    "CorruptRecordError",
    "CtxGuardError",
    "InvalidIdError",
    "InvalidInputError",
    "InvalidMessageError",
    "Message",
    "MessageTooLongError",
    "MissingDependencyError",
    "StoreConnectionError",
    "StoreError",
    "SummarizerError",
    "TemplateRefusedError",
    "TokenizerError",
    "ToolCall",
]
