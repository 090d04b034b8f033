"""Cutting the middle out of an over-long message, with a marker a reader can see."""

from __future__ import annotations

from collections.abc import Callable

from ctxguard.messages import Message

MARKER = "\n[... {n} characters removed by ctxguard to fit the token budget ...]\n"


def shrink_message(
    message: Message, target_tokens: int, count: Callable[[Message], int]
) -> Message:
    """The message with the middle of its text cut so it counts at most ``target_tokens``.

    Binary search on how many characters to keep (half from the start, half
    from the end): O(log n) counts, done only for oversized messages. Keeps
    the message id; ``metadata['ctxguard_truncated']`` records the cut.
    """
    text = message.text
    low, high = 0, len(text)
    best = _cut(message, text, 0)
    while low <= high:
        keep = (low + high) // 2
        candidate = _cut(message, text, keep)
        if count(candidate) <= target_tokens:
            best, low = candidate, keep + 1
        else:
            high = keep - 1
    return best


def _cut(message: Message, text: str, keep: int) -> Message:
    head, tail = text[: (keep + 1) // 2], text[len(text) - keep // 2 :] if keep // 2 else ""
    removed = len(text) - len(head) - len(tail)
    content = head + MARKER.format(n=removed) + tail
    metadata = dict(message.metadata)
    metadata["ctxguard_truncated"] = {"original_chars": len(text), "removed_chars": removed}
    return message.model_copy(update={"content": content, "metadata": metadata})
