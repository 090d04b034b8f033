"""The vllm: counter against a local server shaped like vLLM's /tokenize (real HTTP).

The server renders with a real offline tokenizer (Qwen2.5) the way vLLM does for
Hugging Face templates (``content: null`` becomes ``""``, tool-call arguments are
decoded to objects, template errors answer 400).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from local_http import JsonServer, QuietHandler, Serving

from ctxguard.errors import ConfigError, TemplateRefusedError, TokenizerError
from ctxguard.messages import Message
from ctxguard.tokens import load_counter

from .conversations import CONVERSATIONS
from .test_families import IDS, assert_matches, shaped


class TokenizeServer:
    """vLLM's /tokenize, rendered by a real tokenizer."""

    def __init__(self, tokenizer: Any) -> None:
        self.calls = 0
        self.tokenizer = tokenizer
        self.server = JsonServer(self.answer)
        self.url = self.server.url

    def answer(self, path: str, body: Any, headers: Mapping[str, str]) -> tuple[int, Any]:
        self.calls += 1
        return self.tokenize(self.tokenizer, path, body)

    @staticmethod
    def tokenize(tokenizer: Any, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        if path != "/tokenize":
            return 404, {"detail": "Not Found"}
        if "prompt" in body:
            ids = tokenizer.encode(body["prompt"], add_special_tokens=body["add_special_tokens"])
            return 200, {"count": len(ids), "tokens": ids, "max_model_len": 32768}
        try:
            ids = tokenizer.apply_chat_template(
                shaped(body["messages"], True, True),
                tools=body.get("tools"),
                add_generation_prompt=body["add_generation_prompt"],
                tokenize=True,
                return_dict=False,
            )
        except Exception as exc:  # the template refused: vLLM answers 400
            return 400, {"object": "error", "message": str(exc), "code": 400}
        return 200, {"count": len(ids), "tokens": ids, "max_model_len": 32768}


@pytest.fixture(scope="module")
def server(hf_tokenizers: dict[str, Any]) -> Iterator[TokenizeServer]:
    running = TokenizeServer(hf_tokenizers["qwen-2.5"])
    yield running
    running.server.close()


@pytest.fixture(scope="module")
def counter(server: TokenizeServer) -> Any:
    return load_counter(f"vllm:{server.url}/v1", model="Qwen/Qwen2.5-7B-Instruct")


@pytest.mark.parametrize("name", IDS)
def test_counts_equal_the_servers_own_rendering(
    name: str, counter: Any, hf_tokenizers: dict[str, Any]
) -> None:
    conv, tools = CONVERSATIONS[name]
    try:
        reference: int | None = len(
            hf_tokenizers["qwen-2.5"].apply_chat_template(
                shaped(conv, True, True),
                tools=tools,
                tokenize=True,
                add_generation_prompt=True,
                return_dict=False,
            )
        )
    except Exception:
        reference = None
    assert_matches(counter, conv, tools, reference)


def test_identity_follows_the_server(counter: Any, server: TokenizeServer, hf_dirs: Any) -> None:
    again = load_counter(f"vllm:{server.url}", model="Qwen/Qwen2.5-7B-Instruct")
    assert again.fingerprint == counter.fingerprint and counter.exact
    assert counter.additive is False  # Qwen2.5's template, as the local counter finds
    other = load_counter(f"vllm:{server.url}", model="another-model")
    assert other.fingerprint != counter.fingerprint


def test_unreachable_server_and_bad_specs_are_typed_errors() -> None:
    with pytest.raises(TokenizerError, match="cannot reach") as info:
        load_counter("vllm:http://user:s3cret@127.0.0.1:9")
    assert "s3cret" not in str(info.value)
    with pytest.raises(ConfigError):
        load_counter("vllm:localhost:8000")
    with pytest.raises(ConfigError):
        load_counter("vllm:http://127.0.0.1:9", temperature=0)


@pytest.mark.parametrize(
    "options",
    [
        {"timeout": None},  # (before: TypeError at the first count)
        {"timeout": "5"},
        {"timeout": -1},  # (before: a "deadline" error blaming the server)
        {"timeout": 1e300},  # (before: OverflowError)
        {"headers": "SEKRIT9"},  # (before: ValueError)
        {"headers": {"Authorization": None}},  # (before: TypeError)
        {"headers": {"Authorization": "Bearer caf\u00e9-SEKRIT9"}},  # (UnicodeEncodeError)
        {"model": 123},  # (before: TypeError)
    ],
)
def test_bad_options_are_config_errors_before_any_call(options: dict[str, Any]) -> None:
    with pytest.raises(ConfigError) as info:
        load_counter("vllm:http://127.0.0.1:9", **options)
    assert "SEKRIT9" not in str(info.value)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("mode", ["headers", "body"])
def test_a_drip_feeding_server_cannot_hold_the_counter(mode: str) -> None:
    from drip_server import drip_server

    with drip_server(mode) as server:
        url = server.url.replace("http://", "http://user:s3cret@")
        with pytest.raises(TokenizerError) as info:
            load_counter(f"vllm:{url}", timeout=1)
    shown = server.url.replace("http://", "http://***@")  # redact_url's form
    assert str(info.value) == f"no complete answer from {shown}/tokenize within 1 s (deadline)"


@pytest.mark.timeout(30)
def test_an_endless_fast_body_is_cut_at_the_size_cap() -> None:
    from drip_server import drip_server

    with drip_server("flood") as server, pytest.raises(TokenizerError, match="more than 16 MiB"):
        load_counter(f"vllm:{server.url}", timeout=60)


class RawTokenize(Serving):
    """/tokenize answering ``answer`` (status, raw body bytes), whatever is asked."""

    def __init__(self) -> None:
        self.answer: tuple[int, bytes] = (200, b'{"count": 3}')
        outer = self

        class Handler(QuietHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["Content-Length"]))
                self.send(*outer.answer, "application/json")

        super().__init__(Handler)


@pytest.fixture
def raw_tokenize() -> Iterator[RawTokenize]:
    running = RawTokenize()
    yield running
    running.close()


HI = [Message(role="user", content="hi")]
DEEP = b"[" * 100_000 + b"]" * 100_000  # valid JSON, nested past the recursion limit


@pytest.mark.parametrize("status", [200, 400, 500])
def test_an_answer_nested_too_deep_is_a_typed_error(raw_tokenize: RawTokenize, status: int) -> None:
    """(before: RecursionError out of the count)"""
    counter = load_counter(f"vllm:{raw_tokenize.url}")
    raw_tokenize.answer = (status, DEEP)
    expected = TemplateRefusedError if status == 400 else TokenizerError
    with pytest.raises(expected) as info:
        counter.count_request(HI)
    assert "\n" not in str(info.value) and len(str(info.value)) < 400


@pytest.mark.parametrize("count", [b"1e999", b"-5", b"3.7", b'"12"', b"true", b"null"])
def test_a_count_that_is_no_token_count_is_a_tokenizer_error(
    raw_tokenize: RawTokenize, count: bytes
) -> None:
    """(before: OverflowError for 1e999; -5, 3.7, "12" and true were taken as counts)"""
    counter = load_counter(f"vllm:{raw_tokenize.url}")
    raw_tokenize.answer = (200, b'{"count": ' + count + b"}")
    with pytest.raises(TokenizerError, match="returned no 'count'"):
        counter.count_request(HI)
