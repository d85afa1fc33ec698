"""One step that train, eval and retrain share: fine-tune the encoder, export it, serve it.

:func:`tune_and_export` fits an :class:`~training.tuner.finetune.EncoderTuner` on labelled texts,
saves the tuned weights, exports them to ONNX beside a version
(:func:`classifier.encoders.export_encoder`: checked against torch, int8 where the
settings ask for it and it holds) and returns a
:class:`~classifier.encoders.VersionEncoderEmbedder` over that export. Everything after
this step (the head's fit, thresholds, the gate, :class:`~classifier.pipeline.Classifier`)
encodes with the export, so the figures a run reports are those of the encoder a version
serves, not of the torch weights it came from.

The tuning always starts from the settings' base encoder (MiniLM, e5, or a mean-pooling
sentence-transformers directory: its backend's spec says), never from a previous tuned version: each retrain
distils every label it has into a fresh copy, so errors do not compound from one
version to the next.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from flywheel.classifier.encoders import VersionEncoderEmbedder, export_encoder
from flywheel.classifier.encoders.backends import TuningRecipe, backend_spec
from flywheel.classifier.encoders.base import resolve_runtime
from flywheel.classifier.encoders.version_encoder import EncoderExport, base_max_length
from flywheel.classifier.layer2.head import CrossFitView
from flywheel.classifier.protocols import Embedder
from flywheel.classifier.settings.intents import EmbedderSettings, IntentSet, TuneSettings

__all__ = ["ADAPTER", "CROSSFIT", "CROSSFIT_MAX_ROWS", "HOLDOUT", "MIN_HELD_OUT", "TunedEncoder", "adapt_and_export",
           "calibration_holdout", "crossfit_folds", "intent_pairs", "resolve_calibration",
           "tune_and_export", "unlabelled_stage"]

MIN_HELD_OUT = 2    # rows an intent must keep out of the tuning for them to be cross-validated
ADAPTER = "adapter"  # the objective that trains an adapter on the frozen encoder instead
ADAPTER_STEPS_PER_EPOCH = 50   # full-batch adapter steps per ``tune.epochs``
CROSSFIT = "crossfit"  # the calibration that tunes two more encoders on the two halves of the rows
HOLDOUT = "holdout"    # the calibration on a held-out share of each intent's rows
CROSSFIT_MAX_ROWS = 5000   # "auto" cross-fits up to this many tuning rows, and holds out above
CROSSFIT_BUDGET_SHARE = 0.25   # of ``tune.budget_s``, for each half's encoder; the served one gets the rest


@dataclass(frozen=True)
class TunedEncoder:
    """A tuned, exported encoder: ``embedder`` serves ``export`` (what a version carries);
    ``report`` is the tuner's report plus the export's figures; ``fit_only`` flags, per
    input row, the rows the head must not calibrate on (rows the tuner trained on, of the
    intents that have held-out rows): pass it as the head's ``fit_only`` (see
    :func:`calibration_holdout`). ``views``, with ``tune.calibration: crossfit``, are the
    two half encoders' views of the input rows: pass them as the head's ``cv_views``
    (``fit_only`` is then all false)."""

    embedder: Embedder
    export: EncoderExport
    report: dict[str, Any]
    fit_only: np.ndarray
    views: tuple[CrossFitView, ...] = ()


def calibration_holdout(labels: Sequence[str | None], share: float, seed: int = 0) -> np.ndarray:
    """Per row, whether it is kept out of the tuning to calibrate the head (``True``).

    Of each intent's ``n`` rows, ``round(share * n)`` are held out (a seeded draw) when that
    is at least :data:`MIN_HELD_OUT`, the fewest rows an intent needs to be cross-validated
    (:meth:`classifier.layer2.head.IntentHead.fit`); an intent with fewer rows is tuned on all of
    them and calibrated on them as before. Out-of-scope rows (``None``) are never held out:
    they are kept out of the tuning anyway."""
    rng = np.random.default_rng(seed)
    held = np.zeros(len(labels), dtype=bool)
    by_label: dict[str, list[int]] = {}
    for i, label in enumerate(labels):
        if label is not None:
            by_label.setdefault(label, []).append(i)
    for label in sorted(by_label):
        rows = by_label[label]
        k = int(round(share * len(rows)))
        if k >= MIN_HELD_OUT and k < len(rows):
            held[rng.choice(rows, size=k, replace=False)] = True
    return held


def resolve_calibration(calibration: str, n_rows: int) -> str:
    """``holdout`` or ``crossfit`` for ``tune.calibration`` on ``n_rows`` tuning rows.

    ``auto`` cross-fits up to :data:`CROSSFIT_MAX_ROWS`: with few rows an intent, a holdout
    takes a fifth of what the encoder learns from (few-shot CLINC150: +1.80 points against
    +2.48 cross-fitted, BENCHMARKS.md §14.12), while the two half encoders cost about one
    more tuning plus two torch encodings of every row, which at 100k rows would not fit a
    nightly budget and is where a holdout costs least."""
    if calibration == "auto":
        return CROSSFIT if n_rows <= CROSSFIT_MAX_ROWS else HOLDOUT
    return calibration


def crossfit_folds(labels: Sequence[str | None], seed: int = 0) -> np.ndarray:
    """Per row, its half (0 or 1) for cross-fitted calibration: each label's rows (out of
    scope included) are shuffled with ``seed`` and dealt to the halves in turn, so every
    label with at least two rows has rows in both."""
    rng = np.random.default_rng(seed)
    fold = np.zeros(len(labels), dtype=np.int8)
    by_label: dict[str, list[int]] = {}
    for i, label in enumerate(labels):
        by_label.setdefault("" if label is None else f"={label}", []).append(i)
    for key in sorted(by_label):
        rows = np.array(by_label[key])
        fold[rng.permutation(rows)[1::2]] = 1
    return fold


def intent_pairs(intents: IntentSet) -> tuple[list[str], list[str | None]]:
    """The intent set's examples and out-of-scope examples as (texts, labels)."""
    texts, labels = intents.training_pairs()
    return list(texts), list(labels)


