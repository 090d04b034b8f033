"""kv MODEL: a path that exists but is no regular file is said to be that, not missing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from ctxguard.cli import cli


def test_a_fifo_or_a_device_given_as_the_config_is_not_called_missing(tmp_path: Path) -> None:
    """(``ctxguard kv ./pipe.json`` and a config.json linked to /dev/zero said "config file
    ... does not exist".)"""
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    device = tmp_path / "device.json"
    device.symlink_to("/dev/zero")
    for path in (fifo, device):
        result = CliRunner().invoke(cli, ["kv", str(path), "--gpu-memory", "80"])
        assert result.exit_code == 2, result.output
        err = result.stderr
        assert err.startswith("error: ") and err.count("\n") == 1, err
        assert "is not a regular file" in err and "does not exist" not in err, err
    missing = CliRunner().invoke(cli, ["kv", str(tmp_path / "nope.json"), "--gpu-memory", "80"])
    assert missing.exit_code == 2 and "does not exist" in missing.stderr


LLAMA_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 131072,
    "vocab_size": 128256,
    "torch_dtype": "bfloat16",
}


def test_the_readmes_config_json_example_runs_and_names_the_model_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`ctxguard kv ./config.json ...` (the README's example) named the model '.', as in
    "the weights size of '.' is unknown"; it is the directory's name. With --weights (a
    config.json alone has no weights to measure) the example's flags give a capacity."""
    import json

    model = tmp_path / "Llama-3.1-8B-Instruct"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(LLAMA_CONFIG))
    monkeypatch.chdir(model)
    flags = ["--gpu-memory", "80", "--tp", "2", "--kv-cache-dtype", "fp8", "--concurrency", "32"]
    bare = CliRunner().invoke(cli, ["kv", "./config.json", *flags])
    assert bare.exit_code == 2 and "'Llama-3.1-8B-Instruct'" in bare.stderr, bare.stderr
    assert "'.'" not in bare.stderr
    ran = CliRunner().invoke(cli, ["kv", "./config.json", "--weights", "15", *flags])
    assert ran.exit_code == 0, ran.output
    assert "KV cache of Llama-3.1-8B-Instruct" in ran.stdout and "KV capacity" in ran.stdout
