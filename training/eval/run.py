"""One ``flywheel eval`` run: :class:`EvalOptions` (the command's options, checked once) in,
:class:`EvalRun` (the report and its warnings) out, by :func:`run_eval`.

The run, step by step:

1. the test rows (:func:`training.eval.loaders.load_labelled`);
2. the model: a saved version (``model``), or one fitted from the intent file (``intents``)
   or the labelled training rows (``train``, with ``intents`` as their settings base), cut at
   ``target_oos_recall`` when given; the encoder tuned on those rows first when tuning is on
   (:func:`training.options.tune_for`, the default ``train`` and ``retrain`` share:
   :func:`training.tuner.fit.fit_intents`), and then scored with the exported encoder a
   version would serve; saved to ``save`` when given;
3. with ``calibration``, its prediction sets and its target's cutoff placed on those held-out
   rows (:func:`training.eval.held_out.calibrate`);
4. a multi-turn test file's turns, each with its session's history
   (:func:`training.eval.sessions.read_turns`); the test rows whose label the model does not
   know set aside (a warning), or refused (``strict``);
5. the measurement (:func:`training.eval.measure.evaluate`), with ``skipped_unknown_labels``,
   the tuner's report as ``tuning`` and the plots written (``plots``,
   :func:`training.eval.render.write_plots`) added to it.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flywheel.classifier.errors import InvalidInputError

if TYPE_CHECKING:
    from flywheel.classifier.protocols import Embedder
    from flywheel.classifier.settings.intents import IntentSet, TuneSettings
    from flywheel.classifier.versions.model import IntentModel
    from flywheel.training.eval.loaders import LabelledData
    from flywheel.training.eval.sessions import Turns

__all__ = ["EvalOptions", "EvalRun", "run_eval"]

MAX_LABELS_LISTED = 20    # unknown test labels a warning names


@dataclass(frozen=True)
class EvalOptions:
    """What one ``flywheel eval`` run measures and how (each field is the flag of its name).

    Attributes
    ----------
    test : Path
        The test rows.
    train, intents, model : Path, optional
        What to measure: a model fitted on the labelled ``train`` rows (``intents`` as their
        settings base), or on the intent file ``intents``, or the saved version ``model``.
    dataset_format, text_column, label_column, oos_label, lang_column
        How the labelled files read (:func:`training.eval.loaders.load_labelled`).
    target_oos_recall : float, optional
        Cut the fitted model at this out-of-scope recall (``thresholds.target``).
    calibration : Path, optional
        Held-out labelled rows that calibrate the prediction sets and place a target's cutoff.
    save, plots : Path, optional
        Also save the fitted version there; write the plots there.
    latency_sample : int
        Queries timed one at a time.
    strict : bool
        Refuse test rows whose label the model does not know (default: score without them).
    progress : bool
        Progress bars and the tuning's progress lines.
    home : Path, optional
        The flywheel home whose config file may set ``tune_encoder``.
    tune_encoder : bool, optional
        ``--tune-encoder`` / ``--no-tune-encoder``; ``None``: the default every command shares
        (:func:`training.options.tune_for`).
    tune_budget, tune_objective, tune_epochs, tune_holdout, tune_calibration, tune_unlabelled
        The tuning's settings over the intent file's ``embedder.tune`` (``None``: not given).
    unlabelled : Path, optional
        Unlabelled texts for the tuning's self-supervised stage (its share, when neither
        ``tune_unlabelled`` nor ``embedder.tune.unlabelled`` gives one:
        :data:`training.options.DEFAULT_UNLABELLED_SHARE`).
    """

    test: Path
    train: Path | None = None
    intents: Path | None = None
    model: Path | None = None
    dataset_format: str | None = None
    text_column: str = "text"
    label_column: str = "label"
    oos_label: str = "oos"
    lang_column: str = "lang"
    target_oos_recall: float | None = None
    calibration: Path | None = None
    save: Path | None = None
    plots: Path | None = None
    latency_sample: int = 200
    strict: bool = False
    progress: bool = True
    home: Path | None = None
    tune_encoder: bool | None = None
    tune_budget: float | None = None
    tune_objective: str | None = None
    tune_epochs: int | None = None
    tune_holdout: float | None = None
    tune_calibration: str | None = None
    tune_unlabelled: float | None = None
    unlabelled: Path | None = None

    def __post_init__(self) -> None:
        if self.model is None and self.train is None and self.intents is None:
            raise InvalidInputError("give --train, --intents or --model")
        if self.model is not None and self.tune_encoder:
            raise InvalidInputError("--tune-encoder tunes on --train or --intents, not on a saved --model")
        if self.model is not None and self.target_oos_recall is not None:
            raise InvalidInputError("--target-oos-recall cuts a model as it is fitted (--train or --intents); "
                                    "a saved --model keeps the cutoffs it was trained with")

    def load(self, path: Path, split: str) -> LabelledData:
        """The labelled rows of ``path`` (its ``split``, for CLINC150), read as these options say."""
        from flywheel.training.eval.loaders import load_labelled

        return load_labelled(path, fmt=self.dataset_format, split=split, text_column=self.text_column,
                             label_column=self.label_column, oos_label=self.oos_label, lang_column=self.lang_column)


@dataclass
class EvalRun:
    """What :func:`run_eval` made: the report (JSON-serialisable; :mod:`training.eval.measure`
    defines its figures) and the warnings to show beside it."""

    report: dict[str, Any]
    warnings: list[str] = field(default_factory=list)


def run_eval(options: EvalOptions, say: Callable[[str], None] | None = None) -> EvalRun:
    """Run ``flywheel eval`` as ``options`` say (the module docs list the steps); ``say``
    gets the tuning's progress lines. A bad file or option raises a
    :class:`~classifier.errors.FlywheelError` that names it."""
    from flywheel.classifier.pipeline import Classifier
    from flywheel.training.eval.measure import evaluate

    test = options.load(options.test, "test")
    warnings: list[str] = []
    with tempfile.TemporaryDirectory(prefix="flywheel-tune-") as work:   # the tuned encoder's export
        model, embedder = _model(options, Path(work), say)
        tuning = model.manifest.metrics.get("encoder_tuning") if embedder is not None else None
        if options.calibration is not None:
            from flywheel.training.eval.held_out import calibrate

            model, note = calibrate(model, options.load(options.calibration, "val"), embedder=embedder)
            warnings += [note] if note else []
        turns = _turns(options, test, model)
        full, (test, skipped) = test, _known_rows(options, test, model, warnings)
        if turns is not None and skipped:   # the turns of the rows kept, as drop_unknown_labels keeps them
            known = set(model.manifest.labels)
            turns = turns.select([i for i, v in enumerate(full.labels) if v is None or v in known])
        report = evaluate(Classifier(model, teacher=None, embedder=embedder), test.texts, test.labels,
                          progress=options.progress, latency_sample=options.latency_sample, langs=test.langs,
                          histories=None if turns is None else turns.histories,
                          followups=None if turns is None else turns.figures_args(test.texts))
    report["skipped_unknown_labels"] = skipped
    if tuning is not None:
        report["tuning"] = tuning
    if options.plots is not None:
        from flywheel.training.eval.render import write_plots

        report["plots"] = [str(p) for p in write_plots(report, options.plots)]
    return EvalRun(report, warnings)


def _turns(options: EvalOptions, test: LabelledData, model: IntentModel) -> Turns | None:
    """The turns of a multi-turn test file (``None``: single-turn), histories as long as
    the model's ``teacher.history_size``."""
    from flywheel.training.eval.sessions import read_turns

    return read_turns(options.test, test, fmt=options.dataset_format,
                      history_size=model.intents.teacher.history_size)


