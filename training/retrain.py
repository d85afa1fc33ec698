"""``flywheel retrain``: distil the teacher's labels (human corrections on top) from the
traffic log back into layer 2, and promote the new model only if it is not worse.

Run it from cron. :func:`retrain` checks its options once (:class:`RetrainOptions`),
then one run is these steps (each a function here):

1. ``_retrain_lock``: takes ``<models home>/.retrain.lock`` without waiting (held:
   outcome ``skipped``);
2. ``_load_champion``: the served ``CURRENT`` version (none, unloadable or trained with
   another encoder: no champion, and the report says why);
3. ``_should_skip``: with ``min_new_labels``, counts the labels (valid teacher answers +
   human labels) newer than the champion's training data and skips when there are
   fewer (unless the intent set changed; without a usable champion the job always
   trains);
4. ``_build_data``: the training set and the fixed evaluation split
   (:func:`training.trainset.build_training_set`);
5. ``_fit_challenger``: fits the head on the training set's rows and vectors as they are
   (:func:`classifier.trainer.fit_from_vectors`: the intent examples minus the held-out
   ones, then the logged rows; with ``self_training`` > 0 also layer 2's own confident
   decisions, at that weight and never in the rows that fit the gate and cutoffs; the
   head's cutoffs come from its cross-validation); the model bundles the full intent set;
6. ``_tune``: re-tunes the ``confident`` cutoff on the recent-traffic slice (>= 50 rows)
   for the target precision, or for an LLM-call budget
   (:func:`training.tuning.retune`). The tuned thresholds are a new value: the
   challenger that is evaluated and saved is a new model whose manifest carries them
   (:func:`training.tuning.with_thresholds`); the fitted head is never changed;
7. ``_evaluate``: champion and challenger on the same rows with the same embeddings and
   their serving thresholds: accuracy, in-scope accuracy, out-of-scope recall, macro F1,
   per-intent precision and recall, ECE and the LLM share (queries layer 2 is not
   ``sure`` of);
8. ``_decide``: promotes when ``challenger accuracy >= champion accuracy - tolerance -
   noise`` (and the same for out-of-scope recall when there are >= 20 out-of-scope
   evaluation queries); otherwise keeps the champion;
9. ``_save``: every challenger is saved (its manifest's metrics name the split and the
   log it saw) with ``report.json`` and ``report.md``, and promoted if it won;
   ``dry_run`` saves and promotes nothing.

Gate set: the fixed ``eval`` set. A champion not trained by this job (its manifest lacks
``metrics.eval_split == SPLIT_ID``) may have trained on the held-out intent examples, so
it is compared on the traffic part instead (held-out human-labelled texts + the recent
slice) when that has at least 20 rows.
"""

from __future__ import annotations

import json
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from classifier.errors import FlywheelError, ModelError
from classifier.head import IntentHead
from classifier.intents import IntentSet
from classifier.model import IntentModel, intents_to_doc, new_version_name
from classifier.tiers import Thresholds
from training.gate import decide, evaluate_layer2
from training.report import RetrainResult, jsonable, render_markdown
from training.rows import LabelledSet, TrainingSet
from training.trainset import SELF_TRAINING_MAX, SPLIT_ID, build_training_set
from training.tuning import learned_thresholds, retune, traffic_sample, with_thresholds

__all__ = ["RetrainError", "RetrainOptions", "RetrainResult", "retrain", "count_new_labels", "LOCK_NAME",
           "MIN_GATE_ROWS"]

LOCK_NAME = ".retrain.lock"
MIN_GATE_ROWS = 20          # traffic rows needed to gate a non-flywheel champion on traffic only


class RetrainError(FlywheelError):
    """The retrain job could not run (e.g. the challenger cannot be trained)."""

    exit_code = 1


# ----------------------------------------------------------------- metrics
def count_new_labels(store: Any, since: float | None) -> int:
    """Labels that reached the log after ``since`` (see :meth:`LogStore.count_new_labels`)."""
    return 0 if store is None else store.count_new_labels(since)


