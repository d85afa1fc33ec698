"""Checked before training: how noisy the teacher's labels are, and a filter for the
teacher labels the evidence contradicts (issue 24, item 3).

The noise estimate
------------------
A decision can carry a teacher label (layer 3's inline answer, an audit's background
answer, or one back-filled by ``flywheel label``) and a human label (``flywheel
feedback``) at once; the log's ``decision_labels`` view holds both. Over every decision
with a valid teacher label and a human label, the teacher's latest valid answer is
*wrong* when it differs from the latest human label (out of scope equals out of scope).
:class:`NoiseEstimate` counts these ``(teacher, human)`` pairs;

- ``teacher_noise``: ``{"estimate", "low", "high", "n", "wrong"}``: the share of wrong
  teacher labels among the ``n`` decisions with both labels, with an exact
  (Clopper-Pearson) 95% interval; ``estimate``/``low``/``high`` are ``None`` when ``n`` is 0;
- ``teacher_noise_by_intent``: the same per *teacher* label (what the teacher said, so
  each number is the share of that label's training rows a human would change;
  out of scope is ``OUT_OF_SCOPE``), for labels with at least :data:`MIN_INTENT_ROWS`
  such decisions.

The humans' decisions are not a random sample: feedback is given where someone saw a
mistake, so the estimate is an upper bound on the noise of the teacher labels nobody
checked when most human labels come from feedback, and close to unbiased when they come
from reviewing a random sample (audits).

The filter
----------
:func:`check_training_set` drops *teacher* rows of a training set (never intent
examples, human labels or self-training rows) for one of two reasons, each evidence
that does not come from the teacher:

- ``oos_inside_intent``: the teacher said out of scope, but the query's vector lies deep
  inside one intent's cluster of authoritative rows (its intent examples and human
  labels): its mean cosine similarity to that intent's ``k`` nearest rows reaches the
  median of the same measure for the intent's own rows (leave one out), i.e. it is closer
  to the intent than most of its own examples are, and beats every other intent, and the
  authoritative out-of-scope rows, by ``inside_margin``. The champion is not consulted
  (BENCHMARKS.md §4: the earlier guard leaned on the champion's own top intent).
- ``human_corrected_pair``: humans corrected the teacher's label ``A`` to ``B`` on at
  least ``pair_min`` decisions and on at least ``pair_share`` of the decisions where they
  checked an ``A`` label, and the row's label is ``A`` while layer 2's runner-up is ``B``:
  the champion's most probable intent other than ``A``, and at least ``runner_up_ratio``
  times as probable as ``A`` (a close second or preferred: a query the champion is sure
  is ``A`` keeps its label); without a usable champion the nearest intent by the
  similarity above, at most ``inside_margin`` less similar than ``A``.

What §4 taught: a guard that dropped out-of-scope teacher labels when the nearest intent
examples and the champion agreed on an in-scope intent dropped mostly wrong labels, and
still made layer 2 worse. The out-of-scope gate is fitted, out of fold, on the few real
out-of-scope rows of the training set (64–75 in a flywheel run, most of them teacher
labels); dropping most of them left it a few dozen rows, and those wrong labels were also
the uncertain in-scope queries that taught the gate where to reject. So here out-of-scope
drops are capped: at most ``oos_max_drop_share`` of the teacher's out-of-scope rows, and
never below ``oos_floor`` out-of-scope rows left for the gate; the strongest evidence
goes first and the rest is counted as ``held_back``. Whether the filter helps is measured
on layer-2 accuracy (``benchmarks/bench_flywheel.py --teacher-errors close``, filter on
against ``--no-teacher-filter``), not on how many of its drops were wrong labels.

The noise guard
---------------
A teacher measured as mostly wrong is not distilled silently (issue 41). Above a level
(``flywheel retrain --max-teacher-noise``, :data:`training.options.DEFAULT_MAX_TEACHER_NOISE`),
decided on the estimate's 95% *lower* bound so a few unlucky rows do not trigger it,
:func:`guard_teacher_rows` drops the teacher rows of every label whose own noise is above
the level: its figure in ``teacher_noise_by_intent`` where it has one (at least
:data:`MIN_INTENT_ROWS` human-checked decisions), else the overall estimate. A label whose
own record is within the level keeps its rows; intent examples, human labels (which
already win where a decision has both) and self-training rows are never touched, and no
label is left with fewer than 2 rows (the head needs 2). Dropping rather than weighting:
the head's sample weights reach its logistic regression only, while its temperature, gate
and cutoffs are fitted out of fold, unweighted, on the same rows (and the encoder tuner
trains on them too), so a mostly wrong label weighted down would still calibrate layer 2.
With too few human labels for the interval to exceed the level at all
(:func:`min_labels_for`: 4 at 0.30) it does nothing and says so. :func:`noise_guard` is
the same decision from the figures alone, for ``flywheel stats`` and the dashboard.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

import numpy as np

from flywheel.classifier.layer2.scoring import normalise_rows
from flywheel.classifier.settings.label_names import label_name
from flywheel.classifier.settings.output import counted
from flywheel.classifier.text import normalise_key
from flywheel.training.layer2 import noisy_teacher_guard
from flywheel.training.options import DEFAULT_MAX_TEACHER_NOISE

if TYPE_CHECKING:
    from flywheel.classifier.versions.model import IntentModel
    from flywheel.logstore.reads import LogReader
    from flywheel.training.rows import TrainingSet

__all__ = ["CONFIDENCE", "GUARD_REASON", "MIN_INTENT_ROWS", "REASONS", "FilterRules", "IntentProfile",
           "NoiseEstimate", "Ranker", "champion_ranker", "check_training_set", "clopper_pearson", "estimate_from_log",
           "filter_teacher_rows", "format_noise", "guard_teacher_rows", "min_labels_for", "noise_guard",
           "noise_interval", "noise_section", "profile_ranker"]

CONFIDENCE = 0.95           # of every interval here
MIN_INTENT_ROWS = 10        # per-label estimates only with at least this many decisions
REASONS = ("oos_inside_intent", "human_corrected_pair")
#: the noisy-teacher guard's reason in ``teacher_filter.dropped`` (always applied; its
#: details, formerly the report's ``dataset.noisy_teacher``, are ``teacher_filter.guard``)
GUARD_REASON = "noisy_teacher"


# ------------------------------------------------------------------ the estimate
def clopper_pearson(k: int, n: int, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The exact two-sided ``confidence`` interval of a binomial share ``k / n`` (``n`` > 0).

    >>> clopper_pearson(0, 10)[0], round(clopper_pearson(0, 10)[1], 4)
    (0.0, 0.3085)
    """
    from scipy.stats import beta

    if n <= 0 or not 0 <= k <= n:
        raise ValueError(f"need 0 <= k <= n and n > 0, got k={k}, n={n}")
    a = (1.0 - confidence) / 2.0
    low = 0.0 if k == 0 else float(beta.ppf(a, k, n - k + 1))
    high = 1.0 if k == n else float(beta.ppf(1.0 - a, k + 1, n - k))
    return low, high


