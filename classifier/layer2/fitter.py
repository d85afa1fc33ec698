"""The trainer (separate from the model, as in SetFit): fit layer 2 from an intent set
plus optional extra labelled texts into a model version.

Two entry points: :func:`fit_model` embeds the texts and fits; :func:`fit_from_vectors`
fits rows that already have their vectors (the retrain job reuses the training set's
vectors this way, with no text -> vector round trip). Both return a new
:class:`~classifier.versions.model.IntentModel`; nothing changes it afterwards.
"""

from __future__ import annotations

import time
from typing import Mapping, Sequence

import numpy as np

from flywheel.classifier.encoders import make_embedder
from flywheel.classifier.errors import TrainingError
from flywheel.classifier.layer2.head import CrossFitView, IntentHead
from flywheel.classifier.layer2.negatives import WEIGHT as NEGATIVE_WEIGHT
from flywheel.classifier.layer2.negatives import synthetic_negatives
from flywheel.classifier.layer2.shift import METRIC_KEY as LANGUAGE_ROWS
from flywheel.classifier.layer2.shift import language_rows as count_language_rows
from flywheel.classifier.protocols import Embedder
from flywheel.classifier.settings.intents import IntentSet
from flywheel.classifier.versions.model import IntentModel, Manifest, new_version_name


def embed_negatives(intents: IntentSet, embedder: Embedder) -> np.ndarray | None:
    """Vectors of ``intents.synthetic_negatives`` generated nonsense texts (None for 0)."""
    if intents.synthetic_negatives <= 0:
        return None
    return embedder.encode(list(synthetic_negatives(intents.synthetic_negatives)))


def fit_model(intents: IntentSet, *, embedder: Embedder | None = None,
              extra_texts: Sequence[str] = (), extra_labels: Sequence[str | None] = (),
              extra_vectors: np.ndarray | None = None, version: str | None = None,
              parent: str | None = None, progress: bool = False,
              head: IntentHead | None = None, extra_weights: Sequence[float] | None = None,
              extra_fit_only: Sequence[bool] | None = None,
              examples_fit_only: Sequence[bool] | None = None,
              cv_views: Sequence[CrossFitView] = ()) -> IntentModel:
    """Embed the intent examples (and extra labelled texts) and fit an :class:`IntentHead`.

    ``extra_vectors``, when given, are precomputed embeddings of ``extra_texts``.
    ``extra_weights`` and ``extra_fit_only`` (one per extra text) are passed to
    :meth:`IntentHead.fit` as ``sample_weight`` and ``fit_only``; intent examples have
    weight 1 and are fit-only where ``examples_fit_only`` (one per row of
    ``intents.training_pairs()``: the examples an encoder was tuned on) says so. The rows
    are the intent examples first, then the extras (see :func:`fit_from_vectors`).
    ``cv_views`` (of the intent examples' rows) go to :meth:`IntentHead.fit`.
    """
    if len(extra_texts) != len(extra_labels):
        raise ValueError("extra_texts and extra_labels differ in length")
    for name, seq in (("extra_weights", extra_weights), ("extra_fit_only", extra_fit_only)):
        if seq is not None and len(seq) != len(extra_texts):
            raise ValueError(f"{name} has {len(seq)} values for {len(extra_texts)} extra texts")
    embedder = embedder if embedder is not None else make_embedder(intents.embedder)
    texts, labels = intents.training_pairs()
    t0 = time.perf_counter()
    X = embedder.encode(texts, progress=progress)
    if len(extra_texts):
        Xe = extra_vectors if extra_vectors is not None else embedder.encode(list(extra_texts), progress=progress)
        X = np.vstack([X, Xe])
        labels = list(labels) + list(extra_labels)
    n_ex = len(X) - len(extra_texts)
    weights = None if extra_weights is None else np.r_[np.ones(n_ex), np.asarray(extra_weights, float)]
    if examples_fit_only is not None and len(examples_fit_only) != n_ex:
        raise ValueError(f"examples_fit_only has {len(examples_fit_only)} values for {n_ex} intent examples")
    fit_only = None
    if extra_fit_only is not None or examples_fit_only is not None:
        fit_only = np.r_[np.zeros(n_ex, bool) if examples_fit_only is None else np.asarray(examples_fit_only, bool),
                         np.zeros(len(extra_texts), bool) if extra_fit_only is None
                         else np.asarray(extra_fit_only, bool)]
    negatives = embed_negatives(intents, embedder)
    t_embed = time.perf_counter() - t0
    lang_rows = count_language_rows([*texts, *extra_texts], labels, intents.languages)
    return fit_from_vectors(intents, X, labels, encoder_id=embedder.id, sample_weight=weights, fit_only=fit_only,
                            version=version, parent=parent, head=head, embed_seconds=t_embed, negatives=negatives,
                            cv_views=cv_views, language_rows=lang_rows)