def _fit_only(labels: Sequence[str | None], keep: Sequence[int],
              held: np.ndarray) -> tuple[set[str | None], np.ndarray]:
    """The intents with held-out rows, and per row whether the head must not calibrate on
    it (a tuned row of such an intent; an intent without held-out rows is calibrated on
    its tuned rows, as before the holdout)."""
    tuned_rows = np.zeros(len(labels), dtype=bool)
    tuned_rows[list(keep)] = True
    calibrated = {labels[int(i)] for i in np.flatnonzero(held)}
    return calibrated, tuned_rows & np.array([label in calibrated for label in labels], dtype=bool)


def adapt_and_export(texts: Sequence[str], labels: Sequence[str | None], settings: EmbedderSettings,
                     tune: TuneSettings, workdir: Path, *, sample_weight: Sequence[float] | None = None,
                     progress: Callable[[str], None] | None = None) -> TunedEncoder:
    """``tune.objective == "adapter"``: train an adapter on ``settings``' frozen encoder
    (:class:`training.tuner.adapter_trainer.AdapterTrainer`, any backend, the numpy USE default and bge-m3
    included) and write it into ``workdir/encoder``; the calibration holdout and
    ``fit_only`` are as for a tuned encoder (:func:`tune_and_export`). Out-of-scope rows
    take part (they aim at the uniform distribution), held-out rows do not."""
    from flywheel.classifier.encoders import make_embedder
    from flywheel.classifier.encoders.adapter import AdaptedEmbedder, write_adapter
    from flywheel.training.tuner.adapter_trainer import AdapterTrainer
    from flywheel.training.tuner.finetune import TuningError

    if tune.calibration == CROSSFIT:
        raise TuningError("embedder.tune.calibration: crossfit applies to a tuned encoder, not to an adapter; "
                          "use calibration: holdout or auto")
    held = calibration_holdout(labels, tune.holdout, tune.seed)
    keep = [i for i, _ in enumerate(labels) if not held[i]]
    if len({labels[i] for i in keep if labels[i] is not None}) < 2:
        raise TuningError("an adapter needs labelled rows of at least two intents")
    calibrated, fit_only = _fit_only(labels, keep, held)
    base = make_embedder(settings, cache=False)
    if progress is not None:
        progress(f"training an adapter on {base.id}'s vectors of {len(keep):,} rows ({int(held.sum()):,} held out "
                 f"to calibrate the head), budget {tune.budget_s:.0f} s ...")
    t0 = time.perf_counter()
    vectors = base.encode([texts[i] for i in keep])
    encode_s = time.perf_counter() - t0
    trainer = AdapterTrainer(epochs=ADAPTER_STEPS_PER_EPOCH * tune.epochs, learning_rate=tune.learning_rate * 10,
                             budget_s=max(1.0, tune.budget_s - encode_s), seed=tune.seed)
    trainer.fit(vectors, [labels[i] for i in keep],
                sample_weight=None if sample_weight is None else [sample_weight[i] for i in keep])
    t1 = time.perf_counter()
    export = write_adapter(workdir / "encoder", trainer.weight_, trainer.bias_, base, trained=trainer.report_)
    embedder = AdaptedEmbedder(export.path, base)
    report = {**trainer.report_, "encode_seconds": round(encode_s, 2), "encoder_id": export.id, "quantized": False,
              "base_encoder": base.id, "export_seconds": round(time.perf_counter() - t1, 2),
              "encoder_bytes": export.size_bytes, "cosine_to_torch": None, "int8_cosine_to_fp32": None,
              "holdout": tune.holdout, "held_out_rows": int(held.sum()), "held_out_intents": len(calibrated),
              "calibration": HOLDOUT}
    report["seconds"] = round(encode_s + float(trainer.report_["seconds"]), 2)
    return TunedEncoder(embedder, export, report, fit_only)


