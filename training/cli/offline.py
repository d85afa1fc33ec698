"""Offline commands of the ``flywheel`` command line (registered in :mod:`flywheel.cli`):
``train``, ``eval``, ``feedback``, ``label``, ``stats`` and ``prune-log``; ``models`` is in
:mod:`training.cli.models` and ``retrain`` in :mod:`training.cli.retrain`.

Each command only parses its options, calls the library and prints the result: ``train``
:func:`training.tuner.fit.fit_intents`, ``eval`` :func:`training.eval.run.run_eval`.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

import typer

from flywheel.classifier.errors import FlywheelError, InvalidInputError
from flywheel.classifier.settings.config import TEACHER_HELP, TEACHER_HOST_HELP, Config, load_config
from flywheel.classifier.settings.label_names import label_name
from flywheel.classifier.settings.output import counted, echo_json
from flywheel.training.cli._options import (
    HOME_OPTION,
    JSON_OPTION,
    LOG_DB_OPTION,
    MODELS_OPTION,
    QUIET_OPTION,
    TUNE_BUDGET_OPTION,
    tune_encoder_option,
)

if TYPE_CHECKING:   # the fleet package loads when a command opens its site, not with the CLI
    from flywheel.classifier.protocols import Registry
    from flywheel.classifier.settings.intents import IntentSet
    from flywheel.classifier.versions.model import IntentModel
    from flywheel.fleet.site import Site
    from flywheel.logstore import LogStore
    from flywheel.training.eval.run import EvalRun

__all__ = ["train_command", "eval_command", "feedback_command", "label_command", "stats_command",
           "prune_log_command"]


def train_command(
    intents: Path = typer.Option(..., "--intents", help="Intent definition file (YAML or TOML)."),
    out: Optional[Path] = typer.Option(
        None, "--out", help="The new version's own directory (its name is the version's; never a models "
                            "home: save into <home>/models/NAME, then flywheel models promote NAME)."),
    promote: bool = typer.Option(
        False, "--promote", help="Save it as a new version of the models home (fleet-wide with a store) and "
                                 "serve it, checked as flywheel models promote checks it."),
    models: Optional[Path] = MODELS_OPTION,
    home: Optional[Path] = HOME_OPTION,
    as_json: bool = typer.Option(False, "--json", help="Print the manifest as JSON."),
    quiet: bool = QUIET_OPTION,
    tune_encoder: Optional[bool] = tune_encoder_option(
        "Fine-tune the encoder on the intent examples first and save it inside the version (encoder/, every "
        "file hashed)"),
    tune_budget: Optional[float] = TUNE_BUDGET_OPTION,
) -> None:
    """Fit layer 2 from an intent file and save a model version (--out DIR), or add it to the
    models home and serve it (--promote). Where the encoder can be tuned (minilm,
    e5-multilingual) it is fine-tuned on the examples first, by default: --no-tune-encoder
    fits the head alone, in seconds."""
    from flywheel.classifier.settings.intents import load_intents
    from flywheel.training.options import tune_for
    from flywheel.training.tuner.fit import fit_intents

    if out is None and not promote:
        raise InvalidInputError("give --out DIR (save the version there) or --promote (add it to the models "
                                "home and serve it)")
    cfg = load_config(home=home, tune_encoder=tune_encoder)
    site, registry = _promotion(cfg, out, models, promote)
    intent_set = load_intents(intents)
    if site is not None:   # a move of the served pointer: checked against the configured set before training
        _check_contract(site, intents, intent_set)
    tune, _ = tune_for(intent_set.embedder, cfg, tune_budget)
    with tempfile.TemporaryDirectory(prefix="flywheel-tune-") as work:
        model = fit_intents(intent_set, tune, Path(work), version=out.name if out is not None else None,
                            progress=not quiet, say=_progress("train", quiet))
        target = out
        if target is None:
            assert registry is not None, "--promote without --out: checked above"
            target = registry.staging_dir(model.version)
        model.save(target)   # copies the tuned encoder (if any) out of the work directory
    if registry is not None:
        from flywheel.training.cli.models import push_version

        push_version(registry, target, promote=True, say=False)
    _print_trained(model, target, registry, as_json)


def _progress(command: str, quiet: bool) -> Callable[[str], None] | None:
    """Where a command's progress lines go: stderr, as ``flywheel COMMAND: ...`` (none with ``--quiet``)."""
    if quiet:
        return None
    return lambda line: typer.echo(f"flywheel {command}: {line}", err=True)


