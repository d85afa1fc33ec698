"""Input checks and normalisation shared by every layer."""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

from flywheel.classifier.errors import InvalidInputError

DEFAULT_MAX_CHARS = 4000
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
_SURROGATE = re.compile("[\ud800-\udfff]")
_SPACE = re.compile(r"\s+")


@dataclass(frozen=True)
class CleanText:
    text: str          # what the layers see
    truncated: bool    # longer than max_chars and cut
    original_chars: int


def clean_text(text: object, max_chars: int = DEFAULT_MAX_CHARS, *, on_long: str = "truncate") -> CleanText:
    """Validate and normalise one query.

    - not a string, empty or whitespace-only: :class:`InvalidInputError`;
    - lone surrogates (invalid UTF-16 halves) are replaced with U+FFFD;
    - control characters become spaces; whitespace runs collapse; NFC normalisation;
    - longer than ``max_chars``: truncated (``on_long="truncate"``, flagged) or
      rejected (``on_long="reject"``).

    Examples
    --------
    >>> clean_text("  hi\\tthere\\x00 ").text
    'hi there'
    >>> clean_text("x" * 10, max_chars=4).truncated
    True
    """
    if not isinstance(text, str):
        raise InvalidInputError(f"text must be a string, got {type(text).__name__}")
    if _SURROGATE.search(text) is not None:
        text = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
        text = "".join("\ufffd" if "\ud800" <= ch <= "\udfff" else ch for ch in text)
    if not text.isascii():
        text = unicodedata.normalize("NFC", text)
    text = _CONTROL.sub(" ", text)
    text = _SPACE.sub(" ", text).strip()
    if not text:
        raise InvalidInputError("text is empty or whitespace only")
    n = len(text)
    if n > max_chars:
        if on_long == "reject":
            raise InvalidInputError(f"text is {n} characters, over the limit of {max_chars}")
        return CleanText(text[:max_chars], True, n)
    return CleanText(text, False, n)


def normalise_key(text: str) -> str:
    """Key used to merge duplicates and look up cached embeddings."""
    return _SPACE.sub(" ", text.casefold()).strip()
