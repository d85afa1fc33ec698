"""The retrain job's rows: labelled texts with their vectors, and the training set with
its fixed evaluation slices (built by :func:`training.trainset.build_training_set`)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import numpy as np

from flywheel.classifier.settings.intents import IntentSet

__all__ = ["SOURCES", "LabelledSet", "TrainingSet"]

#: Where a training row's label comes from.
SOURCES = ("intent_example", "teacher", "human", "layer2")


@dataclass
class LabelledSet:
    """Labelled texts with their embeddings (rows aligned)."""

    texts: list[str]
    labels: list[str | None]
    vectors: np.ndarray
    sources: list[str]
    decision_ids: list[str | None]

    def __len__(self) -> int:
        return len(self.texts)

    @property
    def n_out_of_scope(self) -> int:
        return sum(1 for v in self.labels if v is None)

    def counts(self) -> dict[str, int]:
        c = Counter(self.sources)
        return {s: int(c.get(s, 0)) for s in SOURCES}

    def select(self, idx: Iterable[int]) -> "LabelledSet":
        idx = list(idx)
        return LabelledSet([self.texts[i] for i in idx], [self.labels[i] for i in idx],
                           self.vectors[np.asarray(idx, dtype=np.int64)] if idx else self.vectors[:0],
                           [self.sources[i] for i in idx], [self.decision_ids[i] for i in idx])

    def where(self, pred: Callable[[str], bool]) -> "LabelledSet":
        return self.select(i for i, s in enumerate(self.sources) if pred(s))

    def concat(self, other: "LabelledSet") -> "LabelledSet":
        return LabelledSet(self.texts + other.texts, self.labels + other.labels,
                           np.vstack([self.vectors, other.vectors]).astype(np.float32, copy=False),
                           self.sources + other.sources, self.decision_ids + other.decision_ids)


@dataclass
class TrainingSet(LabelledSet):
    """The training rows (intent examples of ``fit_intents`` first, then logged texts)
    plus the fixed evaluation sets and a report of counts."""

    report: dict[str, Any]
    eval: LabelledSet            # held-out intent examples + held-out human-labelled texts
    recent: LabelledSet          # hash holdout of teacher-labelled texts, most recent RECENT_MAX
    fit_intents: IntentSet       # the intent set minus the held-out examples
    log_until: float             # unix time at which the log was read
    train_keys: frozenset = frozenset()     # normalised keys of the training rows
    logged_keys: frozenset = frozenset()    # normalised keys of every labelled logged text
    negatives: np.ndarray | None = None     # synthetic negatives' vectors (fit-only out-of-scope rows)

    def extra(self) -> LabelledSet:
        """The logged training rows (everything after the intent examples)."""
        return self.where(lambda s: s != "intent_example")