def _trained_until(model: IntentModel) -> float | None:
    v = model.manifest.metrics.get("log_until") if isinstance(model.manifest.metrics, dict) else None
    if isinstance(v, (int, float)):
        return float(v)
    try:
        return datetime.strptime(model.manifest.created_at, "%Y-%m-%dT%H:%M:%SZ").replace(
            tzinfo=timezone.utc).timestamp()
    except (TypeError, ValueError):
        return None


# ------------------------------------------------------------------ options
@dataclass(frozen=True)
class RetrainOptions:
    """How one run behaves: the keyword arguments of :func:`retrain`, checked here once
    (an option out of range raises :class:`RetrainError`)."""

    min_new_labels: int = 0
    dry_run: bool = False
    tolerance: float = 0.01
    target_precision: float | None = None
    llm_budget: float | None = None
    progress: bool = False
    now: Any = None
    self_training: float = 0.0
    self_training_max: int = SELF_TRAINING_MAX

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise :class:`RetrainError` naming the first option out of range."""
        if not 0.0 <= self.self_training <= 1.0:
            raise RetrainError(f"self_training must be between 0 and 1, got {self.self_training}")
        if self.self_training_max < 0:
            raise RetrainError(f"self_training_max must be >= 0, got {self.self_training_max}")
        if not 0.0 <= self.tolerance <= 1.0:
            raise RetrainError(f"tolerance must be between 0 and 1, got {self.tolerance}")
        if self.llm_budget is not None and not 0.0 <= self.llm_budget <= 1.0:
            raise RetrainError(f"llm_budget must be between 0 and 1, got {self.llm_budget}")
        if self.target_precision is not None and not 0.0 < self.target_precision <= 1.0:
            raise RetrainError(f"target_precision must be in (0, 1], got {self.target_precision}")
        if self.min_new_labels < 0:
            raise RetrainError(f"min_new_labels must be >= 0, got {self.min_new_labels}")

    def run_at(self) -> float:
        """The run's time for the report (unix seconds)."""
        now = self.now
        return now.timestamp() if isinstance(now, datetime) else float(now) if now is not None else time.time()


@dataclass(frozen=True)
class _Job:
    """One run's inputs; ``notes`` collects what the report should say."""

    store: Any
    registry: Any
    intents: IntentSet
    embedder: Any
    opts: RetrainOptions
    notes: list[str] = field(default_factory=list)

    @property
    def target_precision(self) -> float:
        tp = self.opts.target_precision
        return float(tp if tp is not None else self.intents.thresholds.target_precision)

    def say(self, msg: str) -> None:
        if self.opts.progress:
            print(f"flywheel retrain: {msg}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class _Evaluation:
    """Champion and challenger metrics on the same sets; ``gate`` names the gate set."""

    gate: str
    sets: dict[str, LabelledSet]
    challenger: dict[str, Any]
    champion: dict[str, Any] | None


# ------------------------------------------------------------------ the job
def retrain(*, store: Any, registry: Any, intents: IntentSet, embedder: Any, min_new_labels: int = 0,
            dry_run: bool = False, tolerance: float = 0.01, target_precision: float | None = None,
            llm_budget: float | None = None, progress: bool = False, now: Any = None,
            self_training: float = 0.0, self_training_max: int = SELF_TRAINING_MAX) -> RetrainResult:
    """Run the retrain job once; see the module docs.

    Parameters
    ----------
    store : LogStore
        The traffic log.
    registry : ModelRegistry
        The models home (champion = its CURRENT version; the challenger is saved there).
    intents : IntentSet
        The intent set to train.
    embedder : Embedder
        Its ``id`` must be the champion's encoder id for the champion to be compared.
    min_new_labels : int
        Skip unless at least this many labels arrived since the champion was trained.
    dry_run : bool
        Do everything except saving and promoting.
    tolerance : float
        How much worse (accuracy, out-of-scope recall) the challenger may be.
    target_precision : float, optional
        Precision of layer 2's sure answers the confident cutoff is tuned for (default:
        the intent set's ``thresholds.target_precision``).
    llm_budget : float, optional
        Largest share of recent traffic layer 2 may leave to the teacher; the cutoff is
        the lower of the precision cutoff and the strictest one within the budget.
    progress : bool
        Progress messages on stderr.
    now : float or datetime, optional
        The run's time for the report (default: now).
    self_training : float
        Weight (0 to 1) of self-training rows: layer 2's own confident decisions from
        the log, trained on with this weight and never used to fit the gate or the
        cutoffs (see :mod:`training.trainset`). 0 (the default) leaves them out.
    self_training_max : int
        At most this many of them, the newest.

    The options are checked by :class:`RetrainOptions` before anything runs.
    """
    opts = RetrainOptions(min_new_labels=min_new_labels, dry_run=dry_run, tolerance=tolerance,
                          target_precision=target_precision, llm_budget=llm_budget, progress=progress,
                          now=now, self_training=self_training, self_training_max=self_training_max)
    with _retrain_lock(Path(registry.home), dry_run) as taken:
        if not taken:
            return _skip("another retrain is running", dry_run)
        return _run(_Job(store, registry, intents, embedder, opts))


@contextmanager
def _retrain_lock(home: Path, dry_run: bool) -> Iterator[bool]:
    """Hold ``home/LOCK_NAME`` without waiting; ``False`` when another run holds it. A
    dry run on a home that does not exist yet takes none (it creates nothing)."""
    from filelock import FileLock, Timeout

    if dry_run and not home.is_dir():
        yield True
        return
    home.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(home / LOCK_NAME))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        yield False
        return
    except OSError as exc:
        raise RetrainError(f"cannot take the retrain lock {home / LOCK_NAME}: {exc}") from None
    try:
        yield True
    finally:
        lock.release()


