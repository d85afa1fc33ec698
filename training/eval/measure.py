"""Measure a classifier on labelled queries: accuracy, CLINC150's in-scope accuracy and
out-of-scope recall, macro F1, calibration, tiers, latency and throughput.

:func:`evaluate` returns a JSON-serialisable report dict (:mod:`training.eval.render`
prints and draws it).

Definitions (``None`` = out of scope, also written ``OUT_OF_SCOPE`` in the report):

- ``accuracy``, ``in_scope_accuracy``, ``oos_recall``, ``oos_precision``, ``macro_f1``,
  ``per_intent``, ``confused_pairs`` and ``confusion``: of the decisions' labels
  (:func:`training.metrics.classification_metrics`);
- ``ece``, ``top3_accuracy``, ``reliability``: from layer 2 alone (the head's
  calibrated in-scope probabilities, without the out-of-scope gate), over in-scope
  queries;
- ``set_coverage`` and ``mean_set_size``: over in-scope queries, the share whose true
  intent is in layer 2's conformal prediction set, and the set's mean size
  (``nominal_coverage`` is what the set was calibrated for);
- ``cutoff_precision``: per answered intent (``OUT_OF_SCOPE`` for rejections), the cutoff
  that makes layer 2 sure of it and the precision of its sure answers on these queries
  (``sure_precision`` over all of them; ``deferral`` names the rule);
- ``risk_ece``: calibration of the deferral model's P(wrong) against layer 2's answers;
- ``tradeoff``: layer 2's trade curves on these queries as one cutoff sweeps, and
  ``operating_point`` (with a ``thresholds.target``): the cutoff it chose and the target's
  figure here with its n (:mod:`classifier.layer2.operating_point`);
- ``by_language`` (only when some queries carry a language): ``n``, ``n_in_scope``,
  ``n_out_of_scope``, ``accuracy``, ``in_scope_accuracy``, ``oos_recall``,
  ``oos_precision`` and ``macro_f1`` per language, queries without one under
  ``"unknown"``;
- ``gate``: how often the out-of-scope gate throws an in-scope query away
  (:func:`gate_figures`): ``n_in_scope``, ``rejected_sure`` (layer 2 served it as out of
  scope, sure, without asking the teacher) and ``served_out_of_scope`` (whatever layer
  served it), overall and ``by_language`` (the file's languages, else the detected ones);
- ``followups`` (only for a multi-turn file, ``followups`` given): the follow-ups' ``n``,
  ``accuracy`` and ``served_out_of_scope``, and these ``by_language``
  (:func:`training.eval.sessions.followup_figures`).

Evaluation runs on a private copy of the classifier that shares its model and teacher
but bypasses any :class:`~classifier.encoders.CachedEmbedder` (so repeated runs do not
time cache hits) and logs nothing.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from flywheel.classifier.decision import Decision, Layer, Tier
from flywheel.classifier.encoders.cache import uncached
from flywheel.classifier.errors import InvalidInputError
from flywheel.classifier.layer2.calibration import expected_calibration_error, reliability_bins
from flywheel.classifier.layer2.operating_point import concat_scores, operating_report, trade_curves
from flywheel.classifier.layer2.tiers import Thresholds, assign_tiers
from flywheel.classifier.protocols import DelegatingEmbedder, Embedder, HistoryEntry
from flywheel.classifier.text import clean_text
from flywheel.training.metrics import SLICE_FIELDS, classification_metrics, language_slices, rounded

if TYPE_CHECKING:
    from flywheel.classifier.pipeline import Classifier
    from flywheel.classifier.versions.model import IntentModel

__all__ = ["CHUNK_SIZE", "RELIABILITY_BINS", "evaluate"]

RELIABILITY_BINS = 15
CHUNK_SIZE = 512


class _EvalEmbedder(DelegatingEmbedder):
    """Wraps the uncached embedder; remembers the vectors of the texts it encodes while
    ``recording`` is on (so layer-2 scores need no second encoding pass)."""

    def __init__(self, inner: Embedder) -> None:
        super().__init__(inner)
        self.recording = False
        self.seen: dict[str, np.ndarray] = {}

    def encode(self, texts: Sequence[str], *, batch_size: int | None = None, progress: bool = False) -> np.ndarray:
        X = self.inner.encode(texts, batch_size=batch_size, progress=progress)
        if self.recording:
            for text, row in zip(texts, X):
                self.seen[text] = row
        return X


def _share(values: list[str], names: list[str]) -> dict[str, float]:
    n = len(values)
    out = {k: 0.0 for k in names}
    for v in values:
        out[v] = out.get(v, 0.0) + 1.0
    return {k: rounded(c / n) if n else 0.0 for k, c in out.items()}


class _CutoffTally:
    """What the served cutoffs give on the evaluated queries, layer 2 alone, chunk by chunk:
    the prediction sets' coverage and size (in-scope queries), the precision of layer 2's
    sure answers per answered intent (the ``confident`` cutoff, or the per-intent one, or
    the risk rule's ``defer``), and the risk model's calibration."""

    def __init__(self, th: Thresholds, classes: list[str]) -> None:
        self.th, self.classes = th, classes
        self.index = {c: i for i, c in enumerate(classes)}
        self.covered: list[bool] = []
        self.sizes: list[int] = []
        self.sure: dict[str | None, list[bool]] = {}
        self.risk: list[float] = []
        self.right: list[bool] = []
        self.parts: list[Any] = []          # every chunk's scores and truth, for the trade curves
        self.truth: list[str | None] = []

    def add(self, scores: Any, truth: list[str | None]) -> None:
        t = assign_tiers(scores, self.classes, self.th)
        answers = t.labels(self.classes)
        self.parts.append(scores)
        self.truth.extend(truth)
        for j, (y, a) in enumerate(zip(truth, answers)):
            if t.sure[j]:
                self.sure.setdefault(a, []).append(a == y)
            if t.in_set is not None and y is not None and y in self.index:
                self.covered.append(bool(t.in_set[j, self.index[y]]))
                self.sizes.append(int(t.in_set[j].sum()))
        if scores.risk is not None:
            self.risk.extend(np.asarray(scores.risk, float).tolist())
            self.right.extend(a == y for a, y in zip(answers, truth))

    def report(self) -> dict[str, Any]:
        th = self.th
        per = {("OUT_OF_SCOPE" if k is None else k): {
                   "cutoff": th.defer if th.defer is not None else th.oos_confident if k is None
                   else th.confident_for(k),
                   "precision": rounded(float(np.mean(v))), "n": len(v)}
               for k, v in sorted(self.sure.items(), key=lambda kv: (kv[0] is None, kv[0] or ""))}
        n_sure = sum(len(v) for v in self.sure.values())
        out: dict[str, Any] = {
            "set_coverage": rounded(float(np.mean(self.covered))) if self.covered else None,
            "mean_set_size": rounded(float(np.mean(self.sizes))) if self.sizes else None,
            "nominal_coverage": th.coverage,
            "deferral": "risk" if th.defer is not None else "tiers",
            "sure_precision": rounded(sum(sum(v) for v in self.sure.values()) / n_sure) if n_sure else None,
            "cutoff_precision": per,
        }
        if self.risk:
            out["risk_ece"] = expected_calibration_error(1.0 - np.array(self.risk), np.array(self.right, bool))
        if self.parts:
            out["tradeoff"] = trade_curves(concat_scores(self.parts), self.classes, self.truth, th)
        return out

    def operating_point(self, model: IntentModel) -> dict[str, Any] | None:
        """The model's target, the cutoff it set and what these queries give there."""
        target = model.intents.thresholds.target
        return operating_report(target, model.manifest.metrics, concat_scores(self.parts), self.classes, self.truth,
                                self.th) if target and self.parts else None


class _Layer2Tally:
    """Layer 2 alone on the in-scope queries, chunk by chunk (the head's calibrated
    in-scope probabilities, without the out-of-scope gate): its top probability, whether
    that is the true intent, and whether the true intent is among its top 3."""

    def __init__(self, classes: list[str]) -> None:
        self.index = {c: i for i, c in enumerate(classes)}
        self.conf: list[float] = []
        self.correct: list[bool] = []
        self.top3: list[bool] = []

    def add(self, probs: np.ndarray, truth: list[str | None]) -> None:
        rows = [(j, y) for j, y in enumerate(truth) if y is not None]
        if not rows:
            return
        p = probs[[j for j, _ in rows]]
        top = np.argsort(-p, axis=1)[:, :min(3, p.shape[1])]
        for row, (_, y) in enumerate(rows):
            true_i = self.index.get(y, -1)
            self.conf.append(float(p[row, top[row, 0]]))
            self.correct.append(bool(top[row, 0] == true_i))
            self.top3.append(bool(true_i in top[row]))

    def report(self) -> dict[str, Any]:
        conf = np.array(self.conf, dtype=np.float64)
        ok = np.array(self.correct, dtype=bool)
        bins = reliability_bins(conf, ok, RELIABILITY_BINS) if conf.size else []
        return {"top1_accuracy_layer2": rounded(float(ok.mean())) if ok.size else None,
                "top3_accuracy": rounded(float(np.mean(self.top3))) if self.top3 else None,
                "ece": expected_calibration_error(conf, ok, RELIABILITY_BINS) if conf.size else None,
                "reliability": [{"confidence": rounded(c), "accuracy": rounded(a), "count": k} for c, a, k in bins]}


@dataclass
class _Scored:
    """What the batch pass gives: the decisions, its seconds, and the layer-2 tallies."""

    decisions: list[Decision]
    batch_s: float
    layer2: _Layer2Tally
    cuts: _CutoffTally


def evaluate(clf: Classifier, texts: Sequence[str], labels: Sequence[str | None], *, progress: bool = True,
             latency_sample: int = 200, seed: int = 0, chunk_size: int = CHUNK_SIZE,
             langs: Sequence[str | None] | None = None, histories: Sequence[Sequence[HistoryEntry]] | None = None,
             followups: dict[str, Any] | None = None) -> dict[str, Any]:
    """Classify labelled queries and measure the classifier.

    Parameters
    ----------
    clf : Classifier
        The classifier (its model, teacher and ``on_long`` are used; its embedding
        cache and log sink are not).
    texts, labels : sequences
        The queries and their true labels (``None`` = out of scope).
    progress : bool
        Show a tqdm progress bar for the batch pass.
    latency_sample : int
        How many random queries to classify one at a time for the latency figures
        (0: skip).
    seed : int
        Seed of the latency sample.
    chunk_size : int
        Queries per ``classify_many`` call in the batch pass.
    langs : sequence, optional
        Each query's language (``None``: not given); when any is given the report has
        ``by_language`` (see :func:`language_slices`).
    histories : sequence, optional
        Each query's compact history (a multi-turn file: :mod:`training.eval.sessions`);
        ``None``: every query is classified without one.
    followups : dict, optional
        With ``histories``: ``mask`` (which queries are follow-ups) and the keyword arguments
        of :func:`~training.eval.sessions.followup_figures` besides; the report gets
        ``followups``.

    Returns
    -------
    dict
        The report (JSON-serialisable); see the module docs for the definitions.

    Raises
    ------
    ValueError
        ``texts``, ``labels`` and ``langs`` differ in length, or there are no texts.
    InvalidInputError
        A text is unusable (the message gives its 1-based position).
    """
    from flywheel.classifier.pipeline import Classifier

    texts, truth = _check_inputs(texts, labels, langs, chunk_size)
    if histories is not None and len(histories) != len(texts):
        raise ValueError(f"{len(texts)} texts but {len(histories)} histories")
    model = clf.model
    on_long = clf.on_long
    cleaned = _clean_texts(texts, model.intents.embedder.max_chars, on_long)
    emb = _EvalEmbedder(uncached(clf.embedder))
    twin = Classifier(model, embedder=emb, teacher=clf.teacher, log_sink=None, on_long=on_long)
    classes = [str(c) for c in model.head.classes_]
    scored = _score(twin, emb, texts, cleaned, truth, classes, chunk_size=chunk_size, progress=progress,
                    histories=histories)
    latency = _latency(twin, texts, latency_sample, seed)
    report = _report(model.version, emb.id, classes, truth, langs, scored, latency)
    report["gate"] = gate_figures(truth, scored.decisions, langs)
    if followups is not None:
        from flywheel.training.eval.sessions import followup_figures

        report["followups"] = followup_figures(truth, [d.label for d in scored.decisions],
                                               langs=None if langs is None else list(langs), **followups)
    if (op := scored.cuts.operating_point(model)) is not None:
        report["operating_point"] = op
    return report


def gate_figures(truth: Sequence[str | None], decisions: Sequence[Decision],
                 langs: Sequence[str | None] | None = None) -> dict[str, Any]:
    """The report's ``gate``: of the in-scope queries (``truth`` not ``None``), ``n_in_scope``,
    ``rejected_sure`` (layer 2 answered out of scope and was sure: no teacher was asked, nothing
    degraded) and ``served_out_of_scope`` (any layer); the same ``by_language``, keyed by
    ``langs`` where given, else by each decision's detected language (``unknown`` without
    one). Shares are ``None`` when there is no in-scope query.

    Examples
    --------
    >>> from flywheel.classifier.decision import Decision, Layer, Tier
    >>> d = lambda label, layer: Decision(label, 0.9, Tier.NO_MATCH if label is None else Tier.CONFIDENT,
    ...                                   layer, "", language="es")
    >>> g = gate_figures(["A", "A", None], [d(None, Layer.EMBEDDING), d("A", Layer.LLM), d(None, Layer.EMBEDDING)])
    >>> g["n_in_scope"], g["rejected_sure"], g["by_language"]["es"]["rejected_sure"]
    (2, 0.5, 0.5)
    """
    def lang_of(i: int) -> str:
        return str((langs[i] if langs is not None else None) or decisions[i].language or "unknown")

    idx = [i for i, y in enumerate(truth) if y is not None]
    by: dict[str, list[int]] = {}
    for i in idx:
        by.setdefault(lang_of(i), []).append(i)
    by_language = {k: _gate_shares(decisions, v) for k, v in sorted(by.items())}
    return {**_gate_shares(decisions, idx), "by_language": by_language}


def _gate_shares(decisions: Sequence[Decision], idx: list[int]) -> dict[str, Any]:
    n = len(idx)

    def share(ok: Any) -> float | None:
        return round(sum(bool(ok(decisions[i])) for i in idx) / n, 4) if n else None
    return {"n_in_scope": n,
            "rejected_sure": share(lambda d: d.label is None and d.layer is Layer.EMBEDDING and d.degraded is None),
            "served_out_of_scope": share(lambda d: d.label is None)}


def _check_inputs(texts: Sequence[str], labels: Sequence[str | None], langs: Sequence[str | None] | None,
                  chunk_size: int) -> tuple[list[str], list[str | None]]:
    """The texts and labels (``str`` or ``None``) as lists, once their lengths, the
    languages' and ``chunk_size`` are checked (:class:`ValueError`)."""
    texts = list(texts)
    truth = [None if v is None else str(v) for v in labels]
    if len(texts) != len(truth):
        raise ValueError(f"{len(texts)} texts but {len(truth)} labels")
    if langs is not None and len(langs) != len(texts):
        raise ValueError(f"{len(texts)} texts but {len(langs)} languages")
    if not texts:
        raise ValueError("nothing to evaluate: no texts")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be positive, got {chunk_size!r}")
    return texts, truth


def _clean_texts(texts: list[str], max_chars: int, on_long: str) -> list[str]:
    """Each query as the pipeline cleans it (its vector's key in the batch pass); an
    unusable one is an :class:`InvalidInputError` that gives its 1-based position."""
    cleaned: list[str] = []
    for i, t in enumerate(texts):
        try:
            cleaned.append(clean_text(t, max_chars, on_long=on_long).text)
        except InvalidInputError as exc:
            raise InvalidInputError(f"query #{i + 1}: {exc}") from None
    return cleaned


def _score(twin: Classifier, emb: _EvalEmbedder, texts: list[str], cleaned: list[str], truth: list[str | None],
           classes: list[str], *, chunk_size: int, progress: bool,
           histories: Sequence[Sequence[HistoryEntry]] | None = None) -> _Scored:
    """The batch pass: ``twin`` classifies ``texts`` (each with its history, when given)
    chunk by chunk (timed), and layer 2's scores of each chunk go to the tallies, from the
    vectors the chunk was encoded to (the queries' own: a follow-up's resolved score is the
    decision's, not the tallies')."""
    from tqdm.auto import tqdm

    from flywheel.classifier.pipeline import Query

    n = len(texts)
    scored = _Scored([], 0.0, _Layer2Tally(classes), _CutoffTally(Thresholds.for_model(twin.model), classes))
    with tqdm(total=n, desc="evaluating", unit="query", disable=not progress) as bar:
        for start in range(0, n, chunk_size):
            stop = min(n, start + chunk_size)
            emb.seen = {}
            emb.recording = True
            t0 = time.perf_counter()
            if histories is None:
                scored.decisions.extend(twin.classify_many(texts[start:stop]))
            else:
                scored.decisions.extend(twin.classify_queries(
                    [Query(t, tuple(h)) for t, h in zip(texts[start:stop], histories[start:stop])]))
            scored.batch_s += time.perf_counter() - t0
            emb.recording = False
            scores = twin.model.head.scores(_chunk_vectors(emb, cleaned[start:stop]))
            scored.cuts.add(scores, truth[start:stop])
            scored.layer2.add(scores.probs, truth[start:stop])
            bar.update(stop - start)
    emb.seen = {}
    return scored


def _chunk_vectors(emb: _EvalEmbedder, cleaned: list[str]) -> np.ndarray:
    """The vectors of a chunk's cleaned queries: those the pass encoded, and the others
    (decided by a rule: layer 2 never saw them) encoded now."""
    missing = list(dict.fromkeys(t for t in cleaned if t not in emb.seen))
    if missing:
        emb.seen.update(zip(missing, emb.inner.encode(missing)))
    return np.stack([emb.seen[t] for t in cleaned])


def _report(version: str, encoder: str, classes: list[str], truth: list[str | None],
            langs: Sequence[str | None] | None, scored: _Scored, latency: dict[str, Any] | None) -> dict[str, Any]:
    """The report, in its order: the model, the label metrics (and their slices by
    language), layer 2 alone, the cutoffs, the tier and layer shares, speed, the details."""
    decisions = scored.decisions
    preds = [d.label for d in decisions]
    metrics = classification_metrics(truth, preds)
    report: dict[str, Any] = {"model_version": version, "encoder": encoder, "n_labels": len(classes)}
    report.update({k: metrics[k] for k in SLICE_FIELDS})
    by_language = language_slices(truth, preds, langs)
    if by_language:
        report["by_language"] = by_language
    report.update(scored.layer2.report())
    report.update(scored.cuts.report())
    report["tier_share"] = _share([d.tier.value for d in decisions], [t.value for t in Tier])
    report["layer_share"] = _share([d.layer.value for d in decisions], [x.value for x in Layer])
    report["throughput_qps"] = round(len(truth) / scored.batch_s, 2) if scored.batch_s > 0 else None
    report["batch_seconds"] = round(scored.batch_s, 4)
    report["latency_ms"] = latency
    report["torch_threads"] = _torch_threads()
    report["unknown_labels"] = sorted({v for v in truth if v is not None and v not in scored.layer2.index})
    report.update({k: metrics[k] for k in ("per_intent", "confused_pairs", "confusion")})
    return report


def _torch_threads() -> int | None:
    """torch's intra-op thread count when torch is in use (latency depends on it), else None."""
    import sys

    torch = sys.modules.get("torch")
    try:
        return int(torch.get_num_threads()) if torch is not None else None
    except Exception:  # noqa: BLE001 - a partly imported or stubbed torch
        return None


def _latency(clf: Classifier, texts: list[str], sample: int, seed: int) -> dict[str, Any] | None:
    """Classify a random sample one query at a time; wall-clock milliseconds per call."""
    k = min(int(sample), len(texts))
    if k <= 0:
        return None
    idx = random.Random(seed).sample(range(len(texts)), k)
    clf.classify(texts[idx[0]])  # warm-up, not timed
    times = []
    for i in idx:
        t0 = time.perf_counter()
        clf.classify(texts[i])
        times.append((time.perf_counter() - t0) * 1000.0)
    a = np.array(times)
    return {"p50": round(float(np.percentile(a, 50)), 4), "p99": round(float(np.percentile(a, 99)), 4),
            "mean": round(float(a.mean()), 4), "n": k, "cache": "bypassed"}
