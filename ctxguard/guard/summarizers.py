"""Two summarizers to start with, and the calling convention for your own.

A summarizer is any callable ``(previous_summary, messages) -> str`` (or an
awaitable of ``str``). Its output is checked by the guard (type, emptiness,
token budget, timeout) before it can become context; a failure is recorded in
the audit trail and the request goes out by plain windowing.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from typing import Any

import httpx

from ctxguard import _http
from ctxguard._validate import check_http_url
from ctxguard.errors import SummarizerError
from ctxguard.messages import Message
from ctxguard.stores.urls import redact_url

PROMPT = (
    "Summarize the conversation below for an assistant that will continue it. Keep facts, "
    "names, numbers, decisions, open questions and tool results that matter; drop "
    "pleasantries. Write at most {words} words."
)


class OpenAISummarizer:
    """Summarizes through an OpenAI-compatible ``/chat/completions`` endpoint.

    The API key is read from the environment variable named by ``api_key_env``
    at call time, so it never sits in the guard's config or audit records.
    """

    name = "openai-chat"

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key_env: str = "OPENAI_API_KEY",
        max_words: int = 250,
        max_tokens: int = 512,
        timeout: float = 60.0,
    ) -> None:
        check_http_url(base_url, "summarizer base_url")
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.where = redact_url(self.url)  # what errors (and so the audit trail) show
        self.model = model
        self.api_key_env = api_key_env
        self.max_words = max_words
        self.max_tokens = max_tokens
        self.timeout = timeout

    def _payload(self, previous: str | None, messages: Sequence[Message]) -> dict[str, Any]:
        transcript = "\n".join(f"{m.role}: {m.text}" for m in messages if m.text)
        if previous:
            transcript = f"(summary so far) {previous}\n{transcript}"
        return {
            "model": self.model,
            "max_tokens": self.max_tokens,
            "temperature": 0,
            "messages": [
                {"role": "system", "content": PROMPT.format(words=self.max_words)},
                {"role": "user", "content": transcript},
            ],
        }

    def _headers(self) -> dict[str, str]:
        key = os.environ.get(self.api_key_env)
        return {"Authorization": f"Bearer {key}"} if key else {}

    @staticmethod
    def _text(response: _http.Reply) -> str:
        if response.status_code != 200:
            raise SummarizerError(f"summary endpoint answered HTTP {response.status_code}")
        try:
            text = response.json()["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise SummarizerError(f"summary endpoint returned an unexpected body ({exc})") from None
        if not isinstance(text, str):
            raise SummarizerError("summary endpoint returned no text")
        return text.strip()

    def __call__(self, previous: str | None, messages: Sequence[Message]) -> str:
        payload = self._payload(previous, messages)
        try:
            with _http.client(timeout=self.timeout) as client:
                response = _http.request(
                    client,
                    "POST",
                    self.url,
                    json=payload,
                    headers=self._headers(),
                    seconds=self.timeout,
                    shown=self.where,
                    error=SummarizerError,
                )
        except httpx.HTTPError as exc:
            raise SummarizerError(
                f"summary endpoint {self.where} failed: {type(exc).__name__}"
            ) from None
        return self._text(response)

    async def acall(self, previous: str | None, messages: Sequence[Message]) -> str:
        payload = self._payload(previous, messages)
        try:
            async with httpx.AsyncClient(timeout=self.timeout) as client:
                response = await _http.arequest(
                    client,
                    "POST",
                    self.url,
                    json=payload,
                    headers=self._headers(),
                    seconds=self.timeout,
                    shown=self.where,
                    error=SummarizerError,
                )
        except httpx.HTTPError as exc:
            raise SummarizerError(
                f"summary endpoint {self.where} failed: {type(exc).__name__}"
            ) from None
        return self._text(response)


_SENTENCE = re.compile(r"(?<=[.!?。！？])\s+")


class ExtractiveSummarizer:
    """Offline fallback: the first sentence of each message, newest kept when over budget.

    No model, no network; deterministic, so replay reproduces it.
    """

    name = "extractive"

    def __init__(self, max_chars: int = 2000, per_message_chars: int = 200) -> None:
        self.max_chars = max_chars
        self.per_message_chars = per_message_chars

    def __call__(self, previous: str | None, messages: Sequence[Message]) -> str:
        lines = previous.splitlines() if previous else []
        for message in messages:
            text = " ".join(message.text.split())
            if not text:
                continue
            first = _SENTENCE.split(text, maxsplit=1)[0][: self.per_message_chars]
            lines.append(f"{message.role}: {first}")
        while len(lines) > 1 and len("\n".join(lines)) > self.max_chars:
            lines.pop(0)  # the oldest line goes first; lines are never cut mid-way
        return "\n".join(lines)[: self.max_chars]
