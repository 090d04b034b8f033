"""kv MODEL: a path that exists but is no regular file is said to be that, not missing."""

from __future__ import annotations

import os
from pathlib import Path

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