def noise_interval(wrong: int, n: int) -> dict[str, Any]:
    """``{"estimate", "low", "high", "n", "wrong"}`` for ``wrong`` of ``n`` (rounded to 6
    digits; the three shares ``None`` when ``n`` is 0)."""
    if n == 0:
        return {"estimate": None, "low": None, "high": None, "n": 0, "wrong": 0}
    low, high = clopper_pearson(wrong, n)
    return {"estimate": round(wrong / n, 6), "low": round(low, 6), "high": round(high, 6), "n": int(n),
            "wrong": int(wrong)}


@dataclass(frozen=True)
class NoiseEstimate:
    """The teacher's agreement with human labels: ``pairs[(teacher, human)]`` decisions
    (``None`` = out of scope)."""

    pairs: dict[tuple[str | None, str | None], int] = field(default_factory=dict)

    @classmethod
    def from_rows(cls, rows: Iterable[Sequence[Any]]) -> "NoiseEstimate":
        """From ``(teacher, human)`` or ``(teacher, human, count)`` rows."""
        c: Counter = Counter()
        for r in rows:
            c[(r[0], r[1])] += int(r[2]) if len(r) > 2 else 1
        return cls(dict(c))

    @property
    def n(self) -> int:
        return int(sum(self.pairs.values()))

    @property
    def wrong(self) -> int:
        return int(sum(v for (t, h), v in self.pairs.items() if t != h))

    def overall(self) -> dict[str, Any]:
        """``teacher_noise``."""
        return noise_interval(self.wrong, self.n)

    def by_intent(self, min_rows: int = MIN_INTENT_ROWS) -> dict[str, dict[str, Any]]:
        """``teacher_noise_by_intent``: per teacher label with at least ``min_rows``
        decisions, noisiest first (ties by name)."""
        n: Counter = Counter()
        bad: Counter = Counter()
        for (t, h), v in self.pairs.items():
            n[t] += v
            bad[t] += v if t != h else 0
        out = {label_name(t): noise_interval(bad[t], n[t]) for t in n if n[t] >= min_rows}
        return dict(sorted(out.items(), key=lambda kv: (-(kv[1]["estimate"] or 0.0), kv[0])))

    def corrections(self) -> list[dict[str, Any]]:
        """Every ``(teacher A -> human B)`` correction with its count and the share of the
        human-checked ``A`` labels it is, most frequent first."""
        n_a: Counter = Counter()
        for (t, _), v in self.pairs.items():
            n_a[t] += v
        out = [{"teacher": t, "human": h, "n": int(v), "of": int(n_a[t]), "share": round(v / n_a[t], 6)}
               for (t, h), v in self.pairs.items() if t != h]
        return sorted(out, key=lambda c: (-c["n"], label_name(c["teacher"]), label_name(c["human"])))

    def report(self, min_rows: int = MIN_INTENT_ROWS) -> dict[str, Any]:
        """``{"teacher_noise": ..., "teacher_noise_by_intent": ...}``."""
        return {"teacher_noise": self.overall(), "teacher_noise_by_intent": self.by_intent(min_rows)}


