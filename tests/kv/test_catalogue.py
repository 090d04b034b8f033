"""The built-in catalogue: enough models, each with a source, matching the facts table."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from ctxguard.errors import ConfigError
from ctxguard.kv import catalogue_names, from_catalogue, kv_bytes_per_token, resolve_model

KIB = 1024


def test_at_least_15_models_each_with_a_source() -> None:
    names = catalogue_names()
    assert len(names) >= 15
    for name in names:
        arch = from_catalogue(name)
        assert arch.source, name
        assert arch.max_position_embeddings, name
        assert arch.num_parameters, name


# (name, layers, KV heads, head size, bytes per element-pair factor) from facts section 9
@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("meta-llama/Llama-3.1-8B-Instruct", 2 * 32 * 8 * 128 * 2),  # 128 KiB
        ("meta-llama/Llama-3.3-70B-Instruct", 2 * 80 * 8 * 128 * 2),  # 320 KiB
        ("meta-llama/Llama-3.1-405B-Instruct", 2 * 126 * 8 * 128 * 2),  # 504 KiB
        ("meta-llama/Llama-3.2-1B-Instruct", 2 * 16 * 8 * 64 * 2),  # 32 KiB
        ("mistralai/Mistral-7B-Instruct-v0.2", 2 * 32 * 8 * 128 * 2),  # 128 KiB
        ("Qwen/Qwen2.5-7B-Instruct", 2 * 28 * 4 * 128 * 2),  # 56 KiB
        ("Qwen/Qwen2.5-14B-Instruct", 2 * 48 * 8 * 128 * 2),  # 192 KiB
        ("Qwen/Qwen2.5-32B-Instruct", 2 * 64 * 8 * 128 * 2),  # 256 KiB
        ("Qwen/Qwen3-1.7B", 2 * 28 * 8 * 128 * 2),  # 112 KiB
        ("Qwen/Qwen3-14B", 2 * 40 * 8 * 128 * 2),  # 160 KiB
        ("Qwen/Qwen3-30B-A3B", 2 * 48 * 4 * 128 * 2),  # 96 KiB
        ("Qwen/Qwen3-235B-A22B", 2 * 94 * 4 * 128 * 2),  # 188 KiB
        ("Qwen/Qwen3-Coder-480B-A35B-Instruct-FP8", 2 * 62 * 8 * 128 * 2),  # 248 KiB
        ("zai-org/GLM-4.5", 2 * 92 * 8 * 128 * 2),  # 368 KiB
        ("zai-org/GLM-4.5-Air", 2 * 46 * 8 * 128 * 2),  # 184 KiB
        ("MiniMaxAI/MiniMax-M2", 2 * 62 * 8 * 128 * 2),  # 248 KiB
        ("deepseek-ai/DeepSeek-V2-Lite", 27 * 576 * 2),  # MLA, 30.4 KiB
        ("moonshotai/Kimi-K2-Instruct", 61 * 576 * 2),  # MLA, 70,272 B
    ],
)
def test_catalogue_matches_the_facts_table(name: str, expected: int) -> None:
    assert kv_bytes_per_token(from_catalogue(name)) == expected


def test_facts_table_in_kib() -> None:
    assert kv_bytes_per_token(from_catalogue("glm-4.5")) == 368 * KIB
    assert kv_bytes_per_token(from_catalogue("qwen2.5-7b")) == 56 * KIB


@pytest.mark.parametrize(
    "spelling",
    [
        "llama-3.1-8b",
        "LLAMA-3.1-8B-INSTRUCT",
        "Llama-3.1-8B-Instruct",
        " meta-llama/Llama-3.1-8B-Instruct ",
    ],
)
def test_names_are_forgiving(spelling: str) -> None:
    assert from_catalogue(spelling).name == "meta-llama/Llama-3.1-8B-Instruct"


def test_unknown_name_suggests_close_matches() -> None:
    with pytest.raises(ConfigError) as info:
        from_catalogue("qwen3-8")
    assert str(info.value).startswith("unknown model 'qwen3-8'; did you mean 'Qwen3-8B'?")


def test_unknown_name_without_close_matches_still_says_what_to_do() -> None:
    with pytest.raises(ConfigError, match=r"config\.json path"):
        from_catalogue("zzzzzzzz")


@pytest.mark.parametrize(
    ("typed", "suggested"),
    [
        # Llama 3 (8,192 positions) is not Llama 3.1 (131,072): suggest, never substitute
        ("llama-3-8b", "llama-3.1-8b"),
        ("meta-llama/Meta-Llama-3-8B-Instruct", "meta-llama/Meta-Llama-3.1-8B-Instruct"),
        ("llama-3.1-70b", "llama-3.3-70b"),
        ("glm-4.6", "GLM-4.5"),  # GLM-4.6 has 202,752 positions, GLM-4.5 131,072
    ],
)
def test_a_similar_model_is_suggested_not_substituted(typed: str, suggested: str) -> None:
    with pytest.raises(ConfigError) as info:
        resolve_model(typed)
    message = str(info.value)
    assert message.startswith(f"unknown model {typed!r}; did you mean {suggested!r}")
    assert "\n" not in message


# Same checkpoint, other spellings (short names, the repository's former name)
_SAME_CHECKPOINT = {"meta-llama/Meta-Llama-3.1-8B-Instruct": "meta-llama/Llama-3.1-8B-Instruct"}


def _tokens(name: str) -> list[str]:
    return name.split("/")[-1].lower().split("-")


def _is_subsequence(part: list[str], whole: list[str]) -> bool:
    rest = iter(whole)
    return all(token in rest for token in part)


def test_aliases_name_the_same_checkpoint_only() -> None:
    """An alias is the entry's own name shortened (its words in order), never another model."""
    catalogue = json.loads(
        (Path(__file__).parents[2] / "ctxguard" / "kv" / "catalogue.json").read_text("utf-8")
    )["models"]
    for model_id, entry in catalogue.items():
        for alias in entry["aliases"]:
            if _SAME_CHECKPOINT.get(alias) == model_id:
                continue
            assert _is_subsequence(_tokens(alias), _tokens(model_id)), (model_id, alias)


_HUB_CONFIG = re.compile(r"^https://huggingface\.co/([\w.-]+/[\w.-]+)/blob/main/config\.json$")


def test_every_source_is_the_public_config_json_of_that_model() -> None:
    """Sources cite the model's config.json on its hub page: no notes, paths or third parties."""
    for name in catalogue_names():
        source = from_catalogue(name).source
        match = _HUB_CONFIG.match(source)
        assert match is not None, (name, source)
        assert match.group(1) == name, (name, source)


def test_about_text_cites_no_internal_notes() -> None:
    text = (Path(__file__).parents[2] / "ctxguard" / "kv" / "catalogue.json").read_text("utf-8")
    for internal in ("/work/", "facts section", "section 9", ".md", "jethac", "EchoCog"):
        assert internal not in text, internal


def test_derived_max_model_len_matches_the_positions_for_every_entry() -> None:
    """RoPE factors in the catalogue (yarn, llama3, Gemma 3 linear) derive what vLLM derives."""
    for name in catalogue_names():
        arch = from_catalogue(name)
        assert arch.max_model_len_limit == arch.max_position_embeddings, name


def test_resolve_model_paths_and_names(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps({"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4})
    )
    assert resolve_model(str(config)).num_layers == 2
    assert resolve_model("gpt-oss-20b").name == "openai/gpt-oss-20b"
    with pytest.raises(ConfigError, match="does not exist"):
        resolve_model(str(tmp_path / "missing.json"))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConfigError, match=r"no config\.json"):
        resolve_model(empty)