def _run(job: _Job) -> RetrainResult:
    t_start = time.perf_counter()
    run_at = job.opts.run_at()
    champion = _load_champion(job.registry, job.embedder, job.notes)
    job.say(f"champion: {champion.version if champion else 'none'}")
    skip = _should_skip(job, champion)
    if skip is not None:
        return _skip(skip, job.opts.dry_run, job.notes)
    ts, t_data = _timed(_build_data, job, champion)
    fitted, t_fit = _timed(_fit_challenger, job, ts, champion)
    tuning, thresholds = _tune(job, fitted, ts)
    challenger = with_thresholds(fitted, thresholds)
    ev, t_eval = _timed(_evaluate, job, challenger, champion, ts)
    outcome, reason, checks = _decide(job, challenger, champion, ev)
    challenger = _with_run_metrics(challenger, ts, ev, tuning)
    timing = _timing(ts, challenger, time.perf_counter() - t_start, t_data, t_fit, t_eval)
    report = _report(job, challenger.version, run_at, outcome, reason, checks, champion, ev, ts, timing,
                     {"cross_validation": learned_thresholds(fitted), "tuning": tuning,
                      "saved": dict(challenger.manifest.thresholds)})
    result = _result(job, report, ev)
    if not job.opts.dry_run:
        _save(job, challenger, result)
    return result


def _timed(step, *args) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = step(*args)
    return out, time.perf_counter() - t0


def _load_champion(registry: Any, embedder: Any, notes: list[str]) -> IntentModel | None:
    """The served model, or None (and a note why) when there is none usable here."""
    name = registry.current_name()
    if name is None:
        notes.append("no champion: nothing promoted yet")
        return None
    try:
        champ = registry.load_current()
    except ModelError as exc:
        notes.append(f"champion {name} cannot be loaded ({exc}); treated as no champion")
        return None
    if not champ.encoder_matches(embedder.id, embedder.dim):
        enc = champ.manifest.encoder
        notes.append(f"champion {name} was trained with encoder {enc.get('id')!r} ({enc.get('dim')}-d), not "
                     f"{embedder.id!r}; it cannot be evaluated on these embeddings, so it is treated as "
                     f"no champion")
        return None
    return champ


def _should_skip(job: _Job, champion: IntentModel | None) -> str | None:
    """Why to skip (fewer than ``min_new_labels`` new labels, same intent set), or None."""
    need = job.opts.min_new_labels
    if need <= 0 or champion is None:
        return None
    n_new = count_new_labels(job.store, _trained_until(champion))
    # everything the model bundles (examples, synthetic negatives, metadata, rules, settings)
    changed = intents_to_doc(champion.intents) != intents_to_doc(job.intents)
    if n_new < need and not changed:
        return f"{n_new:,} new labels since {champion.version} (fewer than --min-new-labels {need})"
    if changed:
        job.notes.append("the intent set changed since the champion was trained")
    job.say(f"{n_new:,} new labels since {champion.version}")
    return None


