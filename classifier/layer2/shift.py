"""The out-of-scope gate under shift: which rejections layer 2 cannot be sure of.

The gate rejects a query that is far from every training example. That is evidence of
"out of scope" only where the training rows could have been near it: a query in a
declared language the rows lack (or barely have) is far from them because of its
language, not its meaning (issue 43: one in five in-scope queries in an unseen language
was thrown away as a sure out-of-scope answer). Such a rejection goes to the teacher as
unsure instead (:func:`classifier.layer2.tiers.assign_tiers`, its ``shifted`` rows).

At fit time :func:`language_rows` counts the in-scope training rows per detected
language; the model's manifest keeps the counts under ``metrics["language_rows"]``, and
:func:`undertrained_languages` names the declared languages below
:data:`UNDERTRAINED_SHARE` of the best-covered one. A version saved before the counts
has none: nothing is undertrained and the gate behaves as it did.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Mapping, Sequence

import numpy as np

from flywheel.classifier.language import LanguageDetector

__all__ = ["UNDERTRAINED_SHARE", "METRIC_KEY", "language_rows", "undertrained_languages", "shifted_rows"]

#: A declared language is undertrained when its in-scope training rows are fewer than this
#: share of the best-covered language's.
UNDERTRAINED_SHARE = 0.1
#: Where a manifest's metrics keep :func:`language_rows`.
METRIC_KEY = "language_rows"


def language_rows(texts: Sequence[str], labels: Sequence[str | None], languages: Sequence[str]) -> dict[str, int]:
    """In-scope training rows per language of ``languages`` (as
    :class:`~classifier.language.LanguageDetector` serves them; a language with no row
    counts 0, rows the detector cannot place count under ``unknown``). Out-of-scope rows
    (label ``None``) are not counted: they say nothing of where in-scope queries lie."""
    if len(texts) != len(labels):
        raise ValueError(f"{len(texts)} texts for {len(labels)} labels")
    detector = LanguageDetector(tuple(languages))
    found = Counter(detector.detect(t) for t, y in zip(texts, labels) if y is not None)
    return {**{code: 0 for code in languages}, **dict(found)}


def undertrained_languages(rows: Mapping[str, Any] | None, declared: Sequence[str]) -> frozenset[str]:
    """The declared languages whose training rows (``rows``, a manifest's
    ``metrics["language_rows"]``) are fewer than :data:`UNDERTRAINED_SHARE` of the
    best-covered declared language's. ``None`` (a version fitted before the counts) or a
    single declared language: none."""
    if not rows or len(declared) < 2:
        return frozenset()
    counts = {code: int(rows.get(code, 0)) for code in declared}
    most = max(counts.values())
    return frozenset(code for code, n in counts.items() if n < UNDERTRAINED_SHARE * most)


def shifted_rows(languages: Sequence[str] | None, undertrained: frozenset[str]) -> np.ndarray | None:
    """One flag per query: its language (``languages``, as the bundle's detector answers
    them) is undertrained. ``None`` when no language is (then nobody needs to detect one)."""
    if not undertrained or languages is None:
        return None
    return np.array([lang in undertrained for lang in languages], dtype=bool)
