"""What the build-time probes decide, family by family (pins the table in the docs)."""

from __future__ import annotations

from typing import Any

import pytest

from .conftest import counter_for, require

# family -> (additive?, probes expected to disagree)
EXPECTED = {
    "qwen-2.5": (False, {"two_systems", "two_systems_no_punctuation", "system_after_turns"}),
    "qwen-3": (False, {"reasoning_before_tool_result", "tools_system_user", "tools_tool_round"}),
    "deepseek-v3": (False, {"two_systems_no_punctuation"}),
    "deepseek-r1": (
        False,
        {
            "tool_round_then_user",
            "consecutive_users",
            "two_systems_no_punctuation",
            "two_tool_rounds",
        },
    ),
    "glm-4.7-flash": (False, {"reasoning_before_tool_result"}),
    "mistral:v3-tekken": (False, {"consecutive_users"}),
    "mistral:v7": (True, set()),
}


@pytest.mark.parametrize("family", sorted(EXPECTED))
def test_probe_findings(family: str, hf_dirs: Any, counters: Any) -> None:
    if family.startswith("mistral"):
        require("mistral_common", "mistral-common")
        require("sentencepiece", "sentencepiece")
        spec = family
    else:
        spec = f"hf:{hf_dirs[family]}"
    counter = counter_for(counters, spec)
    additive, disagreeing = EXPECTED[family]
    found = {
        name for name, outcome in counter.probe_report.items() if outcome.startswith("differs")
    }
    assert (counter.additive, found) == (additive, disagreeing), counter.probe_report


@pytest.mark.parametrize("spec", ["tiktoken:cl100k_base", "tiktoken:o200k_base", "approx"])
def test_rule_counters_are_additive(spec: str, counters: Any) -> None:
    assert counter_for(counters, spec).additive
