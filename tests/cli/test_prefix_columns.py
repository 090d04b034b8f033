"""replay and report: tokens sent, reused and prefilled per turn, recorded policy and the other."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ctxguard import Guard
from ctxguard.stores.base import SessionStore

from .conftest import CHAT, Cli, long_text

pytestmark = pytest.mark.redis

SESSION = "prefix-1"


@pytest.fixture
def estimated(redis_url: str, redis_namespace: str) -> Iterator[None]:
    """A sliding-window session counted with cl100k, records with the guard's estimate."""
    guard = Guard(
        redis_url,
        counter="tiktoken:cl100k_base",
        limit=1400,
        namespace=redis_namespace,
        max_tokens=100,
        prefix_block_size=16,
    )
    guard.append(SESSION, [{"role": "system", "content": "You are terse. " * 8}])
    for turn in range(10):
        req = guard.prepare(SESSION, [{"role": "user", "content": long_text(turn)}])
        reply = {"role": "assistant", "content": long_text(turn, 30)}
        guard.complete(SESSION, reply, prepared=req)
    guard.close()
    yield


def _requests(store: SessionStore) -> list[dict[str, Any]]:
    return [r for r in store.read_audit(SESSION) if r["kind"] == "request"]


def test_replay_takes_the_records_estimate_and_models_the_other_policy(
    run: Cli, estimated: None, store: SessionStore
) -> None:
    records = _requests(store)
    assert "reused" not in records[0] and all("reused" in r for r in records[1:])
    assert any(r.get("dropped") for r in records)
    turns = run.json("replay", SESSION, "--policy", "stable")
    assert len(turns) == len(records)
    for turn, record in zip(turns, records, strict=True):
        assert turn["recorded_tokens"] == record["tokens"]
        if "reused" in record:  # the record's (replies included), not the trail's model
            assert turn["prefix_recorded"] is True
            assert (turn["recorded_reused"], turn["recorded_prefilled"]) == (
                record["reused"],
                record["prefilled"],
            )
        else:  # the first request: the model's, everything prefilled
            assert turn["prefix_recorded"] is False
            assert turn["recorded_prefilled"] == record["tokens"]
        assert turn["replayed_reused"] + turn["replayed_prefilled"] == turn["replayed_tokens"]
    table = run("replay", SESSION, "--policy", "stable")
    assert table.exit_code == 0 and "prefilled" in table.stdout


def _cells(page: str, turn: int) -> dict[str, tuple[str, str | None]]:
    row = re.search(rf'<tr id="turn-{turn}"[^>]*>(.*?)</tr>', page, re.S)
    assert row is not None
    cells = re.findall(r'<td class="([a-z-]+)"(?: data-source="(\w+)")?>([^<]*)</td>', row[1])
    return {name: (value, source or None) for name, source, value in cells}


def test_report_shows_sent_reused_and_prefilled_for_both_policies(
    run: Cli, estimated: None, store: SessionStore, tmp_path: Path
) -> None:
    out = tmp_path / "report.html"
    result = run("report", SESSION, "--html", str(out))
    assert result.exit_code == 0, result.stderr
    page = out.read_text()
    for head in ("sliding: reused", "sliding: prefilled", "stable: tokens sent", "stable: reused"):
        assert f"<th>{head}</th>" in page
    assert 'class="series-prefilled"' in page and 'class="series-alt-prefilled"' in page
    replayed = run.json("replay", SESSION, "--policy", "stable")
    for record, turn in zip(_requests(store), replayed, strict=True):
        cells = _cells(page, record["turn"])
        if "reused" in record:
            assert cells["reused"] == (str(record["reused"]), "record")
            assert cells["prefilled"] == (str(record["prefilled"]), "record")
        else:
            assert cells["prefilled"] == (str(record["tokens"]), "model")
        assert cells["alt-tokens"][0] == str(turn["replayed_tokens"])
        assert cells["alt-reused"][0] == str(turn["replayed_reused"])
        assert cells["alt-prefilled"][0] == str(turn["replayed_prefilled"])
    alt = sum(int(_cells(page, r["turn"])["alt-prefilled"][0]) for r in _requests(store)[1:])
    ours = sum(int(_cells(page, r["turn"])["prefilled"][0]) for r in _requests(store)[1:])
    assert alt < ours  # the stable window re-prefills less than the sliding one did


def test_report_without_token_ids_says_so(run: Cli, sessions: None, tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    result = run("report", CHAT, "--html", str(out))
    assert result.exit_code == 0
    assert "prefix-cache columns" in result.stderr and "no token ids" in result.stderr
    page = out.read_text()
    first = re.search(r'<tr id="turn-\d+"[^>]*>(.*?)</tr>', page, re.S)
    assert first is not None and first[1].endswith('<td class="alt-prefilled">-</td>')
    assert 'class="series-prefilled"' not in page
