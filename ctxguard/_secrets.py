"""Foreign text made safe to record or log: what a user's summarizer raised, say.

ctxguard's own messages are built from redacted parts (``stores.urls``); text that
other code wrote (an exception from a callable the user handed us, a body an upstream
answered) may hold a credential in any form. :func:`redact_text` hides the forms we can
recognise without knowing the secret: every URL's user information and secret-looking
query values (through :func:`~ctxguard.stores.urls.redact_url`), and the credential
after ``Bearer`` or ``Basic``.
"""

from __future__ import annotations

import re

from ctxguard.stores.urls import redact_url

# where a URL begins in text (no word boundary asked: a scheme glued to a longer word
# still starts a URL, at most 20 characters before its "://")
_URL = re.compile(r"(?i)[a-z][a-z0-9+.-]{0,19}://")
_SPACE = re.compile(r"\s")
_TRAILING = "'\".,;:)]}>"  # punctuation around a URL in prose or a repr, kept outside it
_BEARER = re.compile(r"(?i)\b(bearer|basic)(\s+)[^\s\"',;)\]}]+")  # an Authorization credential


def _redact_urls(text: str) -> str:
    """Each URL's user information hidden: everything from its ``://`` to the last
    ``@`` on its line (a raw password may hold spaces, ``://`` and ``@``; hiding too
    much is the safe way to be wrong), and its secret-looking query values."""
    out: list[str] = []
    at = 0
    while (found := _URL.search(text, at)) is not None:
        start, body = found.start(), found.end()
        line_end = text.find("\n", body)
        line_end = len(text) if line_end < 0 else line_end
        cred = text.rfind("@", body, line_end)
        space = _SPACE.search(text, cred + 1 if cred >= 0 else body, line_end)
        end = line_end if space is None else space.start()
        core = text[start:end].rstrip(_TRAILING)
        if start + len(core) <= cred:  # (never cut before the credentials' "@")
            core = text[start:end]
        out += [text[at:start], _redact_url(core)]
        at = start + len(core)
    out.append(text[at:])
    return "".join(out)


def _redact_url(url: str) -> str:
    try:
        return redact_url(url)
    except Exception:  # (it raises none we know of; this text is logged while handling one)
        return "<a URL, hidden>"


def redact_text(text: str, limit: int | None = None) -> str:
    """``text`` with every URL's credentials and every bearer/basic credential as
    ``***``; cut to ``limit`` characters (with an ellipsis) when given."""
    text = _redact_urls(_BEARER.sub(r"\1\2***", text))  # (a credential may hold "@")
    if limit is not None and len(text) > limit:
        text = text[: limit - 1] + "…"
    return text


def describe(exc: BaseException, limit: int = 500) -> str:
    """``"<class>: <message>"`` of an exception from code that is not ours, redacted and
    cut to ``limit`` characters of message (what a record or a log line keeps of it)."""
    return f"{type(exc).__name__}: {redact_text(str(exc), limit)}"
