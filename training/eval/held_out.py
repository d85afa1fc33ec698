"""Held-out calibration for ``flywheel eval --calibration FILE``: the prediction sets
(split-conformal) and a ``thresholds.target``'s cutoff learned on labelled rows the model
was not fitted on, instead of its out-of-fold training rows."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from flywheel.classifier.layer2.scoring import HeadScores
    from flywheel.classifier.protocols import Embedder
    from flywheel.classifier.versions.model import IntentModel
    from flywheel.training.eval.loaders import LabelledData

__all__ = ["calibrate"]


def calibrate(model: IntentModel, data: LabelledData,
              embedder: Embedder | None = None) -> tuple[IntentModel, str | None]:
    """``model`` calibrated on held-out ``data`` (``flywheel eval --calibration``): its
    prediction sets (split-conformal on the in-scope rows of an intent the model knows,
    valid when ``data`` is exchangeable with the test queries) and, with a ``thresholds.target`` of
    ``oos_recall`` or ``llm_share``, the cutoff the target picks on these rows instead of
    the out-of-fold training rows (:func:`training.cutoffs.cut_at`); and a note when the
    target stays out of fold (an ``oos_recall`` with no out-of-scope rows here). The rows
    are encoded once for both."""
    from flywheel.classifier.layer2.targets import target_kind
    from flywheel.training.cutoffs import cut_at

    known = set(model.manifest.labels)
    rows = [(t, y) for t, y in zip(data.texts, data.labels) if y is None or y in known]
    scores = model.head.scores(_encoder(model, embedder).encode([t for t, _ in rows])) if rows else None
    truth = [y for _, y in rows]
    model = _with_sets(model, data, scores, truth)
    target = model.intents.thresholds.target
    kind = target_kind(target)
    if target is None or kind not in ("oos_recall", "llm_share"):
        return model, None
    if kind == "oos_recall" and None not in truth:
        return model, (f"{data.source}: no out-of-scope rows, so the oos_recall target keeps the cutoff chosen on "
                       "the out-of-fold training rows")
    assert scores is not None, "out-of-scope rows were found above"
    cut, _ = cut_at(model, target, scores, truth, "held-out calibration rows")
    return cut, None


def _encoder(model: IntentModel, embedder: Embedder | None) -> Embedder:
    from flywheel.classifier.encoders import make_embedder

    return embedder if embedder is not None else make_embedder(model.intents.embedder)


def _with_sets(model: IntentModel, data: LabelledData, scores: HeadScores | None,
               truth: list[str | None]) -> IntentModel:
    """``model`` with the prediction sets' cutoff split-conformal on the in-scope rows among
    these scored ones; :class:`DatasetError` without any."""
    from flywheel.classifier.layer2.head import conformal_cutoff
    from flywheel.training.cutoffs import learned_thresholds, with_thresholds
    from flywheel.training.eval.loaders import DatasetError

    index = {str(c): i for i, c in enumerate(model.manifest.labels)}
    inside = [i for i, y in enumerate(truth) if y is not None]
    if scores is None or not inside:
        raise DatasetError(data.source, "no in-scope rows with an intent the model knows to calibrate the "
                                        "prediction sets on")
    coverage = float(model.head.thresholds_.get("coverage", model.intents.thresholds.coverage))
    cut = conformal_cutoff(scores.probs[inside], np.array([index[str(truth[i])] for i in inside]), coverage)
    return with_thresholds(model, {**learned_thresholds(model), **cut})
