"""``flywheel retrain``: distil the teacher's labels (human corrections on top) from the
traffic log back into layer 2, and promote the new model only if it is not worse.

Run it from cron. :func:`retrain` takes a traffic log (:class:`training.protocols.TrafficLog`),
a registry (:class:`classifier.protocols.Registry`: a local models home or a shared one)
and its options, checked once (:class:`RetrainOptions`). One run, each step a function here:

1. ``registry.lock()``, taken without waiting (held: outcome ``skipped``);
2. ``_load_champion``: the served version and its token (nothing promoted yet: the served
   default model, with no token; unusable here: no champion, and a note says why);
   2b. ``_estimate_teacher_noise``: the teacher's agreement with human labels on the same
   decisions (:mod:`training.teacher_noise`; reported by every run, skips included);
3. ``_should_skip``: fewer than ``min_new_labels`` labels newer than the champion's data,
   and the same intent set;
4. ``_build_data``: the training set and the fixed evaluation split
   (:func:`training.trainset.build_training_set`); 4a. ``_filter_teacher``: the teacher rows
   the evidence contradicts (:func:`training.teacher_noise.check_training_set`), dropped with
   ``teacher_filter``, else counted; 4b. ``_tune_encoder`` (with ``tune``): the encoder tuned
   within its budget and the rows re-encoded by it (:func:`training.tuner.step.tune_encoder`);
   a tuning that fails leaves the head-only challenger alone, with a note;
5. ``_fit_challenger``: the head on the training rows and vectors as they are
   (:func:`training.tuner.fit.fit_head`; with tuning, a second challenger on the re-encoded
   rows that carries the tuned encoder, :func:`training.tuner.fit.train_tuned`);
6. ``_retune_cutoffs``: the ``confident`` cutoff re-tuned on the recent slice for the target
   precision or an LLM budget (:mod:`training.cutoffs`), served by a new model (the head is
   never changed); each challenger is one :class:`training.trial.Challenger`;
7. ``_evaluate``: the champion and the challengers on the same rows, each with its own
   encoder's vectors and serving thresholds; with tuning, the challenger put forward
   (:func:`training.gate.pick_challenger`), kept through any re-gate;
8. ``_decide``: :func:`training.gate.decide` (its module docs state the rule); in a dry run
   a winner is ``would_promote`` (``would_shadow`` with ``shadow``), never ``promoted``;
9. ``_save``: the challenger put forward saved with ``report.json`` and ``report.md`` in the
   registry's staging directory and published; a winner promoted against the champion's
   token (compare-and-swap), or set as the shadow (``shadowed``); a dry run saves nothing;
10. ``_record``: the run recorded in the registry (``record_retrain``), so an alert can tell
    when retrains stop.

The champion may move during the run: the job never overwrites a version it did not gate
against (``_save``, ``_regate``). The gate set is the fixed ``eval`` set, the traffic part for
a champion this job did not train (``_gate_name``), the ``shared`` rows when the intent set
changed (:class:`training.trial.Change`). The run's records are :mod:`training.trial`'s, its
report is assembled by :mod:`training.report`.
"""

from __future__ import annotations

import tempfile
import time
from contextlib import nullcontext
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, TypeVar

import numpy as np

from flywheel.classifier.errors import EmbedderError, FlywheelError, ModelError
from flywheel.classifier.language import UNKNOWN, LanguageDetector
from flywheel.classifier.layer2.head import IntentHead
from flywheel.classifier.layer2.tiers import fmt_probs
from flywheel.classifier.protocols import Embedder, Registry
from flywheel.classifier.settings.intents import EmbedderSettings, IntentSet
from flywheel.classifier.versions.model import IntentModel, intents_to_doc, new_version_name
from flywheel.classifier.versions.registry import PromotionConflict
from flywheel.training.cutoffs import at_target, learned_thresholds, retune, traffic_sample, with_thresholds
from flywheel.training.gate import MIN_GATE_ROWS, decide, decide_changed, pick_challenger
from flywheel.training.options import RetrainError, RetrainOptions
from flywheel.training.protocols import TrafficLog
from flywheel.training.report import (
    RetrainResult,
    jsonable,
    model_metrics,
    render_markdown,
    run_report,
    run_timing,
    teacher_fields,
    with_run_metrics,
    write_reports,
)
from flywheel.training.rows import LabelledSet, TrainingSet
from flywheel.training.teacher_noise import REASONS, NoiseEstimate, check_training_set, estimate_from_log, format_noise
from flywheel.training.trainset import SPLIT_ID, build_training_set
from flywheel.training.trial import Challenger, Champion, Change, Evaluation, Job, Trial, intent_change
from flywheel.training.tuner.fit import HeadRows, fit_head, train_tuned
from flywheel.training.tuner.step import TunedStep, reencode, tune_encoder

