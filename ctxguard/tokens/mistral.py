"""Mistral models through mistral_common, which builds prompts in code (no template).

``ChatCompletionRequest.from_openai(messages, tools=...)`` then
``MistralTokenizer.encode_chat_completion`` — the path mistral_common-based servers use.
The request validator's refusals (bad tool-call ids, empty assistant turns, a system
message after an assistant turn, tools on v1...) become :class:`TemplateRefusedError`.
The tokenizer files ship inside mistral_common, so nothing is downloaded.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ctxguard.errors import ConfigError, MissingDependencyError, TemplateRefusedError
from ctxguard.tokens._openai_dicts import DictStyle, styled
from ctxguard.tokens._protocol import Tools, fingerprint
from ctxguard.tokens._templated import TemplateCounter, build

Dict = dict[str, Any]

VERSIONS: dict[str, Callable[[Any], Any]] = {
    "v1": lambda cls: cls.v1(),
    "v2": lambda cls: cls.v2(),
    "v3": lambda cls: cls.v3(),
    "v3-tekken": lambda cls: cls.v3(is_tekken=True),
    "v7": lambda cls: cls.v7(),
}
# mistral_common parses tool-call arguments itself and reads text parts: keep OpenAI form.
_STYLE = DictStyle(arguments_as_dict=False, content_as_parts=True)


def load_mistral_counter(version: str) -> TemplateCounter:
    """A counter for one of mistral_common's bundled tokenizers (``VERSIONS``)."""
    if version not in VERSIONS:
        raise ConfigError(
            f"unknown Mistral tokenizer {version!r}; use one of: "
            + ", ".join(f"mistral:{v}" for v in VERSIONS)
        )
    try:
        import mistral_common
        from mistral_common.tokens.tokenizers.mistral import MistralTokenizer
    except ImportError:
        raise MissingDependencyError("counting for Mistral models", "mistral") from None
    renderer = MistralRenderer(VERSIONS[version](MistralTokenizer))
    identity = fingerprint("mistral", version, mistral_common.__version__)
    return build(renderer, identity)


class MistralRenderer:
    """Counts a request the way mistral_common encodes it."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._raw = tokenizer.instruct_tokenizer.tokenizer

    def render(self, conversation: Sequence[Dict], tools: Tools | None = None) -> int:
        return len(self.encode(conversation, tools))

    def encode(self, conversation: Sequence[Dict], tools: Tools | None = None) -> list[int]:
        """The prompt's token ids; refusals raised as TemplateRefusedError."""
        from mistral_common.exceptions import MistralCommonException
        from mistral_common.protocol.instruct.request import ChatCompletionRequest
        from pydantic import ValidationError

        try:
            request = ChatCompletionRequest.from_openai(
                styled(conversation, _STYLE), tools=[dict(t) for t in tools] if tools else None
            )
            tokens: list[int] = self.tokenizer.encode_chat_completion(request).tokens
        except (MistralCommonException, ValidationError, ValueError, KeyError) as exc:
            raise TemplateRefusedError(f"mistral_common refused the request: {exc}") from exc
        return tokens

    def raw_count(self, text: str) -> int:
        return len(self._raw.encode(text, bos=False, eos=False))
