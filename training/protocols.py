"""What the training jobs need from the traffic log, as a :class:`typing.Protocol`.

:class:`TrafficLog` is the part of :class:`logstore.LogStore` that
:func:`training.retrain.retrain` (with :mod:`training.trainset`, :mod:`training.cutoffs`
and :mod:`training.teacher_noise`) reads: the log's named reads
(:class:`logstore.reads.LogReader`, which the statistics and the review type against) and
the rows and vectors below; a store that mirrors a shared log implements the same.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Iterable, Protocol, runtime_checkable

import numpy as np

from flywheel.logstore.reads import LogReader

if TYPE_CHECKING:
    from flywheel.classifier.protocols import HistoryEntry
    from flywheel.logstore import LabelledRow

__all__ = ["TrafficLog"]


@runtime_checkable
class TrafficLog(LogReader, Protocol):
    """The traffic log as the retrain reads it: the named reads of :class:`LogReader` (the
    teacher-noise estimate's pairs among them) and these (see :class:`logstore.LogStore` for
    each method's contract)."""

    def ingest(self) -> int:
        """Make everything logged so far readable; the rows moved."""
        ...

    def labelled_rows(self, since: float | datetime | None = None, *,
                      labelled_only: bool = True) -> list[LabelledRow]:
        """Decisions with a human or a valid teacher label (newer than ``since``), oldest first."""
        ...

    def decision_languages(self, decision_ids: Iterable[str]) -> dict[str, str]:
        """The logged language of each decision that has one, by decision id."""
        ...

    def decision_histories(self, decision_ids: Iterable[str]) -> dict[str, tuple[HistoryEntry, ...]]:
        """The logged compact history of each decision in the log, by decision id."""
        ...

    def invalid_teacher_answers(self) -> int:
        """How many teacher answers were logged as invalid."""
        ...

    def unsure_teacher_answers(self) -> int:
        """How many of them were unsure (a candidate set or "cannot tell")."""
        ...

    def unsure_candidate_sets(self, since: float | None = None) -> list[tuple[str | None, ...]]:
        """The candidate sets of unsure teacher answers (newer than ``since``), oldest first."""
        ...

    def embeddings(self, encoder_id: str, decision_ids: Iterable[str] | None = None, *,
                   texts: Iterable[str] | None = None) -> dict[str, np.ndarray]:
        """Logged layer-2 vectors made by ``encoder_id``, by decision id (or by text)."""
        ...

    def confident_layer2(self, encoder_id: str, limit: int
                         ) -> tuple[list[str], list[str], list[str], list[np.ndarray]]:
        """The newest confident in-scope layer-2 decisions with their vectors."""
        ...

    def query_texts(self, limit: int, seed: int = 0) -> list[str]:
        """Up to ``limit`` distinct logged query texts (a seeded draw), retention-erased ones never."""
        ...

    def latest_decisions(self, encoder_id: str, n: int) -> list[tuple[str, str]]:
        """``(decision_id, text)`` of the newest ``n`` decisions layer 2 ran on."""
        ...

    def count_new_labels(self, since: float | None) -> int:
        """Labels that reached the log after ``since``."""
        ...