if TYPE_CHECKING:
    from flywheel.training.tuner.export import TunedEncoder

__all__ = ["RetrainError", "RetrainOptions", "RetrainResult", "retrain", "count_new_labels", "MIN_GATE_ROWS",
           "PROMOTE_TRIES"]

_T = TypeVar("_T")

# MIN_GATE_ROWS (training.gate): traffic rows needed to gate a non-flywheel champion on traffic only
PROMOTE_TRIES = 3           # refused promotions (the champion moved) before the challenger is kept


# ----------------------------------------------------------------- metrics
def count_new_labels(store: TrafficLog | None, since: float | None) -> int:
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


# ------------------------------------------------------------------ the job
def retrain(*, store: TrafficLog, registry: Registry, intents: IntentSet, embedder: Embedder,
            options: RetrainOptions | None = None, served_default: Path | None = None,
            embedder_for: Callable[[EmbedderSettings], Embedder] | None = None) -> RetrainResult:
    """Run the retrain job once; see the module docs.

    Parameters
    ----------
    store : TrafficLog
        The traffic log (a :class:`logstore.LogStore`).
    registry : Registry
        The model versions: the champion is its served version (promotions compare and
        swap against its token); the challenger is saved in its ``staging_dir`` and
        published.
    intents : IntentSet
        The intent set to train.
    embedder : Embedder
        Its ``id`` must be the champion's encoder id for the champion to be compared.
    options : RetrainOptions, optional
        How the run behaves (default: ``RetrainOptions()``).
    served_default : Path, optional
        The version directory the default classifier serves while the registry has no
        promoted version (:func:`classifier.versions.default.existing_model_dir`: the starter or
        intent-file model trained into the home's cache). It is then the champion.
    embedder_for : callable, optional
        Builds the encoder an intent set's ``embedder`` settings name: a champion trained with
        another encoder than ``embedder`` (an encoder switch) scores the gate rows encoded by
        its own, so the gate stays paired. Without it such a champion cannot be evaluated
        and the challenger is gated as a first model.
    """
    opts = options if options is not None else RetrainOptions()
    with registry.lock(create=not opts.dry_run) as taken:   # a dry run creates no models home
        if not taken:
            return _skip("another retrain is running", opts.dry_run)
        job = Job(store, registry, intents, embedder, opts, served_default=served_default, embedder_for=embedder_for)
        result = _run(job)
        if not opts.dry_run:
            _record(job, result)
        return result


def _record(job: Job, result: RetrainResult) -> None:
    """Record the finished run in the registry (the sidecars export its time as
    ``flywheel_last_retrain_timestamp_seconds``); a failure to record is only a warning."""
    status = {"finished_at": time.time(), "outcome": result.outcome, "version": result.version,
              "reason": result.reason[:300]}
    if result.report.get("teacher_noise") is not None:   # flywheel_teacher_noise_ratio
        status["teacher_noise"] = result.report["teacher_noise"]
    export = ((result.report.get("tuning") or {}).get("tuner") or {}).get("export_seconds")
    if not isinstance(export, (int, float)):    # kept for the next tuned run's forecast
        export = (job.registry.last_retrain() or {}).get("tune_export_seconds")
    if isinstance(export, (int, float)):
        status["tune_export_seconds"] = export
    try:
        job.registry.record_retrain(status)
    except FlywheelError as exc:
        job.say(f"warning: the run was not recorded in the registry: {exc}")


def _run(job: Job) -> RetrainResult:
    # the tuned encoder's export lives until the run ends (a saved version holds a copy)
    work = tempfile.TemporaryDirectory(prefix="flywheel-tune-") if job.opts.tune is not None else nullcontext()
    with work as workdir:
        return _run_in(job, workdir)


