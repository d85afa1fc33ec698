"""The ``anchoring`` section of ``flywheel stats``: the teacher's history anchoring
(ADR failure RC-03) measured on the traffic log.

The definition is :mod:`classifier.anchoring`'s (the same as the live metric
``flywheel_anchoring_rate``); this module only reads the log. One observation per
decision the teacher made (``layer = 'llm'``, which the log records only for a valid
inline answer) that has layer 2's own answer (``l2_confidence`` not NULL): the
teacher's label is the decision's ``label``, layer 2's is ``l2_label`` (NULL = out of
scope for both) and the history the teacher was shown is the ``history`` column's
labels, oldest first. Back-filled teacher labels are not observations: the pipeline
did not decide with them.

Range: the whole log, like the totals of :func:`training.stats.traffic.convergence`
(``--window`` and ``--last`` shape only the per-window rows). It is read by a second
statement (:meth:`~logstore.reads.NamedReads.anchoring_observations`), grouped by
``(label, l2_label, history labels)`` so only the distinct combinations leave DuckDB; a
decision logged between the two statements may be counted here and not in the totals.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from flywheel.classifier.anchoring import DEFAULT_MAX_LIFT, DEFAULT_MIN_N, AnchoringMonitor, anchoring_report

if TYPE_CHECKING:  # pragma: no cover
    from flywheel.logstore.reads import LogReader

__all__ = ["anchoring_section", "empty_anchoring", "format_anchoring"]


def _json(report: Any) -> dict[str, Any]:
    out = report.to_dict()
    for k in ("rate_with", "rate_without", "lift"):
        if out[k] is not None:
            out[k] = round(out[k], 6)
    return out


def anchoring_section(store: "LogReader", *, min_n: int = DEFAULT_MIN_N,
                      max_lift: float = DEFAULT_MAX_LIFT) -> dict[str, Any]:
    """``flywheel stats``' ``anchoring``: ``n_with``, ``anchored_with``, ``rate_with``,
    ``n_without``, ``rate_without``, ``lift`` (rates rounded to 6 digits, ``None`` when
    their count is 0) and ``tripped``, over the whole log (see the module docstring)."""
    return _json(anchoring_report(store.anchoring_observations(), min_n=min_n, max_lift=max_lift))


def empty_anchoring() -> dict[str, Any]:
    """The ``anchoring`` section of an empty or missing log."""
    return _json(AnchoringMonitor().report())


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100.0 * x:.1f}%"


def format_anchoring(section: dict[str, Any]) -> str:
    """One line for the terminal table, e.g. ``anchoring (RC-03): with history 30/60
    50.0%, without (chance) 10.0% of 60, lift +40.0 pts: TRIPPED``."""
    s = section
    lift = "-" if s["lift"] is None else f"{100.0 * s['lift']:+.1f} pts"
    verdict = "TRIPPED" if s["tripped"] else "not tripped"
    return (f"anchoring (RC-03): with history {s['anchored_with']}/{s['n_with']} {_pct(s['rate_with'])}, "
            f"without (chance) {_pct(s['rate_without'])} of {s['n_without']}, lift {lift}: {verdict}")
