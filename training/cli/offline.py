"""Offline commands of the ``flywheel`` command line (registered in :mod:`flywheel.cli`):
``train``, ``eval``, ``feedback``, ``label`` and ``stats``; ``models`` is in
:mod:`training.cli.models` and ``retrain`` in :mod:`training.cli.retrain`.

Each command only parses its options, calls the library and prints the result.
"""

from __future__ import annotations

import contextlib
import functools
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

import typer

from flywheel.classifier.errors import FlywheelError, InvalidInputError
from flywheel.classifier.settings.config import HOME_HELP, TEACHER_HELP, TEACHER_HOST_HELP, Config, load_config
from flywheel.classifier.settings.intents import IntentSet, TuneSettings
from flywheel.classifier.settings.label_names import label_name
from flywheel.classifier.settings.output import counted, echo_json
from flywheel.classifier.versions.model import IntentModel

if TYPE_CHECKING:   # the fleet package loads when a command opens its site, not with the CLI
    from flywheel.fleet.site import Site
    from flywheel.logstore import LogStore

__all__ = ["train_command", "eval_command", "feedback_command", "label_command", "stats_command"]


def train_command(
    intents: Path = typer.Option(..., "--intents", help="Intent definition file (YAML or TOML)."),
    out: Optional[Path] = typer.Option(
        None, "--out", help="The new version's own directory (its name is the version's; never a models "
                            "home: save into <home>/models/NAME, then flywheel models promote NAME)."),
    promote: bool = typer.Option(
        False, "--promote", help="Save it as a new version of the models home (fleet-wide with a store) and "
                                 "serve it, checked as flywheel models promote checks it."),
    models: Optional[Path] = typer.Option(None, "--models", help="The models home (default: <home>/models)."),
    home: Optional[Path] = typer.Option(None, "--home", help=HOME_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print the manifest as JSON."),
    quiet: bool = typer.Option(False, "--quiet", help="No progress bars."),
    tune_encoder: Optional[bool] = typer.Option(
        None, "--tune-encoder/--no-tune-encoder",
        help="Fine-tune the encoder on the intent examples first and save it inside the version "
             "(encoder/, every file hashed); default: the intent file's embedder.tune."),
    tune_budget: Optional[float] = typer.Option(
        None, "--tune-budget", help="Seconds the encoder tuning may take (default: embedder.tune.budget_s)."),
) -> None:
    """Fit layer 2 from an intent file and save a model version (--out DIR), or add it to the
    models home and serve it (--promote)."""
    from flywheel.classifier.layer2.fitter import fit_model
    from flywheel.classifier.settings.intents import load_intents

    if out is None and not promote:
        raise InvalidInputError("give --out DIR (save the version there) or --promote (add it to the models "
                                "home and serve it)")
    cfg = load_config(home=home)
    if out is not None:
        _refuse_models_home(out, cfg, models)
    registry = None
    if promote:
        from flywheel.fleet.site import open_site

        site = open_site(cfg)
        registry = site.registry(models)   # the bucket's registry in fleet mode
        if out is not None:
            registry.staging_dir(out.name)      # a valid version name, before training
    intent_set = load_intents(intents)
    if promote:   # a move of the served pointer: checked against the configured set before training
        site.contract().check(intents.name, intent_set, doing=f"promote a version of {intents}", fix=(
            "the intents setting names the set this deployment serves: train that file, or point the setting "
            f"at {intents}; flywheel train --out DIR trains it without serving it"))
    tune = _tune_settings(intent_set, tune_encoder, tune_budget)
    version = out.name if out is not None else None
    with tempfile.TemporaryDirectory(prefix="flywheel-tune-") as work:
        if tune is None:
            model = fit_model(intent_set, version=version, progress=not quiet)
        else:
            model = _train_tuned(intent_set, tune, Path(work), version=version, quiet=quiet)
        if out is not None:
            target = out
        else:
            assert registry is not None, "--promote without --out, checked above"
            target = registry.staging_dir(model.version)
        model.save(target)   # copies the tuned encoder (if any) out of the work directory
    m = model.manifest
    if registry is not None:
        from flywheel.training.cli.models import push_version

        push_version(registry, target, promote=True, say=False)
    if as_json:
        from dataclasses import asdict

        echo_json(asdict(m))
        return
    typer.echo(f"saved {m.version} to {target}")
    if registry is not None:
        typer.echo(f"promoted {m.version} in {getattr(registry, 'home', None) or registry}")
    typer.echo(f"  intents: {len(m.labels)} ({', '.join(m.labels)}); training examples: {m.training_size}")
    typer.echo(f"  encoder: {m.encoder['id']} ({m.encoder['dim']}-d)")
    typer.echo("  thresholds (learned by cross-validation): "
               + ", ".join(f"{k}={v:.3f}" for k, v in m.thresholds.items()))
    met = m.metrics
    typer.echo(f"  cross-validated: top-1 {met['oof_top1_accuracy']:.3f}, in-scope accuracy "
               f"{met['oof_in_scope_accuracy']:.3f}, ECE {met['oof_ece_raw']:.3f} -> {met['oof_ece']:.3f} "
               f"after temperature {met['temperature']:.2f}"
               + (f", out-of-scope recall {met['oof_oos_recall']:.3f}" if "oof_oos_recall" in met else ""))
    if (op := met.get("operating_point")) and model.intents.thresholds.target:
        from flywheel.training.cli.tradeoff import chosen_line

        typer.echo("  " + chosen_line(model.intents.thresholds.target, op, m.thresholds.get(op.get("cutoff", ""))))
    _explain_cutoffs(m.thresholds, met)


def _tune_settings(intent_set: IntentSet, flag: Optional[bool], budget: Optional[float]) -> TuneSettings | None:
    """Whether and how to tune the encoder: ``--tune-encoder/--no-tune-encoder`` over the
    intent file's ``embedder.tune``; ``--tune-budget`` over its ``budget_s``
    (:func:`training.options.resolve_tune`, as retrain resolves them)."""
    from flywheel.training.options import resolve_tune

    return resolve_tune(intent_set.embedder.tune, flag, budget)


def _train_tuned(intent_set: IntentSet, tune: TuneSettings, work: Path, *, version: Optional[str],
                 quiet: bool, unlabelled: Optional[list[str]] = None) -> IntentModel:
    """Tune the encoder on the intent examples, export it, fit the head on its vectors; the
    model carries the export (``encoder_dir``)."""
    from dataclasses import replace

    from flywheel.classifier.layer2.fitter import fit_model
    from flywheel.training.tuner.export import intent_pairs, tune_and_export

    def say(line: str) -> None:
        if not quiet:
            typer.echo(f"flywheel train: {line}", err=True)

    texts, labels = intent_pairs(intent_set)
    tuned = tune_and_export(texts, labels, intent_set.embedder, tune, work, progress=say, unlabelled=unlabelled)
    r = tuned.report
    say(f"encoder tuned ({r['objective']}, {r['device']}) in {r['seconds']:.0f} s"
        + (" (stopped by its budget)" if r["stopped_early"] else "")
        + f"; exported as {r['encoder_id']} ({r['encoder_bytes'] / 1e6:.1f} MB)")
    # the head calibrates only on the examples the tuner did not see (tuned.fit_only), or on
    # each half of them by the encoder tuned on the other half (tuned.views)
    model = fit_model(intent_set, embedder=tuned.embedder, version=version, progress=not quiet,
                      examples_fit_only=tuned.fit_only.tolist(), cv_views=tuned.views)
    model.manifest.metrics["encoder_tuning"] = r
    return replace(model, encoder_dir=tuned.export.path)


def _refuse_models_home(out: Path, cfg: Config, models: Optional[Path]) -> None:
    """``train --out`` names one version's directory: refuse a models home (the configured
    one, ``--models``, or any directory holding versions or a ``CURRENT`` pointer), which
    saving would turn into a version that ``models push`` then nests."""
    from flywheel.classifier.versions.registry import is_models_home

    target = out.expanduser().resolve()
    homes = {p.expanduser().resolve() for p in (cfg.models_dir, models) if p is not None}
    if target in homes or is_models_home(target):
        raise InvalidInputError(f"--out {out} is a models home, not a version directory: save into "
                                f"{out / 'NAME'} and run flywheel models promote NAME, or use "
                                f"flywheel train --promote")


def _explain_cutoffs(th: dict, met: dict) -> None:
    """What the learned cutoffs buy on held-out (out-of-fold) rows."""
    if "oof_set_coverage" in met:
        typer.echo(f"  prediction sets: {met['oof_set_coverage']:.1%} coverage (nominal {th['coverage']:.0%}), "
                   f"mean size {met['oof_mean_set_size']:.2f}; deferral model ECE {met['oof_risk_ece']:.3f}")
    from flywheel.classifier.layer2.tiers import fmt_probs  # 0.9999 is not "1.000"

    cp = met.get("cutoff_precision") or {}
    if cp.get("precision") is not None:
        cut = fmt_probs(cp["cutoff"], digits=3)[0]
        typer.echo(f"  confident cutoff {cut}: precision {cp['precision']:.1%} on {cp['n']:,} "
                   "held-out answers at or above it; by intent (least precise first):")
        per = sorted(cp["per_intent"].items(), key=lambda kv: (kv[1]["precision"], kv[0]))
        for name, v in per[:10]:
            typer.echo(f"    {name}: {v['precision']:.1%} of {v['n']}")
        if len(per) > 10:
            typer.echo(f"    ... {len(per) - 10} more in the manifest's metrics.cutoff_precision")


def eval_command(
    train: Optional[Path] = typer.Option(None, "--train", help="Training data (fits a model on it)."),
    test: Path = typer.Option(..., "--test", help="Test data."),
    intents: Optional[Path] = typer.Option(None, "--intents", help="Intent file to evaluate (and settings base)."),
    model: Optional[Path] = typer.Option(None, "--model", help="Evaluate a saved model version instead."),
    dataset_format: Optional[str] = typer.Option(None, "--dataset-format", help="clinc150 | csv | jsonl"),
    text_column: str = typer.Option("text", "--text-column", help="csv/jsonl: the column holding the text."),
    label_column: str = typer.Option("label", "--label-column", help="csv/jsonl: the column holding the label."),
    oos_label: str = typer.Option("oos", "--oos-label",
                                  help="Label name meaning out of scope (besides OUT_OF_SCOPE, OOS, NONE; any case)."),
    lang_column: str = typer.Option("lang", "--lang-column", help="Optional per-row language (per-language slices)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    plots: Optional[Path] = typer.Option(None, "--plots", help="Write reliability, confusion and trade-curve PNGs "
                                                               "here."),
    target_oos_recall: Optional[float] = typer.Option(
        None, "--target-oos-recall", help="Cut the fitted model at this out-of-scope recall (learned on its "
                                          "out-of-fold training rows, or on the --calibration rows when given, as "
                                          "thresholds.target: {oos_recall: R})."),
    save: Optional[Path] = typer.Option(None, "--save", help="Also save the fitted model version here."),
    calibration: Optional[Path] = typer.Option(
        None, "--calibration", help="Held-out labelled data that calibrates the prediction sets (split-conformal; "
                                    "CLINC150: its val split) and places a target's cutoff, instead of the "
                                    "out-of-fold training rows."),
    latency_sample: int = typer.Option(200, "--latency-sample", help="Queries timed one at a time."),
    strict: bool = typer.Option(False, "--strict", help="Refuse test rows whose label the model does not know "
                                                        "(default: score without them, with a warning)."),
    quiet: bool = typer.Option(False, "--quiet", help="No progress bars."),
    tune_encoder: bool = typer.Option(
        False, "--tune-encoder", help="Fine-tune the encoder on the training data first, "
                                      "then fit and score the head on the tuned vectors (the JSON gets 'tuning')."),
    tune_budget: Optional[float] = typer.Option(
        None, "--tune-budget", help="Wall-clock seconds the tuning may take (default: embedder.tune.budget_s, "
                                             "else 900)."),
    tune_objective: Optional[str] = typer.Option(
        None, "--tune-objective", help="cross_entropy | contrastive | adapter (an adapter on the frozen encoder)"),
    tune_epochs: Optional[int] = typer.Option(None, "--tune-epochs",
                                              help="Passes over the training rows (if the budget allows)."),
    tune_holdout: Optional[float] = typer.Option(
        None, "--tune-holdout",
        help="Share of each intent's rows kept out of the tuning to calibrate the head (default: "
             "embedder.tune.holdout, else 0.2; 0: calibrate on the tuned rows)."),
    tune_calibration: Optional[str] = typer.Option(
        None, "--tune-calibration",
        help="auto | holdout | crossfit: how the tuned head learns its cutoffs (default: "
             "embedder.tune.calibration, else auto: crossfit up to 5,000 rows, holdout above; crossfit "
             "tunes two more encoders on the halves of the rows, about twice the time)."),
    unlabelled: Optional[Path] = typer.Option(
        None, "--unlabelled", help="With --tune-encoder: unlabelled texts (.txt one a line, .jsonl, or .json a "
                                   "list) for a self-supervised stage (SimCSE) before the tuning."),
    tune_unlabelled: Optional[float] = typer.Option(
        None, "--tune-unlabelled", help="Share of the tuning budget the --unlabelled stage may take (default: "
                                        "embedder.tune.unlabelled when above 0, else 0.3; at most 0.5)."),
) -> None:
    """Measure a model: accuracy, in-scope accuracy, OOS recall, F1, ECE, top-3, tiers, latency,
    and the same headline figures per language when the test rows carry one."""
    with contextlib.ExitStack() as stack:   # removes the tuning's work directory
        from flywheel.classifier.layer2.fitter import fit_model
        from flywheel.classifier.pipeline import Classifier
        from flywheel.classifier.settings.intents import load_intents
        from flywheel.classifier.versions.model import IntentModel
        from flywheel.training.evaluate import evaluate, format_report, write_plots
        from flywheel.training.loaders import DatasetError, drop_unknown_labels, intent_set_from_data, load_labelled

        load = functools.partial(load_labelled, fmt=dataset_format, text_column=text_column,
                                 label_column=label_column, oos_label=oos_label, lang_column=lang_column)
        test_data = load(test, split="test")
        tuning, embedder = None, None
        if model is not None:
            if tune_encoder:
                raise typer.BadParameter("--tune-encoder tunes on --train or --intents, not on a saved --model")
            if target_oos_recall is not None:
                raise InvalidInputError("--target-oos-recall cuts a model as it is fitted (--train or --intents); "
                                        "a saved --model keeps the cutoffs it was trained with")
            m = IntentModel.load(model)
        else:
            base = load_intents(intents) if intents else None
            if train is not None:
                data = load(train, split="train")
                intent_set = intent_set_from_data(data, name=train.stem, base=base)
            elif base is not None:
                intent_set = base
            else:
                raise typer.BadParameter("give --train, --intents or --model")
            if target_oos_recall is not None:
                intent_set = _with_target(intent_set, {"oos_recall": target_oos_recall}, "--target-oos-recall")
            if (unlabelled is not None or tune_unlabelled is not None) and not tune_encoder:
                raise typer.BadParameter("--unlabelled and --tune-unlabelled feed the encoder tuning: add "
                                         "--tune-encoder")
            if tune_encoder:
                from flywheel.classifier.encoders import open_version_encoder
                from flywheel.training.loaders import load_unlabelled
                from flywheel.training.options import DEFAULT_UNLABELLED_SHARE, resolve_tune

                pool = load_unlabelled(unlabelled) if unlabelled is not None else None
                share = tune_unlabelled
                file_tune = intent_set.embedder.tune
                if share is None and pool is not None and (file_tune is None or file_tune.unlabelled <= 0):
                    share = DEFAULT_UNLABELLED_SHARE
                tune = resolve_tune(intent_set.embedder.tune, True, tune_budget, objective=tune_objective,
                                    epochs=tune_epochs, holdout=tune_holdout, calibration=tune_calibration,
                                    unlabelled=share)
                assert tune is not None, "--tune-encoder turns tuning on"
                if pool is None and tune.unlabelled > 0:
                    raise typer.BadParameter("--tune-unlabelled (or embedder.tune.unlabelled) needs texts: give "
                                             "them with --unlabelled FILE")
                work = Path(tempfile.mkdtemp(prefix="flywheel-tune-"))
                stack.callback(shutil.rmtree, work, ignore_errors=True)
                m = _train_tuned(intent_set, tune, work, version=None, quiet=quiet, unlabelled=pool)
                assert m.encoder_dir is not None, "a tuned version carries its encoder"
                tuning = m.manifest.metrics["encoder_tuning"]
                # scored as a version serves it: the exported (int8 where it holds) encoder
                embedder = open_version_encoder(m.encoder_dir, intent_set.embedder)
            else:
                m = fit_model(intent_set, progress=not quiet)
            if save is not None:
                m.save(save)
        if calibration is not None:
            from flywheel.training.calibration import calibrate

            m, note = calibrate(m, load(calibration, split="val"), embedder=embedder)
            if note:
                typer.echo(f"flywheel: warning: {note}", err=True)
        # a label the model cannot answer would count as an error: score without those rows, or refuse
        test_data, skipped = drop_unknown_labels(test_data, m.manifest.labels)
        if skipped:
            from flywheel.classifier.settings.label_names import suggest_label

            hints = {k: suggest_label(k, m.manifest.labels) for k in list(skipped)[:20]}
            listed = ", ".join(f"{k} ({v}{f', did you mean {hints[k]}?' if hints[k] else ''})"
                               for k, v in list(skipped.items())[:20])
            listed += f", … ({len(skipped)} labels in all)" if len(skipped) > 20 else ""
            what = f"{sum(skipped.values())} row(s) with labels the model does not know: {listed}"
            if strict:
                raise DatasetError(test, f"{what}; the model knows its {len(m.manifest.labels)} intents and out "
                                         "of scope (OUT_OF_SCOPE, OOS, NONE or --oos-label)")
            if not len(test_data):
                raise DatasetError(test, f"nothing left to score: {what}")
            typer.echo(f"flywheel: warning: {test}: {what}; left out of the scores", err=True)
        clf = Classifier(m, teacher=None, embedder=embedder)
        report = evaluate(clf, test_data.texts, test_data.labels, progress=not quiet, latency_sample=latency_sample,
                          langs=test_data.langs)
        report["skipped_unknown_labels"] = skipped
        if tuning is not None:
            report["tuning"] = tuning
        if plots is not None:
            from flywheel.training.cli.tradeoff import write_tradeoff_plots

            report["plots"] = [str(p) for p in [*write_plots(report, plots), *write_tradeoff_plots(report, plots)]]
        if as_json:
            echo_json(report)
        else:
            from flywheel.training.cli.tradeoff import format_tradeoff

            typer.echo("\n".join([format_report(report), *format_tradeoff(report)]))
            if tuning is not None:
                t = tuning
                stopped = " (stopped by its budget)" if t["stopped_early"] else ""
                typer.echo(f"encoder tuned ({t['objective']}, {t['device']}): {t['steps']} steps, {t['epochs_done']} "
                           f"epoch(s) in {t['seconds']:.0f} s{stopped}, loss {t['loss_first']} -> {t['loss_last']}; "
                           f"served as {t['encoder_id']}" + (" (int8)" if t["quantized"] else " (fp32)"))
                stage = t.get("unlabelled_stage")
                if stage is not None:
                    typer.echo(f"unlabelled stage first (SimCSE): {stage['steps']} steps on {stage['rows']:,} "
                               f"texts in {stage['seconds']:.0f} s, loss {stage['loss_first']} -> {stage['loss_last']}")


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


def feedback_command(
    decision_id: str = typer.Argument(..., help="The decision's id (from classify's output)."),
    label: str = typer.Argument(..., help="The right label, or OUT_OF_SCOPE."),
    author: Optional[str] = typer.Option(None, "--author", help="Who labelled it (kept with the label)."),
    log_db: Optional[str] = typer.Option(None, "--log-db", help="Traffic log DuckDB file."),
    home: Optional[Path] = typer.Option(None, "--home", help=HOME_HELP),
) -> None:
    """Record a human label for a logged decision (it always wins over the teacher's)."""
    from flywheel.fleet.site import open_site

    cfg = load_config(home=home, log_db=log_db)
    site = open_site(cfg)
    store = site.open_log()   # a fleet's is mirrored first
    # the site's one writer: the served model's labels (a fleet's, even before this host synced)
    stored, new = site.human_labels(store).record_text(decision_id, label, author=author)
    if site.fleet and not store.has_decision(decision_id.strip()):   # on a replica's spool still
        typer.echo(f"flywheel: note: decision {decision_id.strip()} is not in the fleet's log yet; the label "
                   f"is kept and counts once the decision arrives", err=True)
    if new:
        typer.echo(f"recorded {label_name(stored)} for decision {decision_id}")
    else:   # the same label from the same author: recorded once
        typer.echo(f"already recorded {label_name(stored)} for decision {decision_id} (nothing written)")


def label_command(
    limit: Optional[int] = typer.Option(None, "--limit", help="At most this many pending decisions."),
    batch_size: int = typer.Option(32, "--batch-size", help="Pending decisions read and labelled per batch."),
    teacher: Optional[str] = typer.Option(None, "--teacher", help=TEACHER_HELP),
    teacher_host: Optional[str] = typer.Option(None, "--teacher-host", "--ollama-host", help=TEACHER_HOST_HELP),
    log_db: Optional[str] = typer.Option(None, "--log-db", help="Traffic log DuckDB file."),
    home: Optional[Path] = typer.Option(None, "--home", help=HOME_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print the counts as one JSON object."),
    quiet: bool = typer.Option(False, "--quiet", help="No progress messages."),
) -> None:
    """Ask the teacher for decisions that needed it while it was down."""
    from flywheel.classifier.pipeline import Classifier
    from flywheel.classifier.teachers import build_teacher
    from flywheel.fleet.site import open_site
    from flywheel.training.labeling import backfill_pending

    cfg = load_config(home=home, log_db=log_db, teacher=teacher, teacher_host=teacher_host)
    if cfg.teacher == "off":
        raise FlywheelError("the teacher is off (teacher = off); nothing can label pending decisions")
    site = open_site(cfg)
    store = site.open_log(progress=not quiet)
    model = site.served_model(progress=not quiet)   # a fleet's current version, even before this host synced
    clf = Classifier(model, teacher=build_teacher(cfg, model.intents), cache_root=cfg.cache_root)
    try:
        counts = backfill_pending(store, clf, batch_size=batch_size, limit=limit, progress=not quiet,
                                  labels=site.labels(store))
    finally:
        clf.close()
    down = _teacher_down(counts)
    if as_json:
        echo_json(counts)
    elif down is None:
        typer.echo(f"labelled {counts['labelled']} of {counted(counts['pending'], 'pending decision')} "
                   f"({counts['invalid']} invalid answers, {counts['remaining']} still pending)")
        if "stopped_because" in counts:
            typer.echo(f"stopped early: {counts['stopped_because']}")
    if down is not None:   # nothing could be labelled: cron must see it (exit 1, as a teacher that is off)
        raise FlywheelError(down)


def _teacher_down(counts: dict) -> str | None:
    """Why ``flywheel label`` failed: the teacher was unreachable before any pending
    decision was answered (``None``: it labelled some, or there was nothing to label)."""
    answered = int(counts["pending"]) - int(counts["remaining"])
    if "stopped_because" not in counts or answered > 0:
        return None
    return (f"the teacher is down ({counts['stopped_because']}); none of "
            f"{counted(counts['pending'], 'pending decision')} could be labelled, all still pending "
            f"(run flywheel label again once it answers)")


def stats_command(
    window: str = typer.Option("day", "--window",
                               help="'day' (also 'hour', 'week') or N: windows of N decisions."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    log_db: Optional[str] = typer.Option(None, "--log-db", help="Traffic log DuckDB file."),
    home: Optional[Path] = typer.Option(None, "--home", help=HOME_HELP),
    last: Optional[str] = typer.Option(None, "--last", metavar="N",
                                       help="Show only the last N windows."),
    top: str = typer.Option("5", "--top", metavar="N", help="Confused pairs to list."),
    shadow: Optional[str] = typer.Option(None, "--shadow", metavar="VERSION",
                                         help="Report this shadow version against the served one "
                                              "(default: the registry's SHADOW, if any)."),
) -> None:
    """Convergence of the flywheel: layer shares, tiers, audits, pending, confusions, shadow."""
    from flywheel.training.stats.traffic import check_options, format_table, int_option, stats_for_path

    # Bad values and log problems raise FlywheelError (InvalidInputError, LogStoreError:
    # exit code 2), which flywheel.cli.main prints as one "flywheel: error: ..." line.
    # (--last/--top are parsed here, not by typer, for the same one-line errors)
    last_n = None if last is None else int_option("--last", last)
    top_n = int_option("--top", top)
    window_v = check_options(window, last_n, top_n)
    if shadow is not None and not shadow.strip():
        raise InvalidInputError("--shadow needs a version name")
    from flywheel.fleet.site import open_site

    cfg = load_config(home=home, log_db=log_db)
    site = open_site(cfg)
    open_store: Callable[[], LogStore] | None = None
    if site.fleet:  # every replica's decisions, mirrored into the local log first
        mirrored = site.open_log(progress=not as_json)   # a store that is down fails here, in one line

        def open_mirrored() -> LogStore:
            return mirrored
        open_store = open_mirrored
    shadow_version = shadow.strip() if shadow is not None else _registry_shadow(site)
    result = stats_for_path(cfg.log_path, window=window_v, last=last_n, top=top_n, open_store=open_store,
                            shadow_version=shadow_version)
    if result.get("missing"):
        typer.echo(f"flywheel: no traffic log at {result['log_path']} yet; nothing to report",
                   err=True)
    if as_json:
        echo_json(result)
    else:
        typer.echo(format_table(result))


def _registry_shadow(site: Site) -> str | None:
    """The shadow version the site's registry names (``SHADOW``: the local models home, or
    in fleet mode the bucket's), or ``None``. Stats must work while the store is down: a
    registry that cannot be read leaves the section out, with a warning on stderr."""
    try:
        return site.registry().shadow()
    except (FlywheelError, OSError) as exc:
        typer.echo(f"flywheel: warning: cannot read the shadow version ({exc}); no shadow section",
                   err=True)
        return None


def prune_log_command(
    days: float = typer.Option(..., "--days", min=0.0, help="Delete raw query text older than this many days."),
    log_db: Optional[str] = typer.Option(None, "--log-db", help="Traffic log DuckDB file."),
    home: Optional[Path] = typer.Option(None, "--home", help=HOME_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Delete raw query text older than N days from the store (fleet mode) and the local log.

    Labels, layer-2 vectors and every other field stay, so the retrain still trains on those
    decisions with the same encoder; the bytes of the text are gone, not only its rows."""
    from flywheel.fleet.site import open_site

    cfg = load_config(home=home, log_db=log_db)
    site = open_site(cfg)
    store = site.open_log(progress=not as_json)
    rep = site.prune_log(store, days)
    out = {"cutoff": rep.cutoff.isoformat() + "Z", "objects_redacted": rep.redacted, "objects_deleted": rep.deleted,
           "objects_waiting": rep.waiting, "local_rows": rep.local_rows, "compacted_bytes": rep.compacted_bytes,
           "spool_files": rep.spool_files, "seconds": round(rep.seconds, 3)}
    if as_json:
        echo_json(out)
        return
    typer.echo(f"removed query text older than {out['cutoff']}: {rep.local_rows:,} local rows"
               + (f", {rep.redacted} store objects rewritten without text ({rep.deleted} originals deleted)"
                  if site.fleet else "")
               + (f"; {rep.waiting} objects of the cutoff day wait for the next run" if rep.waiting else ""))
