"""Adapters stay optional: nothing heavy on import, a named extra when a framework is missing."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

FRAMEWORKS = (
    "langchain_core",
    "langchain",
    "llama_index",
    "agents",
    "openai",
    "pydantic_ai",
    "litellm",
)


def run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120
    )


def test_importing_ctxguard_and_adapters_imports_no_framework() -> None:
    result = run(
        f"""
        import sys
        import ctxguard, ctxguard.adapters
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in {FRAMEWORKS!r})
        assert not loaded, loaded
        assert "CtxGuardSession" in dir(ctxguard.adapters)
        """
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    ("blocked", "module", "name", "extra"),
    [
        ("langchain_core", "langchain", "CtxGuardChatMessageHistory", "langchain"),
        ("llama_index.core", "llamaindex", "CtxGuardChatStore", "llamaindex"),
        ("llama_index.core", "llamaindex", "CtxGuardMemory", "llamaindex"),
        ("llama_index.core", "llamaindex", "CtxGuardLLM", "llamaindex"),
        ("agents", "openai_agents", "CtxGuardSession", "agents"),
        ("pydantic_ai", "pydantic_ai", "CtxGuardCapability", "pydantic-ai"),
        ("langchain.agents.middleware", "langchain", "CtxGuardMiddleware", "langchain"),
        ("litellm", "litellm", "CtxGuardGuardrail", "litellm"),
    ],
)
def test_missing_framework_names_the_extra(
    blocked: str, module: str, name: str, extra: str
) -> None:
    result = run(
        f"""
        import sys
        sys.modules[{blocked!r}] = None  # the import system treats None as "not installed"
        from ctxguard.errors import MissingDependencyError
        import ctxguard.adapters
        try:
            getattr(ctxguard.adapters, {name!r})
        except MissingDependencyError as exc:
            assert exc.extra == {extra!r}, exc.extra
            assert "pip install 'ctxguard[{extra}]'" in str(exc), str(exc)
            assert isinstance(exc, ImportError)
        else:
            raise SystemExit("no MissingDependencyError")
        """
    )
    assert result.returncode == 0, result.stderr + result.stdout


def test_unknown_adapter_name_is_an_attribute_error() -> None:
    import ctxguard.adapters

    with pytest.raises(AttributeError):
        _ = ctxguard.adapters.Nope  # type: ignore[attr-defined]