def estimate_from_log(store: LogReader | None) -> NoiseEstimate:
    """The estimate over the whole traffic log (``None``: no log, no pairs), from its
    ``(teacher, human, n)`` pairs: one grouped statement
    (:meth:`~logstore.reads.NamedReads.teacher_human_pairs`; the latest valid teacher label
    and the latest human label of each decision, as :class:`logstore.LabelledRow` has them)."""
    if store is None:
        return NoiseEstimate()
    return NoiseEstimate.from_rows(store.teacher_human_pairs())


def noise_section(store: LogReader | None, min_rows: int = MIN_INTENT_ROWS) -> dict[str, Any]:
    """``flywheel stats``' ``teacher_noise``: the overall figures plus ``by_intent``."""
    est = estimate_from_log(store)
    return {**est.overall(), "by_intent": est.by_intent(min_rows)}


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100.0 * x:.1f}%"


def format_noise(noise: dict[str, Any] | None, by_intent: dict[str, Any] | None = None, top: int = 3) -> str:
    """One line, e.g. ``teacher noise: 12.0% (95% CI 8.1-17.0%) wrong on 150 decisions with a
    teacher and a human label; noisiest: OUT_OF_SCOPE 60.0% (n=20)``."""
    if not noise or not noise.get("n"):
        return "teacher noise: no decision has both a teacher and a human label yet"
    line = (f"teacher noise: {_pct(noise['estimate'])} (95% CI {_pct(noise['low'])}-{_pct(noise['high'])}) wrong "
            f"on {counted(noise['n'], 'decision')} with a teacher and a human label")
    noisy = [(k, v) for k, v in (by_intent or {}).items() if v.get("estimate")][:top]
    if noisy:
        line += "; noisiest: " + ", ".join(f"{k} {_pct(v['estimate'])} (n={v['n']})" for k, v in noisy)
    return line


