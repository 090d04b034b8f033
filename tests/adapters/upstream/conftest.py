"""Framework test suites re-expressed for ctxguard's adapters.

Each module names the upstream test file and the version of the framework it
follows (the one installed in the test venv). The scenarios and the checked
values are upstream's; the code is ours, and only how the store or session is
built differs. Every module runs on memory:// and on the test Redis through the
``store_url`` fixture of ``tests/adapters/conftest.py`` (and on the cluster
with ``cluster_store_url``). A behaviour ctxguard legitimately does otherwise
is kept as a test marked xfail with the reason in one line.
"""

from __future__ import annotations

import pytest


@pytest.fixture(
    params=[
        "memory",
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("cluster", marks=pytest.mark.cluster),
    ]
)
def any_store_url(request: pytest.FixtureRequest, namespace: str) -> str:
    """memory://, the test Redis and the test cluster (keys purged afterwards)."""
    if request.param == "memory":
        return f"memory://{namespace}"
    url: str = request.getfixturevalue(f"{request.param}_url")
    request.getfixturevalue("purge_after")(url)
    return url
