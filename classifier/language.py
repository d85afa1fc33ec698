"""The language of a query, among the intent set's declared ``languages``.

:class:`LanguageDetector` answers one of the set's language codes, or :data:`UNKNOWN` when
the text gives no clue (digits, a code word) or is in a language the detector does not
know. With one declared language there is nothing to detect: the answer is that language.
Otherwise it asks `lingua <https://github.com/pemistahl/lingua-py>`_ (PyPI
``lingua-language-detector``), built for short text, restricted to the declared
languages, so an English-only set never says Spanish. A detector is made once per served
model version (:class:`~classifier.bundle.ModelBundle`) and builds lingua's models on first
use, never at import time.

Two passes (issue 44: loading the high-accuracy models took 0.4 s of a one-shot
``flywheel classify``): lingua's low-accuracy mode (trigrams only, built in about 25 ms)
answers when its confidence reaches :data:`CASCADE_CONFIDENCE`; below, the high-accuracy
mode (every n-gram, its models loaded on the first such query) decides. On 391 held-out and
follow-up queries (en/es/de) and 3,000 CLINC150 queries, the two passes answer as the
high-accuracy mode alone on all but 3 of the 3,391 (BENCHMARKS §24); high accuracy alone is
right on 139 of the 140 English and Spanish held-out queries (BENCHMARKS §17).
"""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["CASCADE_CONFIDENCE", "UNKNOWN", "LanguageDetector", "language_labels"]

#: The language of a query the detector cannot tell (also a metric label value).
UNKNOWN = "unknown"
#: The low-accuracy pass answers alone when its top language's confidence reaches this.
CASCADE_CONFIDENCE = 0.99


def language_labels(declared: tuple[str, ...]) -> tuple[str, ...]:
    """Every value :meth:`LanguageDetector.detect` can answer for ``declared``: the
    declared languages and :data:`UNKNOWN` (a bounded set, fit for a metric label)."""
    return (*declared, UNKNOWN)


class LanguageDetector:
    """Detects which of ``languages`` (ISO 639-1 codes, the intent file's) a text is in."""

    def __init__(self, languages: tuple[str, ...]) -> None:
        self.languages = tuple(languages)
        self._lock = threading.Lock()
        self._lingua: Any = None       # the low-accuracy pass (or _One, or False: nothing to detect)
        self._high: Any = None         # the high-accuracy pass, built on the first unsure query
        self._codes: dict[Any, str] = {}

    def detect(self, text: str) -> str:
        """One of :attr:`languages`, or :data:`UNKNOWN`."""
        if len(self.languages) == 1:
            return self.languages[0]
        lingua = self._lingua if self._lingua is not None else self._build()
        if lingua is None:
            return UNKNOWN
        if isinstance(lingua, _One):
            return self._codes.get(lingua.language, UNKNOWN)
        values = lingua.compute_language_confidence_values(text)
        if values and values[0].value >= CASCADE_CONFIDENCE:
            found = values[0].language
        else:
            found = (self._high if self._high is not None else self._build_high()).detect_language_of(text)
        return self._codes.get(found, UNKNOWN) if found is not None else UNKNOWN

    def warm(self) -> None:
        """Build both passes now (a promoted version's bundle, before it is swapped in), so no
        served query pays for loading the high-accuracy models."""
        if len(self.languages) > 1 and self._build() is not None and not isinstance(self._lingua, _One):
            self._build_high().detect_language_of("warm-up")

    @property
    def high_accuracy_loaded(self) -> bool:
        """Whether a query has needed the high-accuracy pass yet (its models are loaded)."""
        return self._high is not None

    def _build(self) -> Any:
        with self._lock:
            if self._lingua is None:
                self._lingua = self._make()
            return self._lingua or None

    def _build_high(self) -> Any:
        from lingua import LanguageDetectorBuilder

        with self._lock:
            if self._high is None:
                self._high = LanguageDetectorBuilder.from_languages(*self._codes).build()
            return self._high

    def _make(self) -> Any:
        """lingua's low-accuracy detector restricted to the declared languages it knows
        (``False``: none of them; :class:`_One`: one, nothing to tell apart)."""
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
        return LanguageDetectorBuilder.from_languages(*known).with_low_accuracy_mode().build()


class _One:
    """Only one declared language lingua knows: it is the answer for every text."""

    def __init__(self, language: Any) -> None:
        self.language = language

    def detect_language_of(self, text: str) -> Any:
        return self.language