# ------------------------------------------------------------------ the filter
@dataclass(frozen=True)
class FilterRules:
    """The filter's settings (see the module docs); the defaults are deliberately strict."""

    k: int = 3                          # nearest authoritative rows of an intent
    inside_quantile: float = 0.5        # closer to the intent than this share of its own rows
    inside_margin: float = 0.05         # and closer to it than to any other intent by this much
    min_rows: int = 3                   # authoritative rows an intent needs to judge "inside"
    pair_min: int = 3                   # human corrections A -> B needed
    pair_share: float = 0.5             # ... and this share of the human-checked A labels
    runner_up_ratio: float = 0.5        # B is the runner-up only when P(B) >= this x P(A) (layer 2)
    oos_max_drop_share: float = 0.5     # at most this share of the teacher's out-of-scope rows dropped
    oos_floor: int = 20                 # never fewer out-of-scope training rows left for the gate
    max_refs: int = 200                 # authoritative rows per intent consulted (the first ones)


@dataclass(frozen=True)
class IntentProfile:
    """Each intent's authoritative rows (intent examples, human labels) and how close its
    own rows are to one another: ``inside[c]``, the ``inside_quantile`` of the mean
    similarity of each row to its ``k`` nearest fellow rows. ``oos``: the authoritative
    out-of-scope rows (out-of-scope examples, human out-of-scope labels), a competitor
    like any intent."""

    labels: list[str]
    refs: list[np.ndarray]              # per intent, unit vectors
    inside: np.ndarray
    k: int
    oos: np.ndarray | None = None

    @classmethod
    def build(cls, vectors: np.ndarray, labels: Sequence[str | None], rules: FilterRules) -> "IntentProfile":
        by: dict[str, list[int]] = {}
        for i, lab in enumerate(labels):
            if lab is not None:
                by.setdefault(lab, []).append(i)
        names, refs, inside = [], [], []
        V = normalise_rows(np.asarray(vectors, dtype=np.float32)) if len(vectors) else vectors
        oos = [i for i, lab in enumerate(labels) if lab is None][:rules.max_refs]
        for lab in sorted(by):
            idx = by[lab][:rules.max_refs]
            if len(idx) < max(rules.min_rows, 2):
                continue
            R = V[idx]
            sims = R @ R.T
            np.fill_diagonal(sims, -np.inf)
            k = min(rules.k, len(idx) - 1)
            own = np.sort(sims, axis=1)[:, -k:].mean(axis=1)
            names.append(lab)
            refs.append(R)
            inside.append(float(np.quantile(own, rules.inside_quantile)))
        return cls(names, refs, np.asarray(inside, dtype=np.float64), rules.k, V[oos] if oos else None)

    def oos_scores(self, X: np.ndarray) -> np.ndarray:
        """Mean similarity of each row to its ``k`` nearest authoritative out-of-scope rows
        (``-inf`` without any)."""
        if self.oos is None or not len(X):
            return np.full(len(X), -np.inf)
        sims = normalise_rows(np.asarray(X, dtype=np.float32)) @ self.oos.T
        return np.sort(sims, axis=1)[:, -min(self.k, len(self.oos)):].mean(axis=1)

    def scores(self, X: np.ndarray) -> np.ndarray:
        """``(n, intents)``: mean similarity of each row to each intent's nearest rows
        (the same ``k`` as the intent's own measure)."""
        out = np.full((len(X), len(self.labels)), -np.inf)
        if not len(X):
            return out
        Q = normalise_rows(np.asarray(X, dtype=np.float32))
        for j, R in enumerate(self.refs):
            k = min(self.k, len(R) - 1)
            sims = Q @ R.T
            out[:, j] = np.sort(sims, axis=1)[:, -k:].mean(axis=1)
        return out


#: ``(vectors, row labels) -> runner-up label per row`` (``None``: none close enough)
Ranker = Callable[[np.ndarray, Sequence[str | None]], list]


def champion_ranker(champion: IntentModel, ratio: float = FilterRules.runner_up_ratio) -> Ranker:
    """Layer 2's runner-up to the row's label ``A``: the champion's most probable intent
    ``B`` other than ``A``, when ``P(B) >= ratio * P(A)`` (a close second, or preferred;
    ``P(A)`` is 0 for out of scope); else ``None``."""
    from flywheel.training.layer2 import layer2_predict

    def rank(X: np.ndarray, own: Sequence[str | None]) -> list:
        if not len(X):
            return []
        pred = layer2_predict(champion, X)
        at = {c: j for j, c in enumerate(pred.classes)}
        out = []
        for p, a in zip(pred.probs, own):
            order = [j for j in np.argsort(-p)[:2] if pred.classes[j] != a]
            pa = p[at[a]] if a in at else 0.0
            out.append(pred.classes[order[0]] if order and p[order[0]] >= ratio * pa else None)
        return out
    return rank


