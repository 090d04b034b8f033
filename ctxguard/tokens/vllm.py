"""Counting through a running vLLM (or compatible) server's ``/tokenize`` endpoint.

The server renders the request with the very template and tokenizer it will use
to serve it (``messages`` + ``tools`` + ``add_generation_prompt``), so
``count_request`` is exact by definition, at the price of one HTTP call per
render. Per-message counts and additivity come from the same frame arithmetic
and probes as the local template counters (:mod:`ctxguard.tokens._templated`).

A 400 answer is the template (or the server's validation) refusing the
conversation: :class:`~ctxguard.errors.TemplateRefusedError` with the server's
message. An unreachable server is a :class:`~ctxguard.errors.TokenizerError`
naming the URL without credentials; a 401/403, the server refusing the credentials,
a :class:`~ctxguard.errors.TokenizerAuthError` saying so, with the server's reason less
any credential it echoes (the gateway answers its clients with none of it). The
server is the only judge of what it refuses, so on the additive path ``validate`` asks
it too (one ``/tokenize`` call per request).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import httpx

from ctxguard import _http
from ctxguard._secrets import redact_text
from ctxguard._validate import check_arg_types, check_http_options, check_http_url
from ctxguard.errors import TemplateRefusedError, TokenizerAuthError, TokenizerError
from ctxguard.stores.urls import redact_url
from ctxguard.tokens._protocol import Tools, fingerprint
from ctxguard.tokens._templated import U0, U1, TemplateCounter, build

IDENTITY_TEXT = "ctxguard identity probe: Grüße, 你好, 🙂, def f(x): return x"


class VLLMRenderer:
    """Asks the server for the token count of a conversation or a text."""

    def __init__(
        self,
        base_url: str,
        model: str | None = None,
        *,
        timeout: float = 10.0,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        check_http_url(base_url, "vllm counter base_url")
        check_arg_types("the vllm: counter", model=(model, "str?"))
        check_http_options("the vllm: counter", timeout, headers)
        root = base_url.rstrip("/")
        self.root = root[: -len("/v1")] if root.endswith("/v1") else root
        self.model = model
        self.where = redact_url(self.root)
        self.timeout = timeout
        self._client = _http.client(timeout=timeout, headers=dict(headers or {}))
        # what the server's answers must not echo back into an error: the headers we send
        # (an API key, raw and after its scheme) and the URL's password, longest first
        self._secrets = _http.known_secrets(base_url, headers)

    def render(self, conversation: Sequence[dict[str, Any]], tools: Tools | None = None) -> int:
        body: dict[str, Any] = {"messages": list(conversation), "add_generation_prompt": True}
        if tools:
            body["tools"] = [dict(t) for t in tools]
        return self._count(body)

    def raw_count(self, text: str) -> int:
        return self._count({"prompt": text, "add_special_tokens": False})

    def _count(self, body: dict[str, Any]) -> int:
        if self.model:
            body["model"] = self.model
        try:
            response = _http.request(
                self._client,
                "POST",
                f"{self.root}/tokenize",
                json=body,
                seconds=self.timeout,
                shown=f"{self.where}/tokenize",
                error=TokenizerError,
                idempotent=True,  # a count: safe to ask twice
            )
        except httpx.HTTPError as exc:
            raise TokenizerError(
                f"cannot reach {self.where}/tokenize ({type(exc).__name__}); check the URL "
                "and that the server runs with its tokenizer endpoint enabled"
            ) from None
        if response.status_code == 400:
            message = self._message(response)
            raise TemplateRefusedError(f"{self.where} refused the request: {message}")
        if response.status_code in (401, 403):  # its reason less any credential it echoes
            raise TokenizerAuthError(
                f"{self.where}/tokenize answered HTTP {response.status_code}: the server "
                "refused the counter's credentials; check the API key (headers=) or the "
                f"user and password in the URL (it said: {self._message(response)})",
                response.status_code,
                "/tokenize",
            )
        if response.status_code != 200:
            raise TokenizerError(
                f"{self.where}/tokenize answered HTTP {response.status_code}: "
                f"{self._message(response)}"
            )
        try:
            count = response.json()["count"]
        except (ValueError, KeyError, TypeError):
            count = None
        # a JSON integer: 1e999 (inf), -5 or 3.7 is no token count
        if type(count) is not int or count < 0:
            raise TokenizerError(
                f"{self.where}/tokenize returned no 'count' (a non-negative integer)"
            )
        return count

    def _message(self, response: _http.Reply) -> str:
        """The server's reason, as it says it, less any credential it echoes (ours by
        value, any other by form: :func:`~ctxguard._secrets.redact_text`)."""
        try:
            data = response.json()
        except ValueError:
            text, limit = response.text, 200
        else:
            error = data.get("error", data) if isinstance(data, dict) else data
            text = str(error.get("message", error) if isinstance(error, dict) else error)
            limit = 300
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return redact_text(" ".join(text.split()), limit)  # on one line: an HTML page has many


def load_vllm_counter(
    base_url: str,
    *,
    model: str | None = None,
    timeout: float = 10.0,
    headers: Mapping[str, str] | None = None,
) -> TemplateCounter:
    """A counter backed by ``base_url``'s ``/tokenize`` (``vllm:http://host:8000``).

    The fingerprint covers the server's answers to fixed probes, so a server that
    changes its tokenizer or template changes the fingerprint and old stored
    counts are recounted.
    """
    renderer = VLLMRenderer(base_url, model, timeout=timeout, headers=headers)
    answers = [renderer.render([U0]), renderer.render([U0, U1]), renderer.raw_count(IDENTITY_TEXT)]
    identity = fingerprint("vllm", model or "", *(str(a) for a in answers))
    return build(renderer, identity)
