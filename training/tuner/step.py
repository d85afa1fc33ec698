"""The retrain's encoder-tuning step, as data: what the tuner trains on, which intent pairs
it oversamples, and the training set re-encoded by another encoder.

- :func:`tuning_rows`: the training rows the tuner sees: intent examples, human labels
  (already resolved over the teacher's), teacher labels and, with self-training on, layer
  2's confident decisions at their weight. Rows whose text retention erased (text ``""``:
  they train the head-only challenger on their logged vectors) cannot be re-encoded: they
  are left out and counted.
- :func:`confusion_pairs`: the intent pairs (``None``: out of scope) a model confuses most
  on labelled rows, both directions counted together: the tuner's hard pairs.
- :func:`reencode`: a :class:`~training.rows.LabelledSet` with new vectors from
  ``embedder`` (same rows, same order), every distinct text encoded once;
  :func:`reencode_training_set` does it for a whole training set (rows without text left
  out), its evaluation sets and its synthetic negatives, in one ``encode`` call.
- :func:`reencode_forecast`, :func:`export_forecast` and :func:`tuner_budget`: re-encoding
  (issue 22) and the ONNX export (issue 32) are part of ``embedder.tune.budget_s``, so the
  tuner gets the budget less a forecast of both: the re-encoding timed on a probe of the
  texts before the tuning starts, the export from the last one's seconds (else the base
  encoder's weight bytes); :func:`export_seconds` finds that last export for a registry.
- :func:`tune_encoder`: the step itself (retrain step 4b): tune and export the intent set's
  base encoder within the budget, with those hard pairs, and re-encode the training set by
  it (a :class:`TunedStep`), or ``None`` and a note when the tuning fails.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from flywheel.classifier.errors import EmbedderError, TrainingError
from flywheel.classifier.layer2.negatives import synthetic_negatives
from flywheel.training.cutoffs import TRAFFIC_SAMPLE_ROWS, TrafficSample, traffic_sample
from flywheel.training.layer2 import layer2_predict
from flywheel.training.options import RetrainOptions
from flywheel.training.protocols import TrafficLog
from flywheel.training.rows import LabelledSet, TrainingSet

if TYPE_CHECKING:   # the intent model and the export's encoders load with the retrain, not with this module
    from flywheel.classifier.protocols import Embedder, Registry
    from flywheel.classifier.settings.intents import EmbedderSettings, IntentSet, TuneSettings
    from flywheel.classifier.versions.model import IntentModel
    from flywheel.training.tuner.export import TunedEncoder

__all__ = ["HARD_PAIRS", "MIN_TUNER_SHARE", "EXPORT_BYTES_PER_S", "TunedStep", "candidate_pairs", "confusion_pairs",
           "encode_texts", "export_forecast", "export_seconds", "hard_pairs_of", "reencode", "reencode_forecast",
           "reencode_rows", "reencode_training_set", "tune_encoder", "tuner_budget", "tuning_rows", "unlabelled_pool"]

HARD_PAIRS = 5      # the champion's most confused intent pairs handed to the tuner
REENCODE_PROBE = 256     # texts encoded (and timed) to forecast the re-encoding
REENCODE_MARGIN = 1.2    # the forecast's safety factor
MIN_TUNER_SHARE = 0.25   # of the budget, always left to the tuner however long re-encoding will take
#: a first export's forecast: MiniLM-L6's 90 MB of weights took 45 s to export, check and quantise (issue 32)
EXPORT_BYTES_PER_S = 2e6
_WEIGHTS = (".safetensors", ".bin", ".pt", ".pth")


def tuning_rows(ts: LabelledSet, self_training_weight: float) -> tuple[list[str], list[str | None], list[float], int]:
    """``(texts, labels, sample_weight, rows_without_text)`` of the training rows that
    have a text (see the module docs); ``layer2`` rows weigh ``self_training_weight``."""
    keep = [i for i, t in enumerate(ts.texts) if t]
    weights = [float(self_training_weight) if ts.sources[i] == "layer2" else 1.0 for i in keep]
    return ([ts.texts[i] for i in keep], [ts.labels[i] for i in keep], weights, len(ts) - len(keep))


def confusion_pairs(model: IntentModel, sets: Sequence[LabelledSet], k: int = HARD_PAIRS) -> list[dict[str, Any]]:
    """The ``k`` intent pairs ``model`` (its serving thresholds) confuses most on ``sets``:
    ``[{"pair": [a, b], "errors": n}]``, most errors first (``None``: out of scope; a pair
    is unordered, both directions counted together)."""
    counts: Counter = Counter()
    for data in sets:
        if not len(data):
            continue
        for truth, said in zip(data.labels, layer2_predict(model, data.vectors).labels):
            if truth != said:
                counts[tuple(sorted((truth, said), key=lambda v: (v is None, v or "")))] += 1
    return [{"pair": list(p), "errors": int(n)} for p, n in counts.most_common(k)]


def candidate_pairs(sets: Sequence[Sequence[str | None]], k: int = HARD_PAIRS) -> list[dict[str, Any]]:
    """The ``k`` intent pairs the teacher's candidate sets name most often (issue 24: a
    candidate set is never a training label, but its intents are ones the teacher found
    close, so they are hard negatives for the tuner): ``[{"pair": [a, b], "sets": n}]``,
    most first; a set of three names its three pairs; ``None`` is out of scope."""
    counts: Counter = Counter()
    for cands in sets:
        uniq = sorted(set(cands), key=lambda v: (v is None, v or ""))
        for i, a in enumerate(uniq):
            for b in uniq[i + 1:]:
                counts[(a, b)] += 1
    return [{"pair": list(p), "sets": int(n)} for p, n in counts.most_common(k)]


def hard_pairs_of(confused: Sequence[dict[str, Any]], candidates: Sequence[dict[str, Any]]) -> list[tuple]:
    """The tuner's hard pairs: the champion's confusions, then the teacher's candidate-set
    pairs not among them."""
    out = [tuple(p["pair"]) for p in confused]
    return out + [tuple(p["pair"]) for p in candidates if tuple(p["pair"]) not in out]


def encode_texts(embedder: Embedder, texts: Sequence[str]) -> dict[str, np.ndarray]:
    """text -> vector for every distinct text of ``texts``, in one ``encode`` call."""
    uniq = list(dict.fromkeys(texts))
    if not uniq:
        return {}
    X = np.asarray(embedder.encode(uniq), dtype=np.float32)
    return dict(zip(uniq, X))


def reencode_rows(ts: TrainingSet, sample_rows: int = 0) -> int:
    """How many texts a tuned challenger re-encodes: the training rows that have a text, the
    evaluation and recent-traffic rows, the synthetic negatives and ``sample_rows`` (the
    LLM-budget sample's)."""
    negatives = ts.fit_intents.synthetic_negatives if ts.negatives is not None else 0
    return sum(1 for t in ts.texts if t) + len(ts.eval) + len(ts.recent) + negatives + int(sample_rows)


def reencode_forecast(embedder: Embedder, texts: Sequence[str], n_rows: int, seed: int = 0) -> float:
    """Seconds ``embedder`` will take to encode ``n_rows`` texts (times
    :data:`REENCODE_MARGIN`), timed on a seeded sample of :data:`REENCODE_PROBE` of
    ``texts`` (a sample, since the first rows are the short intent examples; not through a
    cache, which would forecast nothing). A tuned encoder of the same architecture encodes
    at the same speed; 0 when there is nothing to time."""
    from flywheel.classifier.encoders.cache import uncached

    embedder = uncached(embedder)
    distinct = [t for t in dict.fromkeys(texts) if t]
    if not distinct or n_rows <= 0:
        return 0.0
    rng = np.random.default_rng(seed)
    probe = [distinct[i] for i in rng.choice(len(distinct), min(REENCODE_PROBE, len(distinct)), replace=False)]
    embedder.encode(probe[:8])          # a first call may load or warm the encoder: not timed
    t0 = time.perf_counter()
    embedder.encode(probe)
    return REENCODE_MARGIN * (time.perf_counter() - t0) * n_rows / len(probe)


def export_forecast(base_dir: Path | None, previous_s: float | None = None) -> float:
    """Seconds the ONNX export of a tuned encoder will take (it is part of the budget too):
    the last export's seconds on this registry (``previous_s``) times :data:`REENCODE_MARGIN`,
    else, for a first export, the base encoder's weight bytes at :data:`EXPORT_BYTES_PER_S`;
    0 when neither is known (an adapter's export is a small file)."""
    if previous_s is not None and previous_s > 0:
        return REENCODE_MARGIN * float(previous_s)
    if base_dir is None or not Path(base_dir).is_dir():
        return 0.0
    weights = sum(p.stat().st_size for p in Path(base_dir).rglob("*") if p.is_file() and p.suffix in _WEIGHTS)
    return weights / EXPORT_BYTES_PER_S


def tuner_budget(budget_s: float, forecast_s: float) -> float:
    """The tuner's share of ``budget_s`` once ``forecast_s`` of re-encoding is set aside,
    never below :data:`MIN_TUNER_SHARE` of it."""
    return max(MIN_TUNER_SHARE * budget_s, budget_s - forecast_s)


def _rows(data: LabelledSet, vectors: dict[str, np.ndarray], dim: int) -> LabelledSet:
    X = np.stack([vectors[t] for t in data.texts]).astype(np.float32, copy=False) if len(data) \
        else np.zeros((0, dim), np.float32)
    return LabelledSet(list(data.texts), list(data.labels), X, list(data.sources), list(data.decision_ids))


def reencode(sets: dict[str, LabelledSet], embedder: Embedder) -> dict[str, LabelledSet]:
    """``sets`` with their vectors made by ``embedder`` (same rows, same order); every
    distinct text is encoded once. Every row must have its text."""
    texts = [t for data in sets.values() for t in data.texts]
    if any(not t for t in texts):
        raise ValueError("a row without text cannot be re-encoded")
    vectors = encode_texts(embedder, texts)
    dim = int(embedder.dim)
    return {name: _rows(data, vectors, dim) for name, data in sets.items()}


def reencode_training_set(ts: TrainingSet, embedder: Embedder) -> TrainingSet:
    """``ts`` encoded by ``embedder``: its training rows that have a text (rows without
    one left out), ``eval``, ``recent`` and the synthetic negatives, in one ``encode``
    call. The report, split and keys are ``ts``'s."""
    keep = [i for i, t in enumerate(ts.texts) if t]
    train = ts.select(keep)
    neg_texts = list(synthetic_negatives(ts.fit_intents.synthetic_negatives)) if ts.negatives is not None else []
    texts = list(train.texts) + list(ts.eval.texts) + list(ts.recent.texts) + neg_texts
    vectors = encode_texts(embedder, texts)
    dim = int(embedder.dim)
    rows = _rows(train, vectors, dim)
    negatives = np.stack([vectors[t] for t in neg_texts]).astype(np.float32, copy=False) if neg_texts else None
    return replace(ts, texts=rows.texts, labels=rows.labels, vectors=rows.vectors, sources=rows.sources,
                   decision_ids=rows.decision_ids, eval=_rows(ts.eval, vectors, dim),
                   recent=_rows(ts.recent, vectors, dim), negatives=negatives)


@dataclass
class TunedStep:
    """What the tuning step made: the tuned encoder and the training set re-encoded by it."""

    ts: TrainingSet               # the training set re-encoded by the tuned encoder (rows without text left out)
    encoder: TunedEncoder         # the tuned encoder or adapter, its export in the run's temporary directory;
                                  # its fit_only and views are per row of ts (training.tuner.fit.train_tuned)
    report: dict[str, Any]        # the tuning step's report
    sample: TrafficSample | None = None  # the LLM-budget sample, re-encoded (None: no budget, or too small)


def tune_encoder(ts: TrainingSet, champion: IntentModel | None, champion_sets: Sequence[LabelledSet], *,
                 store: TrafficLog, opts: RetrainOptions, intents: IntentSet, embedder: Embedder,
                 registry: Registry, workdir: str, say: Callable[[str], None],
                 notes: list[str]) -> tuple[TunedStep | None, dict[str, Any]]:
    """Retrain step 4b (see :mod:`training.retrain`): the tuned encoder and the training set
    re-encoded by it, or ``None`` when tuning failed (a note says why); and the step's report.

    Fine-tunes the intent set's base encoder (:func:`training.tuner.export.tune_and_export`)
    within ``tune.budget_s`` less the forecasts of the re-encoding and of the ONNX export
    (:func:`reencode_forecast`, :func:`export_seconds`) on the training rows' texts, labels
    and weights (:func:`tuning_rows`: rows whose text retention erased are left out, counted
    as ``rows_without_text``), with the champion's most confused intent pairs as hard pairs
    (:func:`confusion_pairs` on ``champion_sets``, the evaluation sets with the champion's
    own vectors) and the pairs the teacher's candidate sets name most (:func:`candidate_pairs`:
    an unsure answer is never a label, but its intents are hard negatives;
    ``candidate_set_pairs`` in the report). The export goes to ``workdir`` (the retrain
    removes it when the run ends; a saved version holds its own copy). Then every training
    row that has a text, the synthetic negatives and the evaluation sets are re-encoded by
    the tuned encoder (same rows, same order; timed apart from the tuning). A tuning that
    fails (an encoder that cannot be tuned, unusable data, an export that disagrees with
    torch) returns ``None``. ``embedder``: the served encoder (the forecasts')."""
    from flywheel.training.tuner.export import tune_and_export

    tune = opts.tune
    assert tune is not None
    texts, labels, weights, n_textless = tuning_rows(ts, opts.self_training)
    pairs = confusion_pairs(champion, list(champion_sets)) if champion is not None else []
    # the teacher's candidate sets: never a training label, but intents it found close (issue 24)
    cand = candidate_pairs(store.unsure_candidate_sets()) if opts.candidate_pairs else []
    hard = hard_pairs_of(pairs, cand)
    report: dict[str, Any] = {
        "settings": asdict(tune), "base": intents.embedder.backend, "rows": len(texts),
        "rows_without_text": n_textless, "hard_pairs": pairs,
        "hard_pairs_from": (f"champion {champion.version}'s errors on the eval and recent sets"
                            if champion is not None else "no champion: none"),
        "candidate_set_pairs": cand}
    if n_textless:
        say(f"{n_textless:,} training rows have no text (retention erased it): they cannot be re-encoded, "
            f"so the tuned challenger trains without them")
    # re-encoding (issue 22) and the export (issue 32) are part of the budget: the tuner gets
    # what their forecasts leave
    t0 = time.perf_counter()
    n_reencode = reencode_rows(ts, TRAFFIC_SAMPLE_ROWS if opts.llm_budget is not None else 0)
    forecast = reencode_forecast(embedder, texts, n_reencode)
    export = export_seconds(registry, champion, intents.embedder, tune)
    budget = tuner_budget(tune.budget_s, forecast + export + (time.perf_counter() - t0))
    report.update(reencode_forecast_seconds=round(forecast, 2), export_forecast_seconds=round(export, 2),
                  tuner_budget_s=round(budget, 2))
    no_time = _budget_spent(tune.budget_s, forecast, export)
    if no_time is not None:
        return _no_tuning(report, no_time, t0, say, notes)
    say(f"tuning the encoder on {len(texts):,} rows with {len(hard)} hard pairs (budget {tune.budget_s:g} s: "
        f"{budget:.0f} s to tune, {export:.0f} s set aside for the ONNX export and {forecast:.0f} s to "
        f"re-encode about {n_reencode:,} rows) ...")
    pool = unlabelled_pool(store, tune, report, say)
    try:
        out = tune_and_export(texts, labels, intents.embedder, replace(tune, budget_s=budget), workdir,
                              sample_weight=weights, hard_pairs=hard, unlabelled=pool,
                              progress=lambda line: say(f"tuning: {line}"))
        report.update(step_seconds=round(time.perf_counter() - t0, 3), encoder_id=out.embedder.id,
                      stopped_by_budget=bool(out.report.get("stopped_early")), tuner=out.report)
        t1 = time.perf_counter()
        tuned_ts = reencode_training_set(ts, out.embedder)
        sample = (traffic_sample(store, embedder.id, tuned_ts, encoder=out.embedder)
                  if opts.llm_budget is not None else None)
    except (TrainingError, EmbedderError) as exc:
        return _no_tuning(report, f"encoder tuning failed ({exc})", t0, say, notes)
    except ImportError as exc:   # an install without torch or transformers: the head-only challenger serves
        return _no_tuning(report, f"encoder tuning needs {exc.name or 'torch'}, which is not installed "
                                  f"({exc})", t0, say, notes)
    report["reencode_seconds"] = round(time.perf_counter() - t1, 3)
    report["reencoded_rows"] = len(tuned_ts) + len(tuned_ts.eval) + len(tuned_ts.recent)
    spent = time.perf_counter() - t0
    report["budget_overrun_seconds"] = round(max(0.0, spent - tune.budget_s), 2)
    if report["budget_overrun_seconds"] > 0:
        say(f"the tuning step took {spent:.0f} s, {report['budget_overrun_seconds']:.0f} s over its "
            f"{tune.budget_s:g} s budget (an export or re-encoding slower than forecast)")
    stage = out.report.get("unlabelled_stage")
    if stage is not None:
        say(f"unlabelled stage: {stage['steps']} SimCSE steps on {stage['rows']:,} logged queries in "
            f"{stage['seconds']:.0f} s" + (" (stopped by its budget)" if stage["stopped_early"] else ""))
    say(f"encoder tuned ({out.report.get('steps')} steps in {out.report.get('seconds')} s"
        + (", stopped by its budget" if report["stopped_by_budget"] else "") + f"; {out.embedder.id}); "
        f"{report['reencoded_rows']:,} rows re-encoded in {report['reencode_seconds']:.2f}s")
    return TunedStep(tuned_ts, out, report, sample=sample), report


def unlabelled_pool(store: TrafficLog, tune: TuneSettings, report: dict[str, Any],
                    say: Callable[[str], None]) -> list[str] | None:
    """The logged queries for the unlabelled stage when ``tune.unlabelled`` asks for one: up
    to ``tune.unlabelled_rows`` distinct texts (a draw seeded by ``tune.seed``; retention-erased
    texts never), counted in ``report["unlabelled_pool"]``; ``None`` without a stage."""
    if tune.unlabelled <= 0.0:
        return None
    pool = store.query_texts(int(tune.unlabelled_rows), int(tune.seed))
    report["unlabelled_pool"] = len(pool)
    say(f"unlabelled stage: {len(pool):,} distinct logged queries (at most {tune.unlabelled_rows:,}), "
        f"{tune.unlabelled:.0%} of the tuner's budget")
    return pool


def _budget_spent(budget_s: float, reencode_s: float, export_s: float) -> str | None:
    """Why tuning is not started, or ``None``: the forecasts of the re-encoding and the
    export alone fill ``budget_s`` (a tuned encoder would arrive after the budget)."""
    if reencode_s + export_s < budget_s:
        return None
    return (f"encoder tuning skipped: re-encoding ({reencode_s:.0f} s) and the ONNX export ({export_s:.0f} s) "
            f"alone are forecast to take the whole {budget_s:g} s budget (raise --tune-budget or "
            f"embedder.tune.budget_s)")


def _no_tuning(report: dict[str, Any], why: str, t0: float, say: Callable[[str], None],
               notes: list[str]) -> tuple[None, dict[str, Any]]:
    """The step's answer when there is no tuned encoder: the report says why (``error``),
    and a note says the head-only challenger alone goes to the gate."""
    report["error"] = why
    report.setdefault("step_seconds", round(time.perf_counter() - t0, 3))
    notes.append(f"{why}; only the head-only challenger was fitted")
    say(notes[-1])
    return None, report


def export_seconds(registry: Registry, champion: IntentModel | None, settings: EmbedderSettings,
                   tune: TuneSettings) -> float:
    """The tuned encoder's export forecast (:func:`export_forecast`): from the last export's
    seconds ``registry`` recorded (the last run's record, else the champion's manifest),
    else from the base encoder's weights (an adapter: none)."""
    from flywheel.training.tuner import finetune
    from flywheel.training.tuner.export import ADAPTER

    if tune.objective == ADAPTER:
        return 0.0
    last = registry.last_retrain() or {}
    previous = last.get("tune_export_seconds")
    if not isinstance(previous, (int, float)) and champion is not None:
        previous = champion.manifest.metrics.get("encoder_export_seconds")
    try:
        base = finetune.tunable_base(settings)
    except (TrainingError, EmbedderError, OSError):
        base = None          # the tuning fails on it in a moment, with its note
    return export_forecast(base, previous if isinstance(previous, (int, float)) else None)
