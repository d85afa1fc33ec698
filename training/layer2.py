"""Layer 2 as the retrain job sees it: a model's tiered answers for a batch of vectors,
nearest-example labels, and the noisy-teacher guard built on both."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from flywheel.classifier.layer2.scoring import HeadScores, normalise_rows
from flywheel.classifier.layer2.tiers import Thresholds, assign_tiers
from flywheel.classifier.settings.label_names import label_name
from flywheel.training.rows import LabelledSet

if TYPE_CHECKING:
    from flywheel.classifier.versions.model import IntentModel

__all__ = ["GUARD_K", "Layer2Batch", "layer2_predict", "knn_labels", "noisy_teacher_guard"]

GUARD_K = 5         # nearest intent examples the noisy-teacher guard consults
_CHUNK = 4096


@dataclass
class Layer2Batch:
    """Layer 2's view of a batch: tiered labels, ``sure`` flags and calibrated scores."""

    labels: list[str | None]      # what layer 2 answers (None = out of scope)
    sure: np.ndarray              # bool: layer 2 decides alone (else the teacher is asked)
    tiers: list[str]
    probs: np.ndarray             # (n, n_classes) calibrated in-scope probabilities
    oos_class: np.ndarray
    p_oos: np.ndarray
    classes: list[str]
    risk: np.ndarray | None = None  # calibrated P(wrong); None for heads without a risk model


def layer2_predict(model: IntentModel, X: np.ndarray, thresholds: Thresholds | None = None) -> Layer2Batch:
    """Score ``X`` with ``model``'s head and tier every row as the pipeline would."""
    th = thresholds if thresholds is not None else Thresholds.for_model(model)
    classes = [str(c) for c in model.manifest.labels]
    n = len(X)
    if n == 0:
        z = np.zeros((0, len(classes)))
        return Layer2Batch([], np.zeros(0, bool), [], z, np.zeros(0), np.zeros(0), classes)
    parts = [model.head.scores(X[i:i + _CHUNK]) for i in range(0, n, _CHUNK)]
    probs = np.vstack([p.probs for p in parts])
    oos_class = np.concatenate([p.oos_class for p in parts])
    p_oos = np.concatenate([p.p_oos for p in parts])
    risk = None if parts[0].risk is None else np.concatenate([p.risk for p in parts])
    sim = np.concatenate([p.similarity for p in parts])   # the novelty floor reads it
    t = assign_tiers(HeadScores(probs, oos_class, p_oos, sim, risk), classes, th)
    return Layer2Batch(t.labels(classes), t.sure, [x.value for x in t.tier], probs, oos_class, p_oos, classes,
                       risk)


def knn_labels(X: np.ndarray, ref: np.ndarray, ref_labels: Sequence[str | None], k: int = GUARD_K) -> list[str | None]:
    """Majority label of the ``k`` nearest ``ref`` rows (cosine) for each row of ``X``;
    a tie goes to the label whose nearest member is closest."""
    if len(X) == 0:
        return []
    if len(ref) == 0:
        raise ValueError("knn_labels needs at least one reference row")
    R = normalise_rows(ref)
    k = min(k, len(R))
    out: list[str | None] = []
    for i in range(0, len(X), _CHUNK):
        sims = normalise_rows(X[i:i + _CHUNK]) @ R.T
        top = np.argpartition(-sims, k - 1, axis=1)[:, :k] if k < len(R) else np.tile(np.arange(len(R)), (len(sims), 1))
        for row, cand in zip(sims, top):
            order = cand[np.argsort(-row[cand], kind="stable")]
            votes: dict[Any, int] = {}
            for j in order:                       # insertion order = nearest first
                lab = ref_labels[j]
                votes[lab] = votes.get(lab, 0) + 1
            best = max(votes.values())
            out.append(next(lab for lab, c in votes.items() if c == best))
    return out


def noisy_teacher_guard(rows: LabelledSet, examples: LabelledSet, champion: IntentModel | None,
                         encoder_id: str) -> tuple[dict[str, Any], list[int]]:
    """Drop teacher labels that both a sure champion and the nearest intent examples
    contradict (see :mod:`training.trainset`'s rules): the report and the indices of the
    rows kept. ``encoder_id``: the encoder of the rows' vectors (the champion must share it).
    Part of the one teacher-label filter step, :func:`training.teacher_noise.check_training_set`."""
    reason = (f"teacher label disagrees with a sure layer-2 prediction of the champion AND with the "
              f"majority of the {GUARD_K} nearest intent examples")
    info: dict[str, Any] = {"active": False, "checked": 0, "dropped": 0, "reason": reason,
                            "by_label": {}, "examples": []}
    keep = list(range(len(rows)))
    teacher_idx = [i for i, s in enumerate(rows.sources) if s == "teacher"]
    if champion is None:
        info["inactive_because"] = "no champion model"
        return info, keep
    if not champion.encoder_matches(encoder_id, rows.vectors.shape[1]):
        used = champion.manifest.encoder.get("id")
        info["inactive_because"] = f"champion {champion.version} uses encoder {used!r}, not {encoder_id!r}"
        return info, keep
    if len(examples) == 0:
        info["inactive_because"] = "no intent examples to compare with"
        return info, keep
    info["active"] = True
    info["champion"] = champion.version
    info["checked"] = len(teacher_idx)
    if not teacher_idx:
        return info, keep
    X = rows.vectors[teacher_idx]
    pred = layer2_predict(champion, X)
    near = knn_labels(X, examples.vectors, examples.labels, GUARD_K)
    drop: set[int] = set()
    pairs: Counter = Counter()
    for j, i in enumerate(teacher_idx):
        lab = rows.labels[i]
        if pred.sure[j] and pred.labels[j] != lab and near[j] != lab:
            drop.add(i)
            pairs[f"{label_name(lab)} -> {label_name(pred.labels[j])}"] += 1
            if len(info["examples"]) < 10:
                info["examples"].append({"text": rows.texts[i][:200], "teacher": lab,
                                         "champion": pred.labels[j], "nearest_examples": near[j]})
    info["dropped"] = len(drop)
    info["by_label"] = dict(pairs.most_common())
    return info, [i for i in keep if i not in drop]
