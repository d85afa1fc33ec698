"""The retrain job's promotion gate: layer-2 metrics of a model on a labelled set, and
the decision to promote a challenger or keep the champion.

A challenger is promoted when, on the gate set, ``accuracy >= champion accuracy -
tolerance - noise`` (and the same for out-of-scope recall when there are at least
:data:`MIN_OOS_FOR_GATE` out-of-scope queries). ``noise`` is 1.96 paired (McNemar)
standard errors of the difference: with a few hundred evaluation queries a fixed
tolerance alone rejects challengers on chance.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from flywheel.classifier.calibration import expected_calibration_error
from flywheel.classifier.model import IntentModel
from flywheel.training.layer2 import layer2_predict
from flywheel.training.rows import LabelledSet

__all__ = ["MIN_OOS_FOR_GATE", "evaluate_layer2", "noise_margins", "decide"]

MIN_OOS_FOR_GATE = 20       # out-of-scope eval queries needed to gate on out-of-scope recall


def evaluate_layer2(model: IntentModel, data: LabelledSet) -> dict[str, Any]:
    """Layer-2 metrics of ``model`` on ``data`` with its serving thresholds.

    ``accuracy`` counts out of scope as a class; ``llm_share`` is the share of queries
    layer 2 is not ``sure`` of (they would go to the teacher); ``sure_accuracy`` is the
    accuracy on the rest; ``ece`` is over in-scope queries (top calibrated probability
    vs. top label right).
    """
    from flywheel.training.evaluate import classification_metrics

    n = len(data)
    if n == 0:
        return {"n": 0, "n_in_scope": 0, "n_out_of_scope": 0, "accuracy": None, "in_scope_accuracy": None,
                "oos_recall": None, "macro_f1": None, "ece": None, "llm_share": None, "sure_accuracy": None,
                "per_intent": {}, "confused_pairs": []}
    b = layer2_predict(model, data.vectors)
    m = classification_metrics(data.labels, b.labels)
    truth = np.array([v is not None for v in data.labels])
    top = np.array(b.classes, dtype=object)[b.probs.argmax(axis=1)]
    correct = np.array([t == y for t, y in zip(top, data.labels)])
    ece = expected_calibration_error(b.probs.max(axis=1)[truth], correct[truth]) if truth.any() else None
    right = np.array([p == y for p, y in zip(b.labels, data.labels)])
    return {
        "n": n, "n_in_scope": m["n_in_scope"], "n_out_of_scope": m["n_out_of_scope"],
        "accuracy": m["accuracy"], "in_scope_accuracy": m["in_scope_accuracy"],
        "oos_recall": m["oos_recall"], "macro_f1": m["macro_f1"], "ece": ece,
        "llm_share": round(float(1.0 - b.sure.mean()), 6),
        "sure_accuracy": round(float(right[b.sure].mean()), 6) if b.sure.any() else None,
        "per_intent": {k: {"precision": v["precision"], "recall": v["recall"], "support": v["support"]}
                       for k, v in m["per_intent"].items()},
        "confused_pairs": m["confused_pairs"][:5],
    }


def noise_margins(challenger: IntentModel, champion: IntentModel, data: LabelledSet,
                   z: float = 1.96) -> dict[str, float]:
    """How much worse the challenger may look on ``data`` by chance alone (z standard errors).

    Accuracy uses the paired (McNemar) standard error of the difference: only queries
    on which the two models disagree count. Out-of-scope recall uses the unpaired
    standard error over the out-of-scope queries. With a few hundred eval queries this
    is several points: a fixed tolerance alone would reject challengers on noise.
    """
    if len(data) == 0:
        return {"accuracy": 0.0, "oos_recall": 0.0}
    truth = list(data.labels)
    r_ch = np.array([p == y for p, y in zip(layer2_predict(challenger, data.vectors).labels, truth)])
    r_cp = np.array([p == y for p, y in zip(layer2_predict(champion, data.vectors).labels, truth)])
    n = len(truth)
    worse, better = int((r_cp & ~r_ch).sum()), int((~r_cp & r_ch).sum())
    se_acc = np.sqrt(max(worse + better - (better - worse) ** 2 / n, 0.0)) / n
    oos = np.array([y is None for y in truth])
    if oos.any():
        p1, p2 = r_ch[oos].mean(), r_cp[oos].mean()
        se_oos = float(np.sqrt((p1 * (1 - p1) + p2 * (1 - p2)) / oos.sum()))
    else:
        se_oos = 0.0
    return {"accuracy": float(z * se_acc), "oos_recall": float(z * se_oos)}


def _f(x: Any) -> str:
    return "n/a" if x is None else f"{float(x):.3f}"


def decide(challenger: IntentModel, champion: IntentModel | None, ch: dict[str, Any], cp: dict[str, Any] | None,
           data: LabelledSet | None, gate_name: str, tolerance: float,
           notes: list[str]) -> tuple[str, str, list[dict[str, Any]]]:
    """``(outcome, reason, checks)`` for the challenger's and champion's metrics ``ch`` and
    ``cp`` (per set, from :func:`evaluate_layer2`) on the gate set ``data`` named
    ``gate_name``. Appends to ``notes`` what was not gated."""
    checks: list[dict[str, Any]] = []
    if cp is None or champion is None or data is None:
        return "promoted", "no usable champion: first model", checks
    if ch["n"] == 0:
        return "kept", "no evaluation data to compare the challenger with the champion", checks
    n_oos = ch[gate_name]["n_out_of_scope"]
    if n_oos < MIN_OOS_FOR_GATE:
        notes.append(f"out-of-scope recall not gated: {n_oos} out-of-scope eval queries (< {MIN_OOS_FOR_GATE})")
    gate_metrics = ["accuracy"] + (["oos_recall"] if n_oos >= MIN_OOS_FOR_GATE else [])
    margins = noise_margins(challenger, champion, data)
    failed = None
    for metric in gate_metrics:
        a, b = ch[gate_name][metric], cp[gate_name][metric]
        noise = margins[metric]
        ok = a is None or b is None or a >= b - tolerance - noise - 1e-12
        checks.append({"metric": metric, "challenger": a, "champion": b, "noise_margin": round(noise, 6),
                       "ok": ok})
        if not ok and failed is None:
            failed = (metric, a, b, noise)
    if failed is not None:
        metric, a, b, noise = failed
        return "kept", (f"{metric} {a:.3f} < champion {b:.3f} - tolerance {tolerance:g} - noise {noise:.3f} "
                        f"on {ch['n']:,} {gate_name} queries"), checks
    return "promoted", "; ".join(f"{c['metric']} {_f(c['challenger'])} >= champion {_f(c['champion'])} - "
                                 f"tolerance {tolerance:g} - noise {c['noise_margin']:.3f}" for c in checks), checks