def _promotion(cfg: Config, out: Optional[Path], models: Optional[Path],
               promote: bool) -> tuple[Site | None, Registry | None]:
    """``train``'s site and registry with ``--promote`` (the bucket's registry in fleet mode;
    ``--out``'s name checked as a version name before training), else none; ``--out`` is
    never a models home."""
    if out is not None:
        _refuse_models_home(out, cfg, models)
    if not promote:
        return None, None
    from flywheel.fleet.site import open_site

    site = open_site(cfg)
    registry = site.registry(models)
    if out is not None:
        registry.staging_dir(out.name)      # a valid version name, before training
    return site, registry


def _check_contract(site: Site, intents: Path, intent_set: IntentSet) -> None:
    """``train --promote`` serves only a version of the configured intent set."""
    site.contract().check(intents.name, intent_set, doing=f"promote a version of {intents}", fix=(
        "the intents setting names the set this deployment serves: train that file, or point the setting "
        f"at {intents}; flywheel train --out DIR trains it without serving it"))


def _print_trained(model: IntentModel, target: Path, registry: Registry | None, as_json: bool) -> None:
    """What ``train`` made: the manifest as JSON, or its lines (where it went, the intents, the
    encoder, the learned cutoffs and what they buy out of fold)."""
    m = model.manifest
    if as_json:
        from dataclasses import asdict

        echo_json(asdict(m))
        return
    typer.echo(f"saved {m.version} to {target}")
    if registry is not None:
        from flywheel.classifier.versions.registry import ModelRegistry

        # a local home by its path, the bucket by its repr (as `flywheel models` names them)
        typer.echo(f"promoted {m.version} in {registry.home if isinstance(registry, ModelRegistry) else registry}")
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
        from flywheel.training.eval.render import chosen_line

        typer.echo("  " + chosen_line(model.intents.thresholds.target, op, m.thresholds.get(op.get("cutoff", ""))))
    _explain_cutoffs(m.thresholds, met)


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
    test: Path = typer.Option(..., "--test", help=(
        "Test data. Multi-turn (CSV/JSONL): 'session' and 'turn' columns (each turn classified with the gold labels "
        "of its session's earlier turns as history) or a 'history' column; an optional 'kind' column marks "
        "follow-ups ('referential'). JSON: 'followups'.")),
    intents: Optional[Path] = typer.Option(None, "--intents", help="Intent file to evaluate (and settings base)."),
    model: Optional[Path] = typer.Option(None, "--model", help="Evaluate a saved model version instead."),
    dataset_format: Optional[str] = typer.Option(None, "--dataset-format", help="clinc150 | csv | jsonl"),
    text_column: str = typer.Option("text", "--text-column", help="csv/jsonl: the column holding the text."),
    label_column: str = typer.Option("label", "--label-column", help="csv/jsonl: the column holding the label."),
    oos_label: str = typer.Option("oos", "--oos-label",
                                  help="Label name meaning out of scope (besides OUT_OF_SCOPE, OOS, NONE; any case)."),
    lang_column: str = typer.Option("lang", "--lang-column", help="Optional per-row language (per-language slices)."),
    as_json: bool = JSON_OPTION,
    plots: Optional[Path] = typer.Option(None, "--plots", help="Write reliability, confusion and trade plots here."),
    target_oos_recall: Optional[float] = typer.Option(None, "--target-oos-recall", help=(
        "Cut the fitted model at this out-of-scope recall (learned on its out-of-fold training rows, or on the "
        "--calibration rows when given, as thresholds.target: {oos_recall: R}).")),
    save: Optional[Path] = typer.Option(None, "--save", help="Also save the fitted model version here."),
    calibration: Optional[Path] = typer.Option(None, "--calibration", help=(
        "Held-out labelled data that calibrates the prediction sets (split-conformal; CLINC150: its val split) and "
        "places a target's cutoff, instead of the out-of-fold training rows.")),
    latency_sample: int = typer.Option(200, "--latency-sample", help="Queries timed one at a time."),
    strict: bool = typer.Option(False, "--strict", help="Refuse test rows whose label the model does not know "
                                                        "(default: score without them, with a warning)."),
    quiet: bool = QUIET_OPTION,
    home: Optional[Path] = HOME_OPTION,
    tune_encoder: Optional[bool] = tune_encoder_option(
        "Fine-tune the encoder on the training data first, then fit and score the head on it (JSON: 'tuning')"),
    tune_budget: Optional[float] = TUNE_BUDGET_OPTION,
    tune_objective: Optional[str] = typer.Option(
        None, "--tune-objective", help="cross_entropy | contrastive | adapter (an adapter on the frozen encoder)"),
    tune_epochs: Optional[int] = typer.Option(None, "--tune-epochs", help="Passes over the rows (budget allowing)."),
    tune_holdout: Optional[float] = typer.Option(
        None, "--tune-holdout", help="Share of each intent's rows kept out of the tuning to calibrate the head "
                                     "(default: embedder.tune.holdout, else 0.2; 0: calibrate on the tuned rows)."),
    tune_calibration: Optional[str] = typer.Option(None, "--tune-calibration", help=(
        "auto | holdout | crossfit: how the tuned head learns its cutoffs (default: embedder.tune.calibration, else "
        "auto: crossfit up to 5,000 rows, holdout above; crossfit tunes two more encoders, about twice the time).")),
    unlabelled: Optional[Path] = typer.Option(
        None, "--unlabelled", help="With tuning: unlabelled texts (.txt one a line, .jsonl, or .json a list) for a "
                                   "self-supervised stage (SimCSE) before the tuning."),
    tune_unlabelled: Optional[float] = typer.Option(
        None, "--tune-unlabelled", help="Share of the tuning budget the --unlabelled stage may take (default: "
                                        "embedder.tune.unlabelled when above 0, else 0.3; at most 0.5)."),
) -> None:
    """Measure a model: accuracy, in-scope accuracy, OOS recall, F1, ECE, top-3, tiers, latency,
    and the same headline figures per language when the test rows carry one. A model fitted
    here tunes its encoder first by default, as train does (--no-tune-encoder: the head alone)."""
    from flywheel.training.eval.run import EvalOptions, run_eval

    run = run_eval(EvalOptions(
        test, train=train, intents=intents, model=model, dataset_format=dataset_format, text_column=text_column,
        label_column=label_column, oos_label=oos_label, lang_column=lang_column, target_oos_recall=target_oos_recall,
        calibration=calibration, save=save, plots=plots, latency_sample=latency_sample, strict=strict,
        progress=not quiet, home=home, tune_encoder=tune_encoder, tune_budget=tune_budget,
        tune_objective=tune_objective, tune_epochs=tune_epochs, tune_holdout=tune_holdout,
        tune_calibration=tune_calibration, tune_unlabelled=tune_unlabelled, unlabelled=unlabelled),
        say=_progress("eval", quiet))
    _print_eval(run, as_json)


