"""The examples run as a newcomer runs them (they are documentation that must not rot)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
# one example per framework adapter, each with a scripted (offline) model
ADAPTERS = {
    "langchain_agent.py": "langchain.agents",
    "llamaindex_chat.py": "llama_index.core",
    "openai_agents_session.py": "agents",
    "pydantic_ai_agent.py": "pydantic_ai",
}


def run(name: str) -> str:
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / name)], capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    return done.stdout


@pytest.mark.parametrize("name", ["quickstart.py", "async_backend.py"])
def test_example_runs(name: str) -> None:
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / name)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr


def test_quickstart_shows_the_window_sliding_and_a_summary() -> None:
    out = subprocess.run(
        [sys.executable, str(EXAMPLES / "quickstart.py")],
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    assert "Context limit: 592 tokens per request" in out  # Llama-3.1-8B, 24 GiB, 64 in flight
    assert "Summary v" in out and "Audit of turn 12" in out


@pytest.mark.parametrize("name", sorted(ADAPTERS))
def test_adapter_example_keeps_every_request_within_the_limit(name: str) -> None:
    pytest.importorskip(ADAPTERS[name])
    out = run(name)
    found = re.search(r"Largest request: (\d+) tokens \+ (\d+) reserved <= (\d+)", out)
    assert found, out
    tokens, reserved, limit = map(int, found.groups())
    assert tokens > 0 and tokens + reserved <= limit


def test_langchain_example_audits_every_model_call() -> None:
    pytest.importorskip("langchain.agents")
    out = run("langchain_agent.py")
    assert "Agent state: 53 messages; ctxguard session: 53 messages" in out
    assert "Usage records: 24" in out  # 12 turns, a tool call and an answer each


def test_pydantic_ai_example_keeps_the_run_in_the_session() -> None:
    pytest.importorskip("pydantic_ai")
    out = run("pydantic_ai_agent.py")
    assert "Session equals the run's history: True" in out
    assert "Usage records: 24" in out
    assert "Model context window: 700" in out


def test_openai_agents_example_trims_the_model_input() -> None:
    pytest.importorskip("agents")
    out = run("openai_agents_session.py")
    assert "Session items: 48" in out
    last = int(re.search(r"items on the last call: (\d+)", out).group(1))  # type: ignore[union-attr]
    assert last < 48


def test_llamaindex_example_pins_the_system_prompt() -> None:
    pytest.importorskip("llama_index.core")
    out = run("llamaindex_chat.py")
    assert "Stored: 25 messages" in out
    assert "First message of every request: ['system']" in out


# -- the README's adapter snippets: complete programs whose every import exists ----------

README = EXAMPLES.parent / "README.md"


def adapter_snippets() -> list[str]:
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## Adapters\n") : text.index("## Performance\n")]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


def test_the_readme_has_a_snippet_per_framework() -> None:
    snippets = adapter_snippets()
    for adapter in ("langchain", "llamaindex", "openai_agents", "pydantic_ai"):
        assert any(f"ctxguard.adapters.{adapter} import" in s for s in snippets), adapter
    assert "CtxGuardMiddleware" in snippets[0]  # the LangChain docs lead with the middleware


@pytest.mark.parametrize("index", range(4))
def test_readme_adapter_snippet_compiles_and_its_imports_exist(index: int) -> None:
    import importlib

    snippet = adapter_snippets()[index]
    compile(snippet, f"README snippet {index}", "exec")
    for module, names in re.findall(r"^from ([\w.]+) import ([\w, ]+)$", snippet, flags=re.M):
        loaded = pytest.importorskip(module)
        importlib.import_module(module)
        for name in (n.strip() for n in names.split(",")):
            assert hasattr(loaded, name), f"{module}.{name}"