def _skip(reason: str, dry_run: bool, notes: list[str] | None = None) -> RetrainResult:
    return RetrainResult("skipped", None, reason, dry_run=dry_run, report={"notes": notes or []})


def _build_data(job: _Job, champion: IntentModel | None) -> TrainingSet:
    o = job.opts
    return build_training_set(job.store, job.intents, embedder=job.embedder, champion=champion,
                              progress=o.progress, self_training_max=o.self_training_max if o.self_training > 0 else 0)


def _fit_challenger(job: _Job, ts: TrainingSet, champion: IntentModel | None) -> IntentModel:
    """Fit the head on the training rows as they are (their vectors; the held-out intent
    examples are not among them); the model bundles the full intent set."""
    from classifier.trainer import fit_from_vectors

    layer2 = np.array([s == "layer2" for s in ts.sources], dtype=bool)
    weighted = bool(layer2.any())
    job.say(f"fitting the challenger on {len(ts):,} rows ...")
    try:
        model = fit_from_vectors(ts.fit_intents, ts.vectors, ts.labels, encoder_id=job.embedder.id,
                                 sample_weight=np.where(layer2, job.opts.self_training, 1.0) if weighted else None,
                                 fit_only=layer2 if weighted else None, version=new_version_name(),
                                 parent=champion.version if champion else None,
                                 head=IntentHead(target_precision=job.target_precision),
                                 negatives=ts.negatives)
    except ValueError as exc:
        raise RetrainError(f"cannot train the challenger: {exc}") from None
    return replace(model, intents=job.intents)


def _tune(job: _Job, model: IntentModel, ts: TrainingSet) -> tuple[dict[str, Any], dict[str, float]]:
    """Re-tune the confident cutoff on the recent slice (and the LLM budget's traffic
    sample): the tuning report and the new learned thresholds."""
    budget = job.opts.llm_budget
    sample = traffic_sample(job.store, job.embedder.id, ts) if budget is not None else None
    tuning, thresholds = retune(model, ts.recent, job.target_precision, budget, sample)
    job.say(f"confident cutoff: {tuning['cv_confident']:.3f} (cross-validation) -> {tuning['confident']:.3f} "
            f"({tuning['method']})")
    return tuning, thresholds


def _evaluate(job: _Job, challenger: IntentModel, champion: IntentModel | None, ts: TrainingSet) -> _Evaluation:
    """Both models on the same sets with their serving thresholds."""
    gate, sets = _gate_sets(job, champion, ts)
    return _Evaluation(gate, sets, _metrics(challenger, sets, gate),
                       _metrics(champion, sets, gate) if champion is not None else None)


def _gate_sets(job: _Job, champion: IntentModel | None, ts: TrainingSet) -> tuple[str, dict[str, LabelledSet]]:
    """The gate set's name and the evaluation sets (see the module docs)."""
    traffic = ts.eval.where(lambda s: s != "intent_example").concat(ts.recent)
    gate = "eval"
    if champion is not None and champion.manifest.metrics.get("eval_split") != SPLIT_ID:
        if len(traffic) >= MIN_GATE_ROWS:
            gate = "eval_traffic"
            job.notes.append(f"champion {champion.version} was not trained by retrain (it may have seen the "
                             f"held-out intent examples): compared on traffic only (held-out human labels + "
                             f"recent slice, {len(traffic):,} rows)")
        else:
            job.notes.append(f"champion {champion.version} was not trained by retrain and may have seen the "
                             f"held-out intent examples; too little traffic to compare on traffic only")
    if gate == "eval" and len(ts.eval) == 0 and len(ts.recent) > 0:
        gate = "recent"
        job.notes.append("the fixed eval set is empty (too few intent examples to hold any out, no human "
                         "labels): compared on the recent-traffic slice")
    sets = {"eval": ts.eval, "recent": ts.recent}
    if gate == "eval_traffic":
        sets["eval_traffic"] = traffic
    return gate, sets


