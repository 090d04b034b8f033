"""Hugging Face tokenizers counted through the model's own chat template.

Loads ``AutoTokenizer.from_pretrained(dir, local_files_only=True)`` and counts with
``apply_chat_template(..., tokenize=True, add_generation_prompt=True, tools=...)``, the
call an OpenAI-compatible server makes. Messages are first shaped the way vLLM shapes
them (``_openai_dicts.DictStyle``); whether this template wants tool-call arguments as
objects or JSON text, and list content or joined text, is found by rendering probes.
Template errors (``raise_exception``, undefined values, type errors, anything its
expressions raise: ``1/0``, a macro that calls itself) become
:class:`TemplateRefusedError` carrying the template's own message; a template that does
not compile is a :class:`TokenizerError` raised when the counter is built.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from ctxguard._validate import check_arg_types, one_line, show
from ctxguard.errors import (
    ConfigError,
    CtxGuardError,
    MissingDependencyError,
    TemplateRefusedError,
    TokenizerError,
)
from ctxguard.tokens._openai_dicts import DictStyle, styled
from ctxguard.tokens._protocol import Tools, file_digest, fingerprint
from ctxguard.tokens._templated import TemplateCounter, build

Dict = dict[str, Any]
_FINGERPRINT_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "chat_template.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
)


def load_hf_counter(
    path: str,
    *,
    chat_template: str | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
) -> TemplateCounter:
    """A counter for the tokenizer directory ``path`` (nothing is downloaded)."""
    check_arg_types(
        "the hf: counter",
        chat_template=(chat_template, "str?"),
        template_kwargs=(template_kwargs, "map?"),
    )
    if template_kwargs is not None and not all(type(k) is str for k in template_kwargs):
        raise ConfigError("the hf: counter: template_kwargs must have str keys (names)")
    tokenizer = _load_tokenizer(path)
    template = _template_text(tokenizer, path, chat_template)
    renderer = HFRenderer(tokenizer, template, dict(template_kwargs or {}))
    renderer.style = detect_style(renderer)
    parts = [f"{name}:{digest}" for name, digest in _file_digests(path)]
    identity = fingerprint(
        "hf",
        *parts,
        template,
        renderer.style.key(),
        json.dumps(renderer.kwargs, sort_keys=True, default=str),
    )
    return build(renderer, identity)


def _load_tokenizer(path: str) -> Any:
    if not os.path.isdir(path):
        raise TokenizerError(
            f"tokenizer directory {path!r} does not exist; hf: takes the path of a local "
            "directory holding the model's tokenizer files (a hub name is never downloaded)"
        )
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise MissingDependencyError("counting with Hugging Face tokenizers", "hf") from None
    try:
        return AutoTokenizer.from_pretrained(path, local_files_only=True)
    except Exception as exc:  # transformers raises OSError, ValueError, KeyError...
        # (its messages run over several lines)
        raise TokenizerError(one_line(f"cannot load a tokenizer from {path!r}: {exc}")) from exc


def _template_text(tokenizer: Any, path: str, override: str | None) -> str:
    if override is not None:
        if os.path.isfile(override):
            try:
                with open(override, encoding="utf-8") as handle:
                    return handle.read()
            except (OSError, UnicodeDecodeError) as exc:
                raise TokenizerError(
                    one_line(f"cannot read the chat template file {override!r}: {exc}")
                ) from exc
        if "{{" not in override and "{%" not in override:
            # a path with a typo would otherwise be the "template": a constant text
            raise TokenizerError(
                one_line(
                    f"chat_template= {show(override, 80)} is neither a file nor a Jinja "
                    "template; pass the template text or the path of its .jinja file"
                )
            )
        return override
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):
        template = template.get("default")
    if not isinstance(template, str) or not template:
        raise TokenizerError(
            f"{path!r} has no chat template (base model?); pass chat_template= with the "
            "instruct model's template text or a path to its .jinja file"
        )
    return template


def _file_digests(path: str) -> list[tuple[str, str]]:
    found = [n for n in _FINGERPRINT_FILES if os.path.isfile(os.path.join(path, n))]
    return [(n, file_digest(os.path.join(path, n))) for n in found]


class HFRenderer:
    """Renders OpenAI dicts through one tokenizer's chat template."""

    def __init__(self, tokenizer: Any, template: str, kwargs: Dict) -> None:
        self.tokenizer = tokenizer
        self.template = template
        self.kwargs = kwargs
        self.style = DictStyle()

    def render(self, conversation: Sequence[Dict], tools: Tools | None = None) -> int:
        ids = self._apply(conversation, tools, tokenize=True)
        return len(ids)

    def ids(self, conversation: Sequence[Dict], tools: Tools | None = None) -> list[int]:
        """The rendered prompt's token ids (what the server prefills)."""
        return [int(i) for i in self._apply(conversation, tools, tokenize=True)]

    def reply_ids(self, text: str) -> list[int]:
        """A reply's ids as generated: its text, then the end-of-turn token."""
        ids = [int(i) for i in self.tokenizer.encode(text, add_special_tokens=False)]
        eos = self.tokenizer.eos_token_id
        return [*ids, int(eos)] if isinstance(eos, int) else ids

    def render_text(self, conversation: Sequence[Dict], tools: Tools | None = None) -> str:
        return str(self._apply(conversation, tools, tokenize=False))

    def validate(self, conversation: Sequence[Dict], tools: Tools | None = None) -> None:
        """The template's refusals (``raise_exception``, undefined values...), untokenized."""
        self._apply(conversation, tools, tokenize=False)

    def raw_count(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False))

    def _apply(self, conversation: Sequence[Dict], tools: Tools | None, *, tokenize: bool) -> Any:
        import jinja2

        from ctxguard.tokens import _render_budget

        try:
            _render_budget.bound(self.template)  # no loop or string without end
            with _render_budget.budget():
                return self.tokenizer.apply_chat_template(
                    styled(conversation, self.style),
                    tools=[dict(t) for t in tools] if tools else None,
                    chat_template=self.template,
                    tokenize=tokenize,
                    add_generation_prompt=True,
                    return_dict=False,
                    **self.kwargs,
                )
        except jinja2.TemplateSyntaxError as exc:
            raise TokenizerError(f"the chat template does not compile: {exc}") from exc
        except CtxGuardError:
            raise
        except Exception as exc:  # jinja's errors, and what the template's expressions
            # raise: 1/0, a macro calling itself (RecursionError), 10.0 ** 999...
            raise TemplateRefusedError(one_line(f"the chat template refused: {exc}")) from exc


