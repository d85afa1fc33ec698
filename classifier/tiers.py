"""Turn layer-2 scores into a tiered result: confident, ambiguous, weak or no_match.

All cutoffs are compared with ``>=``/``<``, never by truthiness: ``0.0`` is a valid
threshold (a confident cutoff of 0.0 makes every in-scope answer confident).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from classifier.decision import Candidate, Tier


@dataclass(frozen=True)
class Thresholds:
    """Cutoffs used by :func:`assign_tier`.

    confident : top in-scope probability needed for ``confident``.
    ambiguous_ratio : the runner-up is "close" when ``p2 / p1 >= ambiguous_ratio``.
    oos : out-of-scope probability (the head's gate) at or above which a query is out of scope.
    oos_confident : out-of-scope probability at or above which layer 2 is sure of it
        (above 1.0: never; the teacher is asked).
    per_intent : overrides of ``confident`` by label.
    """

    confident: float
    ambiguous_ratio: float
    oos: float
    oos_confident: float = 1.1
    per_intent: dict[str, float] = field(default_factory=dict)

    @classmethod
    def for_model(cls, model: Any) -> "Thresholds":
        """The cutoffs ``model`` (an IntentModel) is served with: the intent file's fixed
        values where set, else the learned ones of its manifest (which post-hoc tuning
        replaces; a key missing there falls back to the head's own ``thresholds_``)."""
        th = {**getattr(model.head, "thresholds_", {}), **(model.manifest.thresholds or {})}
        user = model.intents.thresholds
        return cls(
            confident=user.confident if user.confident is not None else float(th["confident"]),
            ambiguous_ratio=user.ambiguous_ratio if user.ambiguous_ratio is not None
            else float(th["ambiguous_ratio"]),
            oos=user.oos if user.oos is not None else float(th["oos"]),
            oos_confident=float(th.get("oos_confident", 1.1)),
            per_intent=dict(user.per_intent),
        )

    def confident_for(self, label: str) -> float:
        return self.per_intent.get(label, self.confident)

    def to_dict(self) -> dict[str, object]:
        return {"confident": self.confident, "ambiguous_ratio": self.ambiguous_ratio, "oos": self.oos,
                "oos_confident": self.oos_confident, "per_intent": dict(self.per_intent)}


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


def assign_tier(probs: np.ndarray, labels: Sequence[str], oos_class: float, p_oos: float,
                th: Thresholds) -> Layer2Result:
    """Tier one query from calibrated in-scope ``probs`` (aligned with ``labels``), the
    probability of the out-of-scope class and the gate's out-of-scope probability
    ``p_oos`` (which includes the distance to the nearest training example).

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
    order = np.argsort(-probs)
    cands = [Candidate(labels[i], float(probs[i])) for i in order]
    top = cands[0]
    second = cands[1].confidence if len(cands) > 1 else 0.0
    if p_oos >= th.oos or oos_class >= top.confidence:
        why = (f"out of scope: probability {p_oos:.2f} >= cutoff {th.oos:.2f}" if p_oos >= th.oos
               else f"out-of-scope class most likely ({oos_class:.2f} >= {top.label} {top.confidence:.2f})")
        conf = max(p_oos, oos_class)
        return Layer2Result(None, float(conf), Tier.NO_MATCH, [], why, cands, float(p_oos),
                            conf >= th.oos_confident)
    cutoff = th.confident_for(top.label)
    close = top.confidence > 0 and second / top.confidence >= th.ambiguous_ratio
    if top.confidence >= cutoff and not close:
        return Layer2Result(top.label, top.confidence, Tier.CONFIDENT, [],
                            f"confidence {top.confidence:.2f} >= cutoff {cutoff:.2f}", cands, float(p_oos), True)
    alts = cut_at_drop(cands, th.ambiguous_ratio)
    if close and len(alts) >= 2:
        return Layer2Result(top.label, top.confidence, Tier.AMBIGUOUS, alts,
                            f"{len(alts)} intents within ratio {th.ambiguous_ratio:.2f} of the top",
                            cands, float(p_oos), False)
    return Layer2Result(top.label, top.confidence, Tier.WEAK, alts,
                        f"confidence {top.confidence:.2f} < cutoff {cutoff:.2f}", cands, float(p_oos), False)