def profile_ranker(profile: IntentProfile, margin: float = FilterRules.inside_margin) -> Ranker:
    """Without a champion: the nearest intent ``B`` other than the row's label ``A`` by
    :meth:`IntentProfile.scores`, when it is at most ``margin`` less similar than ``A``."""
    def rank(X: np.ndarray, own: Sequence[str | None]) -> list:
        s = profile.scores(X)
        at = {c: j for j, c in enumerate(profile.labels)}
        out = []
        for row, a in zip(s, own):
            order = [j for j in np.argsort(-row) if profile.labels[j] != a]
            sa = row[at[a]] if a in at else -np.inf
            ok = order and np.isfinite(row[order[0]]) and row[order[0]] >= sa - margin
            out.append(profile.labels[order[0]] if ok else None)
        return out
    return rank


def filter_teacher_rows(vectors: np.ndarray, labels: Sequence[str | None], sources: Sequence[str],
                        estimate: NoiseEstimate, *, ranker: Ranker | None = None,
                        rules: FilterRules = FilterRules(), texts: Sequence[str] | None = None
                        ) -> tuple[list[int], dict[str, Any]]:
    """Which rows to drop and why (see the module docs). Rows are a training set's
    (``sources``: ``"intent_example"``, ``"human"``, ``"teacher"``, ``"layer2"``); only
    ``"teacher"`` rows are ever dropped. Returns ``(dropped row indices, info)``, where
    ``info["dropped"]`` is ``{reason: count}``."""
    labels = list(labels)
    authoritative = [i for i, s in enumerate(sources) if s in ("intent_example", "human")]
    profile = IntentProfile.build(vectors[authoritative], [labels[i] for i in authoritative], rules)
    rank = ranker if ranker is not None else profile_ranker(profile, rules.inside_margin)
    teacher = [i for i, s in enumerate(sources) if s == "teacher"]
    info: dict[str, Any] = {"checked": len(teacher), "dropped": {r: 0 for r in REASONS},
                            "held_back": {"oos_cap": 0, "last_rows_of_label": 0}, "pairs": [], "examples": []}
    cand: dict[int, tuple[str, float, str | None]] = {}     # row -> (reason, strength, evidence label)

    # rule 1: out of scope deep inside one intent's cluster
    oos = [i for i in teacher if labels[i] is None]
    if oos and profile.labels:
        s = profile.scores(vectors[oos])
        s_oos = profile.oos_scores(vectors[oos])
        for i, row, so in zip(oos, s, s_oos):
            order = np.argsort(-row)
            best = order[0]
            second = max(row[order[1]] if len(order) > 1 else -np.inf, so)   # the next intent, or out of scope
            if row[best] >= profile.inside[best] and row[best] - second >= rules.inside_margin:
                cand[i] = ("oos_inside_intent", float(row[best] - profile.inside[best]), profile.labels[best])

    # rule 2: a label humans keep correcting to the row's runner-up
    pairs = [c for c in estimate.corrections() if c["n"] >= rules.pair_min and c["share"] >= rules.pair_share]
    info["pairs"] = [{"teacher": label_name(c["teacher"]), "human": label_name(c["human"]), "n": c["n"],
                      "of": c["of"], "share": c["share"]} for c in pairs]
    to_b: dict[str | None, set] = {}
    for c in pairs:
        to_b.setdefault(c["teacher"], set()).add(c["human"])
    rows2 = [i for i in teacher if labels[i] in to_b and i not in cand]
    if rows2:
        runner = rank(vectors[rows2], [labels[i] for i in rows2])
        for i, b in zip(rows2, runner):
            if b is not None and b in to_b[labels[i]]:
                share = next(c["share"] for c in pairs if c["teacher"] == labels[i] and c["human"] == b)
                cand[i] = ("human_corrected_pair", float(share), b)

    drop = _cap(cand, labels, sources, rules, info)
    for i in sorted(drop, key=lambda j: -cand[j][1]):
        reason, _, ev = cand[i]
        info["dropped"][reason] += 1
        if len(info["examples"]) < 10:
            info["examples"].append({"text": (texts[i] if texts is not None else "")[:200],
                                     "teacher": label_name(labels[i]), "reason": reason, "evidence": label_name(ev)})
    return sorted(drop), info