def tune_and_export(texts: Sequence[str], labels: Sequence[str | None], settings: EmbedderSettings,
                    tune: TuneSettings, workdir: str | Path, *, sample_weight: Sequence[float] | None = None,
                    hard_pairs: Sequence[tuple[str | None, str | None]] | None = None,
                    progress: Callable[[str], None] | None = None, tune_on_oos: bool = False,
                    unlabelled: Sequence[str] | None = None) -> TunedEncoder:
    """Fine-tune ``settings``' base encoder on ``(texts, labels)`` and export it into
    ``workdir/encoder``.

    Parameters
    ----------
    texts, labels : sequences
        One label per text; ``None`` is out of scope. Out-of-scope rows are left out of
        the tuning unless ``tune_on_oos``: the head learns its out-of-scope gate from
        out-of-fold predictions, which stand for unseen traffic only if the encoder has not
        memorised those rows (tuned on them, out-of-fold OOS recall was 1.0 and unseen OOS
        recall fell from 72.7% to 53.6% on CLINC150 10-shot: BENCHMARKS.md §14.1).
    settings : EmbedderSettings
        The intent set's encoder: its base weights (:func:`training.tuner.finetune.tunable_base`)
        and whether to serve int8 (``quantize``; ``auto``: as the base encoder would).
    tune : TuneSettings
        The tuning's objective, budget and optimiser settings.
    workdir : path
        Where the tuned weights (``hf/``, removed after the export) and the export
        (``encoder/``) are written; the caller owns it.
    sample_weight, hard_pairs, progress
        Passed to :class:`training.tuner.finetune.EncoderTuner`.
    unlabelled : sequence of str, optional
        Texts for the self-supervised stage (:func:`unlabelled_stage`), run first when
        ``tune.unlabelled`` is above 0: the supervised tuning (both cross-fitting halves
        too) then starts from the stage's encoder, with what the stage left of the budget.

    The tuner trains on every in-scope row except a calibration holdout
    (:func:`calibration_holdout`, ``tune.holdout`` of each intent's rows): the head fitted
    next must learn its cutoffs, calibration and deferral model only on the rows the encoder
    has not seen (``TunedEncoder.fit_only``), since cross-validation
    on memorised rows looks surer than unseen traffic (BENCHMARKS.md §14.2, §14.3). The held-out rows
    still train the head's regression.

    Raises
    ------
    training.tuner.finetune.TuningError
        An encoder that cannot be tuned, or unusable data.
    classifier.errors.EmbedderError
        The export did not match torch.
    """
    from flywheel.training.tuner.finetune import EncoderTuner, TuningError, tunable_base, tuning_recipe

    work = Path(workdir)
    work.mkdir(parents=True, exist_ok=True)
    if tune.objective == ADAPTER:
        return adapt_and_export(texts, labels, settings, tune, work, sample_weight=sample_weight, progress=progress)
    base = tunable_base(settings)
    recipe = tuning_recipe(settings)
    spec = backend_spec(settings.backend)   # unresolved: auto's int8 default and kept nodes are fp32 and none

    def tuner_for(budget_s: float) -> EncoderTuner:
        return EncoderTuner(base, objective=tune.objective, epochs=tune.epochs,
                            batch_size=tune.batch_size, learning_rate=tune.learning_rate, max_length=tune.max_length,
                            budget_s=budget_s, seed=tune.seed, device=settings.device, progress=progress,
                            hard_pairs=hard_pairs, num_threads=settings.num_threads,
                            query_prefix=recipe.query_prefix,
                            freeze_word_embeddings=recipe.freeze_word_embeddings)

    t_start = time.perf_counter()
    stage = unlabelled_stage(unlabelled, base, recipe, settings, tune, work, progress=progress)
    if stage is not None:
        start_dir, stage_report = stage
        licence_dir = base
        base = start_dir
        tune = replace(tune, budget_s=max(1e-3, tune.budget_s - (time.perf_counter() - t_start)))
        t_start = time.perf_counter()
    else:
        licence_dir, stage_report = base, None
    calibration = resolve_calibration(tune.calibration, sum(1 for y in labels if tune_on_oos or y is not None))
    crossfit = calibration == CROSSFIT
    views: tuple[CrossFitView, ...] = ()
    half_reports: list[dict[str, Any]] = []
    if crossfit:
        views, half_reports = _crossfit_views(texts, labels, tuner_for, tune, sample_weight=sample_weight,
                                              progress=progress, tune_on_oos=tune_on_oos)
    held = np.zeros(len(labels), bool) if crossfit else calibration_holdout(labels, tune.holdout, tune.seed)
    keep = [i for i, label in enumerate(labels) if (tune_on_oos or label is not None) and not held[i]]
    if len({labels[i] for i in keep}) < 2:
        raise TuningError("tuning the encoder needs labelled rows of at least two intents")
    calibrated, fit_only = _fit_only(labels, keep, held)
    weights = None if sample_weight is None else [sample_weight[i] for i in keep]
    # the served encoder's tuning gets what the half encoders left of the budget
    budget = max(1e-3, tune.budget_s - (time.perf_counter() - t_start)) if crossfit else tune.budget_s
    if progress is not None:
        how = ("every row, each half calibrated on the other half's encoder" if crossfit else
               f"{int(held.sum()):,} of {len(calibrated):,} intents held out to calibrate the head")
        progress(f"tuning the encoder on {len(keep):,} labelled rows ({how}; out-of-scope rows kept out of it), "
                 f"budget {budget:.0f} s ...")
    tuner = tuner_for(budget)
    tuner.fit([texts[i] for i in keep], [labels[i] for i in keep], sample_weight=weights)
    if stage is not None:   # every tuner has loaded it: the stage's weights are not needed any more
        shutil.rmtree(base, ignore_errors=True)
    if not tuner.report_["steps"]:   # the base encoder again: not worth an export, nor a challenger
        raise TuningError(f"the budget ran out before the first tuning step ({tuner.report_['seconds']} s of "
                          f"{budget:.0f} s spent loading the encoder and its starting point): nothing to export")
    hf = Path(tempfile.mkdtemp(prefix="hf-", dir=work))
    try:
        tuner.save(hf)
        quantize = settings.quantize
        if quantize is None:   # auto: int8 where the base encoder serves int8
            quantize = spec.int8_default(resolve_runtime(settings.runtime, settings.device), settings.layers)
        if progress is not None:
            progress("exporting the tuned encoder to ONNX (checked against torch) ...")
        # served with the base encoder's token limit (tuning truncates at tune.max_length for speed)
        export = export_encoder(hf, work / "encoder", quantize=bool(quantize),
                                max_length=base_max_length(licence_dir),
                                num_threads=settings.num_threads, query_prefix=recipe.query_prefix,
                                int8_keep_fp32=spec.keep_fp32(),   # as the base serves: e5's FFN down-projections
                                extra_files=[licence_dir / recipe.licence] if recipe.licence else ())
    finally:
        shutil.rmtree(hf, ignore_errors=True)
    embedder = VersionEncoderEmbedder(export.path, batch_size=settings.batch_size, max_chars=settings.max_chars,
                                      num_threads=settings.num_threads)
    report = {**tuner.report_, "encoder_id": export.id, "quantized": export.quantized,
              "export_seconds": round(export.seconds, 2), "encoder_bytes": export.size_bytes,
              "encoder_blob_bytes": export.blob_bytes,   # shared (classifier.encoders.blobs), stored once per home
              "cosine_to_torch": export.cosine, "int8_cosine_to_fp32": export.int8_cosine,
              "holdout": 0.0 if crossfit else tune.holdout, "held_out_rows": int(held.sum()),
              "held_out_intents": len(calibrated), "calibration": calibration}
    if stage_report is not None:
        report["unlabelled_stage"] = stage_report
    if crossfit:
        report["crossfit_halves"] = half_reports
        report["seconds"] = round(time.perf_counter() - t_start - export.seconds, 2)
        report["stopped_early"] = bool(report["stopped_early"] or any(h["stopped_early"] for h in half_reports))
    return TunedEncoder(embedder, export, report, fit_only, views)


