"""Turn layer-2 scores into a tiered result: confident, ambiguous, weak or no_match.

All cutoffs are compared with ``>=``/``<``, never by truthiness: ``0.0`` is a valid
threshold (a confident cutoff of 0.0 makes every in-scope answer confident).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Sequence

import numpy as np

from flywheel.classifier.decision import Candidate, Tier
from flywheel.classifier.layer2.scoring import HeadScores
from flywheel.classifier.layer2.shift import METRIC_KEY, undertrained_languages

if TYPE_CHECKING:
    from flywheel.classifier.versions.model import IntentModel


@dataclass(frozen=True)
class Thresholds:
    """Cutoffs used by :func:`assign_tiers`.

    confident : top in-scope probability needed for ``confident``.
    ambiguous_ratio : the runner-up is "close" when ``p2 / p1 >= ambiguous_ratio``.
    oos : out-of-scope probability (the head's gate) at or above which a query is out of scope.
    oos_confident : out-of-scope probability at or above which layer 2 is sure of it
        (above 1.0: never; the teacher is asked).
    per_intent : overrides of ``confident`` by label.
    defer : with the ``risk`` deferral rule, layer 2 decides alone when its calibrated
        probability of being wrong is at most this (``None``: the ``tiers`` rule, the
        ``confident``/``ambiguous_ratio``/``oos_confident`` cutoffs above).
    set_cutoff : an intent is in the conformal prediction set when its probability is at
        least this (``None``: a model fitted before prediction sets, or an intent file that
        fixes ``ambiguous_ratio``; alternatives are then cut where the scores drop).
    coverage : the nominal coverage ``set_cutoff`` was calibrated for.
    undertrained : declared languages the training rows lack or barely have
        (:func:`classifier.layer2.shift.undertrained_languages`): a rejection of a query in
        one of them is unsure (see :func:`assign_tiers`).
    """

    confident: float
    ambiguous_ratio: float
    oos: float
    oos_confident: float = 1.1
    per_intent: dict[str, float] = field(default_factory=dict)
    defer: float | None = None
    set_cutoff: float | None = None
    coverage: float | None = None
    undertrained: frozenset[str] = frozenset()

    @classmethod
    def for_model(cls, model: IntentModel) -> "Thresholds":
        """The cutoffs ``model`` is served with: the intent file's fixed
        values where set, else the learned ones of its manifest (which post-hoc tuning
        replaces; a key missing there falls back to the head's own ``thresholds_``)."""
        th = {**model.head.thresholds_, **(model.manifest.thresholds or {})}
        user = model.intents.thresholds
        rows = (model.manifest.metrics or {}).get(METRIC_KEY)
        risk = user.deferral == "risk" and "defer" in th
        return cls(
            confident=user.confident if user.confident is not None else float(th["confident"]),
            ambiguous_ratio=user.ambiguous_ratio if user.ambiguous_ratio is not None
            else float(th["ambiguous_ratio"]),
            oos=user.oos if user.oos is not None else float(th["oos"]),
            oos_confident=float(th.get("oos_confident", 1.1)),
            per_intent=dict(user.per_intent),
            defer=float(th["defer"]) if risk else None,
            # a fixed ambiguous_ratio keeps the ratio rule for the alternatives
            set_cutoff=float(th["set"]) if "set" in th and user.ambiguous_ratio is None else None,
            coverage=float(th["coverage"]) if "coverage" in th else None,
            undertrained=undertrained_languages(rows, model.intents.languages),
        )

    def confident_for(self, label: str) -> float:
        return self.per_intent.get(label, self.confident)

    def to_dict(self) -> dict[str, object]:
        return {"confident": self.confident, "ambiguous_ratio": self.ambiguous_ratio, "oos": self.oos,
                "oos_confident": self.oos_confident, "per_intent": dict(self.per_intent), "defer": self.defer,
                "set_cutoff": self.set_cutoff, "coverage": self.coverage}


@dataclass(frozen=True)
class Layer2Result:
    label: str | None
    confidence: float
    tier: Tier
    alternatives: list[Candidate]
    reason: str
    candidates: list[Candidate]     # every in-scope label, best first (for the teacher)
    p_oos: float
    sure: bool                      # layer 2 decides; otherwise the teacher is asked


#: Decimals of every probability, confidence and cutoff a reason or a report prints: one
#: format in one run, whichever layer or path wrote the reason (issue 44).
PROB_DIGITS = 3


def fmt_probs(*values: float, digits: int = PROB_DIGITS) -> list[str]:
    """``values`` (probabilities, confidences, cutoffs) as text for a reason or a report,
    each with exactly ``digits`` decimals. Rounded to the nearest, except that a value
    strictly between 0 and 1 never prints as 0 or 1 (``fmt_probs(0.9999)`` is
    ``['>0.999']``, never a misleading ``1.000``; ``fmt_probs(0.00004)`` is ``['<0.001']``)
    and that two different values never print alike where a step apart tells them (the
    smaller rounded down, the larger up: ``fmt_probs(0.996, 0.9961)`` is
    ``['0.996', '0.997']``, never ``0.996 < 0.996``)."""
    vals = [float(v) for v in values]
    step = 10.0 ** -digits
    near = [round(v, digits) for v in vals]
    shown = list(near)
    for i, v in enumerate(vals):
        alike = [w for w, n in zip(vals, near) if n == near[i] and w != v]
        if alike and v < min(alike):        # rounded apart: the smallest down, the largest up
            shown[i] = float(np.floor(v / step + 1e-9)) * step
        elif alike and v > max(alike):
            shown[i] = float(np.ceil(v / step - 1e-9)) * step
    return [_text(v, x, digits) for v, x in zip(vals, shown)]


def _text(v: float, shown: float, digits: int) -> str:
    """``shown`` (``v`` rounded) with ``digits`` decimals; ``<0.001``/``>0.999`` (for 3) when
    ``v`` is strictly between 0 and 1 and would print as one of them."""
    text = f"{shown:.{digits}f}"
    if 0.0 < v < 1.0 and float(text) in (0.0, 1.0):
        step = 10.0 ** -digits
        return f"<{step:.{digits}f}" if float(text) == 0.0 else f">{1.0 - step:.{digits}f}"
    return text


def cut_at_drop(cands: Sequence[Candidate], ratio: float, max_n: int = 10) -> list[Candidate]:
    """Keep the leading candidates until the first one whose score falls below
    ``ratio`` times the previous one (the place where the scores drop).

    Examples
    --------
    >>> c = [Candidate("a", .40), Candidate("b", .35), Candidate("c", .05)]
    >>> [x.label for x in cut_at_drop(c, 0.5)]
    ['a', 'b']
    """
    out: list[Candidate] = []
    for c in cands[:max_n]:
        if out and c.confidence < ratio * out[-1].confidence:
            break
        out.append(c)
    return out


_TIERS = (Tier.CONFIDENT, Tier.AMBIGUOUS, Tier.WEAK, Tier.NO_MATCH)


class TierBatch:
    """:func:`assign_tiers` for a batch: one entry per row.

    top : index of the top in-scope intent. rejected : layer 2 answers out of scope.
    close : the runner-up is within ``ambiguous_ratio`` of the top. sure : layer 2
    decides alone (else the teacher is asked). tier : a :class:`Tier` per row.
    confidence : the top probability, or the out-of-scope score for rejections.
    in_set : (n, k) membership of the conformal prediction set (``None`` without one).
    p1, p2 : the top and the runner-up in-scope probabilities.
    doubt : rows the gate rejected in an undertrained language (:func:`unsure_rejections`):
        still ``rejected``, never ``sure``: the teacher decides.
    """

    def __init__(self, top: np.ndarray, rejected: np.ndarray, close: np.ndarray, sure: np.ndarray,
                 tier: np.ndarray, confidence: np.ndarray, in_set: np.ndarray | None,
                 p1: np.ndarray, p2: np.ndarray, doubt: np.ndarray | None = None) -> None:
        self.top, self.rejected, self.close, self.sure = top, rejected, close, sure
        self.tier, self.confidence, self.in_set = tier, confidence, in_set
        self.p1, self.p2 = p1, p2
        self.doubt = doubt if doubt is not None else np.zeros(len(top), bool)

    def __len__(self) -> int:
        return len(self.top)

    def labels(self, classes: Sequence[str]) -> list[str | None]:
        """The answer of every row: its top intent, or ``None`` when rejected."""
        names = np.asarray(classes, dtype=object)[self.top]
        return [None if r else str(n) for n, r in zip(names, self.rejected)]


def unsure_rejections(rejected: np.ndarray, shifted: np.ndarray | None = None) -> np.ndarray:
    """The rejections layer 2 cannot be sure of (the gate under shift), among ``rejected``:
    every ``shifted`` row (its language is undertrained: :mod:`classifier.layer2.shift`).
    The gate's distance and the out-of-scope class's claim both grow with the language
    shift, so neither is evidence there: the teacher decides (measured in BENCHMARKS §23:
    keeping the rejections the out-of-scope class claims surely left 3.9% of in-scope
    queries as sure rejections, es -> en). A rejection of a query in a well-trained
    language is evidence: it stays."""
    if shifted is None:
        return np.zeros(len(rejected), bool)
    return np.asarray(rejected, bool) & np.asarray(shifted, bool)


def assign_tiers(scores: HeadScores, labels: Sequence[str], th: Thresholds,
                 shifted: np.ndarray | None = None) -> TierBatch:
    """The one tier rule, vectorised over a batch of :class:`~classifier.layer2.scoring.HeadScores`
    (``labels`` aligned with its columns).

    - **Rejected** (out of scope): the gate's ``p_oos >= oos``, or the out-of-scope class
      at least as likely as the top intent. Tier ``no_match``.
    - **Sure** (layer 2 decides): with ``defer`` set and a risk model, the calibrated
      P(wrong) is at most ``defer`` (and the top reaches its per-intent cutoff, if any);
      otherwise a rejection is sure at ``oos_confident``, an answer when its top reaches
      its cutoff and the runner-up is not close. A sure answer is ``confident``.
    - **Unsure** answers are ``ambiguous`` when more than one intent is plausible (the
      conformal set holds two or more; without a set: close and two before the drop),
      else ``weak``.
    - **A rejection under language shift** (:func:`unsure_rejections`: ``shifted`` rows, one flag
      per row, are queries in an undertrained language) is never sure: the teacher decides,
      and without a teacher it is served as the rejection it is.
    """
    probs = np.asarray(scores.probs, dtype=np.float64)
    n, k = probs.shape
    rows = np.arange(n)
    order = np.argsort(-probs, axis=1, kind="stable")
    top = order[:, 0] if k else np.zeros(n, int)
    p1 = probs[rows, top]
    p2 = probs[rows, order[:, 1]] if k > 1 else np.zeros(n)
    oos_conf = scores.oos_confidence
    rejected = scores.rejected(th.oos)       # the out-of-scope rule, kept with the scores
    doubt = unsure_rejections(rejected, shifted)
    close = (p1 > 0) & (p2 / np.clip(p1, 1e-12, None) >= th.ambiguous_ratio)
    names = np.asarray(labels, dtype=object)
    cut = np.array([th.per_intent.get(str(x), th.confident) for x in names], float)[top] if k else np.zeros(n)
    risk = scores.risk
    if th.defer is not None and risk is not None:
        has_own = np.array([str(x) in th.per_intent for x in names], bool)[top] if k else np.zeros(n, bool)
        sure = (np.asarray(risk) <= th.defer) & (rejected | ~has_own | (p1 >= cut))
    else:
        sure = np.where(rejected, oos_conf >= th.oos_confident, (p1 >= cut) & ~close)
    sure = sure & ~doubt
    in_set = probs >= th.set_cutoff if th.set_cutoff is not None else None
    plural = in_set.sum(axis=1) >= 2 if in_set is not None else close  # close: two before the drop
    codes = np.where(rejected, 3, np.where(sure, 0, np.where(plural, 1, 2)))
    tier = np.array(_TIERS, dtype=object)[codes]
    confidence = np.where(rejected, oos_conf, p1)
    return TierBatch(top, rejected, close, sure.astype(bool), tier, confidence, in_set, p1, p2, doubt)


def tier_rows(scores: HeadScores, labels: Sequence[str], th: Thresholds,
              shifted: np.ndarray | None = None) -> list[Layer2Result]:
    """:func:`assign_tiers` as one :class:`Layer2Result` per row (what the pipeline serves)."""
    batch = assign_tiers(scores, labels, th, shifted)
    risk = scores.risk
    out = [_result(batch, j, scores.probs[j], labels, float(scores.oos_class[j]), float(scores.p_oos[j]),
                   None if risk is None else float(risk[j]), th) for j in range(len(batch))]
    for j in np.flatnonzero(batch.doubt):   # why the gate's rejection went to the teacher
        out[j] = replace(out[j], reason=f"{doubt_reason(th)}: {out[j].reason}")
    return out


def doubt_reason(th: Thresholds) -> str:
    """The start of a rejection's reason when :func:`unsure_rejections` sent it to the teacher."""
    return f"out of scope unsure, the query's language is undertrained ({', '.join(sorted(th.undertrained))})"


def assign_tier(probs: np.ndarray, labels: Sequence[str], oos_class: float, p_oos: float,
                th: Thresholds, risk: float | None = None) -> Layer2Result:
    """Tier one query (the row view of :func:`assign_tiers`) from calibrated in-scope
    ``probs`` (aligned with ``labels``), the probability of the out-of-scope class, the
    gate's out-of-scope probability ``p_oos`` (which includes the distance to the nearest
    training example) and, for the ``risk`` rule, the calibrated P(wrong).

    Examples
    --------
    >>> import numpy as np
    >>> th = Thresholds(confident=0.6, ambiguous_ratio=0.5, oos=0.5)
    >>> assign_tier(np.array([0.9, 0.05]), ["A", "B"], 0.0, 0.1, th).tier.value
    'confident'
    >>> assign_tier(np.array([0.45, 0.40]), ["A", "B"], 0.0, 0.1, th).tier.value
    'ambiguous'
    >>> assign_tier(np.array([0.9, 0.05]), ["A", "B"], 0.0, 0.9, th).tier.value
    'no_match'
    """
    row = HeadScores(np.asarray(probs, dtype=np.float64)[None, :], np.array([oos_class], float),
                     np.array([p_oos], float), np.zeros(1), None if risk is None else np.array([risk], float))
    batch = assign_tiers(row, labels, th)
    return _result(batch, 0, row.probs[0], labels, oos_class, p_oos, risk, th)


def _result(batch: TierBatch, j: int, probs: np.ndarray, labels: Sequence[str], oos_class: float, p_oos: float,
            risk: float | None, th: Thresholds) -> Layer2Result:
    """Row ``j`` of ``batch`` with its candidates, alternatives and reason."""
    order = np.argsort(-np.asarray(probs), kind="stable")
    cands = [Candidate(labels[i], float(probs[i])) for i in order]
    top, tier, sure = cands[0], Tier(batch.tier[j]), bool(batch.sure[j])
    by_risk, why_risk = False, ""
    if th.defer is not None and risk is not None:
        by_risk = True
        r_txt, d_txt = fmt_probs(risk, th.defer)
        why_risk = f"; P(wrong) {r_txt} {'<=' if sure else '>'} cutoff {d_txt}"
    if batch.rejected[j]:
        if p_oos >= th.oos:
            why = "out of scope: probability {} >= cutoff {}".format(*fmt_probs(p_oos, th.oos))
        else:
            o_txt, t_txt = fmt_probs(oos_class, top.confidence)
            why = f"out-of-scope class most likely ({o_txt} >= {top.label} {t_txt})"
        conf = float(batch.confidence[j])
        if not sure and not by_risk and conf < th.oos_confident:   # say why it goes to the teacher
            why += "; unsure: out-of-scope confidence {} < cutoff {}".format(*fmt_probs(conf, th.oos_confident))
        return Layer2Result(None, conf, Tier.NO_MATCH, [], why + why_risk, cands, float(p_oos), sure)
    cutoff = th.confident_for(labels[order[0]])   # top.label, never None here
    if tier is Tier.CONFIDENT:
        why = why_risk[2:] if by_risk else "confidence {} >= cutoff {}".format(*fmt_probs(top.confidence, cutoff))
        return Layer2Result(top.label, top.confidence, tier, [], why, cands, float(p_oos), True)
    if batch.in_set is not None and th.set_cutoff is not None:   # in_set is there only with set_cutoff
        alts = [c for c in cands if c.confidence >= th.set_cutoff][:10] or cands[:1]
    else:
        alts = cut_at_drop(cands, th.ambiguous_ratio)
    if tier is Tier.AMBIGUOUS:
        ratio = fmt_probs(th.ambiguous_ratio)[0]
        why = (f"{len(alts)} intents in the {th.coverage:.0%} prediction set" if batch.in_set is not None
               and th.coverage is not None else f"{len(alts)} intents within ratio {ratio} of the top")
        return Layer2Result(top.label, top.confidence, tier, alts, why + why_risk, cands, float(p_oos), False)
    if by_risk:
        why = why_risk[2:]
    elif top.confidence >= cutoff:
        why = f"runner-up within ratio {fmt_probs(th.ambiguous_ratio)[0]} of the top"
    else:
        why = "confidence {} < cutoff {}".format(*fmt_probs(top.confidence, cutoff))
    return Layer2Result(top.label, top.confidence, Tier.WEAK, alts, why, cands, float(p_oos), False)