def _cap(cand: dict[int, tuple[str, float, str | None]], labels: list, sources: Sequence[str], rules: FilterRules,
         info: dict[str, Any]) -> set[int]:
    """The candidates actually dropped: out-of-scope drops within the gate's caps, and no
    label left with fewer than 2 rows (the head needs 2), strongest evidence first."""
    n_oos = sum(1 for lab in labels if lab is None)
    t_oos = sum(1 for lab, s in zip(labels, sources) if lab is None and s == "teacher")
    oos_budget = max(0, min(int(math.floor(rules.oos_max_drop_share * t_oos)), n_oos - rules.oos_floor))
    left = Counter(labels)
    drop: set[int] = set()
    for i in sorted(cand, key=lambda j: (-cand[j][1], j)):
        lab = labels[i]
        if lab is None:
            if oos_budget <= 0:
                info["held_back"]["oos_cap"] += 1
                continue
            oos_budget -= 1
        elif left[lab] <= 2:
            info["held_back"]["last_rows_of_label"] += 1
            continue
        left[lab] -= 1
        drop.add(i)
    return drop


def check_training_set(ts: TrainingSet, estimate: NoiseEstimate, *, champion: IntentModel | None = None,
                       encoder_id: str | None = None, enabled: bool = True,
                       rules: FilterRules = FilterRules()) -> tuple[TrainingSet, dict[str, Any]]:
    """The retrain's one teacher-label filter step on a :class:`training.rows.TrainingSet`:
    the training set without the teacher rows the evidence contradicts, and
    ``teacher_filter``, the step's one report section.

    First the noisy-teacher guard (:func:`training.layer2.noisy_teacher_guard`, always on:
    ``noisy_teacher`` in ``dropped``, its details in ``guard``), then the evidence rules of
    the module docs (``oos_inside_intent``, ``human_corrected_pair``), applied only when
    ``enabled``; off, ``would_drop`` says what they would drop and they count 0 in
    ``dropped``. Also: ``enabled``, ``checked`` (teacher rows), ``held_back``, the
    human-corrected ``pairs``, ``runner_up_from``, ``examples`` and the settings.
    ``champion`` gives layer 2's runner-up when it was trained on ``encoder_id`` (the
    training set's vectors), else the intent examples do."""
    checked = sum(1 for s in ts.sources if s == "teacher")
    ts, guard = _guard(ts, champion, encoder_id)
    ts, info = _check_evidence(ts, estimate, champion=champion, encoder_id=encoder_id, enabled=enabled, rules=rules)
    info.update(checked=checked, dropped={GUARD_REASON: guard["dropped"], **info["dropped"]}, guard=guard)
    return ts, info


def _guard(ts: TrainingSet, champion: IntentModel | None, encoder_id: str | None) -> tuple[TrainingSet, dict[str, Any]]:
    """The noisy-teacher guard over the teacher rows that have a text (those whose text
    retention removed are training-only rows, never checked), against the intent examples."""
    rows = [i for i, (s, t) in enumerate(zip(ts.sources, ts.texts)) if s == "teacher" and t]
    examples = ts.select(i for i, s in enumerate(ts.sources) if s == "intent_example")
    info, keep = noisy_teacher_guard(ts.select(rows), examples, champion, str(encoder_id))
    gone = set(rows) - {rows[j] for j in keep}
    if not gone:
        return ts, info
    keys = ts.train_keys - {normalise_key(ts.texts[i]) for i in gone}
    return replace(_without(ts, gone), train_keys=keys), info


def _without(ts: TrainingSet, gone: set[int]) -> TrainingSet:
    """``ts`` without the rows ``gone``, its report's ``train`` counts updated."""
    kept = ts.select(i for i in range(len(ts)) if i not in gone)
    report = {**ts.report, "train": {"n": len(kept), "by_source": kept.counts(), "n_out_of_scope": kept.n_out_of_scope}}
    return replace(ts, texts=kept.texts, labels=kept.labels, vectors=kept.vectors, sources=kept.sources,
                   decision_ids=kept.decision_ids, report=report)