_ARGS_PROBE: list[Dict] = [
    {"role": "user", "content": "Weather?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call1abcd",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call1abcd", "content": "18C"},
]
_PARTS_PROBE: list[Dict] = [
    {
        "role": "user",
        "content": [{"type": "text", "text": "First part."}, {"type": "text", "text": "Second."}],
    }
]


def detect_style(renderer: HFRenderer) -> DictStyle:
    """vLLM's defaults unless the template shows it needs JSON text or reads list content."""
    as_dict = _arguments_as_dict(renderer)
    renderer.style = DictStyle(arguments_as_dict=as_dict, content_as_parts=True)
    reads_parts = _renders(renderer, _PARTS_PROBE, ("First part.", "Second."))
    return DictStyle(arguments_as_dict=as_dict, content_as_parts=reads_parts)


def _arguments_as_dict(renderer: HFRenderer) -> bool:
    renderer.style = DictStyle(arguments_as_dict=True)
    if _renders(renderer, _ARGS_PROBE, ('"city"',), forbidden="'city'"):
        return True
    renderer.style = DictStyle(arguments_as_dict=False)
    return not _renders(renderer, _ARGS_PROBE, ('"city"',))


def _renders(
    renderer: HFRenderer, conv: list[Dict], needles: tuple[str, ...], forbidden: str = "\x00"
) -> bool:
    try:
        text = renderer.render_text(conv)
    except TemplateRefusedError:
        return False
    return all(n in text for n in needles) and forbidden not in text
