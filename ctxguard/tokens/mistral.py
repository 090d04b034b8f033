"""Mistral models through mistral_common, which builds prompts in code (no template).

``ChatCompletionRequest.from_openai(messages, tools=...)`` then
``MistralTokenizer.encode_chat_completion`` — the path mistral_common-based servers use.
The request validator's refusals (bad tool-call ids, empty assistant turns, a system
message after an assistant turn, tools on v1...) become :class:`TemplateRefusedError`.
The tokenizer files ship inside mistral_common, so nothing is downloaded.

``validate`` (the additive path's check) runs the same steps — ``from_openai``, the
tokenizer's request validator, its normalizer and its instruct encoder — with the text
encoder replaced by one that returns no ids: every refusal mistral_common raises, at a
few percent of an encode's cost.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
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
    except ImportError:
        raise MissingDependencyError("counting for Mistral models", "mistral") from None
    renderer = _renderer(version)
    identity = fingerprint("mistral", version, mistral_common.__version__)
    return build(renderer, identity)


def _renderer(version: str) -> MistralRenderer:
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

    return MistralRenderer(VERSIONS[version](MistralTokenizer), version)


class MistralRenderer:
    """Counts a request the way mistral_common encodes it. Copied and pickled as its
    version (the bundled tokenizer is made again): mistral_common's own objects are
    neither (a bare RecursionError on ``copy.deepcopy``, a PicklingError on pickle)."""

    def __init__(self, tokenizer: Any, version: str) -> None:
        self.version = version
        self.tokenizer = tokenizer
        self._raw = tokenizer.instruct_tokenizer.tokenizer
        self._structure = _structure_only(tokenizer)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_renderer, (self.version,))

    def render(self, conversation: Sequence[Dict], tools: Tools | None = None) -> int:
        return len(self.encode(conversation, tools))

    def encode(self, conversation: Sequence[Dict], tools: Tools | None = None) -> list[int]:
        """The prompt's token ids; refusals raised as TemplateRefusedError."""
        with _refusals():
            tokens: list[int] = self.tokenizer.encode_chat_completion(
                _request(conversation, tools)
            ).tokens
        return tokens

    def validate(self, conversation: Sequence[Dict], tools: Tools | None = None) -> None:
        """Every refusal ``encode`` raises, without encoding any text."""
        if self._structure is None:
            self.encode(conversation, tools)
            return
        validator, normalizer, instruct = self._structure
        with _refusals():
            request = validator.validate_request(_request(conversation, tools))
            instruct.encode_instruct(normalizer.from_chat_completion_request(request))

    def raw_count(self, text: str) -> int:
        return len(self._raw.encode(text, bos=False, eos=False))


def _request(conversation: Sequence[Dict], tools: Tools | None) -> Any:
    from mistral_common.protocol.instruct.request import ChatCompletionRequest

    return ChatCompletionRequest.from_openai(
        styled(conversation, _STYLE), tools=[dict(t) for t in tools] if tools else None
    )


@contextmanager
def _refusals() -> Iterator[None]:
    from mistral_common.exceptions import MistralCommonException
    from pydantic import ValidationError

    try:
        yield
    except (MistralCommonException, ValidationError, ValueError, KeyError) as exc:
        raise TemplateRefusedError(f"mistral_common refused the request: {exc}") from exc


class _NoText:
    """The raw tokenizer with ``encode`` returning no ids (control tokens stay real)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def encode(self, text: str, bos: bool, eos: bool) -> list[int]:
        return []


def _structure_only(tokenizer: Any) -> tuple[Any, Any, Any] | None:
    """(validator, normalizer, instruct encoder over ``_NoText``), as encode_chat_completion
    uses them; None when this mistral_common keeps them elsewhere (validate then encodes)."""
    validator = getattr(tokenizer, "_chat_completion_request_validator", None)
    normalizer = getattr(tokenizer, "_instruct_request_normalizer", None)
    instruct = getattr(tokenizer, "instruct_tokenizer", None)
    if validator is None or normalizer is None or instruct is None:
        return None
    structure = copy.copy(instruct)
    structure.tokenizer = _NoText(instruct.tokenizer)
    return validator, normalizer, structure