def _check_evidence(ts: TrainingSet, estimate: NoiseEstimate, *, champion: IntentModel | None, encoder_id: str | None,
                    enabled: bool, rules: FilterRules) -> tuple[TrainingSet, dict[str, Any]]:
    """The evidence rules (the module docs) on the guarded training set."""
    dim = ts.vectors.shape[1] if ts.vectors.ndim == 2 else 0
    usable = champion if (champion is not None and encoder_id is not None and champion.encoder_dir is None
                          and champion.encoder_matches(encoder_id, dim)) else None
    ranker = champion_ranker(usable, rules.runner_up_ratio) if usable is not None else None
    drop, info = filter_teacher_rows(ts.vectors, ts.labels, ts.sources, estimate, ranker=ranker, rules=rules,
                                     texts=ts.texts)
    info = {"enabled": bool(enabled), **info,
            "runner_up_from": (f"champion {usable.version}" if usable is not None
                               else "intent examples and human labels"),
            "rules": {k: getattr(rules, k) for k in rules.__dataclass_fields__}}
    if not enabled:
        info["would_drop"], info["dropped"] = info["dropped"], {r: 0 for r in REASONS}
        return ts, info
    return (_without(ts, set(drop)) if drop else ts), info


# ------------------------------------------------------------------ the noise guard
def min_labels_for(level: float, confidence: float = CONFIDENCE) -> int | None:
    """The fewest decisions with both labels whose ``confidence`` interval can lie above
    ``level`` at all (every one of them wrong: the lower bound is then
    ``((1 - confidence) / 2) ** (1 / n)``); ``None`` for a level of 1 or more.

    >>> min_labels_for(0.30), min_labels_for(0.5), min_labels_for(0.0), min_labels_for(1.0)
    (4, 6, 1, None)
    """
    if level >= 1.0:
        return None
    if level <= 0.0:
        return 1
    a = (1.0 - confidence) / 2.0
    n = max(1, math.floor(math.log(a) / math.log(level)))
    while a ** (1.0 / n) <= level:
        n += 1
    return n


def _level_words(level: float) -> str:
    return f"--max-teacher-noise {level:g}" + (" (the default)" if level == DEFAULT_MAX_TEACHER_NOISE else "")


def _unknown_line(n: int, need: int, level: float, what: str) -> str:
    return (f"teacher noise unknown: {counted(n, 'human label')} on decisions the teacher labelled; at least "
            f"{need:,} are needed before the 95% interval can show the teacher above {_level_words(level)}, so "
            f"{what} distilled unchecked (flywheel feedback adds human labels)")


def noise_guard(noise: dict[str, Any] | None, by_intent: dict[str, Any] | None,
                level: float = DEFAULT_MAX_TEACHER_NOISE) -> dict[str, Any]:
    """Whether the teacher is above the noise ``level`` and which labels that costs, from
    the figures alone (``teacher_noise`` and ``teacher_noise_by_intent``; the module docs):
    ``{"level", "status", "n", "min_n", "estimate", "low", "labels", "kept_labels", "line"}``.
    ``status``: ``off`` (a level of 1 or more), ``unknown`` (fewer than ``min_n`` decisions
    with both labels: :func:`min_labels_for`), ``above`` (the 95% lower bound is above the
    level) or ``within``. With ``above``, ``labels`` are the teacher labels whose own
    figure is above the level and ``kept_labels`` those whose own figure is not (each with
    its estimate); every other teacher label goes by the overall estimate, so is dropped
    too. ``line`` says it in one sentence."""
    noise = noise or {}
    n, low, est = int(noise.get("n") or 0), noise.get("low"), noise.get("estimate")
    need = min_labels_for(level)
    out: dict[str, Any] = {"level": float(level), "status": "within", "n": n, "min_n": need, "estimate": est,
                           "low": low, "labels": {}, "kept_labels": {}}
    if need is None:
        out["status"] = "off"
        out["line"] = "teacher-noise guard off (--max-teacher-noise 1): the teacher's labels are distilled whatever " \
                      "its noise"
    elif n < need or low is None:
        out["status"] = "unknown"
        out["line"] = _unknown_line(n, need, level, "its labels are")
    elif low > level:
        out["status"] = "above"
        for k, v in (by_intent or {}).items():
            (out["labels"] if (v.get("estimate") or 0.0) > level else out["kept_labels"])[k] = v.get("estimate")
        kept = ", ".join(f"{k} {_pct(v)}" for k, v in out["kept_labels"].items())
        out["line"] = (f"teacher above {_level_words(level)}: {_pct(est)} wrong, 95% lower bound {_pct(low)}, on "
                       f"{counted(n, 'decision')} with a human label: the next retrain drops its labels from the "
                       f"training rows"
                       + (f" except those of the labels with their own record within the level ({kept})"
                          if kept else ""))
    else:
        out["line"] = (f"teacher noise within {_level_words(level)}: 95% lower bound {_pct(low)} (estimate "
                       f"{_pct(est)}, n={n:,}); its labels are distilled")
    return out