def unlabelled_stage(texts: Sequence[str] | None, base: Path, recipe: TuningRecipe, settings: EmbedderSettings,
                     tune: TuneSettings, work: Path, *, progress: Callable[[str], None] | None = None
                     ) -> tuple[Path, dict[str, Any]] | None:
    """The self-supervised stage (:class:`training.tuner.unlabelled.ContrastivePretrainer`)
    on at most ``tune.unlabelled_rows`` of ``texts`` (:func:`~training.tuner.unlabelled.stage_pool`),
    within ``tune.unlabelled`` of ``tune.budget_s``: ``(directory of the encoder after it,
    its report)``, or ``None`` when there is no stage (share 0, no texts given). Fewer
    texts than the stage needs, or a budget that ends before its first step, also give
    ``None`` and a progress line saying so: the tuning then starts from ``base`` as without
    the stage."""
    from flywheel.training.tuner.unlabelled import (
        MIN_STAGE_ROWS,
        STAGE_WORD_DELETION,
        ContrastivePretrainer,
        stage_pool,
    )

    if texts is None or tune.unlabelled <= 0.0:
        return None
    pool = stage_pool(texts, tune.unlabelled_rows, tune.seed)
    if len(pool) < MIN_STAGE_ROWS:
        if progress is not None:
            progress(f"no unlabelled stage: {len(pool)} distinct unlabelled texts, it needs {MIN_STAGE_ROWS}")
        return None
    budget = tune.unlabelled * tune.budget_s
    if progress is not None:
        progress(f"unlabelled stage (SimCSE, {STAGE_WORD_DELETION:.0%} of the second view's words deleted) on "
                 f"{len(pool):,} texts, budget {budget:.0f} s ...")
    stage = ContrastivePretrainer(base, batch_size=max(2, 2 * tune.batch_size), max_length=tune.max_length,
                                  word_deletion=STAGE_WORD_DELETION,
                                  budget_s=budget, seed=tune.seed, device=settings.device, progress=progress,
                                  num_threads=settings.num_threads, query_prefix=recipe.query_prefix,
                                  freeze_word_embeddings=recipe.freeze_word_embeddings).fit(pool)
    if not stage.report_["steps"]:
        if progress is not None:
            progress(f"no unlabelled stage: its budget ({budget:.0f} s) ran out before the first step")
        return None
    return stage.save(Path(tempfile.mkdtemp(prefix="stage-", dir=work))), stage.report_