def _run_in(job: Job, workdir: str | None) -> RetrainResult:
    t_start = time.perf_counter()
    run_at = job.opts.run_at()
    champion = _load_champion(job)
    job.say(f"champion: {champion.model.version if champion.model else 'none'}")
    _estimate_teacher_noise(job)
    skip = _should_skip(job, champion.model)
    if skip is not None:
        result = _skip(skip, job.opts.dry_run, job.notes)
        result.report.update(teacher_fields(job))
        return result
    ts, t_data = _timed(_build_data, job, champion.model)
    ts = _filter_teacher(job, ts, champion.model)
    step, tune_report = _tune_encoder(job, ts, champion, workdir) if workdir is not None else (None, None)
    head_only = _fit_head_only(job, ts, champion)
    tuned = _fit_tuned(job, step, champion) if step is not None else None
    trial = Trial(ts, head_only, run_at, t_start, t_data, notes_before_gate=len(job.notes), tuned=tuned,
                  tune_report=tune_report)
    result, challenger = _gate(job, trial, champion)
    if not job.opts.dry_run:
        result = _save(job, trial, champion, challenger, result)
    return result


def _timed(step: Callable[..., _T], *args: Any) -> tuple[_T, float]:
    t0 = time.perf_counter()
    out = step(*args)
    return out, time.perf_counter() - t0


def _load_champion(job: Job) -> Champion:
    """The served version now (nothing promoted: the served default model, with no name
    or token), with its model when usable here (else a note why not)."""
    name, token = job.registry.current()
    if name is None and job.served_default is None:
        job.notes.append("no champion: nothing promoted yet")
        return Champion(None, token, None)
    try:
        if name is None:
            assert job.served_default is not None, "no champion at all returned above"
            champ = IntentModel.load(job.served_default)
            job.notes.append(f"nothing promoted yet: the served default model {champ.version} "
                             f"({job.served_default}) is the champion")
        else:
            champ = job.registry.load(name)
    except ModelError as exc:
        job.notes.append(f"champion {name or job.served_default} cannot be loaded ({exc}); treated as no champion")
        return Champion(name, token, None)
    if champ.encoder_dir is not None:
        return _with_own_encoder(job, name, token, champ)
    emb = job.embedder
    if not champ.encoder_matches(emb.id, emb.dim):
        return _with_other_encoder(job, name, token, champ)
    return Champion(name, token, champ)


def _with_other_encoder(job: Job, name: str | None, token: str | None, champ: IntentModel) -> Champion:
    """A champion trained with another encoder than the challengers' (an encoder switch in
    the intent file): it scores the same gate rows encoded by the encoder its own settings
    build (``job.embedder_for``), so the gate stays paired; when that encoder cannot be
    built here, no champion (a note says why)."""
    enc, emb = champ.manifest.encoder, job.embedder
    who = name or champ.version
    try:
        if job.embedder_for is None:
            raise EmbedderError("no encoder factory was given to the retrain")
        own = job.embedder_for(champ.intents.embedder)
        if (own.id, own.dim) != (enc.get("id"), enc.get("dim")):
            raise EmbedderError(f"its bundled settings build {own.id!r} ({own.dim}-d)")
        own.encode(["warm-up"])   # loads and checks it
    except EmbedderError as exc:
        job.notes.append(f"champion {who} was trained with encoder {enc.get('id')!r} ({enc.get('dim')}-d), not "
                         f"{emb.id!r}, and that encoder cannot be loaded here ({exc}); it cannot be evaluated, "
                         f"so it is treated as no champion")
        return Champion(name, token, None)
    job.notes.append(f"encoder switch: champion {who} uses {own.id} ({own.dim}-d), the challenger {emb.id} "
                     f"({emb.dim}-d); the champion scores the same gate rows encoded by its own encoder (paired)")
    job.say(job.notes[-1])
    return Champion(name, token, champ, own)


def _with_own_encoder(job: Job, name: str | None, token: str | None, champ: IntentModel) -> Champion:
    """A champion that carries its own encoder: usable when that encoder loads (it then
    scores the evaluation sets re-encoded by it, see ``_champion_sets``)."""
    from flywheel.classifier.encoders import open_version_encoder

    assert champ.encoder_dir is not None, "called for a champion that carries its encoder"
    try:
        own = open_version_encoder(champ.encoder_dir, champ.intents.embedder)
        own.encode(["warm-up"])   # loads and checks it
    except EmbedderError as exc:
        job.notes.append(f"champion {name or champ.version}'s own encoder cannot be served here ({exc}); "
                         f"treated as no champion")
        return Champion(name, token, None)
    job.notes.append(f"champion {name or champ.version} carries its own encoder {own.id}: it is evaluated on the "
                     f"evaluation sets re-encoded by it")
    return Champion(name, token, champ, own)


