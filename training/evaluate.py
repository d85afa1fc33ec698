"""Evaluate a classifier on labelled queries: accuracy, CLINC150's in-scope accuracy and
out-of-scope recall, macro F1, calibration, tiers, latency and throughput.

:func:`evaluate` returns a JSON-serialisable report dict, :func:`format_report` renders
it for a terminal and :func:`write_plots` draws a reliability diagram and a confusion
matrix (matplotlib, Agg canvas, imported only there).

Definitions (``None`` = out of scope, also written ``OUT_OF_SCOPE`` in the report):

- ``accuracy``: share of all queries whose decision label equals the true label
  (out of scope is its own class: ``None == None`` is right);
- ``in_scope_accuracy`` (Larson et al., 2019): over in-scope queries, the share
  predicted with the right intent *and* not rejected as out of scope;
- ``oos_recall``: over out-of-scope queries, the share predicted out of scope;
- ``macro_f1``: unweighted mean F1 over every class seen in the truth or the
  predictions (in-scope labels and out of scope);
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
  ``"unknown"``.

Evaluation runs on a private copy of the classifier that shares its model and teacher
but bypasses any :class:`~classifier.encoders.CachedEmbedder` (so repeated runs do not
time cache hits) and logs nothing.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from flywheel.classifier.decision import Decision, Layer, Tier
from flywheel.classifier.encoders.cache import uncached
from flywheel.classifier.errors import InvalidInputError
from flywheel.classifier.layer2.calibration import expected_calibration_error, reliability_bins
from flywheel.classifier.layer2.operating_point import concat_scores, operating_report, trade_curves
from flywheel.classifier.layer2.tiers import Thresholds, assign_tiers, fmt_probs
from flywheel.classifier.protocols import DelegatingEmbedder, Embedder
from flywheel.classifier.settings.label_names import OUT_OF_SCOPE, label_name
from flywheel.classifier.text import clean_text

if TYPE_CHECKING:
    from flywheel.classifier.pipeline import Classifier
    from flywheel.classifier.versions.model import IntentModel

__all__ = ["evaluate", "classification_metrics", "language_slices", "format_report", "write_plots"]


RELIABILITY_BINS = 15
CHUNK_SIZE = 512
TOP_CONFUSED_PAIRS = 10
CONFUSION_MAX_LABELS = 20       # the confusion plot shows at most this many labels
UNKNOWN_LANGUAGE = "unknown"    # the by_language slice of queries without a language
SLICE_FIELDS = ("n", "n_in_scope", "n_out_of_scope", "accuracy", "in_scope_accuracy", "oos_recall",
                "oos_precision", "macro_f1")


# ------------------------------------------------------------------ metrics
def classification_metrics(true: Sequence[str | None], pred: Sequence[str | None], *,
                           top_pairs: int = TOP_CONFUSED_PAIRS,
                           confusion_labels: int = CONFUSION_MAX_LABELS) -> dict[str, Any]:
    """Label-only metrics of predictions against the truth (``None`` = out of scope).

    Returns ``n``, ``n_in_scope``, ``n_out_of_scope``, ``accuracy``, ``in_scope_accuracy``,
    ``oos_recall``, ``oos_precision``, ``macro_f1``, ``per_intent``, ``confused_pairs``
    and ``confusion`` (the labels most involved in errors and their count matrix, rows
    = true, columns = predicted). A rate with nothing to count is ``None``.

    Examples
    --------
    >>> m = classification_metrics(["a", "a", "b", None], ["a", None, "b", None])
    >>> m["accuracy"], m["in_scope_accuracy"], m["oos_recall"]
    (0.75, 0.666667, 1.0)
    """
    if len(true) != len(pred):
        raise ValueError(f"{len(true)} true labels but {len(pred)} predictions")
    t = [label_name(v) for v in true]
    p = [label_name(v) for v in pred]
    n = len(t)
    in_scope = np.array([v is not None for v in true], dtype=bool)
    right = np.array([a == b for a, b in zip(t, p)], dtype=bool)
    pred_oos = np.array([v is None for v in pred], dtype=bool)

    classes = sorted(set(t) | set(p), key=lambda c: (c == OUT_OF_SCOPE, c))  # out of scope last
    index = {c: i for i, c in enumerate(classes)}
    cm = np.zeros((len(classes), len(classes)), dtype=np.int64)
    if n:
        np.add.at(cm, ([index[c] for c in t], [index[c] for c in p]), 1)
    tp = np.diag(cm).astype(float)
    support = cm.sum(axis=1)
    predicted = cm.sum(axis=0)
    precision = np.divide(tp, predicted, out=np.zeros_like(tp), where=predicted > 0)
    recall = np.divide(tp, support, out=np.zeros_like(tp), where=support > 0)
    denom = precision + recall
    f1 = np.divide(2 * precision * recall, denom, out=np.zeros_like(tp), where=denom > 0)
    per_intent = {c: {"precision": _r(precision[i]), "recall": _r(recall[i]), "f1": _r(f1[i]),
                      "support": int(support[i])} for i, c in enumerate(classes)}

    off = cm.copy()
    np.fill_diagonal(off, 0)
    rows, cols = np.nonzero(off)
    pairs = sorted(((classes[i], classes[j], int(off[i, j])) for i, j in zip(rows, cols)),
                   key=lambda x: (-x[2], x[0], x[1]))
    n_oos = int((~in_scope).sum())
    return {
        "n": n,
        "n_in_scope": int(in_scope.sum()),
        "n_out_of_scope": n_oos,
        "accuracy": _r(right.mean()) if n else None,
        "in_scope_accuracy": _r(right[in_scope].mean()) if in_scope.any() else None,
        "oos_recall": _r(pred_oos[~in_scope].mean()) if n_oos else None,
        "oos_precision": _r((~in_scope)[pred_oos].mean()) if pred_oos.any() else None,
        "macro_f1": _r(f1.mean()) if len(classes) else None,
        "per_intent": per_intent,
        "confused_pairs": [list(x) for x in pairs[:top_pairs]],
        "confusion": _confusion_subset(cm, classes, off, confusion_labels),
    }


def _confusion_subset(cm: np.ndarray, classes: list[str], off: np.ndarray, k: int) -> dict[str, Any]:
    """The ``k`` labels most involved in errors (all when there are few) and their matrix."""
    if len(classes) <= k:
        keep = list(range(len(classes)))
    else:
        errors = off.sum(axis=0) + off.sum(axis=1)
        order = sorted(range(len(classes)), key=lambda i: (-int(errors[i]), classes[i]))
        keep = sorted(order[:k], key=lambda i: (classes[i] == OUT_OF_SCOPE, classes[i]))
    return {"labels": [classes[i] for i in keep], "matrix": cm[np.ix_(keep, keep)].tolist(),
            "complete": len(keep) == len(classes), "n_labels": len(classes)}


def language_slices(true: Sequence[str | None], pred: Sequence[str | None],
                    langs: Sequence[str | None] | None) -> dict[str, dict[str, Any]]:
    """The scalar :func:`classification_metrics` of each language's queries.

    Languages are sorted, with queries whose language is ``None`` last under
    ``"unknown"``. Empty when ``langs`` is ``None`` or holds no language.

    Examples
    --------
    >>> s = language_slices(["a", "a", None], ["a", "b", None], ["en", "es", "es"])
    >>> s["en"]["accuracy"], s["es"]["accuracy"], s["es"]["oos_recall"]
    (1.0, 0.5, 1.0)
    """
    if langs is None or all(v is None for v in langs):
        return {}
    if not len(true) == len(pred) == len(langs):
        raise ValueError(f"{len(true)} true labels, {len(pred)} predictions but {len(langs)} languages")
    groups: dict[str | None, list[int]] = {}
    for i, lang in enumerate(langs):
        groups.setdefault(lang, []).append(i)
    order = sorted((g for g in groups if g is not None), key=str) + ([None] if None in groups else [])
    out: dict[str, dict[str, Any]] = {}
    for lang in order:
        idx = groups[lang]
        m = classification_metrics([true[i] for i in idx], [pred[i] for i in idx])
        out[UNKNOWN_LANGUAGE if lang is None else str(lang)] = {k: m[k] for k in SLICE_FIELDS}
    return out


def _r(x: float) -> float:
    return round(float(x), 6)


# --------------------------------------------------------------- evaluation
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
    return {k: _r(c / n) if n else 0.0 for k, c in out.items()}


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
                   "precision": _r(float(np.mean(v))), "n": len(v)}
               for k, v in sorted(self.sure.items(), key=lambda kv: (kv[0] is None, kv[0] or ""))}
        n_sure = sum(len(v) for v in self.sure.values())
        out: dict[str, Any] = {
            "set_coverage": _r(float(np.mean(self.covered))) if self.covered else None,
            "mean_set_size": _r(float(np.mean(self.sizes))) if self.sizes else None,
            "nominal_coverage": th.coverage,
            "deferral": "risk" if th.defer is not None else "tiers",
            "sure_precision": _r(sum(sum(v) for v in self.sure.values()) / n_sure) if n_sure else None,
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
        return {"top1_accuracy_layer2": _r(float(ok.mean())) if ok.size else None,
                "top3_accuracy": _r(float(np.mean(self.top3))) if self.top3 else None,
                "ece": expected_calibration_error(conf, ok, RELIABILITY_BINS) if conf.size else None,
                "reliability": [{"confidence": _r(c), "accuracy": _r(a), "count": k} for c, a, k in bins]}


@dataclass
class _Scored:
    """What the batch pass gives: the decisions, its seconds, and the layer-2 tallies."""

    decisions: list[Decision]
    batch_s: float
    layer2: _Layer2Tally
    cuts: _CutoffTally


def evaluate(clf: Classifier, texts: Sequence[str], labels: Sequence[str | None], *, progress: bool = True,
             latency_sample: int = 200, seed: int = 0, chunk_size: int = CHUNK_SIZE,
             langs: Sequence[str | None] | None = None) -> dict[str, Any]:
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
    model = clf.model
    on_long = clf.on_long
    cleaned = _clean_texts(texts, model.intents.embedder.max_chars, on_long)
    emb = _EvalEmbedder(uncached(clf.embedder))
    twin = Classifier(model, embedder=emb, teacher=clf.teacher, log_sink=None, on_long=on_long)
    classes = [str(c) for c in model.head.classes_]
    scored = _score(twin, emb, texts, cleaned, truth, classes, chunk_size=chunk_size, progress=progress)
    latency = _latency(twin, texts, latency_sample, seed)
    report = _report(model.version, emb.id, classes, truth, langs, scored, latency)
    if (op := scored.cuts.operating_point(model)) is not None:
        report["operating_point"] = op
    return report


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
           classes: list[str], *, chunk_size: int, progress: bool) -> _Scored:
    """The batch pass: ``twin`` classifies ``texts`` chunk by chunk (timed), and layer 2's
    scores of each chunk go to the tallies, from the vectors the chunk was encoded to."""
    from tqdm.auto import tqdm

    n = len(texts)
    scored = _Scored([], 0.0, _Layer2Tally(classes), _CutoffTally(Thresholds.for_model(twin.model), classes))
    with tqdm(total=n, desc="evaluating", unit="query", disable=not progress) as bar:
        for start in range(0, n, chunk_size):
            stop = min(n, start + chunk_size)
            emb.seen = {}
            emb.recording = True
            t0 = time.perf_counter()
            scored.decisions.extend(twin.classify_many(texts[start:stop]))
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


# ------------------------------------------------------------------- output
def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100.0 * x:.1f}%"


def format_report(report: dict[str, Any], *, worst: int = 10) -> str:
    """The report as readable terminal text (headline metrics, tiers, latency, confusions,
    and the ``worst`` intents by F1)."""
    n = report.get("n", 0)
    lines = [f"Model {report.get('model_version', '?')} ({report.get('n_labels', '?')} intents, "
             f"encoder {report.get('encoder', '?')})",
             f"Evaluated on {n:,} queries: {report.get('n_in_scope', 0):,} in scope, "
             f"{report.get('n_out_of_scope', 0):,} out of scope", ""]
    ece = report.get("ece")
    rows = [("accuracy (out of scope as a class)", _pct(report.get("accuracy"))),
            ("in-scope accuracy", _pct(report.get("in_scope_accuracy"))),
            ("out-of-scope recall", _pct(report.get("oos_recall"))),
            ("out-of-scope precision", _pct(report.get("oos_precision"))),
            ("macro F1", "n/a" if report.get("macro_f1") is None else f"{report['macro_f1']:.3f}"),
            ("layer-2 top-1 accuracy (no gate)", _pct(report.get("top1_accuracy_layer2"))),
            ("layer-2 top-3 accuracy", _pct(report.get("top3_accuracy"))),
            ("layer-2 ECE", "n/a" if ece is None else f"{ece:.4f}")]
    if report.get("set_coverage") is not None:
        rows += [(f"prediction-set coverage (nominal {report['nominal_coverage']:.0%})", _pct(report["set_coverage"])),
                 ("mean prediction-set size", f"{report['mean_set_size']:.2f}")]
    if report.get("sure_precision") is not None:
        rows.append((f"precision of layer 2's sure answers ({report.get('deferral')} rule)",
                     _pct(report["sure_precision"])))
    width = max(len(r[0]) for r in rows)
    lines += [f"  {name:<{width}}  {value:>8}" for name, value in rows]
    lines += _language_table(report.get("by_language") or {})
    lines.append("")
    for key, title in (("tier_share", "Tiers"), ("layer_share", "Layers")):
        shares = report.get(key) or {}
        lines.append(f"{title + ':':<8}" + "  ".join(f"{k} {_pct(v)}" for k, v in shares.items() if v))
    lat = report.get("latency_ms")
    if lat:
        threads = f", torch threads {report['torch_threads']}" if report.get("torch_threads") else ""
        lines.append(f"Latency (one query at a time, {lat['n']} sampled, cache bypassed{threads}): "
                     f"p50 {lat['p50']:.2f} ms, p99 {lat['p99']:.2f} ms, mean {lat['mean']:.2f} ms")
    if report.get("throughput_qps") is not None:
        lines.append(f"Throughput (batch pass): {report['throughput_qps']:,.1f} queries/s")
    unknown = report.get("unknown_labels") or []
    if unknown:
        shown = ", ".join(unknown[:10]) + (f" (+{len(unknown) - 10} more)" if len(unknown) > 10 else "")
        lines.append(f"Warning: {len(unknown)} true label(s) unknown to the model: {shown}")
    pairs = report.get("confused_pairs") or []
    if pairs:
        lines += ["", "Most confused (true -> predicted):"]
        cw = max(len(str(p[2])) for p in pairs)
        lines += [f"  {p[2]:>{cw}}  {p[0]} -> {p[1]}" for p in pairs]
    lines += _cutoff_table(report.get("cutoff_precision") or {}, worst)
    per = report.get("per_intent") or {}
    if per and worst > 0:
        items = sorted(per.items(), key=lambda kv: (kv[1]["f1"], -kv[1]["support"], kv[0]))[:worst]
        lw = max(5, *(len(k) for k, _ in items))
        lines += ["", f"Weakest intents by F1 ({min(worst, len(per))} of {len(per)}):",
                  f"  {'label':<{lw}}  {'prec':>6}  {'recall':>6}  {'f1':>6}  {'support':>7}"]
        lines += [f"  {k:<{lw}}  {v['precision']:>6.3f}  {v['recall']:>6.3f}  {v['f1']:>6.3f}  {v['support']:>7}"
                  for k, v in items]
    return "\n".join(lines)


def _cutoff_table(per: dict[str, dict[str, Any]], worst: int) -> list[str]:
    """The least precise intents at their cutoff (layer 2's sure answers)."""
    if not per or worst <= 0:
        return []
    items = sorted(per.items(), key=lambda kv: (kv[1]["precision"], -kv[1]["n"], kv[0]))[:worst]
    lw = max(5, *(len(k) for k, _ in items))
    lines = ["", f"What each cutoff buys: precision of layer 2's sure answers, least precise "
                 f"{len(items)} of {len(per)}:", f"  {'label':<{lw}}  {'cutoff':>6}  {'prec':>6}  {'n':>6}"]
    for k, v in items:
        cut = "" if v["cutoff"] is None else fmt_probs(v["cutoff"], digits=3)[0]
        lines.append(f"  {k:<{lw}}  {cut:>6}  {v['precision']:>6.3f}  {v['n']:>6}")
    return lines


def _language_table(slices: dict[str, dict[str, Any]]) -> list[str]:
    """A short per-language table (empty without languages)."""
    if not slices:
        return []
    lw = max(4, *(len(k) for k in slices))
    lines = ["", "By language:",
             f"  {'lang':<{lw}}  {'n':>6}  {'accuracy':>8}  {'in-scope':>8}  {'oos recall':>10}"]
    lines += [f"  {k:<{lw}}  {v['n']:>6,}  {_pct(v.get('accuracy')):>8}  {_pct(v.get('in_scope_accuracy')):>8}  "
              f"{_pct(v.get('oos_recall')):>10}" for k, v in slices.items()]
    return lines


def write_plots(report: dict[str, Any], directory: str | Path) -> list[Path]:
    """Write ``reliability.png`` (layer-2 reliability diagram) and ``confusion.png``
    (the labels most involved in errors) into ``directory``; return their paths."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    out_dir = Path(directory)
    out_dir.mkdir(parents=True, exist_ok=True)
    version = report.get("model_version", "?")
    paths: list[Path] = []

    # Reliability diagram: accuracy per confidence bin against the diagonal.
    fig = Figure(figsize=(6.5, 6.5), dpi=110)
    FigureCanvasAgg(fig)
    ax, ax_n = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    width = 1.0 / RELIABILITY_BINS
    bins = report.get("reliability") or []
    lefts = [min(int(b["confidence"] * RELIABILITY_BINS), RELIABILITY_BINS - 1) * width for b in bins]
    ax.bar(lefts, [b["accuracy"] for b in bins], width=width, align="edge", color="#4C72B0",
           edgecolor="black", linewidth=0.6, label="accuracy")
    ax.bar(lefts, [abs(b["confidence"] - b["accuracy"]) for b in bins],
           bottom=[min(b["confidence"], b["accuracy"]) for b in bins], width=width, align="edge",
           facecolor="none", edgecolor="#C44E52", hatch="//", linewidth=0.8, label="gap to mean confidence")
    ax.plot([0, 1], [0, 1], "--", color="gray", linewidth=1, label="perfect calibration")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_ylabel("accuracy")
    ece = report.get("ece")
    ax.set_title(f"Layer-2 reliability, model {version}\nECE {ece:.4f}" if ece is not None
                 else f"Layer-2 reliability, model {version}")
    ax.legend(loc="upper left", fontsize=8)
    ax_n.bar(lefts, [b["count"] for b in bins], width=width, align="edge", color="gray", edgecolor="black",
             linewidth=0.6)
    ax_n.set_xlabel("top in-scope confidence")
    if bins:
        ax_n.set_yscale("log")
    ax_n.set_ylabel("queries (log)")
    fig.tight_layout()
    path = out_dir / "reliability.png"
    fig.savefig(path)
    paths.append(path)

    # Confusion matrix of the labels most involved in errors.
    conf = report.get("confusion") or {"labels": [], "matrix": [], "complete": True, "n_labels": 0}
    names = list(conf["labels"])
    m = np.array(conf["matrix"], dtype=float).reshape(len(names), len(names))
    size = min(14.0, max(5.0, 0.45 * len(names) + 3.0))
    fig = Figure(figsize=(size + 1.0, size), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    if names:
        im = ax.imshow(np.log1p(m), cmap="Blues", aspect="equal")
        fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04, label="log(1 + count)")
        ax.set_xticks(range(len(names)))
        ax.set_yticks(range(len(names)))
        ax.set_xticklabels([_short(s) for s in names], rotation=60, ha="right", fontsize=8)
        ax.set_yticklabels([_short(s) for s in names], fontsize=8)
        if len(names) <= 25:
            hi = m.max() if m.size else 0
            for i in range(len(names)):
                for j in range(len(names)):
                    if m[i, j]:
                        ax.text(j, i, f"{int(m[i, j])}", ha="center", va="center", fontsize=7,
                                color="white" if hi and math.log1p(m[i, j]) > 0.6 * math.log1p(hi) else "black")
    else:
        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    subset = "" if conf.get("complete", True) else \
        f" ({len(names)} of {conf.get('n_labels', '?')} labels, most confused)"
    ax.set_title(f"Confusion matrix{subset}\nmodel {version}", fontsize=10)
    fig.tight_layout()
    path = out_dir / "confusion.png"
    fig.savefig(path)
    paths.append(path)
    return paths


def _short(label: str, n: int = 28) -> str:
    return label if len(label) <= n else label[: n - 1] + "…"
