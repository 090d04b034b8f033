"""Without its extra, an observe module says which one to install (a typed error).

``sys.modules[name] = None`` makes ``import name`` fail as if the package were not
installed; each case runs in a fresh interpreter so nothing is cached.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

PROBE = """
import sys
for name in {blocked!r}:
    sys.modules[name] = None
from ctxguard.errors import MissingDependencyError
try:
    import {module}
except MissingDependencyError as exc:
    print("typed", exc.extra, str(exc), sep="|")
else:
    print("imported")
"""


@pytest.mark.parametrize(
    ("module", "blocked", "extra"),
    [
        ("ctxguard.observe.metrics", ["prometheus_client"], "metrics"),
        ("ctxguard.observe.tracing", ["opentelemetry", "opentelemetry.trace"], "otel"),
    ],
)
def test_a_missing_extra_is_a_typed_error_naming_it(
    module: str, blocked: list[str], extra: str
) -> None:
    code = PROBE.format(blocked=blocked, module=module)
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    ).stdout.strip()
    kind, named, message = out.split("|")
    assert kind == "typed" and named == extra
    assert f"pip install 'ctxguard[{extra}]'" in message and "\n" not in message


def test_the_background_deliverer_needs_no_extra() -> None:
    code = PROBE.format(
        blocked=["prometheus_client", "opentelemetry"], module="ctxguard.observe.background"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    ).stdout.strip()
    assert out == "imported"