def _champion_sets(job: Job, champion: Champion, ts: TrainingSet) -> dict[str, LabelledSet]:
    """``eval`` and ``recent`` with the champion's vectors: the training set's own when it
    uses the served encoder, else re-encoded by its encoder once per run (timed)."""
    if champion.embedder is None:
        return {"eval": ts.eval, "recent": ts.recent}
    if "sets" not in champion.encoded:
        job.say(f"re-encoding {len(ts.eval) + len(ts.recent):,} evaluation rows with the champion's encoder ...")
        t0 = time.perf_counter()
        champion.encoded["sets"] = reencode({"eval": ts.eval, "recent": ts.recent}, champion.embedder)
        champion.encoded["seconds"] = round(time.perf_counter() - t0, 3)
    return champion.encoded["sets"]


def _should_skip(job: Job, champion: IntentModel | None) -> str | None:
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


def _build_data(job: Job, champion: IntentModel | None) -> TrainingSet:
    o = job.opts
    return build_training_set(job.store, job.intents, embedder=job.embedder,
                              progress=o.progress, self_training_max=o.self_training_max if o.self_training > 0 else 0)


def _estimate_teacher_noise(job: Job) -> None:
    """Step 2b: how often the teacher's label differs from a human label on the same
    decision (:mod:`training.teacher_noise`)."""
    est = estimate_from_log(job.store)
    job.teacher["estimate"] = est
    job.teacher.update(est.report())
    job.say(format_noise(job.teacher["teacher_noise"], job.teacher["teacher_noise_by_intent"]))


def _filter_teacher(job: Job, ts: TrainingSet, champion: IntentModel | None) -> TrainingSet:
    """Step 4a: the training set without the teacher rows the evidence contradicts (with
    ``teacher_filter`` on; off, the report says what it would drop), then the noise guard's."""
    from flywheel.training.teacher_noise import guard_teacher_rows  # the module's import line is full
    est = job.teacher.get("estimate") or NoiseEstimate()
    ts, info = check_training_set(ts, est, champion=champion, encoder_id=job.embedder.id,
                                  enabled=job.opts.teacher_filter)
    job.teacher["teacher_filter"] = info
    job.teacher["teacher_filtered"] = {k: v for k, v in info["dropped"].items() if v}
    counts = {k: v for k, v in (info["dropped"] if info["enabled"] else info["would_drop"]).items() if k in REASONS}
    what = ", ".join(f"{k.replace('_', ' ')} {v:,}" for k, v in counts.items())
    job.say(f"noisy teacher labels dropped: {info['dropped']['noisy_teacher']:,}; "
            f"teacher filter {'on' if info['enabled'] else 'off'}: {sum(counts.values()):,} of "
            f"{info['checked']:,} teacher rows {'dropped' if info['enabled'] else 'would be dropped'} ({what}; "
            f"{info['held_back']['oos_cap']:,} out-of-scope drops held back for the gate)")
    ts, job.teacher["teacher_guard"] = guard_teacher_rows(ts, est, job.opts.max_teacher_noise)
    job.notes.extend(job.teacher["teacher_guard"]["notes"])
    job.say(job.teacher["teacher_guard"]["line"])
    return ts


def _tune_encoder(job: Job, ts: TrainingSet, champion: Champion,
                  workdir: str) -> tuple[TunedStep | None, dict[str, Any]]:
    """Step 4b (:func:`training.tuner.step.tune_encoder`): the tuned encoder and the
    training set re-encoded by it, or ``None`` when tuning failed; and the step's report."""
    sets = _champion_sets(job, champion, ts).values() if champion.model is not None else ()
    made, report = tune_encoder(ts, champion.model, list(sets), store=job.store, opts=job.opts,
                                intents=job.intents, embedder=job.embedder, registry=job.registry,
                                workdir=workdir, say=job.say, notes=job.notes)
    return made, report


def _fit_head_only(job: Job, ts: TrainingSet, champion: Champion) -> Challenger:
    """Steps 5 and 6 for the head-only challenger: the head fitted on the training rows
    and the served encoder's vectors, its cutoffs re-tuned."""
    fitted, t_fit = _timed(_fit_challenger, job, ts, champion.model)
    cutoffs, thresholds = _retune_cutoffs(job, fitted, ts)
    return Challenger(ts, fitted, with_thresholds(fitted, thresholds), cutoffs, t_fit)


