"""``load_counter(spec)``: one explicit table from spec prefix to counter builder."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ctxguard._validate import check_http_url
from ctxguard.errors import ConfigError
from ctxguard.tokens._protocol import TokenCounter

SPEC_FORMS = (
    "tiktoken:cl100k_base | tiktoken:o200k_base | tiktoken:/path/to/file.tiktoken",
    "hf:/path/to/tokenizer_dir",
    "mistral:v1 | mistral:v2 | mistral:v3 | mistral:v3-tekken | mistral:v7",
    "vllm:http://host:8000 (a running vLLM's /tokenize; option model=)",
    "approx",
)


def _tiktoken(rest: str, options: dict[str, Any]) -> TokenCounter:
    from ctxguard.tokens._encodings import load_file, load_named
    from ctxguard.tokens.openai_rule import TiktokenCounter

    looks_like_path = "/" in rest or rest.endswith(".tiktoken")
    loaded = load_file(rest, options.pop("like", None)) if looks_like_path else load_named(rest)
    _no_more(options, "tiktoken")
    return TiktokenCounter(loaded)


def _hf(rest: str, options: dict[str, Any]) -> TokenCounter:
    from ctxguard.tokens.hf import load_hf_counter

    unknown = set(options) - {"chat_template", "template_kwargs"}
    if unknown:
        raise ConfigError(
            f"hf counters take chat_template=, template_kwargs=; not {sorted(unknown)}"
        )
    return load_hf_counter(rest, **options)


def _mistral(rest: str, options: dict[str, Any]) -> TokenCounter:
    from ctxguard.tokens.mistral import load_mistral_counter

    _no_more(options, "mistral")
    return load_mistral_counter(rest)


def _shown(text: str) -> str:
    """A spec as an error shows it: whatever precedes an ``@`` (credentials) is ``***``."""
    return repr("***@" + text.rpartition("@")[2] if "@" in text else text)


def _vllm(rest: str, options: dict[str, Any]) -> TokenCounter:
    from ctxguard.tokens.vllm import load_vllm_counter

    check_http_url(rest, "the vllm: counter's server URL (as in vllm:http://host:8000)")
    unknown = set(options) - {"model", "timeout", "headers"}
    if unknown:
        raise ConfigError(f"vllm counters take model=, timeout=, headers=; not {sorted(unknown)}")
    return load_vllm_counter(rest, **options)


def _approx(rest: str, options: dict[str, Any]) -> TokenCounter:
    from ctxguard.tokens.approx import ApproxCounter

    if rest:
        raise ConfigError(f"'approx' takes no argument, got 'approx:{rest}'")
    _no_more(options, "approx")
    return ApproxCounter()


_BUILDERS: dict[str, Callable[[str, dict[str, Any]], TokenCounter]] = {
    "tiktoken": _tiktoken,
    "hf": _hf,
    "mistral": _mistral,
    "vllm": _vllm,
    "approx": _approx,
}


def load_counter(spec: str, **options: Any) -> TokenCounter:
    """Build the counter named by ``spec`` (see ``SPEC_FORMS``); nothing is downloaded.

    Options: ``like=`` for a tiktoken file of unknown hash; ``chat_template=`` and
    ``template_kwargs=`` for ``hf:``.
    """
    if not isinstance(spec, str):
        raise ConfigError(
            f"a token counter spec is a string such as 'approx' or 'tiktoken:cl100k_base', "
            f"got {type(spec).__name__}"
        )
    kind, _, rest = spec.partition(":")
    builder = _BUILDERS.get(kind)
    if builder is None or (kind != "approx" and not rest):
        raise ConfigError(
            f"unknown token counter spec {_shown(spec)}; valid forms: " + "; ".join(SPEC_FORMS)
        )
    return builder(rest, dict(options))


def _no_more(options: dict[str, Any], kind: str) -> None:
    if options:
        raise ConfigError(f"{kind} counters take no options {sorted(options)}")