def guard_teacher_rows(ts: TrainingSet, estimate: NoiseEstimate, level: float = DEFAULT_MAX_TEACHER_NOISE,
                       min_rows: int = MIN_INTENT_ROWS) -> tuple[TrainingSet, dict[str, Any]]:
    """The retrain's noise guard (the module docs; step 4a's last part): the training set
    without the teacher rows of the labels above the noise ``level`` when the teacher is
    (:func:`noise_guard` on ``estimate``), and ``teacher_guard``, the step's report section:
    :func:`noise_guard`'s fields plus ``checked`` (teacher rows), ``dropped``,
    ``dropped_by_label``, ``held_back`` (rows kept as the last 2 of a label) and ``notes``
    (what the run's summary says: the rows dropped, or that the noise is unknown while
    there are teacher rows; nothing when the teacher is within the level or the guard is
    off)."""
    info = noise_guard(estimate.overall(), estimate.by_intent(min_rows), level)
    teacher = [i for i, s in enumerate(ts.sources) if s == "teacher"]
    info.update(checked=len(teacher), dropped=0, dropped_by_label={}, held_back=0, notes=[])
    if not teacher or info["status"] not in ("above", "unknown"):
        return ts, info
    if info["status"] == "unknown":
        info["line"] = _unknown_line(info["n"], info["min_n"], level,
                                     f"the teacher's {counted(len(teacher), 'training row')} are")
        info["notes"] = [info["line"]]
        return ts, info
    left: Counter = Counter(ts.labels)
    by: Counter = Counter()
    gone: set[int] = set()
    for i in teacher:
        lab = ts.labels[i]
        if label_name(lab) in info["kept_labels"]:
            continue
        if left[lab] <= 2:
            info["held_back"] += 1
            continue
        left[lab] -= 1
        by[label_name(lab)] += 1
        gone.add(i)
    info.update(dropped=len(gone), dropped_by_label=dict(sorted(by.items(), key=lambda kv: (-kv[1], kv[0]))))
    own = ", ".join(f"{k} {_pct(v)}" for k, v in info["labels"].items())
    kept = ", ".join(f"{k} {_pct(v)}" for k, v in info["kept_labels"].items())
    info["line"] = (f"teacher above {_level_words(level)}: {_pct(info['estimate'])} wrong (95% CI "
                    f"{_pct(info['low'])}-{_pct(estimate.overall()['high'])}) on {counted(info['n'], 'decision')} "
                    f"with a teacher and a human label, so its labels were not distilled: {len(gone):,} of "
                    f"{counted(len(teacher), 'teacher row')} dropped before training ("
                    + (f"by their own record: {own}; " if own else "")
                    + f"{'the other labels' if own or kept else 'every label'} at the overall "
                      f"{_pct(info['estimate'])})"
                    + (f"; kept, their own record within the level: {kept}" if kept else "")
                    + (f"; {info['held_back']:,} held back as the last 2 rows of a label" if info["held_back"] else "")
                    + "; --max-teacher-noise 1 distils them anyway")
    info["notes"] = [info["line"]]
    return (_without(ts, gone) if gone else ts), info