def _fit_tuned(job: Job, step: TunedStep, champion: Champion) -> Challenger:
    """Fit the tuned challenger exactly as the head-only one (its rows, its vectors) and
    re-tune its cutoffs the same way; it carries the tuned encoder."""
    job.say("the tuned challenger:")
    fitted, t_fit = _timed(_fit_challenger, job, step.ts, champion.model, step.encoder)
    cutoffs, thresholds = _retune_cutoffs(job, fitted, step.ts, step.sample)
    return Challenger(step.ts, fitted, with_thresholds(fitted, thresholds), cutoffs, t_fit, step)


def _fit_challenger(job: Job, ts: TrainingSet, champion: IntentModel | None,
                    tuned: TunedEncoder | None = None) -> IntentModel:
    """Fit the head on the training rows as they are (their vectors: the served encoder's,
    or with ``tuned`` the tuned encoder's, :func:`training.tuner.fit.train_tuned`; the
    held-out intent examples are not among them); the model bundles the full intent set.
    Self-training rows weigh ``self_training`` and never calibrate the head."""
    layer2 = np.array([s == "layer2" for s in ts.sources], dtype=bool)
    # per-row lists, as fit_from_vectors takes them (the head reads them back into arrays)
    weights = np.where(layer2, job.opts.self_training, 1.0).tolist() if layer2.any() else None
    rows = HeadRows(ts.vectors, ts.labels, sample_weight=weights, fit_only=layer2, negatives=ts.negatives,
                    texts=ts.texts)
    head = IntentHead(target_precision=job.target_precision, coverage=job.intents.thresholds.coverage,
                      operating_point=job.intents.thresholds.target)
    parent = champion.version if champion else None
    job.say(f"fitting the challenger on {len(ts):,} rows ...")
    try:
        if tuned is None:
            model = fit_head(ts.fit_intents, rows, encoder_id=job.embedder.id, version=new_version_name(),
                             parent=parent, head=head)
        else:
            model = train_tuned(ts.fit_intents, tuned, rows=rows, version=new_version_name(), parent=parent, head=head)
    except ValueError as exc:
        raise RetrainError(f"cannot train the challenger: {exc}") from None
    return replace(model, intents=job.intents)


_LOGGED: Any = object()   # _retune_cutoffs' default sample: the logged vectors of the served encoder


def _retune_cutoffs(job: Job, model: IntentModel, ts: TrainingSet,
                    sample: Any = _LOGGED) -> tuple[dict[str, Any], dict[str, float]]:
    """Step 6: re-tune the confident cutoff on the recent slice (and the LLM budget's
    traffic sample: by default of the logged vectors; the tuned challenger passes its own):
    how it was re-tuned (:func:`training.cutoffs.retune`'s report) and the new learned
    thresholds."""
    budget = job.opts.llm_budget
    if sample is _LOGGED:
        sample = traffic_sample(job.store, job.embedder.id, ts) if budget is not None else None
    cutoffs, thresholds = retune(model, ts.recent, job.target_precision, budget, sample)
    if cutoffs.get("method") == "risk":
        job.say(f"deferral cutoff: P(wrong) > {fmt_probs(cutoffs['defer'], digits=3)[0]} goes to the LLM "
                f"(expected LLM share {cutoffs.get('llm_share_expected', 'n/a')})")
    else:
        cv, served = fmt_probs(cutoffs["cv_confident"], cutoffs["confident"], digits=3)
        job.say(f"confident cutoff: {cv} (cross-validation) -> {served} ({cutoffs['method']})")
    if "risk_ece_recent" in cutoffs:
        job.say(f"deferral model calibration: ECE {cutoffs['risk_ece_recent']:.3f} on {cutoffs['n']:,} recent "
                f"labelled rows (out of fold: {model.head.metrics_.get('oof_risk_ece', float('nan')):.3f})")
    return cutoffs, thresholds