def _model(options: EvalOptions, work: Path,
           say: Callable[[str], None] | None) -> tuple[IntentModel, Embedder | None]:
    """The model to measure, and the encoder it is scored with when not the one its
    settings name (a tuned one: the export a version would serve, int8 where it holds)."""
    from flywheel.classifier.versions.model import IntentModel

    if options.model is not None:
        return IntentModel.load(options.model), None
    from flywheel.classifier.encoders import open_version_encoder
    from flywheel.training.tuner.fit import fit_intents

    intent_set = _intent_set(options)
    tune, pool = _tuning(options, intent_set)
    model = fit_intents(intent_set, tune, work, progress=options.progress, say=say, unlabelled=pool)
    if options.save is not None:
        model.save(options.save)
    if model.encoder_dir is None:
        return model, None
    return model, open_version_encoder(model.encoder_dir, intent_set.embedder)


def _intent_set(options: EvalOptions) -> IntentSet:
    """The intent set to fit: the training rows' (the intent file as their settings base),
    else the intent file's; cut at ``--target-oos-recall`` when given."""
    from flywheel.classifier.settings.intents import load_intents
    from flywheel.training.eval.loaders import intent_set_from_data

    base = load_intents(options.intents) if options.intents is not None else None
    if options.train is not None:
        intent_set = intent_set_from_data(options.load(options.train, "train"), name=options.train.stem, base=base)
    else:
        assert base is not None, "EvalOptions needs --train, --intents or --model"
        intent_set = base
    if options.target_oos_recall is None:
        return intent_set
    return _with_target(intent_set, {"oos_recall": options.target_oos_recall}, "--target-oos-recall")