def _print_eval(run: EvalRun, as_json: bool) -> None:
    """The run's warnings on stderr, then its report: one JSON object, or the text
    (:func:`training.eval.render.eval_text`)."""
    for warning in run.warnings:
        typer.echo(f"flywheel: warning: {warning}", err=True)
    if as_json:
        echo_json(run.report)
        return
    from flywheel.training.eval.render import eval_text

    typer.echo(eval_text(run.report))


def feedback_command(
    decision_id: str = typer.Argument(..., help="The decision's id (from classify's output)."),
    label: str = typer.Argument(..., help="The right label, or OUT_OF_SCOPE."),
    author: Optional[str] = typer.Option(None, "--author", help="Who labelled it (kept with the label)."),
    log_db: Optional[str] = LOG_DB_OPTION,
    home: Optional[Path] = HOME_OPTION,
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
    log_db: Optional[str] = LOG_DB_OPTION,
    home: Optional[Path] = HOME_OPTION,
    as_json: bool = typer.Option(False, "--json", help="Print the counts as one JSON object."),
    quiet: bool = QUIET_OPTION,
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
    as_json: bool = JSON_OPTION,
    log_db: Optional[str] = LOG_DB_OPTION,
    home: Optional[Path] = HOME_OPTION,
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
    log_db: Optional[str] = LOG_DB_OPTION,
    home: Optional[Path] = HOME_OPTION,
    as_json: bool = JSON_OPTION,
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