def _gate(job: Job, trial: Trial, champion: Champion) -> tuple[RetrainResult, IntentModel]:
    """Steps 7 and 8 against ``champion``: the result (with its report) and the challenger
    put forward as saved (its metrics do not depend on the champion)."""
    champion, cut = _at_target(job, trial, champion)
    ev, t_eval = _timed(_evaluate, job, trial, champion)
    chosen = trial.tuned if trial.tuned is not None and ev.choice.get("put_forward") == "tuned" else trial.head_only
    outcome, reason, checks = _decide(job, chosen.model, champion.model, ev)
    if job.opts.dry_run and outcome == "promoted":     # nothing is promoted in a dry run
        outcome = "would_shadow" if job.opts.shadow else "would_promote"
    model = with_run_metrics(chosen, trial.ts, ev)
    timing = run_timing(trial, champion, model, t_eval)
    report = run_report(job, model.version, trial.run_at, outcome, reason, checks, champion.model, ev, trial.ts,
                        timing, {"cross_validation": learned_thresholds(chosen.fitted),
                                 "tuning": chosen.cutoffs,
                                 "saved": dict(model.manifest.thresholds),
                                 **({"target": {"target": job.intents.thresholds.target, "champion": cut,
                                                "challenger": chosen.fitted.manifest.metrics.get("operating_point")}}
                                    if job.intents.thresholds.target else {})}, trial)
    return _result(job, report), model


def _at_target(job: Job, trial: Trial, champion: Champion) -> tuple[Champion, dict | None]:
    """The champion cut at the intent set's ``thresholds.target``, as the challengers are
    (:func:`training.cutoffs.at_target`, on its held-out ``recent`` rows), and how; a note says so."""
    target = job.intents.thresholds.target
    if champion.model is None or not target:
        return champion, None
    model, cut = at_target(champion.model, target, _champion_sets(job, champion, trial.ts)["recent"])
    if cut is not None:
        (kind, want), = target.items()
        job.notes.append(f"gated at the target {kind} {want:g}: the challenger cut out of fold, the champion "
                         f"{cut['how']}" + (f" ({cut['cutoff']} {cut['value']:.3f})" if "value" in cut else ""))
    return replace(champion, model=model), cut


def _evaluate(job: Job, trial: Trial, champion: Champion) -> Evaluation:
    """The champion and the challengers on the same sets, each with its own encoder's
    vectors and its serving thresholds; with a tuned challenger, the pick of the one put
    forward (fixed at the first gate: it is the one saved)."""
    ts, cp = trial.ts, champion.model
    change = intent_change(job.intents, cp, ts) if cp is not None else None
    gate = _gate_name(job, cp, ts) if change is None else "shared"
    sets = _sets(ts.eval, ts.recent, gate, change)
    if change is not None:
        rename = (" (a renamed intent is a removal plus an addition: the old name's logged labels are dropped)"
                  if change.added and change.removed else "")
        job.notes.append(f"the intent set changed since champion {cp.version if cp else '?'} ({change.words()}): "
                         f"gated on the {len(sets['shared']):,} held-out rows of the intents both sets share "
                         f"(out of scope included; none of the {len(change.seen):,} texts the champion trained on), "
                         f"kept only if measurably worse there{rename}")
    head = model_metrics(trial.head_only.model, sets, gate)
    cp_sets = None
    if cp is not None:
        own = _champion_sets(job, champion, ts)
        cp_sets = _sets(own["eval"], own["recent"], gate, change)
    cp_metrics = model_metrics(cp, cp_sets, gate) if cp is not None and cp_sets is not None else None
    tuned = trial.tuned
    if tuned is None:
        why = "encoder tuning is off" if trial.tune_report is None else "encoder tuning failed"
        return Evaluation(gate, sets, head, cp_metrics, cp_sets, head, None,
                          {"put_forward": "head_only", "reason": why, "paired": None, "by_language": {},
                           "languages": "none"}, change)
    t_sets = _sets(tuned.ts.eval, tuned.ts.recent, gate, change)
    t_metrics = model_metrics(tuned.model, t_sets, gate)
    choice = pick_challenger(trial.head_only.model, tuned.model, head, t_metrics, sets[gate], t_sets[gate],
                             job.opts.tolerance, job.intents.languages, _gate_languages(job, sets[gate]))
    if trial.pick is None:
        trial.pick = choice["put_forward"]
        job.say(f"put forward: the {_CHALLENGER[trial.pick]} challenger ({choice['reason']})")
    elif choice["put_forward"] != trial.pick:
        choice = {**choice, "put_forward": trial.pick,
                  "reason": f"the {_CHALLENGER[trial.pick]} challenger was put forward at the first gate and saved "
                            f"(on this gate set: {choice['reason']})"}
    if choice["put_forward"] == "tuned":
        return Evaluation(gate, t_sets, t_metrics, cp_metrics, cp_sets, head, t_metrics, choice, change)
    return Evaluation(gate, sets, head, cp_metrics, cp_sets, head, t_metrics, choice, change)


_CHALLENGER = {"head_only": "head-only", "tuned": "tuned"}


