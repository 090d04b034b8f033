"""Adapters for the frameworks users arrive from; each is an optional extra.

===========================================  =======================  ==============
class                                        module                   extra
===========================================  =======================  ==============
``CtxGuardChatMessageHistory``               ``adapters.langchain``   ``langchain``
``CtxGuardMiddleware`` (langchain>=1.0)      ``adapters.langchain``   ``langchain``
``CtxGuardChatStore``, ``CtxGuardMemory``    ``adapters.llamaindex``  ``llamaindex``
``CtxGuardLLM`` (agents' final input)         ``adapters.llamaindex``  ``llamaindex``
``CtxGuardSession``                          ``adapters.openai_agents``  ``agents``
``CtxGuardCapability``                       ``adapters.pydantic_ai``  ``pydantic-ai``
``CtxGuardGuardrail`` (LiteLLM proxy)        ``adapters.litellm``     ``litellm``
===========================================  =======================  ==============

Importing this package imports no framework: a name is resolved from its module
on first access, and a missing framework raises
:class:`~ctxguard.errors.MissingDependencyError` naming the extra to install.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "CtxGuardChatMessageHistory": "langchain",
    "CtxGuardMiddleware": "langchain",
    "CtxGuardChatStore": "llamaindex",
    "CtxGuardMemory": "llamaindex",
    "CtxGuardLLM": "llamaindex",
    "CtxGuardSession": "openai_agents",
    "CtxGuardCapability": "pydantic_ai",
    "CtxGuardGuardrail": "litellm",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))