def _crossfit_views(texts: Sequence[str], labels: Sequence[str | None], tuner_for: Callable[[float], Any],
                    tune: TuneSettings, *, sample_weight: Sequence[float] | None,
                    progress: Callable[[str], None] | None, tune_on_oos: bool
                    ) -> tuple[tuple[CrossFitView, ...], list[dict[str, Any]]]:
    """Cross-fitted calibration's two views: for each half of the rows
    (:func:`crossfit_folds`), an encoder tuned on the other half's labelled rows (budget
    ``CROSSFIT_BUDGET_SHARE`` of ``tune.budget_s``) encodes every row in torch; the view
    predicts the half it did not see. Returns the views and each half tuner's report."""
    from flywheel.training.tuner.finetune import TuningError

    fold = crossfit_folds(labels, tune.seed)
    views: list[CrossFitView] = []
    reports: list[dict[str, Any]] = []
    for half in (0, 1):
        keep = [i for i, label in enumerate(labels) if fold[i] != half and (tune_on_oos or label is not None)]
        if len({labels[i] for i in keep}) < 2:
            raise TuningError("cross-fitted calibration needs labelled rows of at least two intents in each half")
        if progress is not None:
            progress(f"cross-fitting, half {half + 1} of 2: tuning on {len(keep):,} rows to calibrate the other "
                     f"{int((fold == half).sum()):,} ...")
        tuner = tuner_for(tune.budget_s * CROSSFIT_BUDGET_SHARE)
        tuner.fit([texts[i] for i in keep], [labels[i] for i in keep],
                  sample_weight=None if sample_weight is None else [sample_weight[i] for i in keep])
        t0 = time.perf_counter()
        vectors = tuner.embedder().encode(list(texts))
        views.append(CrossFitView(vectors, fold == half))
        reports.append({"rows": len(keep), "steps": tuner.report_["steps"], "seconds": tuner.report_["seconds"],
                        "stopped_early": tuner.report_["stopped_early"],
                        "encode_seconds": round(time.perf_counter() - t0, 2)})
    return tuple(views), reports
