"""The operating point: what layer 2 trades as one cutoff moves, and the cutoff a target picks.

Two trades, each measured with the served decision rule (:func:`classifier.layer2.tiers.assign_tiers`
at the model's thresholds with the one cutoff moved; nothing here re-implements the rule):

- ``oos``: in-scope accuracy against out-of-scope recall as the ``oos`` cutoff sweeps;
- ``answered``: the accuracy of the answers layer 2 gives alone (its sure ones, out of scope
  included) against their share, as the cutoff that makes it sure sweeps (``confident``, or
  ``defer`` under the ``risk`` deferral rule); the rest goes to the teacher.

A target (an intent file's ``thresholds.target``, :mod:`classifier.layer2.targets`) names one
point: ``oos_recall`` sets the ``oos`` cutoff, ``llm_share`` (the share sent to the teacher)
the ``confident`` (or ``defer``) cutoff, and ``precision`` is ``thresholds.target_precision``
by another name (the precision of confident answers, learned as before).
:func:`choose_cutoff` finds the point on labelled rows the model was not fitted on (the
head's out-of-fold rows, or held-out calibration rows), never on the test set.

Every figure a target is chosen or checked on carries its 95% Wilson interval
(:func:`figure_interval`) and the ``tolerance`` it gives (the larger distance from the
figure to an end): a cutoff chosen on 100 out-of-scope rows promises its recall only to
about ±7 points, and :func:`few_rows` says when that is wider than :data:`FEW_ROWS_TOLERANCE`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Sequence

import numpy as np

from flywheel.classifier.layer2.scoring import HeadScores
from flywheel.classifier.layer2.targets import target_kind
from flywheel.classifier.layer2.tiers import Thresholds, TierBatch, assign_tiers

__all__ = ["sure_knob", "trade_curves", "choose_cutoff", "oos_cutoff_for_recall", "target_figure", "concat_scores",
           "operating_report", "figure_interval", "few_rows", "FEW_ROWS_TOLERANCE", "INTERVAL_LEVEL"]

GRID = 51          # cutoffs each trade curve is measured at (0, 0.02, ..., 1), plus the served one
INTERVAL_LEVEL = 0.95       # the confidence level of a target figure's interval
FEW_ROWS_TOLERANCE = 0.05   # a chosen figure less sure than ±5 points rests on too few rows to promise its target


def figure_interval(k: int, n: int) -> tuple[float, float]:
    """The :data:`INTERVAL_LEVEL` Wilson score interval of ``k`` successes in ``n`` rows
    (``n`` > 0; scipy's :meth:`~scipy.stats.binomtest` computes it).

    >>> [round(x, 3) for x in figure_interval(85, 100)]
    [0.767, 0.907]
    """
    from scipy.stats import binomtest

    ci = binomtest(int(k), int(n)).proportion_ci(confidence_level=INTERVAL_LEVEL, method="wilson")
    return float(ci.low), float(ci.high)


def _with_interval(name: str, mask: np.ndarray) -> dict[str, Any]:
    """``{name: the share of true in mask, "n", "interval", "tolerance"}`` (the last two
    only with rows)."""
    n = int(mask.size)
    out: dict[str, Any] = {name: _rate(mask), "n": n}
    if n:
        lo, hi = figure_interval(int(mask.sum()), n)
        value = float(mask.mean())
        out.update(interval=[round(lo, 6), round(hi, 6)], tolerance=round(max(value - lo, hi - value), 6))
    return out


def few_rows(figure: dict[str, Any]) -> bool:
    """Whether a target's ``figure`` (from :func:`target_figure`) is less sure than
    ±:data:`FEW_ROWS_TOLERANCE`: too few rows to promise the target on other rows."""
    tol = figure.get("tolerance")
    return tol is None or float(tol) > FEW_ROWS_TOLERANCE


def sure_knob(th: Thresholds) -> str:
    """The cutoff that decides whether layer 2 answers alone: ``defer`` under the risk rule,
    else ``confident``."""
    return "defer" if th.defer is not None else "confident"


def concat_scores(parts: Sequence[HeadScores]) -> HeadScores:
    """Batches of scores as one."""
    risk = None if any(p.risk is None for p in parts) else np.concatenate([np.asarray(p.risk) for p in parts])
    return HeadScores(np.vstack([p.probs for p in parts]), np.concatenate([p.oos_class for p in parts]),
                      np.concatenate([p.p_oos for p in parts]), np.concatenate([p.similarity for p in parts]), risk)


def _moved(th: Thresholds, field: str, value: float) -> Thresholds:
    """``th`` with the one cutoff ``field`` (``oos``, ``confident`` or ``defer``) at ``value``."""
    return replace(th, **{field: float(value)})  # type: ignore[arg-type]  # a float field, by name


def _at(scores: HeadScores, classes: Sequence[str], th: Thresholds, field: str, value: float) -> TierBatch:
    return assign_tiers(scores, classes, _moved(th, field, value))


def _right(t: TierBatch, classes: Sequence[str], truth: Sequence[str | None]) -> np.ndarray:
    return np.array([a == y for a, y in zip(t.labels(classes), truth)], dtype=bool)


def _rate(mask: np.ndarray) -> float | None:
    return round(float(mask.mean()), 6) if mask.size else None


def trade_curves(scores: HeadScores, classes: Sequence[str], truth: Sequence[str | None], th: Thresholds,
                 grid: int = GRID) -> dict[str, Any]:
    """Both trades on these rows (``truth``: ``None`` = out of scope), each a list of points
    in ascending cutoff order; the served cutoff's point says ``"served": true``.

    ``oos`` points: ``cutoff``, ``in_scope_accuracy`` (in-scope rows answered with their
    intent), ``oos_recall``. ``answered`` points: ``cutoff``, ``answered_share`` (rows layer 2
    answers alone), ``answered_accuracy`` (of those), ``llm_share`` (the rest)."""
    is_oos = np.array([y is None for y in truth], dtype=bool)
    knob = sure_knob(th)
    out: dict[str, Any] = {"n": len(truth), "n_in_scope": int((~is_oos).sum()), "n_out_of_scope": int(is_oos.sum()),
                           "oos": [], "answered": [], "answered_cutoff": knob}
    for field, key in (("oos", "oos"), (knob, "answered")):
        served = float(getattr(th, field))
        for c in sorted({*np.round(np.linspace(0.0, 1.0, grid), 6).tolist(), served}):
            t = _at(scores, classes, th, field, c)
            right = _right(t, classes, truth)
            point: dict[str, Any] = {"cutoff": round(c, 6)}
            if key == "oos":
                point.update(in_scope_accuracy=_rate(right[~is_oos]), oos_recall=_rate(t.rejected[is_oos]))
            else:
                share = float(t.sure.mean()) if len(t) else 0.0
                point.update(answered_share=round(share, 6), answered_accuracy=_rate(right[t.sure]),
                             llm_share=round(1.0 - share, 6))
            if c == served:
                point["served"] = True
            out[key].append(point)
    return out


def oos_cutoff_for_recall(scores: HeadScores, is_oos: np.ndarray, recall: float) -> float:
    """The highest ``oos`` cutoff at which at least ``recall`` of the out-of-scope rows are
    rejected (:meth:`HeadScores.rejected`, the served rule): the most in-scope answers kept
    for that recall. :class:`ValueError` without out-of-scope rows."""
    is_oos = np.asarray(is_oos, dtype=bool)
    if not is_oos.any():
        raise ValueError("no out-of-scope rows to measure the out-of-scope recall on")
    cands = np.unique(np.r_[0.0, np.asarray(scores.p_oos, float)[is_oos]])      # ascending

    def reached(i: int) -> bool:   # recall falls as the cutoff rises
        return float(scores.rejected(float(cands[i]))[is_oos].mean()) >= recall - 1e-12

    return float(cands[_last_true(len(cands), reached)])


def _last_true(n: int, ok: Any) -> int:
    """The last index ``i < n`` with ``ok(i)``, for ``ok`` true up to some point and false
    after (``ok(0)`` is assumed); bisection."""
    lo, hi = 0, n - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def _sure_cutoff_for_share(scores: HeadScores, classes: Sequence[str], th: Thresholds,
                           share: float) -> tuple[str, float, bool]:
    """``(knob, cutoff, reached)``: the strictest cutoff of :func:`sure_knob` at which at most
    ``share`` of the rows go to the teacher (unreachable: the loosest, and ``False``)."""
    knob = sure_knob(th)

    def llm(c: float) -> float:
        return 1.0 - float(_at(scores, classes, th, knob, c).sure.mean())

    if knob == "confident":     # a higher cutoff sends more to the teacher
        cands = np.unique(np.r_[0.0, np.asarray(scores.probs, float).max(axis=1), 1.0])
        if llm(0.0) > share + 1e-12:
            return knob, 0.0, False
        return knob, float(cands[_last_true(len(cands), lambda i: llm(float(cands[i])) <= share + 1e-12)]), True
    risk = np.asarray(scores.risk, float)
    cands = np.unique(np.r_[risk, 1.0])[::-1]         # descending: a lower defer cutoff sends more
    if llm(1.0) > share + 1e-12:
        return knob, 1.0, False
    return knob, float(cands[_last_true(len(cands), lambda i: llm(float(cands[i])) <= share + 1e-12)]), True


def target_figure(target: dict[str, float], scores: HeadScores, classes: Sequence[str],
                  truth: Sequence[str | None], th: Thresholds) -> dict[str, Any]:
    """What these rows give at ``th`` for the target's own figure: its value, the ``n`` it
    is measured on (out-of-scope rows for a recall, all rows for a share, sure answers for a
    precision), its ``interval`` and ``tolerance`` (:func:`figure_interval`)."""
    kind = target_kind(target)
    t = assign_tiers(scores, classes, th)
    if kind == "oos_recall":
        return _with_interval(kind, t.rejected[np.array([y is None for y in truth], dtype=bool)])
    if kind == "llm_share":
        return _with_interval(kind, ~t.sure)
    return _with_interval("precision", _right(t, classes, truth)[t.sure])


def choose_cutoff(target: dict[str, float], scores: HeadScores, classes: Sequence[str],
                  truth: Sequence[str | None], th: Thresholds, on: str) -> dict[str, Any]:
    """The cutoff ``target`` (``oos_recall`` or ``llm_share``) picks on these labelled rows
    (``on`` says which, for the report): ``{"target", "cutoff" (its name), "value",
    "reached", "on", and the target's figure there with its n}``. :class:`ValueError` for a
    ``precision`` target (that is ``target_precision``) or an ``oos_recall`` without
    out-of-scope rows."""
    kind = target_kind(target)
    want = target[kind] if kind else 0.0
    if kind == "oos_recall":
        is_oos = np.array([y is None for y in truth], dtype=bool)
        field, value, reached = "oos", oos_cutoff_for_recall(scores, is_oos, want), True
    elif kind == "llm_share":
        field, value, reached = _sure_cutoff_for_share(scores, classes, th, want)
    else:
        raise ValueError(f"a {kind} target is not chosen here (thresholds.target_precision learns it)")
    got = target_figure(target, scores, classes, truth, _moved(th, field, value))
    return {"target": dict(target), "cutoff": field, "value": value, "reached": reached, "on": on, **got}


def operating_report(target: dict[str, float], metrics: dict[str, Any], scores: HeadScores, classes: Sequence[str],
                     truth: Sequence[str | None], th: Thresholds) -> dict[str, Any]:
    """A model's target on evaluated rows: the target, the cutoff it set (its name and the
    served value), where it was chosen and what those rows gave (``chosen``, from the
    manifest's ``metrics``), the target's figure on these rows with its n (``test``), each
    with its interval, and whether the two intervals overlap (``consistent``)."""
    kind = target_kind(target)
    info = metrics.get("operating_point") or {}
    if kind == "precision":     # target_precision: the confident cutoff's out-of-fold precision
        cp = metrics.get("cutoff_precision") or {}
        info = {"cutoff": sure_knob(th), "on": "out-of-fold training rows", "precision": cp.get("precision"),
                "n": cp.get("n")}
    if kind == "llm_share" and sure_knob(th) == "defer":     # the risk rule serves: its own cutoff
        info = {**info, **(info.get("defer") or {}), "cutoff": "defer"}
    field = str(info.get("cutoff") or ("oos" if kind == "oos_recall" else sure_knob(th)))
    chosen = {k: info[k] for k in ("on", kind or "", "n", "reached", "interval", "tolerance") if k in info}
    test = target_figure(target, scores, classes, truth, th)
    return {"target": dict(target), "cutoff": field, "value": getattr(th, field, None), "chosen": chosen,
            "test": test, "consistent": _overlap(chosen.get("interval"), test.get("interval"))}


def _overlap(a: Sequence[float] | None, b: Sequence[float] | None) -> bool | None:
    """Whether two intervals overlap: the rows a target was chosen on and the rows it is
    checked on plausibly give the same figure (``False``: they differ, e.g. a shift in what
    out-of-scope queries look like); ``None`` without both."""
    if not a or not b:
        return None
    return bool(a[0] <= b[1] and b[0] <= a[1])
