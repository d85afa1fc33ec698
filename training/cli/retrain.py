"""``flywheel retrain``: the command over :func:`training.retrain.retrain`, safe for cron.

Exit code 0 whenever the job ran as designed (promoted, shadowed, kept or skipped; in a
dry run would_promote or would_shadow), with a first line starting with the outcome and
ending with the gate's one-line reason; one ``flywheel: error: ...`` line otherwise,
never a traceback (``FLYWHEEL_DEBUG=1`` shows it).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

from flywheel.classifier.errors import FlywheelError, ModelError
from flywheel.classifier.settings.output import echo_json
from flywheel.training.cli._options import (
    HOME_OPTION,
    JSON_OPTION,
    LOG_DB_OPTION,
    MODELS_OPTION,
    QUIET_OPTION,
    TUNE_BUDGET_OPTION,
    tune_encoder_option,
)
from flywheel.training.options import RetrainOptions, resolve_tune, tune_for
from flywheel.training.report import (
    RetrainResult,
    challenger_lines,
    figures_line,
    intent_change_lines,
    write_reports,
)

if TYPE_CHECKING:
    from flywheel.classifier.protocols import Embedder, Registry
    from flywheel.classifier.settings.intents import EmbedderSettings, IntentSet

__all__ = ["retrain_command", "run_from_config", "make_embedder"]

_DEFAULTS = RetrainOptions()   # the options' defaults, stated once (in RetrainOptions)


def retrain_command(
    min_new_labels: int = typer.Option(_DEFAULTS.min_new_labels, "--min-new-labels", min=0,
                                       help="Skip unless this many labels arrived since the champion."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Train and evaluate; save and promote nothing."),
    as_json: bool = JSON_OPTION,
    tolerance: float = typer.Option(_DEFAULTS.tolerance, "--tolerance", min=0.0, max=1.0,
                                    help="How much worse the challenger may be."),
    target_precision: Optional[float] = typer.Option(None, "--target-precision",
                                                     help="Precision of layer 2's sure answers."),
    llm_budget: Optional[float] = typer.Option(None, "--llm-budget", min=0.0, max=1.0,
                                               help="Largest share of traffic left to the LLM, e.g. 0.05."),
    self_training: float = typer.Option(_DEFAULTS.self_training, "--self-training", min=0.0, max=1.0,
                                        help="Also train on layer 2's confident decisions at this weight "
                                             "(0 = off, e.g. 0.3)."),
    self_training_max: int = typer.Option(_DEFAULTS.self_training_max, "--self-training-max", min=0,
                                          help="At most this many of them (the newest)."),
    models: Optional[Path] = MODELS_OPTION,
    log_db: Optional[str] = LOG_DB_OPTION,
    intents: Optional[Path] = typer.Option(None, "--intents", help="Intent file (default: the intents setting, "
                                                                   "else the champion's bundled intent set)."),
    home: Optional[Path] = HOME_OPTION,
    quiet: bool = QUIET_OPTION,
    shadow: bool = typer.Option(False, "--shadow", help="Publish a winning challenger as the shadow version (scored "
                                                        "on live traffic, enforcing nothing) instead of promoting it."),
    tune_encoder: Optional[bool] = tune_encoder_option(
        "Also fine-tune the encoder: a tuned challenger competes with the head-only one and the champion"),
    tune_budget: Optional[float] = TUNE_BUDGET_OPTION,
    tune_unlabelled: Optional[float] = typer.Option(None, "--tune-unlabelled", help=(
        "Share of the tuning budget (at most 0.5) for a self-supervised stage on the logged queries before the "
        "tuning; its challenger must still win the gate (default: embedder.tune.unlabelled, 0: none).")),
    teacher_filter: bool = typer.Option(_DEFAULTS.teacher_filter, "--teacher-filter/--no-teacher-filter", help=(
        "Drop teacher labels the evidence contradicts before training (out of scope deep inside an intent, labels "
        "humans keep correcting); off, the report says what it would drop.")),
    promote_untested: bool = typer.Option(_DEFAULTS.promote_untested, "--promote-untested", help=(
        "Promote a challenger the gate cannot measure (fewer than 20 held-out queries and no significant gain) "
        "all the same; by default it is kept out.")),
    candidate_pairs: bool = typer.Option(
        _DEFAULTS.candidate_pairs, "--candidate-pairs/--no-candidate-pairs",
        help="With tuning: the intent pairs the teacher's candidate sets name are hard negatives for the tuner."),
    max_teacher_noise: float = typer.Option(_DEFAULTS.max_teacher_noise, "--max-teacher-noise", help=(
        "When the teacher-noise estimate's 95% lower bound is above this share (0 to 1), the teacher rows of the "
        "labels above it are dropped before training (1 = off; too few human labels: nothing dropped, a note says "
        "so).")),
) -> None:
    """Retrain layer 2 from the traffic log; promote the challenger only if it is not worse."""
    with _one_line_errors():
        options = RetrainOptions(min_new_labels=min_new_labels, dry_run=dry_run, tolerance=tolerance,
                                 target_precision=target_precision, llm_budget=llm_budget, progress=not quiet,
                                 self_training=self_training, self_training_max=self_training_max,
                                 shadow=shadow, teacher_filter=teacher_filter, candidate_pairs=candidate_pairs,
                                 promote_untested=promote_untested, max_teacher_noise=max_teacher_noise)
        result = run_from_config(options, models=models, log_db=log_db, intents=intents, home=home,
                                 tune_encoder=tune_encoder, tune_budget=tune_budget, tune_unlabelled=tune_unlabelled)
    _print_result(result, as_json)


def _print_result(result: RetrainResult, as_json: bool) -> None:
    """The run's result: one JSON object, or its summary lines. A dry run's report is saved
    nowhere else: it goes to a temporary directory, which the lines name."""
    if result.dry_run and result.markdown:
        write_reports(Path(tempfile.mkdtemp(prefix="flywheel-retrain-dry-run-")), result)
    if as_json:
        echo_json(result.to_dict())
        return
    for line in _readable(result):
        typer.echo(line)


@contextlib.contextmanager
def _one_line_errors() -> Iterator[None]:
    """Cron gets one ``flywheel: error: ...`` line and the error's exit code, never a
    traceback (``FLYWHEEL_DEBUG=1`` shows it): 1 for an unexpected error."""
    try:
        yield
    except FlywheelError as exc:
        typer.echo(f"flywheel: error: {exc}", err=True)
        raise typer.Exit(exc.exit_code) from None
    except OSError as exc:
        typer.echo(f"flywheel: error: {exc}", err=True)
        raise typer.Exit(1) from None
    except Exception as exc:  # noqa: BLE001 - cron wants one line, not a traceback
        if os.environ.get("FLYWHEEL_DEBUG"):
            raise
        typer.echo(f"flywheel: error: retrain failed: {type(exc).__name__}: {exc} "
                   f"(set FLYWHEEL_DEBUG=1 for the traceback)", err=True)
        raise typer.Exit(1) from None


def make_embedder(settings: EmbedderSettings, cache_root: Path | None = None) -> Embedder:
    """The embedder for an intent set's settings, its caches under ``cache_root`` (the seam tests replace
    with a fake embedder: :func:`run_from_config` builds its embedder only through this)."""
    from flywheel.classifier.encoders import make_embedder

    return make_embedder(settings, cache_root=cache_root)


def run_from_config(options: RetrainOptions, *, models: Path | None = None, log_db: str | None = None,
                    intents: Path | None = None, home: Path | None = None, tune_encoder: bool | None = None,
                    tune_budget: float | None = None, tune_unlabelled: float | None = None) -> RetrainResult:
    """Run :func:`training.retrain.retrain` with ``options`` on the configured models home
    and traffic log (``models``, ``log_db`` and ``home`` override the configuration). The
    intent set is the configured one as every command reads it (``intents``, else
    ``FLYWHEEL_INTENTS``, else the config file's ``intents``), else the champion's bundled
    one, else the starter set. A dry run applies no log retention. While the registry has no
    promoted version, the model the default classifier serves
    (:func:`classifier.versions.default.existing_model_dir`: e.g. the starter model trained
    into the home's cache) is the champion.

    Encoder tuning (``options.tune``): as for train and eval (:func:`training.options.tune_for`):
    ``tune_encoder`` (``--tune-encoder`` True, ``--no-tune-encoder`` False, else the setting)
    wins over the intent set's ``embedder.tune``, which applies when it is ``None``: left out,
    tuning is on for an encoder tuned by default; ``tune_budget`` (``--tune-budget``) overrides
    the budget and ``tune_unlabelled`` (``--tune-unlabelled``) the unlabelled stage's share.
    ``options.tune`` is used as it is when set."""
    from flywheel.classifier.settings.config import load_config, starter_intents_path
    from flywheel.classifier.settings.intents import load_intents
    from flywheel.classifier.versions.default import existing_model_dir
    from flywheel.fleet.site import open_site

    if tune_budget is not None or tune_unlabelled is not None:   # bad, or with --no-tune-encoder: exit 2 now
        resolve_tune(None, tune_encoder is not False, tune_budget, unlabelled=tune_unlabelled)
    cfg = load_config(home=home, log_db=log_db, intents=str(intents) if intents else None,
                      tune_encoder=tune_encoder)
    site = open_site(cfg)
    registry = site.registry(models)
    if cfg.intents:   # --intents, else FLYWHEEL_INTENTS, else the config file: as every command reads it
        intent_set = load_intents(Path(cfg.intents).expanduser())
    else:
        bundled = _champion_intents(registry)
        intent_set = bundled if bundled is not None else load_intents(starter_intents_path())
    if options.tune is None:
        tune, why = tune_for(intent_set.embedder, cfg, tune_budget, unlabelled=tune_unlabelled)
        options = replace(options, tune=tune, tune_why=why)
    embedder = make_embedder(intent_set.embedder, cfg.cache_root)
    store = site.open_log(progress=options.progress)
    if not options.dry_run:   # a dry run changes nothing, the log included
        site.apply_retention(store, progress=options.progress)
    from flywheel.training.retrain import retrain  # scikit-learn: imported when the command runs, not with the CLI

    served_default = existing_model_dir(cfg) if registry.current()[0] is None else None
    return retrain(store=store, registry=registry, intents=intent_set, embedder=embedder, options=options,
                   served_default=served_default,
                   embedder_for=lambda settings: make_embedder(settings, cfg.cache_root))


def _champion_intents(registry: Registry) -> IntentSet | None:
    """The served version's bundled intent set, or None (nothing served, or unloadable)."""
    name, _ = registry.current()
    if name is None:
        return None
    try:
        return registry.load(name).intents
    except ModelError:
        return None


def _readable(result: RetrainResult) -> list[str]:
    out = [result.summary_line()]
    if result.outcome == "skipped":
        return out
    ch, cp = result.challenger or {}, result.champion
    side_by_side = challenger_lines(result.report)
    for who, m in (("challenger", ch), ("champion", cp)) if not side_by_side else ():
        if not m:
            continue
        gate = m.get("gate_set") or "eval"
        out.append(f"  {who:<10} {m['version']}: {figures_line(m.get(gate) or {}, gate, m)}")
    out += side_by_side
    t = result.report.get("encoder_tuning")
    if t:
        out.append(f"  encoder tuning: {t['why']}" + (f"; {t['fallback']}: the head-only challenger alone"
                                                      if t.get("fallback") else ""))
    d = result.report.get("dataset", {})
    if d:
        tr = d["train"]["by_source"]
        out.append(f"  training rows {d['train']['n']:,} ({tr['intent_example']:,} examples, {tr['teacher']:,} "
                   f"teacher, {tr['human']:,} human, {tr.get('layer2', 0):,} self-training); "
                   f"dropped: {d['conflicts']['teacher_tie_dropped']:,} ties, "
                   f"{d['dropped_unknown_intent']['total']:,} removed intents, "
                   f"{(result.report.get('teacher_filter') or {}).get('dropped', {}).get('noisy_teacher', 0):,} "
                   "noisy teacher labels")
    out += intent_change_lines(result.report)
    for n in result.report.get("notes", []):
        out.append(f"  note: {n}")
    if result.report_path:
        md = result.report_path.with_name("report.md")
        where = "a dry run's, in a temporary directory" if result.dry_run else "report.json beside it"
        out.append(f"  report: {md} ({where})")
    return out
