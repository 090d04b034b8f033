"""The examples run as a newcomer runs them (they are documentation that must not rot)."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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


# -- the README's adapter snippets, run end to end against a vLLM-shaped server ----------

README_VLLM = 'VLLM = "http://localhost:8000"'
README_REDIS = '"redis://localhost:6379/0"'
# per snippet (README order): the module it needs, the arguments of the tool call the
# model makes and what the run prints (the fake echoes the tool's result)
SNIPPET_RUNS = {
    "langchain": ("langchain_openai", {"city": "Paris"}, "echo: Paris: 18C and clear"),
    "llamaindex": (
        "llama_index.llms.openai_like",
        {"order_id": 1138},
        "echo: Order 1138 left the warehouse this morning.",
    ),
    "openai_agents": ("agents", {"city": "Paris"}, "echo: Paris: 18C and clear"),
    "pydantic_ai": ("pydantic_ai.models.openai", {"city": "Paris"}, "echo: Paris: 18C and clear"),
}
USER_TEXT = {"llamaindex": "Where is my order 1138?"}


@pytest.fixture(scope="module")
def vllm(hf_dirs: dict[str, Path]) -> Iterator[Any]:
    """tests/serve's vLLM-shaped server (real HTTP, exact counts through Qwen's template)."""
    from serve.upstream import FakeVLLM
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(hf_dirs["qwen-2.5"]), local_files_only=True)
    server = FakeVLLM(tokenizer).start()
    yield server
    server.stop()


def addressed(snippet: str, vllm_url: str, store_url: str) -> str:
    """The snippet with the README's addresses replaced (each exactly once)."""
    assert snippet.count(README_VLLM) == 1, "the snippet no longer names vLLM as the README says"
    assert snippet.count(README_REDIS) == 1, "the snippet no longer names Redis as the README says"
    snippet = snippet.replace(README_VLLM, f'VLLM = "{vllm_url}"')
    return snippet.replace(README_REDIS, repr(store_url))


# what the user said before: 16 turns, together far over the served limit below
EARLIER = [
    {"role": role, "content": f"{role} turn {i}: " + " ".join(["the weather was fine"] * 25)}
    for i in range(16)
    for role in ("user", "assistant")
]
SERVED_LIMIT = 1536  # the fake's max_model_len: room for the 512-token reply and a little


@pytest.mark.parametrize("framework", sorted(SNIPPET_RUNS))
def test_readme_adapter_snippet_runs_against_a_vllm_shaped_server(
    framework: str,
    vllm: Any,
    redis_url: str,
    namespace: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The snippet, as printed (only the addresses replaced), talks to a vLLM-shaped
    server: the model calls the snippet's tool and answers; every request the server got
    fit its limit by its exact count although the session's history does not; the turn
    is stored in the session "user-42" of the test's Redis namespace."""
    from ctxguard import Guard

    module, arguments, printed = SNIPPET_RUNS[framework]
    pytest.importorskip(module)
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "OPENAI_API_BASE"):
        monkeypatch.delenv(name, raising=False)  # as a user with vLLM and no OpenAI account
    snippet = next(s for s in adapter_snippets() if f"ctxguard.adapters.{framework} " in s)
    join = "&" if "?" in redis_url else "?"
    code = addressed(snippet, vllm.url, f"{redis_url}{join}namespace={namespace}")
    guard = Guard(redis_url, limit=4096, namespace=namespace)
    try:
        guard.append("user-42", EARLIER)
        history = vllm.count({"messages": EARLIER})
        assert history > SERVED_LIMIT  # sent whole, the history alone would not fit
        vllm.requests.clear()
        vllm.prompt_tokens.clear()
        vllm.max_model_len, vllm.first_tool_arguments = SERVED_LIMIT, arguments
        try:
            exec(compile(code, f"README {framework} snippet", "exec"), {"__name__": "__main__"})
        finally:
            vllm.max_model_len, vllm.first_tool_arguments = 4096, None
        out = capsys.readouterr().out
        stored = [s.message.to_openai() for s in guard.store.read("user-42")]
    finally:
        guard.close()

    assert printed in out, out  # the model called the snippet's tool and answered from it
    # the model was called: the tool call, then the answer from the tool's result
    assert len(vllm.requests) >= 2
    assert any(m["role"] == "tool" for m in vllm.requests[-1]["messages"])
    for body, prompt in zip(vllm.requests, vllm.prompt_tokens, strict=True):
        reserved = body.get("max_tokens") or body.get("max_completion_tokens") or 0
        assert prompt + reserved <= SERVED_LIMIT, (prompt, reserved)
    # the session: the earlier turns, then this turn with its tool call and the answer
    user = USER_TEXT.get(framework, "Weather in Paris?")
    assert [m["content"] for m in stored[: len(EARLIER)]] == [m["content"] for m in EARLIER]
    new = stored[len(EARLIER) :]
    assert [m["content"] for m in new if m["role"] == "user"] == [user], new
    assert any(m.get("tool_calls") for m in new), new
    assert new[-1]["role"] == "assistant" and printed in str(new[-1]["content"]), new


# -- the README's "Use" snippet, run as printed against a vLLM-shaped server -------------

README_USE_URL = '"redis://:password@localhost:6379/0?namespace=support&tenant=acme"'
README_USE_COUNTER = '"hf:/models/Qwen2.5-7B-Instruct"'


def test_readme_use_snippet_runs_against_a_vllm_shaped_server(
    vllm: Any, hf_dirs: dict[str, Path], redis_url: str, namespace: str
) -> None:
    """The first snippet a user copies: the README's store URL (with a password our
    server has not) and tokenizer path are the only changes; `client`, `MODEL` and `TOOLS`,
    which it leaves to the reader, are an OpenAI client on the fake, its model and a tool."""
    pytest.importorskip("openai")
    from ctxguard import Guard

    text = README.read_text(encoding="utf-8")
    use = text[text.index("## Use\n") :]
    snippet = re.search(r"```python\n(.*?)```", use, flags=re.S).group(1)  # type: ignore[union-attr]
    assert snippet.count(README_USE_URL) == 1 and snippet.count(README_USE_COUNTER) == 1
    join = "&" if "?" in redis_url else "?"
    store = f"{redis_url}{join}namespace={namespace}&tenant=acme"
    code = snippet.replace(README_USE_URL, repr(store)).replace(
        README_USE_COUNTER, repr(f"hf:{hf_dirs['qwen-2.5']}")
    )
    setup = (
        "import openai\n"
        f"client = openai.OpenAI(base_url={vllm.url + '/v1'!r}, api_key='unused')\n"
        "MODEL = 'Qwen/Qwen2.5-7B-Instruct'\n"
        "TOOLS = [{'type': 'function', 'function': {'name': 'order_status', 'description': "
        "'Where an order is.', 'parameters': {'type': 'object', 'properties': {}}}}]\n"
    )
    scope: dict[str, Any] = {"__name__": "__main__"}
    exec(compile(setup + code, "README Use snippet", "exec"), scope)
    request = scope["request"]
    assert request.tokens + request.reserved_output <= request.limit == 32768
    assert request.reserved_output == 512 and "calculator" in request.limit_source
    scope["guard"].close()
    guard = Guard(redis_url, namespace=namespace, tenant="acme", limit=4096)
    try:
        stored = [s.message.role for s in guard.store.read("chat-123")]
    finally:
        guard.close()
    assert stored == ["user", "assistant"]
