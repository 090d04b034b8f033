"""Images, files and audio in a framework's message: what the adapters do with them.

ctxguard's message model holds text parts and OpenAI ``image_url`` parts; its counters
count text (each refuses an ``image_url`` part with :class:`UncountableContentError`).
So an adapter passes an image a user message holds on as the equivalent ``image_url``
part (a URL, or the image's bytes as a data URL, as the framework's OpenAI client sends
it), and the counter decides; anything else (a file, audio, video, an image where no
chat message can hold one, such as a tool result) is refused here, with its place. It is
never stored as its text alone, which would count it as nothing.
"""

from __future__ import annotations

import base64

from ctxguard.errors import UncountableContentError
from ctxguard.messages import ImagePart


def uncountable(where: str, kind: str) -> UncountableContentError:
    """The one-line refusal of ``kind`` content (an image, a file ...) at ``where``."""
    return UncountableContentError(
        f"{where} is {kind} content, which ctxguard cannot count (its counters count text): "
        "give the model its text instead, or keep it out of the guarded conversation"
    )


def image_part(url: str) -> ImagePart:
    """The OpenAI ``image_url`` part of an image at ``url`` (a data URL too)."""
    return ImagePart.model_validate({"image_url": {"url": url}})


def data_url(data: bytes, media_type: str, *, encoded: bool = False) -> str:
    """``data:<media_type>;base64,...`` of ``data`` (already base64 when ``encoded``)."""
    text = data.decode("ascii") if encoded else base64.b64encode(data).decode("ascii")
    return f"data:{media_type};base64,{text}"
