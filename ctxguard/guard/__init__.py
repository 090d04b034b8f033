"""The guard: budget policies, tool-call integrity, admission control, audit."""

from ctxguard.guard.aio import AsyncGuard
from ctxguard.guard.config import GuardConfig, Summarizer
from ctxguard.guard.prepared import PreparedRequest
from ctxguard.guard.summarizers import ExtractiveSummarizer, OpenAISummarizer
from ctxguard.guard.sync import Guard

__all__ = [
    "AsyncGuard",
    "ExtractiveSummarizer",
    "Guard",
    "GuardConfig",
    "OpenAISummarizer",
    "PreparedRequest",
    "Summarizer",
]