def _gate_languages(job: Job, rows: LabelledSet) -> list[str | None] | None:
    """Each gate row's language: the logged one; for a row without one (a held-out intent
    example, a decision logged before the column) of a set declaring two or more
    languages, the one classify's detector gives its text (:mod:`classifier.language`), so
    English-heavy traffic cannot hide what a challenger costs the held-out Spanish examples.
    ``None`` for a row with neither; ``None`` when no row has one."""
    ids = [d for d in rows.decision_ids if d]
    got = job.store.decision_languages(ids) if ids else {}
    langs: list[str | None] = [got.get(d) if d else None for d in rows.decision_ids]
    if len(job.intents.languages) > 1 and not all(langs):
        detector = LanguageDetector(job.intents.languages)
        langs = [lang or _detected(detector, text) for lang, text in zip(langs, rows.texts)]
    return langs if any(langs) else None


def _detected(detector: LanguageDetector, text: str) -> str | None:
    """The text's language, ``None`` for an erased text or one the detector cannot tell."""
    lang = detector.detect(text) if text else UNKNOWN
    return None if lang == UNKNOWN else lang


def _sets(ev: LabelledSet, recent: LabelledSet, gate: str, change: Change | None = None) -> dict[str, LabelledSet]:
    """The evaluation sets for the gate set ``gate`` from ``eval`` and ``recent`` (any
    encoder's vectors: the rows and their order depend only on the training set). With a
    changed intent set, ``shared`` (the gate set: the rows of ``eval`` and ``recent`` of
    the intents both sets share) and ``recent_shared`` (the LLM share's)."""
    sets = {"eval": ev, "recent": recent}
    if gate == "eval_traffic":
        sets["eval_traffic"] = ev.where(lambda s: s != "intent_example").concat(recent)
    if change is not None:
        sets["shared"] = change.rows(ev.concat(recent))
        sets["recent_shared"] = change.rows(recent)
    return sets


def _gate_name(job: Job, champion: IntentModel | None, ts: TrainingSet) -> str:
    """The gate set's name, with a note when it is not ``eval``: the fixed ``eval`` set; a
    champion not trained by this job (its manifest lacks ``metrics.eval_split == SPLIT_ID``)
    may have trained on the held-out intent examples, so it is compared on the traffic part
    instead (held-out human labels + the recent slice) when that has :data:`MIN_GATE_ROWS`."""
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
    return gate


def _decide(job: Job, challenger: IntentModel, champion: IntentModel | None,
            ev: Evaluation) -> tuple[str, str, list[dict[str, Any]]]:
    if ev.change is not None and champion is not None and ev.champion_sets is not None:
        share_on = "recent_shared" if len(ev.sets["recent_shared"]) else "shared"
        return decide_changed(challenger, champion, ev.sets["shared"], ev.champion_sets["shared"],
                              ev.sets[share_on], ev.champion_sets[share_on], job.opts.tolerance, job.notes,
                              ev.change.words())
    rows = ev.sets[ev.gate] if ev.champion else None
    return decide(challenger, champion, ev.challenger, ev.champion, rows, ev.gate, job.opts.tolerance, job.notes,
                  champion_data=ev.champion_sets[ev.gate] if ev.champion and ev.champion_sets else None,
                  langs=_gate_languages(job, rows) if rows is not None and len(rows) else None,
                  declared=job.intents.languages, promote_untested=job.opts.promote_untested)


def _result(job: Job, report: dict[str, Any]) -> RetrainResult:
    """The run's result with its markdown."""
    dry_run = job.opts.dry_run
    result = RetrainResult(report["outcome"], report["version"], report["reason"], challenger=report["challenger"],
                           champion=report["champion"], dry_run=dry_run, report=jsonable(report))
    result.markdown = render_markdown(result)
    job.say(result.summary_line())  # the markdown is the caller's to print (the CLI does on a dry run)
    return result


