"""Commands beyond classify/train, registered on the typer app by :func:`register`:
``eval``, ``feedback``, ``label``, ``models`` (list, promote, rollback, prune), plus
``retrain`` and ``stats`` from their own modules."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer

from classifier.config import load_config
from classifier.errors import FlywheelError

_registered: set[int] = set()


def _echo_json(obj: object) -> None:
    sys.stdout.write(json.dumps(obj, ensure_ascii=False, default=str) + "\n")


def eval_command(
    train: Optional[Path] = typer.Option(None, "--train", help="Training data (fits a model on it)."),
    test: Path = typer.Option(..., "--test", help="Test data."),
    intents: Optional[Path] = typer.Option(None, "--intents", help="Intent file to evaluate (and settings base)."),
    model: Optional[Path] = typer.Option(None, "--model", help="Evaluate a saved model version instead."),
    dataset_format: Optional[str] = typer.Option(None, "--dataset-format", help="clinc150 | csv | jsonl"),
    text_column: str = typer.Option("text", "--text-column"),
    label_column: str = typer.Option("label", "--label-column"),
    oos_label: str = typer.Option("oos", "--oos-label", help="Label name meaning out of scope."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    plots: Optional[Path] = typer.Option(None, "--plots", help="Write reliability and confusion PNGs here."),
    save: Optional[Path] = typer.Option(None, "--save", help="Also save the fitted model version here."),
    latency_sample: int = typer.Option(200, "--latency-sample", help="Queries timed one at a time."),
    quiet: bool = typer.Option(False, "--quiet", help="No progress bars."),
) -> None:
    """Measure a model: accuracy, in-scope accuracy, OOS recall, F1, ECE, top-3, tiers, latency."""
    from classifier.intents import load_intents
    from classifier.model import IntentModel
    from classifier.pipeline import Classifier
    from classifier.trainer import fit_model
    from training.datasets import intent_set_from_data, load_labelled
    from training.evaluate import evaluate, format_report, write_plots

    opts = dict(fmt=dataset_format, text_column=text_column, label_column=label_column, oos_label=oos_label)
    test_data = load_labelled(test, split="test", **opts)
    if model is not None:
        m = IntentModel.load(model)
    else:
        base = load_intents(intents) if intents else None
        if train is not None:
            data = load_labelled(train, split="train", **opts)
            intent_set = intent_set_from_data(data, name=train.stem, base=base)
        elif base is not None:
            intent_set = base
        else:
            raise typer.BadParameter("give --train, --intents or --model")
        m = fit_model(intent_set, progress=not quiet)
        if save is not None:
            m.save(save)
    clf = Classifier(m, teacher=None)
    report = evaluate(clf, test_data.texts, test_data.labels, progress=not quiet, latency_sample=latency_sample)
    if plots is not None:
        report["plots"] = [str(p) for p in write_plots(report, plots)]
    if as_json:
        _echo_json(report)
    else:
        typer.echo(format_report(report))


def feedback_command(
    decision_id: str = typer.Argument(..., help="The decision's id (from classify's output)."),
    label: str = typer.Argument(..., help="The right label, or OUT_OF_SCOPE."),
    author: Optional[str] = typer.Option(None, "--author"),
    log_db: Optional[str] = typer.Option(None, "--log-db"),
    home: Optional[Path] = typer.Option(None, "--home"),
) -> None:
    """Record a human label for a logged decision (it always wins over the teacher's)."""
    from training.feedback import record_feedback

    cfg = load_config(home=home, log_db=log_db)
    stored = record_feedback(cfg, decision_id, label, author=author)
    typer.echo(f"recorded {stored or 'OUT_OF_SCOPE'} for decision {decision_id}")


def label_command(
    limit: Optional[int] = typer.Option(None, "--limit", help="At most this many pending decisions."),
    batch_size: int = typer.Option(32, "--batch-size"),
    ollama_host: Optional[str] = typer.Option(None, "--ollama-host"),
    log_db: Optional[str] = typer.Option(None, "--log-db"),
    home: Optional[Path] = typer.Option(None, "--home"),
    as_json: bool = typer.Option(False, "--json"),
    quiet: bool = typer.Option(False, "--quiet"),
) -> None:
    """Ask the teacher for decisions that needed it while it was down."""
    from training.serving import backfill_pending, open_classifier

    cfg = load_config(home=home, log_db=log_db, ollama_host=ollama_host)
    if cfg.teacher == "off":
        raise FlywheelError("the teacher is off (teacher = off); nothing can label pending decisions")
    served = open_classifier(cfg, log_decisions=False, progress=not quiet)
    from training.logstore import LogStore

    try:
        counts = backfill_pending(LogStore(cfg.log_path), served.classifier, batch_size=batch_size,
                                  limit=limit, progress=not quiet)
    finally:
        served.close()
    if as_json:
        _echo_json(counts)
        return
    typer.echo(f"labelled {counts['labelled']} of {counts['pending']} pending decisions "
               f"({counts['invalid']} invalid answers, {counts['remaining']} still pending)")
    if "stopped_because" in counts:
        typer.echo(f"stopped early: {counts['stopped_because']}")


models_app = typer.Typer(help="Model versions: list, promote, rollback, prune.", no_args_is_help=True)


def _registry(models: Optional[Path], home: Optional[Path]):
    from classifier.registry import ModelRegistry

    return ModelRegistry(models or load_config(home=home).models_dir)


@models_app.command("list")
def models_list(models: Optional[Path] = typer.Option(None, "--models"),
                home: Optional[Path] = typer.Option(None, "--home"),
                as_json: bool = typer.Option(False, "--json")) -> None:
    """List versions (the served one marked with *)."""
    reg = _registry(models, home)
    vs = reg.versions()
    if as_json:
        _echo_json([{"version": v.name, "current": v.current, "created_at": v.created_at,
                     "training_size": v.training_size, "valid": v.valid, "metrics": v.metrics} for v in vs])
        return
    if not vs:
        typer.echo(f"no model versions in {reg.home}")
        return
    for v in vs:
        acc = v.metrics.get("oof_top1_accuracy")
        typer.echo(f"{'*' if v.current else ' '} {v.name:32} {v.created_at:21} n={v.training_size:<7}"
                   + (f" cv-top1={acc:.3f}" if isinstance(acc, (int, float)) else "")
                   + ("" if v.valid else f"  INVALID: {v.problem}"))


@models_app.command("promote")
def models_promote(version: str = typer.Argument(...),
                   models: Optional[Path] = typer.Option(None, "--models"),
                   home: Optional[Path] = typer.Option(None, "--home")) -> None:
    """Serve VERSION (checked before the switch)."""
    _registry(models, home).promote(version)
    typer.echo(f"promoted {version}")


@models_app.command("rollback")
def models_rollback(models: Optional[Path] = typer.Option(None, "--models"),
                    home: Optional[Path] = typer.Option(None, "--home")) -> None:
    """Serve the previously promoted version again."""
    typer.echo(f"rolled back to {_registry(models, home).rollback()}")


@models_app.command("prune")
def models_prune(keep_promoted: int = typer.Option(5, "--keep-promoted",
                                                   help="Keep the last N promoted versions (rollback depth)."),
                 keep_recent: int = typer.Option(3, "--keep-recent",
                                                 help="Keep the N newest versions, promoted or not."),
                 dry_run: bool = typer.Option(False, "--dry-run", help="Only list what would be removed."),
                 models: Optional[Path] = typer.Option(None, "--models"),
                 home: Optional[Path] = typer.Option(None, "--home")) -> None:
    """Delete old versions; the served one, the last promoted and the newest stay."""
    reg = _registry(models, home)
    total = len(reg.versions())
    if dry_run or not reg.home.is_dir():
        removed = reg.prune(keep_promoted=keep_promoted, keep_recent=keep_recent, dry_run=dry_run)
    else:  # never delete beside a running retrain (it saves, then promotes, a new version)
        from filelock import FileLock, Timeout

        from training.retrain import LOCK_NAME

        lock = FileLock(str(reg.home / LOCK_NAME))
        try:
            lock.acquire(timeout=0)
        except Timeout:
            raise FlywheelError(f"a retrain is running ({reg.home / LOCK_NAME} is held); "
                                "try again when it is done") from None
        except OSError as exc:
            raise FlywheelError(f"cannot take the retrain lock {reg.home / LOCK_NAME}: {exc}") from None
        try:
            removed = reg.prune(keep_promoted=keep_promoted, keep_recent=keep_recent)
        finally:
            lock.release()
    verb = "would remove" if dry_run else "removed"
    for name in removed:
        typer.echo(f"{verb} {name}")
    typer.echo(f"{'dry run: ' if dry_run else ''}{verb} {len(removed)} of {total} versions, "
               f"{total - len(removed)} kept, in {reg.home}")


def register(app: typer.Typer) -> None:
    if id(app) in _registered:
        return
    _registered.add(id(app))
    app.command("eval")(eval_command)
    app.command("feedback")(feedback_command)
    app.command("label")(label_command)
    app.add_typer(models_app, name="models")
    for module in ("training.retrain", "training.stats"):
        try:
            mod = __import__(module, fromlist=["register"])
        except ImportError:  # pragma: no cover - optional while a module is being developed
            continue
        if hasattr(mod, "register"):
            mod.register(app)
