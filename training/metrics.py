"""Label metrics of predictions against the truth, shared by ``flywheel eval``
(:mod:`training.eval.measure`) and the promotion gate (:mod:`training.gate`): light (numpy
only), so the gate loads no classifier to use them.

Definitions (``None`` = out of scope, written ``OUT_OF_SCOPE`` in a report):

- ``accuracy``: share of all queries whose label equals the true label (out of scope is its
  own class: ``None == None`` is right);
- ``in_scope_accuracy`` (Larson et al., 2019): over in-scope queries, the share predicted
  with the right intent *and* not rejected as out of scope;
- ``oos_recall``: over out-of-scope queries, the share predicted out of scope;
- ``macro_f1``: unweighted mean F1 over every class seen in the truth or the predictions
  (in-scope labels and out of scope);
- :func:`language_slices`: the scalar metrics per language (queries without one under
  ``"unknown"``).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from flywheel.classifier.settings.label_names import OUT_OF_SCOPE, label_name

__all__ = ["CONFUSION_MAX_LABELS", "SLICE_FIELDS", "TOP_CONFUSED_PAIRS", "UNKNOWN_LANGUAGE", "classification_metrics",
           "language_slices", "rounded"]

TOP_CONFUSED_PAIRS = 10
CONFUSION_MAX_LABELS = 20       # the confusion plot shows at most this many labels
UNKNOWN_LANGUAGE = "unknown"    # the by_language slice of queries without a language
SLICE_FIELDS = ("n", "n_in_scope", "n_out_of_scope", "accuracy", "in_scope_accuracy", "oos_recall",
                "oos_precision", "macro_f1")


def classification_metrics(true: Sequence[str | None], pred: Sequence[str | None], *,
                           top_pairs: int = TOP_CONFUSED_PAIRS,
                           confusion_labels: int = CONFUSION_MAX_LABELS) -> dict[str, Any]:
    """Label-only metrics of predictions against the truth (``None`` = out of scope).

    Returns ``n``, ``n_in_scope``, ``n_out_of_scope``, ``accuracy``, ``in_scope_accuracy``,
    ``oos_recall``, ``oos_precision``, ``macro_f1``, ``per_intent``, ``confused_pairs``
    and ``confusion`` (the labels most involved in errors and their count matrix, rows
    = true, columns = predicted). A rate with nothing to count is ``None``.

    Examples
    --------
    >>> m = classification_metrics(["a", "a", "b", None], ["a", None, "b", None])
    >>> m["accuracy"], m["in_scope_accuracy"], m["oos_recall"]
    (0.75, 0.666667, 1.0)
    """
    if len(true) != len(pred):
        raise ValueError(f"{len(true)} true labels but {len(pred)} predictions")
    t = [label_name(v) for v in true]
    p = [label_name(v) for v in pred]
    n = len(t)
    in_scope = np.array([v is not None for v in true], dtype=bool)
    right = np.array([a == b for a, b in zip(t, p)], dtype=bool)
    pred_oos = np.array([v is None for v in pred], dtype=bool)

    classes = sorted(set(t) | set(p), key=lambda c: (c == OUT_OF_SCOPE, c))  # out of scope last
    index = {c: i for i, c in enumerate(classes)}
    cm = np.zeros((len(classes), len(classes)), dtype=np.int64)
    if n:
        np.add.at(cm, ([index[c] for c in t], [index[c] for c in p]), 1)
    tp = np.diag(cm).astype(float)
    support = cm.sum(axis=1)
    predicted = cm.sum(axis=0)
    precision = np.divide(tp, predicted, out=np.zeros_like(tp), where=predicted > 0)
    recall = np.divide(tp, support, out=np.zeros_like(tp), where=support > 0)
    denom = precision + recall
    f1 = np.divide(2 * precision * recall, denom, out=np.zeros_like(tp), where=denom > 0)
    per_intent = {c: {"precision": rounded(precision[i]), "recall": rounded(recall[i]), "f1": rounded(f1[i]),
                      "support": int(support[i])} for i, c in enumerate(classes)}

    off = cm.copy()
    np.fill_diagonal(off, 0)
    rows, cols = np.nonzero(off)
    pairs = sorted(((classes[i], classes[j], int(off[i, j])) for i, j in zip(rows, cols)),
                   key=lambda x: (-x[2], x[0], x[1]))
    n_oos = int((~in_scope).sum())
    return {
        "n": n,
        "n_in_scope": int(in_scope.sum()),
        "n_out_of_scope": n_oos,
        "accuracy": rounded(right.mean()) if n else None,
        "in_scope_accuracy": rounded(right[in_scope].mean()) if in_scope.any() else None,
        "oos_recall": rounded(pred_oos[~in_scope].mean()) if n_oos else None,
        "oos_precision": rounded((~in_scope)[pred_oos].mean()) if pred_oos.any() else None,
        "macro_f1": rounded(f1.mean()) if len(classes) else None,
        "per_intent": per_intent,
        "confused_pairs": [list(x) for x in pairs[:top_pairs]],
        "confusion": _confusion_subset(cm, classes, off, confusion_labels),
    }


def _confusion_subset(cm: np.ndarray, classes: list[str], off: np.ndarray, k: int) -> dict[str, Any]:
    """The ``k`` labels most involved in errors (all when there are few) and their matrix."""
    if len(classes) <= k:
        keep = list(range(len(classes)))
    else:
        errors = off.sum(axis=0) + off.sum(axis=1)
        order = sorted(range(len(classes)), key=lambda i: (-int(errors[i]), classes[i]))
        keep = sorted(order[:k], key=lambda i: (classes[i] == OUT_OF_SCOPE, classes[i]))
    return {"labels": [classes[i] for i in keep], "matrix": cm[np.ix_(keep, keep)].tolist(),
            "complete": len(keep) == len(classes), "n_labels": len(classes)}


def language_slices(true: Sequence[str | None], pred: Sequence[str | None],
                    langs: Sequence[str | None] | None) -> dict[str, dict[str, Any]]:
    """The scalar :func:`classification_metrics` of each language's queries.

    Languages are sorted, with queries whose language is ``None`` last under
    ``"unknown"``. Empty when ``langs`` is ``None`` or holds no language.

    Examples
    --------
    >>> s = language_slices(["a", "a", None], ["a", "b", None], ["en", "es", "es"])
    >>> s["en"]["accuracy"], s["es"]["accuracy"], s["es"]["oos_recall"]
    (1.0, 0.5, 1.0)
    """
    if langs is None or all(v is None for v in langs):
        return {}
    if not len(true) == len(pred) == len(langs):
        raise ValueError(f"{len(true)} true labels, {len(pred)} predictions but {len(langs)} languages")
    groups: dict[str | None, list[int]] = {}
    for i, lang in enumerate(langs):
        groups.setdefault(lang, []).append(i)
    order = sorted((g for g in groups if g is not None), key=str) + ([None] if None in groups else [])
    out: dict[str, dict[str, Any]] = {}
    for lang in order:
        idx = groups[lang]
        m = classification_metrics([true[i] for i in idx], [pred[i] for i in idx])
        out[UNKNOWN_LANGUAGE if lang is None else str(lang)] = {k: m[k] for k in SLICE_FIELDS}
    return out


def rounded(x: float) -> float:
    """``x`` as a float rounded to 6 places, as every rate of a report is."""
    return round(float(x), 6)
