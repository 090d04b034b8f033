"""`import ctxguard` stays light: heavy optional libraries load only where used."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = (
    "transformers",
    "tiktoken",
    "torch",
    "mistral_common",
    "langchain_core",
    "llama_index",
    "agents",
    "tokenizers",  # the hf extra: not installed for every user
    "prometheus_client",  # the metrics extra
    "opentelemetry",  # the otel extra
)

PROBE = """
import json, sys
{imports}
print(json.dumps(sorted(m.split(".")[0] for m in sys.modules)))
"""


def _top_level_modules_after(imports: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE.format(imports=imports)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize(
    "imports",
    [
        "import ctxguard",
        "import ctxguard.stores\nctxguard.stores.open_store('memory://')",
        "import ctxguard\nctxguard.Guard('memory://', limit=100, max_tokens=10)"
        ".prepare('s', [{'role': 'user', 'content': 'hi'}])",
        "import ctxguard.observe",
    ],
)
def test_import_stays_light(imports: str) -> None:
    loaded = _top_level_modules_after(imports)
    assert "ctxguard" in loaded
    assert not loaded.intersection(HEAVY), sorted(loaded.intersection(HEAVY))


def test_probe_would_notice_a_heavy_import() -> None:
    assert "xml" in _top_level_modules_after("import xml.dom.minidom")


GUARD_WITHOUT_OBSERVER = """
import json, sys
import ctxguard
guard = ctxguard.Guard('memory://', limit=100, max_tokens=10)
guard.prepare('s', [{'role': 'user', 'content': 'hi'}])
guard.complete('s', {'role': 'assistant', 'content': 'hello'})
print(json.dumps(sorted(sys.modules)))
"""


def test_a_guard_without_observer_loads_nothing_of_observe() -> None:
    out = subprocess.run(
        [sys.executable, "-c", GUARD_WITHOUT_OBSERVER],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    loaded = set(json.loads(out.stdout.strip().splitlines()[-1]))
    assert "ctxguard.guard.events" in loaded  # the hook point itself is the guard's
    observe = sorted(
        m for m in loaded if m == "ctxguard.observe" or m.startswith("ctxguard.observe.")
    )
    assert observe == []
    assert not {m.split(".")[0] for m in loaded}.intersection(HEAVY)
