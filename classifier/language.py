"""The language of a query, among the intent set's declared ``languages``.

:class:`LanguageDetector` answers one of the set's language codes, or :data:`UNKNOWN` when
the text gives no clue (digits, a code word) or is in a language the detector does not
know. With one declared language there is nothing to detect: the answer is that language.
Otherwise it asks `lingua <https://github.com/pemistahl/lingua-py>`_ (PyPI
``lingua-language-detector``), built for short text, restricted to the declared
languages, so an English-only set never says Spanish. A detector is made once per served
model version (:class:`~classifier.bundle.ModelBundle`) and builds lingua's models on first
use, never at import time; high-accuracy mode: on the project's held-out queries (140,
English and Spanish) it is right on 139 (low-accuracy mode 137) at about 60 µs a query
(BENCHMARKS §17).
"""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["UNKNOWN", "LanguageDetector", "language_labels"]

#: The language of a query the detector cannot tell (also a metric label value).
UNKNOWN = "unknown"


def language_labels(declared: tuple[str, ...]) -> tuple[str, ...]:
    """Every value :meth:`LanguageDetector.detect` can answer for ``declared``: the
    declared languages and :data:`UNKNOWN` (a bounded set, fit for a metric label)."""
    return (*declared, UNKNOWN)


class LanguageDetector:
    """Detects which of ``languages`` (ISO 639-1 codes, the intent file's) a text is in."""

    def __init__(self, languages: tuple[str, ...]) -> None:
        self.languages = tuple(languages)
        self._lock = threading.Lock()
        self._lingua: Any = None
        self._codes: dict[Any, str] = {}

    def detect(self, text: str) -> str:
        """One of :attr:`languages`, or :data:`UNKNOWN`."""
        if len(self.languages) == 1:
            return self.languages[0]
        lingua = self._lingua if self._lingua is not None else self._build()
        if lingua is None:
            return UNKNOWN
        found = lingua.detect_language_of(text)
        return self._codes.get(found, UNKNOWN) if found is not None else UNKNOWN

    def _build(self) -> Any:
        with self._lock:
            if self._lingua is None:
                self._lingua = self._make()
            return self._lingua or None

    def _make(self) -> Any:
        """lingua's detector restricted to the declared languages it knows (``False``:
        fewer than two of them, nothing to tell apart)."""
        from lingua import IsoCode639_1, Language, LanguageDetectorBuilder

        known: dict[Any, str] = {}
        for code in self.languages:
            try:
                known[Language.from_iso_code_639_1(IsoCode639_1.from_str(code))] = code
            except ValueError:
                continue   # a code lingua does not know is never detected: UNKNOWN
        if len(known) < 2:
            self._codes = known
            return False if not known else _One(next(iter(known)))
        self._codes = known
        return LanguageDetectorBuilder.from_languages(*known).build()


class _One:
    """Only one declared language lingua knows: it is the answer for every text."""

    def __init__(self, language: Any) -> None:
        self.language = language

    def detect_language_of(self, text: str) -> Any:
        return self.language