def _with_target(intent_set: IntentSet, target: dict[str, float], flag: str) -> IntentSet:
    """``intent_set`` cut at ``target`` instead of its own ``thresholds.target``, checked as
    the intent file's is (a bad value: one line, exit 2)."""
    from dataclasses import replace

    from flywheel.classifier.layer2.targets import threshold_target

    th = intent_set.thresholds
    try:
        checked = threshold_target({"target": target, "oos": th.oos, "confident": th.confident})
    except ValueError as exc:
        raise InvalidInputError(f"{flag}: {exc}") from None
    return replace(intent_set, thresholds=replace(th, target=checked))


def _tuning(options: EvalOptions, intent_set: IntentSet) -> tuple[TuneSettings | None, list[str] | None]:
    """Whether and how to tune the encoder (the default ``train`` and ``retrain`` share,
    :func:`training.options.tune_for`, under the ``--tune-*`` flags), and the unlabelled
    texts of its self-supervised stage: ``--unlabelled`` given, the stage takes
    :data:`~training.options.DEFAULT_UNLABELLED_SHARE` of the budget unless
    ``--tune-unlabelled`` or ``embedder.tune.unlabelled`` says."""
    from flywheel.classifier.settings.config import load_config
    from flywheel.training.options import DEFAULT_UNLABELLED_SHARE, resolve_tune, tune_for

    cfg = load_config(home=options.home, tune_encoder=options.tune_encoder)
    tune, why = tune_for(intent_set.embedder, cfg, options.tune_budget, objective=options.tune_objective,
                         epochs=options.tune_epochs, holdout=options.tune_holdout,
                         calibration=options.tune_calibration)
    if tune is None:
        if options.unlabelled is not None or options.tune_unlabelled is not None:
            raise InvalidInputError(f"--unlabelled and --tune-unlabelled feed the encoder tuning, which is off here "
                                    f"({why}): add --tune-encoder")
        return None, None
    from flywheel.training.eval.loaders import load_unlabelled

    pool = load_unlabelled(options.unlabelled) if options.unlabelled is not None else None
    share = options.tune_unlabelled
    file_tune = intent_set.embedder.tune
    if share is None and pool is not None and (file_tune is None or file_tune.unlabelled <= 0):
        share = DEFAULT_UNLABELLED_SHARE
    tune = resolve_tune(tune, True, None, unlabelled=share)   # checked as the flag --tune-unlabelled
    if pool is None and tune is not None and tune.unlabelled > 0:
        raise InvalidInputError("--tune-unlabelled (or embedder.tune.unlabelled) needs texts: give them with "
                                "--unlabelled FILE")
    return tune, pool


def _known_rows(options: EvalOptions, test: LabelledData, model: IntentModel,
                warnings: list[str]) -> tuple[LabelledData, dict[str, int]]:
    """The test rows whose label the model knows, and the others counted by label: a label
    the model cannot answer would count as an error. Scored without them, with a warning;
    refused with ``strict`` (:class:`~training.eval.loaders.DatasetError`)."""
    from flywheel.classifier.settings.label_names import suggest_label
    from flywheel.training.eval.loaders import DatasetError, drop_unknown_labels

    labels = model.manifest.labels
    kept, skipped = drop_unknown_labels(test, labels)
    if not skipped:
        return kept, skipped
    shown = list(skipped.items())[:MAX_LABELS_LISTED]
    hints = {k: suggest_label(k, labels) for k, _ in shown}
    listed = ", ".join(f"{k} ({v}{f', did you mean {hints[k]}?' if hints[k] else ''})" for k, v in shown)
    listed += f", … ({len(skipped)} labels in all)" if len(skipped) > MAX_LABELS_LISTED else ""
    what = f"{sum(skipped.values())} row(s) with labels the model does not know: {listed}"
    if options.strict:
        raise DatasetError(options.test, f"{what}; the model knows its {len(labels)} intents and out of scope "
                                         "(OUT_OF_SCOPE, OOS, NONE or --oos-label)")
    if not len(kept):
        raise DatasetError(options.test, f"nothing left to score: {what}")
    warnings.append(f"{options.test}: {what}; left out of the scores")
    return kept, skipped