def _metrics(m: IntentModel, sets: dict[str, LabelledSet], gate: str) -> dict[str, Any]:
    per = {k: evaluate_layer2(m, v) for k, v in sets.items()}
    share_on = "recent" if per["recent"]["n"] else gate
    return {"version": m.version, "accuracy": per[gate]["accuracy"], "n": per[gate]["n"],
            "oos_recall": per[gate]["oos_recall"], "gate_set": gate,
            "llm_share": per[share_on]["llm_share"], "llm_share_on": share_on,
            "thresholds": Thresholds.for_model(m).to_dict(), **per}


def _decide(job: _Job, challenger: IntentModel, champion: IntentModel | None,
            ev: _Evaluation) -> tuple[str, str, list[dict[str, Any]]]:
    return decide(challenger, champion, ev.challenger, ev.champion,
                  ev.sets[ev.gate] if ev.champion else None, ev.gate, job.opts.tolerance, job.notes)


def _with_run_metrics(model: IntentModel, ts: TrainingSet, ev: _Evaluation, tuning: dict[str, Any]) -> IntentModel:
    """The challenger as saved: its manifest's metrics say which split and log it saw."""
    ch = ev.challenger
    metrics = {**model.manifest.metrics,
               "eval_split": SPLIT_ID, "log_until": ts.log_until,
               "eval_accuracy": ch["eval"]["accuracy"], "eval_n": ch["eval"]["n"],
               "recent_llm_share": ch["recent"]["llm_share"], "recent_n": ch["recent"]["n"],
               "confident_tuning": tuning["method"]}
    return replace(model, manifest=replace(model.manifest, metrics=metrics))


def _timing(ts: TrainingSet, model: IntentModel, total: float, t_data: float, t_fit: float,
            t_eval: float) -> dict[str, Any]:
    emb = ts.report["embeddings"]
    return {"total_seconds": round(total, 3), "dataset_seconds": round(t_data, 3),
            "embed_seconds": emb["seconds"], "embeddings_reused": emb["reused"],
            "embeddings_computed": emb["computed"], "fit_seconds": round(t_fit, 3),
            "head_fit_seconds": model.manifest.metrics.get("fit_seconds"), "eval_seconds": round(t_eval, 3)}


def _report(job: _Job, name: str, run_at: float, outcome: str, reason: str, checks: list[dict[str, Any]],
            champion: IntentModel | None, ev: _Evaluation, ts: TrainingSet, timing: dict[str, Any],
            thresholds: dict[str, Any]) -> dict[str, Any]:
    """``report.json`` of the challenger ``name`` (its version is ``None`` in a dry run)."""
    dry_run = job.opts.dry_run
    return {
        "outcome": outcome, "version": None if dry_run else name, "reason": reason,
        "promoted": outcome == "promoted" and not dry_run, "dry_run": dry_run,
        "created_at": datetime.fromtimestamp(run_at, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "champion_version": champion.version if champion else None,
        "notes": job.notes,
        "gate": {"set": ev.gate, "n": ev.challenger["n"], "tolerance": job.opts.tolerance, "checks": checks},
        "challenger": ev.challenger, "champion": ev.champion,
        "thresholds": thresholds,
        "dataset": ts.report,
        "timing": timing,
    }


def _result(job: _Job, report: dict[str, Any], ev: _Evaluation) -> RetrainResult:
    """The run's result with its markdown."""
    dry_run = job.opts.dry_run
    result = RetrainResult(report["outcome"], report["version"], report["reason"], challenger=ev.challenger,
                           champion=ev.champion, dry_run=dry_run, report=jsonable(report))
    result.markdown = render_markdown(result)
    job.say(result.summary_line())  # the markdown is the caller's to print (the CLI does on a dry run)
    return result


def _save(job: _Job, model: IntentModel, result: RetrainResult) -> None:
    """Save the challenger with ``report.json`` and ``report.md``; promote it if it won."""
    path = job.registry.version_dir(model.version)
    model.save(path)
    result.report_path = path / "report.json"
    result.report_path.write_text(json.dumps(result.report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    (path / "report.md").write_text(result.markdown + "\n", encoding="utf-8")
    if result.outcome == "promoted":
        job.registry.promote(model.version)
        job.say(f"promoted {model.version}")