def _save(job: Job, trial: Trial, champion: Champion, model: IntentModel,
          result: RetrainResult) -> RetrainResult:
    """Save the challenger with ``report.json`` and ``report.md`` in the registry's staging
    directory and publish it; promote it if it won, against the token of the champion it
    was gated against. A champion that moved meanwhile is gated against first (before
    publishing, and after each refused promotion, at most :data:`PROMOTE_TRIES`)."""
    path = job.registry.staging_dir(model.version)
    model.save(path)
    _record_storage(job, champion, path, result)
    if result.outcome == "promoted":
        champion, result = _follow(job, trial, champion, result)
    if result.outcome == "promoted" and job.opts.shadow:
        result = _as_shadow(job, result)
    write_reports(path, result)
    name = job.registry.publish(path)
    if result.outcome == "shadowed":
        job.registry.set_shadow(name)
        job.say(f"published {name} as the shadow version")
        return result
    if result.outcome != "promoted":
        return result
    for _ in range(PROMOTE_TRIES):
        try:
            job.registry.promote(name, expected=champion.token)
        except PromotionConflict as exc:
            conflict = exc
            champion, result = _follow(job, trial, champion, result)
            write_reports(path, result)
            if result.outcome != "promoted":
                return result
            continue
        job.say(f"promoted {name}")
        return result
    # refused PROMOTE_TRIES times: the champion keeps moving
    moved = trial.moves[-1] if trial.moves else (conflict.expected, conflict.found)
    result = _overrule(job, result, f"champion moved during the run ({_moved(*moved)}); not overwritten")
    write_reports(path, result)
    return result


def _record_storage(job: Job, champion: Champion, path: Path, result: RetrainResult) -> None:
    """``report["storage"]`` (:func:`classifier.encoders.blobs.version_storage`): the saved
    version's own bytes, the shared encoder blobs it names, and what a replica serving the
    champion downloads to follow a promotion to it (its files + the blobs the champion lacks)."""
    from flywheel.classifier.encoders.blobs import version_storage

    champ = champion.model.path if champion.model is not None else None
    st = version_storage(path, [champ] if champ is not None else [])
    result.report["storage"] = st
    result.markdown = render_markdown(result)
    job.say(f"{path.name}: {st['own_bytes'] / 1e6:.1f} MB of its own + {st['blob_bytes'] / 1e6:.1f} MB of shared "
            f"encoder blobs; a replica serving {champion.name or 'nothing'} downloads "
            f"{st['download_bytes'] / 1e6:.1f} MB to follow a promotion to it")


def _as_shadow(job: Job, result: RetrainResult) -> RetrainResult:
    """``result`` (a winner) turned into ``shadowed``: published as the shadow, not promoted."""
    return _result(job, {**result.report, "outcome": "shadowed", "promoted": False,
                         "reason": f"{result.reason}; published as the shadow version (scored on live traffic, "
                                   f"enforcing nothing; flywheel models promote --from-shadow promotes it)"})


def _follow(job: Job, trial: Trial, champion: Champion,
            result: RetrainResult) -> tuple[Champion, RetrainResult]:
    """The champion now and the result gated against it (unchanged when it did not move)."""
    _, token = job.registry.current()
    return (champion, result) if token == champion.token else _regate(job, trial, champion)


def _regate(job: Job, trial: Trial, old: Champion) -> tuple[Champion, RetrainResult]:
    """Load the champion that replaced ``old`` and repeat steps 7 and 8 against it. The
    challenger is kept, not promoted, when it loses that gate, or when the new champion is
    another retrain of ``old`` (its manifest's ``parent``: two retrains raced and the other
    won); the reason and the notes say which version it found."""
    mark = trial.notes_before_gate
    del job.notes[mark:]                       # the last gate's notes were about the old champion
    champion = _load_champion(job)
    trial.moves.append((old.name, champion.name))
    job.notes[mark:mark] = [f"the champion moved during the run ({_moved(*m)}): the challenger was gated again "
                            f"against {m[1] or 'none'}" for m in trial.moves]
    job.say(job.notes[mark + len(trial.moves) - 1])
    result, _ = _gate(job, trial, champion)
    parent = old.model.version if old.model is not None else None
    new = champion.model
    if result.outcome == "promoted" and new is not None and new.manifest.metrics.get("eval_split") == SPLIT_ID \
            and new.manifest.parent == parent:
        result = _overrule(job, result, f"champion moved during the run ({_moved(old.name, champion.name)}), "
                                        f"to another retrain of {old.name or 'no champion'}; not overwritten")
    return champion, result


def _moved(expected: str | None, found: str | None) -> str:
    return f"expected {expected or 'none'}, found {found or 'none'}"


def _overrule(job: Job, result: RetrainResult, reason: str) -> RetrainResult:
    """``result`` turned into ``kept`` for ``reason`` (the gate's metrics unchanged)."""
    return _result(job, {**result.report, "outcome": "kept", "reason": reason, "promoted": False})
