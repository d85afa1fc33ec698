"""Layer 2 fitted on a tuned encoder: the one way ``flywheel train``, ``flywheel eval`` and the
retrain's tuned challenger do it (:func:`train_tuned`).

The tuner (:func:`training.tuner.export.tune_and_export`) returns a
:class:`~training.tuner.export.TunedEncoder`: the exported encoder; per tuning row, whether
the tuner trained on it (``fit_only``: such a row fits the head's regression, never its
cutoffs or calibration, which on memorised rows look surer than unseen traffic); and, with
cross-fitted calibration, the two half encoders' views of the rows. :func:`train_tuned` fits
the head on the tuned encoder's vectors with both, and the model it returns carries the
export (``encoder_dir``, which :meth:`~classifier.versions.model.IntentModel.save` copies into
the version). Its rows are either

- an intent set's examples (train and eval: :func:`fit_intents` tunes on them first,
  :func:`tune_intents`, when tuning is on), encoded by the tuned encoder; or
- rows that already have their vectors (:class:`HeadRows`: the retrain's training set,
  re-encoded by the tuned encoder), with their own weights, fit-only rows and synthetic
  negatives; :func:`fit_head` fits such rows on the served encoder (the head-only challenger).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:   # the head (scikit-learn) loads when a head is fitted, not with this module
    from flywheel.classifier.layer2.head import CrossFitView, IntentHead
    from flywheel.classifier.settings.intents import IntentSet, TuneSettings
    from flywheel.classifier.versions.model import IntentModel
    from flywheel.training.tuner.export import TunedEncoder

__all__ = ["HeadRows", "fit_head", "fit_intents", "train_tuned", "tune_intents"]


@dataclass(frozen=True)
class HeadRows:
    """Rows with their vectors, as the head fits them (one label per row, ``None``: out of
    scope): ``sample_weight`` (``None``: all 1), ``fit_only`` (per row: fits the regression,
    never the cutoffs or the calibration) and ``negatives`` (synthetic negatives' vectors:
    out-of-scope rows that are fit-only, see :func:`classifier.layer2.fitter.fit_from_vectors`) and
    ``texts`` (the rows' texts: the version counts its training rows per language from them,
    :mod:`classifier.layer2.shift`; ``None``: no counts, the gate ignores languages)."""

    vectors: np.ndarray
    labels: Sequence[str | None]
    sample_weight: Sequence[float] | None = None
    fit_only: np.ndarray | None = None
    negatives: np.ndarray | None = None
    texts: Sequence[str] | None = None

    def tuned_on(self, fit_only: np.ndarray) -> HeadRows:
        """These rows, those a tuner trained on (``fit_only``, one per row) fit-only too."""
        own = np.zeros(len(self.labels), dtype=bool) if self.fit_only is None else np.asarray(self.fit_only, bool)
        return replace(self, fit_only=own | np.asarray(fit_only, dtype=bool))


def fit_head(intents: IntentSet, rows: HeadRows, *, encoder_id: str, version: str | None = None,
             parent: str | None = None, head: IntentHead | None = None,
             views: Sequence[CrossFitView] = ()) -> IntentModel:
    """The head fitted on ``rows``, their vectors made by the encoder ``encoder_id``
    (:func:`classifier.layer2.fitter.fit_from_vectors`); ``views``: a cross-fitted
    calibration's views of the rows. The model bundles ``intents``."""
    from flywheel.classifier.layer2.fitter import fit_from_vectors
    from flywheel.classifier.layer2.shift import language_rows

    fit_only = rows.fit_only
    langs = None if rows.texts is None else language_rows(rows.texts, rows.labels, intents.languages)
    return fit_from_vectors(intents, rows.vectors, rows.labels, encoder_id=encoder_id, sample_weight=rows.sample_weight,
                            fit_only=fit_only.tolist() if fit_only is not None and fit_only.any() else None,
                            version=version, parent=parent, head=head, negatives=rows.negatives, cv_views=views,
                            language_rows=langs)


def train_tuned(intents: IntentSet, tuned: TunedEncoder, *, rows: HeadRows | None = None, version: str | None = None,
                parent: str | None = None, head: IntentHead | None = None, progress: bool = False) -> IntentModel:
    """Layer 2 fitted on ``tuned``'s vectors; the model carries its export (``encoder_dir``).

    Without ``rows``, the rows are ``intents``' examples (the rows ``tuned`` was tuned on,
    :func:`tune_intents`) encoded by ``tuned.embedder``, and the manifest's
    ``metrics.encoder_tuning`` is the tuner's report; with ``rows``, rows already encoded by
    it, one per tuning row (the retrain reports its tuning itself). Either way the rows the
    tuner trained on never calibrate the head (``tuned.fit_only``) and a cross-fitted
    calibration's views (``tuned.views``) go to the head. ``version``, ``parent`` and
    ``head`` are as :func:`classifier.layer2.fitter.fit_from_vectors` takes them;
    ``progress``: a progress bar while the examples are encoded."""
    if rows is None:
        from flywheel.classifier.layer2.fitter import fit_model

        model = fit_model(intents, embedder=tuned.embedder, version=version, parent=parent, head=head,
                          progress=progress, examples_fit_only=np.asarray(tuned.fit_only, bool).tolist(),
                          cv_views=tuned.views)
        model.manifest.metrics["encoder_tuning"] = tuned.report
    else:
        model = fit_head(intents, rows.tuned_on(tuned.fit_only), encoder_id=tuned.embedder.id, version=version,
                         parent=parent, head=head, views=tuned.views)
    return replace(model, encoder_dir=tuned.export.path)


def tune_intents(intents: IntentSet, tune: TuneSettings, workdir: Path, *, say: Callable[[str], None] | None = None,
                 unlabelled: Sequence[str] | None = None) -> TunedEncoder:
    """The intent set's encoder tuned on its own examples and exported into ``workdir``
    (:func:`training.tuner.export.tune_and_export`; ``unlabelled``: texts for its
    self-supervised stage); ``say`` gets its progress and a last line on what it made."""
    from flywheel.training.tuner.export import intent_pairs, tune_and_export

    texts, labels = intent_pairs(intents)
    tuned = tune_and_export(texts, labels, intents.embedder, tune, workdir, progress=say, unlabelled=unlabelled)
    r = tuned.report
    if say is not None:
        say(f"encoder tuned ({r['objective']}, {r['device']}) in {r['seconds']:.0f} s"
            + (" (stopped by its budget)" if r["stopped_early"] else "")
            + f"; exported as {r['encoder_id']} ({r['encoder_bytes'] / 1e6:.1f} MB)")
    return tuned


def fit_intents(intents: IntentSet, tune: TuneSettings | None, workdir: Path, *, version: str | None = None,
                progress: bool = False, say: Callable[[str], None] | None = None,
                unlabelled: Sequence[str] | None = None) -> IntentModel:
    """A model version fitted from an intent set (``flywheel train`` and ``eval``): with
    ``tune``, on its encoder tuned on its examples first (:func:`tune_intents` into
    ``workdir``, which must outlive the model until it is saved: :func:`train_tuned`),
    else on the encoder its settings name (:func:`classifier.layer2.fitter.fit_model`)."""
    from flywheel.classifier.layer2.fitter import fit_model

    if tune is None:
        return fit_model(intents, version=version, progress=progress)
    tuned = tune_intents(intents, tune, workdir, say=say, unlabelled=unlabelled)
    return train_tuned(intents, tuned, version=version, progress=progress)
