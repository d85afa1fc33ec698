"""History anchoring: does the teacher echo the history instead of reading the query?

ADR failure RC-03, "classifier output mirrors dominant history type": a small LLM
shown the session's last turns (label + snippet) tends to answer with the label that
dominates them. This module is the one definition of that measure, pure (no I/O);
the live metric (:class:`AnchoringMonitor` on :class:`classifier.pipeline.Classifier`,
exposed by ``service.metrics``) and ``flywheel stats`` (``training.stats.anchoring``)
both use it.

An observation is one teacher decision: the teacher's label (``None`` = out of
scope), layer 2's own top label for the same query (``None`` = out of scope) and the
labels of the history the teacher was shown, oldest first (may be empty).

- Dominant history label (:func:`dominant_label`): the most common label of the
  history, out of scope (``None``) counting as a label; ties go to the most recent.
- With a history, the observation is *anchored* when ``teacher == dominant`` and
  ``l2 != dominant``: the teacher picked the history's label although layer 2, which
  sees the query alone, did not. ``rate_with = anchored_with / n_with``.
- Without a history there is no dominant label, so the baseline is the chance rate of
  the same event: for a label X, ``r_X`` = share of no-history observations with
  ``teacher == X`` and ``l2 != X``; ``rate_without = sum_X w_X * r_X`` where ``w_X`` is
  the share of with-history observations whose dominant label is X (the baseline asks
  "how often would the teacher have 'agreed with the history' by chance, for the
  dominant labels that actually occurred"). With no with-history observation there are
  no weights: ``rate_without`` is then the unweighted mean of ``r_X`` over the labels
  seen (as teacher or layer-2 label) in the no-history observations, so it is ``None``
  only when ``n_without`` is 0.
- ``lift = rate_with - rate_without`` (``None`` when either rate is); the monitor
  *trips* when ``n_with >= min_n``, ``n_without >= min_n`` and ``lift >= max_lift``.

Memory is bounded by the label set: a monitor keeps counters per label, never the
observations, so a long-running server can hold one forever.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any, Iterable, Sequence

__all__ = ["DEFAULT_MIN_N", "DEFAULT_MAX_LIFT", "AnchoringReport", "AnchoringMonitor", "dominant_label",
           "anchoring_report"]

#: Observations needed on each side (with and without a history) before the monitor may trip.
DEFAULT_MIN_N = 20
#: The lift of ``rate_with`` over the chance baseline at which the monitor trips.
DEFAULT_MAX_LIFT = 0.15

_EPS = 1e-9  # a lift equal to max_lift up to float rounding (0.35 - 0.2 < 0.15) trips


def dominant_label(history_labels: Sequence[str | None]) -> Any:
    """The most common label of ``history_labels`` (oldest first), ties broken by the
    most recent; ``None`` (out of scope) is a label like any other.

    Raises :class:`ValueError` for an empty history (it has no dominant label).

    >>> dominant_label(["A", "B", "B", "A"])
    'A'
    >>> dominant_label(["A", None, None]) is None
    True
    """
    if not history_labels:
        raise ValueError("an empty history has no dominant label")
    counts = Counter(history_labels)
    top = max(counts.values())
    for label in reversed(history_labels):
        if counts[label] == top:
            return label
    raise AssertionError("unreachable")  # pragma: no cover


@dataclass(frozen=True)
class AnchoringReport:
    """What an :class:`AnchoringMonitor` has seen (see the module docstring).

    ``rate_with`` / ``rate_without`` are ``None`` when their count is 0, ``lift`` when
    either rate is; ``tripped`` is ``n_with >= min_n and n_without >= min_n and
    lift >= max_lift``.
    """

    n_with: int
    anchored_with: int
    rate_with: float | None
    n_without: int
    rate_without: float | None
    lift: float | None
    tripped: bool

    def to_dict(self) -> dict[str, Any]:
        """The fields as a JSON-ready dict (``flywheel stats --json``'s ``anchoring``)."""
        return asdict(self)


class AnchoringMonitor:
    """Counts teacher decisions and reports history anchoring. Thread-safe.

    Parameters
    ----------
    min_n : int
        Observations needed with and without a history before the monitor may trip.
    max_lift : float
        ``rate_with - rate_without`` at which it trips.

    Raises :class:`ValueError` for ``min_n < 1`` or a ``max_lift`` outside ``(0, 1]``.
    """

    def __init__(self, *, min_n: int = DEFAULT_MIN_N, max_lift: float = DEFAULT_MAX_LIFT) -> None:
        if isinstance(min_n, bool) or int(min_n) != min_n or min_n < 1:
            raise ValueError(f"min_n must be a positive integer, got {min_n!r}")
        if not 0.0 < max_lift <= 1.0:
            raise ValueError(f"max_lift must be in (0, 1], got {max_lift!r}")
        self.min_n = int(min_n)
        self.max_lift = float(max_lift)
        self._lock = threading.Lock()
        self._n_with = 0
        self._anchored = 0
        self._dominant: Counter[str | None] = Counter()   # with a history: dominant label -> n
        self._n_without = 0
        self._chance: Counter[str | None] = Counter()     # no history: X -> n(teacher == X != l2)
        self._seen: set[str | None] = set()               # no history: labels seen (teacher or l2)

    def observe(self, teacher_label: str | None, l2_label: str | None,
                history_labels: Sequence[str | None] = (), *, n: int = 1) -> None:
        """Count one teacher decision (``n`` identical ones: a grouped log row).

        ``teacher_label`` is the teacher's answer and ``l2_label`` layer 2's own top label
        for the same query (``None`` = out of scope for both); ``history_labels`` are the
        labels of the history the teacher was shown, oldest first.
        """
        if n <= 0:
            return
        with self._lock:
            if history_labels:
                dom = dominant_label(history_labels)
                self._n_with += n
                self._dominant[dom] += n
                if teacher_label == dom and l2_label != dom:
                    self._anchored += n
            else:
                self._n_without += n
                self._seen.update((teacher_label, l2_label))
                if teacher_label != l2_label:
                    self._chance[teacher_label] += n

    def report(self) -> AnchoringReport:
        """The rates, lift and verdict so far (one consistent snapshot)."""
        with self._lock:
            n_with, anchored, n_without = self._n_with, self._anchored, self._n_without
            dominant, chance, seen = dict(self._dominant), dict(self._chance), set(self._seen)
        rate_with = anchored / n_with if n_with else None
        rate_without: float | None = None
        if n_without:
            if n_with:
                rate_without = sum(k * chance.get(x, 0) for x, k in dominant.items()) / (n_with * n_without)
            else:
                rate_without = sum(chance.values()) / (len(seen) * n_without)
        lift = rate_with - rate_without if rate_with is not None and rate_without is not None else None
        tripped = (n_with >= self.min_n and n_without >= self.min_n and lift is not None
                   and lift >= self.max_lift - _EPS)
        return AnchoringReport(n_with, anchored, rate_with, n_without, rate_without, lift, tripped)


def anchoring_report(rows: Iterable[Sequence[Any]], *, min_n: int = DEFAULT_MIN_N,
                     max_lift: float = DEFAULT_MAX_LIFT) -> AnchoringReport:
    """The report of a batch of observations: rows of ``(teacher_label, l2_label,
    history_labels)``, or ``(teacher_label, l2_label, history_labels, n)`` for ``n``
    identical ones (``history_labels`` ``None`` = no history)."""
    monitor = AnchoringMonitor(min_n=min_n, max_lift=max_lift)
    for row in rows:
        teacher, l2, history = row[0], row[1], row[2]
        monitor.observe(teacher, l2, history or (), n=int(row[3]) if len(row) > 3 else 1)
    return monitor.report()
