"""Foreign text made safe to record or log: what a user's summarizer raised, say.

ctxguard's own messages are built from redacted parts (``stores.urls``); text that
other code wrote (an exception from a callable the user handed us, a body an upstream
answered) may hold a credential in any form. :func:`forget` takes out the secrets the
caller knows (a store's password, which a server may quote back), and
:func:`redact_text` hides the forms we can recognise without knowing the secret: every
URL's user information and secret-looking query values (through
:func:`~ctxguard.stores.urls.redact_url`), the credential after ``Bearer`` or ``Basic``,
a whole ``Authorization`` value, and the value of anything named like a secret
(``api_key``, ``x-api-key``, ``token``, ``password``, ``secret``, a URL's ``?key=``) as
a header, a dict entry, a keyword or a query parameter. Callers that know a secret (an
upstream API key) remove it themselves first.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from ctxguard.stores.urls import redact_url

# where a URL begins in text (no word boundary asked: a scheme glued to a longer word
# still starts a URL, at most 20 characters before its "://")
_URL = re.compile(r"(?i)[a-z][a-z0-9+.-]{0,19}://")
_SPACE = re.compile(r"\s")
_TRAILING = "'\".,;:)]}>"  # punctuation around a URL in prose or a repr, kept outside it
_BEARER = re.compile(r"(?i)\b(bearer|basic)(\s+)[^\s\"',;)\]}]+")  # an Authorization credential
# a whole Authorization header's value, whatever its scheme ("Token abc", "Digest ...")
_AUTH_HEADER = re.compile(r"(?i)\b((?:proxy-)?authorization['\"]?\s*[:=]\s*['\"]?)[^'\"\r\n}]+")
# a named secret, as a header, a JSON or repr'd dict entry, a keyword or a query
# parameter of a URL shown without its scheme ("...:generateContent?key=AIza...")
# (a ":" only after a quoted name or before white space: "tiktoken:cl100k_base" is a name)
# (a name may go on after a word that always means a secret, "secret_key",
# "aws_secret_access_key", "private_key_pem"; not after "token": "max_tokens: 512")
_NAMED = re.compile(
    r"(?i)((?:\b[\w.-]*(?:(?:api[_-]?key|apikey|access[_-]?key|private[_-]?key|secret|password"
    r"|passwd)[\w-]*|token)|[?&]key|[?&]sig)"
    r"(?:['\"]\s*:\s*['\"]?|:\s+['\"]?|['\"]?\s*=\s*['\"]?))[^\s'\",;&}]+"
)


def _redact_urls(text: str) -> str:
    """Each URL's user information hidden: everything from its ``://`` to the last
    ``@`` on its line (a raw password may hold spaces, ``://`` and ``@``; hiding too
    much is the safe way to be wrong), and its secret-looking query values. Linear in
    the text: each line's last ``@`` is found once."""
    out: list[str] = []
    at = 0
    line_end = last_at = -1
    while (found := _URL.search(text, at)) is not None:
        start, body = found.start(), found.end()
        if body > line_end:  # a new line: its end and its last "@", once
            line_end = text.find("\n", body)
            line_end = len(text) if line_end < 0 else line_end
            last_at = text.rfind("@", body, line_end)
        cred = last_at if last_at >= body else -1
        space = _SPACE.search(text, cred + 1 if cred >= 0 else body, line_end)
        end = line_end if space is None else space.start()
        core = text[start:end].rstrip(_TRAILING)
        if start + len(core) <= cred:  # (never cut before the credentials' "@")
            core = text[start:end]
        out += [text[at:start], _redact_url(core)]
        at = start + len(core)
    out.append(text[at:])
    return "".join(out)


def _cut(text: str, size: int) -> str:
    """The first ``size`` characters. When the cut line goes on to an "@", a URL's
    credentials on it may reach past the cut (to the line's last "@"): then nothing of
    the line from its first URL on is kept."""
    if len(text) <= size:
        return text
    head = text[:size]
    line_end = text.find("\n", size)
    if text.find("@", size, len(text) if line_end < 0 else line_end) >= 0:
        found = _URL.search(head, head.rfind("\n") + 1)
        if found is not None:
            head = head[: found.start()]
    return head + "…"


def _redact_url(url: str) -> str:
    try:
        return redact_url(url)
    except Exception:  # (it raises none we know of; this text is logged while handling one)
        return "<a URL, hidden>"


def redact_urls(text: str) -> str:
    """Only the URLs in ``text`` redacted (a token counter spec: ``vllm:http://u:p@h``)."""
    return _redact_urls(text)


def redact_text(text: str, limit: int | None = None) -> str:
    """``text`` with every credential of the forms in the module's docstring as ``***``;
    cut to ``limit`` characters (with an ellipsis) when given, the work bounded too."""
    if limit is not None:  # a message may be megabytes
        text = _cut(text, max(8 * limit, 4096))
    text = _BEARER.sub(r"\1\2***", text)
    text = _NAMED.sub(r"\1***", _AUTH_HEADER.sub(r"\1***", text))
    text = _redact_urls(text)  # (after them: a credential may hold "@")
    if limit is not None and len(text) > limit:
        text = text[: limit - 1] + "…"
    return text


def forget(text: str, secrets: Iterable[str]) -> str:
    """``text`` with each of ``secrets`` (the longest first, as given) as ``***``."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return text


def forget_in_chain(exc: BaseException, secrets: Sequence[str]) -> None:
    """Each exception under ``exc`` (its causes and contexts, what a traceback or an
    error tracker shows) whose text holds one of ``secrets`` keeps that text without it:
    its ``args`` become the one forgotten line (an exception whose text cannot be made
    has each of its string arguments forgotten instead)."""
    if not secrets:
        return
    seen: list[BaseException] = []
    item: BaseException | None = exc
    while item is not None and all(item is not s for s in seen):
        seen.append(item)
        try:
            text: str | None = str(item)
        except Exception:  # its __str__ fails: what a repr shows still counts
            text = None
        if text is not None and any(s in text for s in secrets if s):
            if isinstance(item, OSError):  # its text is made from these, not from args
                for name in ("strerror", "filename", "filename2"):
                    value = getattr(item, name)
                    if isinstance(value, str):
                        setattr(item, name, forget(value, secrets))
            item.args = (forget(text, secrets),)
        elif text is None:
            args = tuple(forget(a, secrets) if isinstance(a, str) else a for a in item.args)
            if args != item.args:
                item.args = args
        item = item.__cause__ or item.__context__


def describe(exc: BaseException, limit: int = 500) -> str:
    """``"<class>: <message>"`` of an exception from code that is not ours, redacted and
    cut to ``limit`` characters of message (what a record or a log line keeps of it)."""
    try:
        text = str(exc)
    except Exception:  # an exception class whose __str__ fails is still reported
        text = "<its text could not be made>"
    return f"{type(exc).__name__}: {redact_text(text, limit)}"