def fit_from_vectors(intents: IntentSet, X: np.ndarray, labels: Sequence[str | None], *, encoder_id: str,
                     sample_weight: Sequence[float] | None = None, fit_only: Sequence[bool] | None = None,
                     version: str | None = None, parent: str | None = None, head: IntentHead | None = None,
                     embed_seconds: float = 0.0, negatives: np.ndarray | None = None,
                     negative_weight: float = NEGATIVE_WEIGHT, cv_views: Sequence[CrossFitView] = (),
                     language_rows: Mapping[str, int] | None = None) -> IntentModel:
    """Fit an :class:`IntentHead` on embedded rows and bundle it into a model version.

    Parameters
    ----------
    intents : IntentSet
        Bundled with the model; its ``embedder`` settings go into the manifest and its
        ``thresholds.target_precision`` configures the default head.
    X : ndarray of shape (n, dim)
        One embedding per row, made by the encoder ``encoder_id``.
    labels : sequence of str or None
        One label per row (``None``: out of scope).
    sample_weight, fit_only, cv_views : sequence, optional
        Passed to :meth:`IntentHead.fit` (``cv_views``: cross-fitted calibration by a
        tuned encoder's two halves, over the first rows of ``X``).
    head : IntentHead, optional
        An unfitted head (default: ``IntentHead(target_precision=..., operating_point=...)``
        of ``intents``: its ``thresholds.target`` cuts it at that point).
    embed_seconds : float
        Time spent embedding ``X``, recorded in the manifest's metrics.
    negatives : ndarray of shape (m, dim), optional
        Vectors of synthetic negatives (:func:`embed_negatives`): appended as out-of-scope
        rows that are fit-only (they never fit the gate or the cutoffs), each weighing
        ``negative_weight`` (default :data:`classifier.layer2.negatives.WEIGHT`).
    language_rows : mapping, optional
        In-scope rows per language (:func:`classifier.layer2.shift.language_rows`), kept in
        the manifest's metrics so serving knows the undertrained languages; ``None`` (rows
        without their texts): none kept, the gate rejects as before.
    """
    X = np.asarray(X)
    if len(X) != len(labels):
        raise ValueError(f"X has {len(X)} rows for {len(labels)} labels")
    n_real, n_neg = len(X), 0 if negatives is None else len(negatives)
    if n_neg:
        X = np.vstack([X, np.asarray(negatives, dtype=X.dtype)])
        labels = [*labels, *([None] * n_neg)]
        real_w = np.ones(n_real) if sample_weight is None else np.asarray(sample_weight, float)
        sample_weight = np.r_[real_w, np.full(n_neg, negative_weight)]
        fit_only = np.r_[np.zeros(n_real, bool) if fit_only is None else np.asarray(fit_only, bool),
                         np.ones(n_neg, bool)]
    if head is None:
        th = intents.thresholds
        head = IntentHead(target_precision=th.target_precision, coverage=th.coverage, operating_point=th.target)
    t0 = time.perf_counter()
    try:
        head.fit(X, labels, sample_weight=sample_weight, fit_only=fit_only, cv_views=cv_views)
    except ValueError as exc:  # too few examples, a single intent, ...
        raise TrainingError(f"cannot fit layer 2 for intent set {intents.name!r}: {exc}") from None
    t_fit = time.perf_counter() - t0
    manifest = Manifest(
        version=version or new_version_name(),
        labels=[str(c) for c in head.classes_],
        encoder={"backend": intents.embedder.backend, "model": intents.embedder.model,
                 "id": encoder_id, "dim": int(X.shape[1])},
        thresholds={k: float(v) for k, v in head.thresholds_.items()},
        training_size=n_real,
        metrics={**head.metrics_, "n_out_of_scope": int(sum(1 for v in labels[:n_real] if v is None)),
                 "n_synthetic_negatives": n_neg,
                 "embed_seconds": round(embed_seconds, 3), "fit_seconds": round(t_fit, 3),
                 **({LANGUAGE_ROWS: dict(language_rows)} if language_rows is not None else {})},
        created_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        intent_set=intents.name,
        parent=parent,
    )
    return IntentModel(intents=intents, head=head, manifest=manifest)
