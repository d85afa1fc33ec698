"""Re-tune the challenger's ``confident`` cutoff for a target precision or an LLM budget.

The precision target needs labels, so it is measured on the held-out teacher-labelled
``recent`` slice. The LLM budget is a share of *all* traffic and is measured on a
:class:`TrafficSample` of the latest logged decisions, built so that it estimates what
the challenger will see:

- **Rows the challenger was trained on are left out.** The model is over-sure on its
  own training rows, so counting them understates the share it will send to the LLM.
- **Labelled traffic is represented by held-out rows, reweighted.** Most
  teacher-labelled texts (the hard traffic: they went to the LLM) are training rows.
  Their stratum keeps its weight, the number of labelled decisions among the latest
  ``n``, but is measured on held-out labelled rows (the hash split makes them a random
  sample of it): the held-out teacher rows among those decisions, or, when there are
  fewer than ``min_held``, the newest ``min_held`` of the recent teacher slice (older
  escalations were made by weaker champions and are easier: using all of them
  understates the share), plus the held-out human labels among those decisions.
- Unlabelled decisions (decided by layer 2, never sent to the teacher) count once each.

When the ``confident`` cutoff alone cannot meet the budget (layer 2's unsure
out-of-scope answers and near-ties are already over it), layer 2 may decide the surest
of those too, but only in a way it gets right more often than not on the held-out
labelled rows (see :func:`_relax_allowed`): a budget never buys a cheaper wrong answer.

Tuning is post-hoc and outside the estimator (like scikit-learn's
``TunedThresholdClassifierCV``): :func:`retune` reads the model and returns the new
learned thresholds as a new dict; the fitted head (its ``thresholds_``) and the
model's manifest are never changed. :func:`with_thresholds` makes the new model that
serves them (its manifest's thresholds are what :meth:`Thresholds.for_model` serves).
The steps: the precision cutoff on ``recent`` (:func:`_precision_cutoff`), then, with
an LLM budget, the budget cutoff and any relaxed escalations (:func:`_budget_cutoff`).
With an intent file's ``thresholds.target`` (:mod:`classifier.layer2.operating_point`), an
``llm_share`` keeps the cutoffs the head chose for it out of fold (unless an LLM budget is
given), an ``oos_recall`` keeps its ``oos`` cutoff, and :func:`at_target` cuts a champion
fitted without the target at it on held-out rows, so the gate compares both at one point.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from flywheel.classifier.layer2.head import precision_cutoff
from flywheel.classifier.layer2.operating_point import choose_cutoff
from flywheel.classifier.layer2.targets import target_kind
from flywheel.classifier.layer2.tiers import Thresholds, assign_tiers
from flywheel.classifier.text import normalise_key
from flywheel.classifier.versions.model import IntentModel
from flywheel.training.rows import LabelledSet, TrainingSet

if TYPE_CHECKING:
    from flywheel.classifier.layer2.scoring import HeadScores
    from flywheel.classifier.protocols import Embedder
    from flywheel.training.protocols import TrafficLog

__all__ = ["MIN_TUNE_ROWS", "TRAFFIC_SAMPLE_ROWS", "TrafficSample", "traffic_sample", "retune", "learned_thresholds",
           "with_thresholds", "layer2_state", "risk_ece", "at_target", "cut_at"]

MIN_TUNE_ROWS = 50          # rows needed to re-tune the confident cutoff
MIN_KIND_ROWS = 10          # held-out rows of a kind of escalation needed to judge it
RELAX_MIN_ACCURACY = 0.5    # the budget hands a kind of escalation to layer 2 only above this
TRAFFIC_SAMPLE_ROWS = 2000  # the latest decisions the LLM-budget sample holds, at most


@dataclass
class TrafficSample:
    """Embeddings standing for recent traffic, with a weight per row (see module docs)."""

    vectors: np.ndarray
    weights: np.ndarray
    n_decisions: int             # decisions read from the log
    n_unlabelled: int            # of those, counted as themselves
    n_labelled: int              # of those, labelled: represented by held-out rows
    n_held_out: int              # held-out labelled rows standing for them
    n_excluded: int              # unlabelled decisions whose text is a training row

    def __len__(self) -> int:
        return len(self.vectors)

    def describe(self) -> str:
        return (f"latest {self.n_decisions:,} logged decisions: {self.n_unlabelled:,} unlabelled as themselves, "
                f"{self.n_labelled:,} labelled as {self.n_held_out:,} held-out rows (weight "
                f"{self.n_labelled / max(self.n_held_out, 1):.2f}), {self.n_excluded:,} training texts left out")


def traffic_sample(store: TrafficLog | None, encoder_id: str, ts: TrainingSet, n: int = TRAFFIC_SAMPLE_ROWS,
                   min_held: int = 50, encoder: Embedder | None = None) -> TrafficSample | None:
    """The budget sample of the latest ``n`` decisions logged with ``encoder_id``.

    ``None`` when the log has none, or the sample would be smaller than
    :data:`MIN_TUNE_ROWS`. ``encoder`` (a tuned challenger's): the same decisions' texts
    encoded by it instead of their logged vectors (decisions whose text retention removed
    are left out); ``ts`` must then carry its vectors too.
    """
    if store is None:
        return None
    rows = store.latest_decisions(encoder_id, n)
    if not rows:
        return None
    unlabelled: list[str] = []
    window_keys: set[str] = set()
    n_labelled = n_excluded = 0
    for did, text in rows:
        key = normalise_key(text)
        if key in ts.logged_keys:
            n_labelled += 1
            window_keys.add(key)
        elif key in ts.train_keys:
            n_excluded += 1
        else:
            unlabelled.append(did)
    if encoder is None:
        vecs = store.embeddings(encoder_id, unlabelled) if unlabelled else {}
    else:
        texts = dict(rows)
        unlabelled = [d for d in unlabelled if texts.get(d)]
        vecs = dict(zip(unlabelled, np.asarray(encoder.encode([texts[d] for d in unlabelled]), np.float32))) \
            if unlabelled else {}
    parts = [np.stack([vecs[i] for i in unlabelled if i in vecs])] if vecs else []
    weights = [np.ones(len(parts[0]))] if parts else []
    in_window = [i for i, t in enumerate(ts.recent.texts) if normalise_key(t) in window_keys]
    if len(in_window) < min_held:   # ts.recent is oldest first
        in_window = list(range(max(0, len(ts.recent) - min_held), len(ts.recent)))
    humans = [i for i, (t, src) in enumerate(zip(ts.eval.texts, ts.eval.sources))
              if src == "human" and normalise_key(t) in window_keys]
    held: LabelledSet = ts.recent.select(in_window).concat(ts.eval.select(humans))
    if n_labelled and len(held):
        parts.append(held.vectors)
        weights.append(np.full(len(held), n_labelled / len(held)))
    if not parts or sum(len(p) for p in parts) < MIN_TUNE_ROWS:
        return None
    return TrafficSample(np.vstack(parts).astype(np.float32, copy=False), np.concatenate(weights),
                         n_decisions=len(rows), n_unlabelled=len(vecs), n_labelled=n_labelled,
                         n_held_out=len(held) if n_labelled else 0, n_excluded=n_excluded)


def layer2_state(model: IntentModel, th: Any, classes: np.ndarray, X: np.ndarray) -> tuple:
    """Scores, top/second probabilities, out-of-scope and near-tie flags, top labels."""
    s = model.head.scores(X)
    t = assign_tiers(s, classes.tolist(), th)      # the one tier rule
    return s, t.p1, t.p2, t.rejected, t.close, classes[t.top]


def _fits(weights: np.ndarray, budget: float) -> int:
    """How many leading rows (already in escalation order) fit in ``budget`` weight."""
    return int(np.searchsorted(np.cumsum(weights), budget + 1e-9, side="right"))


def _relax_for_budget(learned: dict[str, float], s: Any, conf: np.ndarray, second: np.ndarray,
                      oos_esc: np.ndarray, amb_esc: np.ndarray, w: np.ndarray, budget: float,
                      allow: dict[str, str | None], ambiguous_ratio: float) -> dict[str, Any]:
    """Hand the surest of these escalations to layer 2 so that at most ``budget`` weight
    of them remains; return the relaxed cutoffs (to be set in ``learned``, the learned
    thresholds being tuned, which is read here and not changed).

    ``allow["out_of_scope"]``: ``"reject"`` lowers ``oos_confident`` (layer 2 serves its
    surest unsure rejections as out of scope), ``"accept"`` raises ``oos`` (the least
    out-of-scope-like of them are served as their top intent), ``None`` keeps them all
    with the LLM. ``allow["near_tie"]``: ``"decide"`` raises ``ambiguous_ratio``.
    """
    oos_score = s.oos_confidence
    ratio = (second / np.clip(conf, 1e-12, None))[amb_esc]
    r_order = np.argsort(-ratio, kind="stable")
    ratios, amb_w = ratio[r_order], w[amb_esc][r_order]
    w_oos, w_amb = float(w[oos_esc].sum()), float(amb_w.sum())
    mode = allow.get("out_of_scope")
    if mode and allow.get("near_tie"):
        total = w_oos + w_amb
        b_oos = budget * w_oos / total if total else 0.0
    else:
        b_oos = w_oos if not mode else max(0.0, budget - w_amb)
    out: dict[str, Any] = {}
    kept_oos = w_oos
    if mode == "reject":
        o = np.argsort(oos_score[oos_esc], kind="stable")
        scores, ow = oos_score[oos_esc][o], w[oos_esc][o]
        k = _fits(ow, b_oos)                 # escalated when below the cutoff: keep the k lowest
        kept_oos = float(ow[:k].sum())
        if k < len(scores):
            out["oos_confident"] = float(scores[k])
    elif mode == "accept":
        movable = oos_esc & _acceptable(s, conf, second, ambiguous_ratio)
        fixed_w = float(w[oos_esc & ~movable].sum())
        o = np.argsort(-s.p_oos[movable], kind="stable")
        p, pw = s.p_oos[movable][o], w[movable][o]
        k = _fits(pw, max(0.0, b_oos - fixed_w))     # keep the k most out-of-scope-like rejected
        kept_oos = fixed_w + float(pw[:k].sum())
        if k < len(p):
            new = float(p[k - 1]) if k > 0 else float(p[0]) + 1e-6
            new = min(new, float(learned["oos_confident"]))
            if new > learned["oos"]:
                out["oos"] = new
    b_amb = max(0.0, budget - kept_oos)
    k_amb = _fits(amb_w, b_amb) if allow.get("near_tie") else len(ratios)
    if k_amb < len(ratios):      # ambiguous when at or above the ratio: keep the k_amb highest
        r = float(ratios[k_amb - 1]) if k_amb > 0 else min(1.0, float(ratios[0]) + 1e-6)
        out["ambiguous_ratio"] = r
    return out


def _acceptable(s: Any, conf: np.ndarray, second: np.ndarray, ambiguous_ratio: float) -> np.ndarray:
    """Rejections a higher ``oos`` cutoff would serve as their top intent: rejected by
    ``p_oos`` only (not by the out-of-scope class) and not a near-tie once accepted."""
    return (s.oos_class < conf) & (second / np.clip(conf, 1e-12, None) < ambiguous_ratio)


def _relax_allowed(recent: LabelledSet, s: Any, conf: np.ndarray, second: np.ndarray, rejected: np.ndarray,
                   oos_sure: np.ndarray, close: np.ndarray, top: np.ndarray, ambiguous_ratio: float,
                   fixed: dict[str, bool]) -> tuple[dict[str, str | None], dict[str, Any]]:
    """How the budget may hand each kind of escalation to layer 2: only in a way layer 2
    gets right more often than not on the held-out labelled rows (at least
    :data:`MIN_KIND_ROWS` of them).

    Unsure out-of-scope answers are served as out of scope (``"reject"``) or as their top
    intent (``"accept"``), whichever is right more often; on traffic with little out of
    scope the rejections can be mostly wrong. Near-ties are served as their top intent
    (``"decide"``). Otherwise they stay with the LLM (``None``): a budget never buys a
    cheaper wrong answer. A threshold the intent file fixes (``fixed``) is never relaxed.
    """
    labels = recent.labels
    is_oos = np.array([y is None for y in labels])
    top_right = np.array([t == y for t, y in zip(top, labels)])
    unsure = rejected & ~oos_sure
    movable = unsure & _acceptable(s, conf, second, ambiguous_ratio)

    def acc(mask: np.ndarray, right: np.ndarray) -> float | None:
        return float(right[mask].mean()) if mask.sum() >= MIN_KIND_ROWS else None

    a_rej, a_acc = acc(unsure, is_oos), acc(movable, top_right)
    ok_rej = a_rej is not None and a_rej > RELAX_MIN_ACCURACY
    ok_acc = a_acc is not None and a_acc > RELAX_MIN_ACCURACY and not fixed["oos"]
    if ok_rej and ok_acc:   # both right more often than not: the more accurate; a tie keeps the rejection
        assert a_rej is not None and a_acc is not None, "ok_rej and ok_acc say both were measured"
        oos_mode: str | None = "accept" if a_acc > a_rej else "reject"
    else:
        oos_mode = "reject" if ok_rej else "accept" if ok_acc else None
    a_amb = acc(~rejected & close, top_right)
    amb_mode = "decide" if (a_amb is not None and a_amb > RELAX_MIN_ACCURACY
                            and not fixed["ambiguous_ratio"]) else None
    seen = {"out_of_scope": {"n": int(unsure.sum()), "accuracy": _r(a_rej), "n_movable": int(movable.sum()),
                             "top_intent_accuracy": _r(a_acc), "relaxed": oos_mode},
            "near_tie": {"n": int((~rejected & close).sum()), "accuracy": _r(a_amb), "relaxed": amb_mode}}
    return {"out_of_scope": oos_mode, "near_tie": amb_mode}, seen


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def learned_thresholds(model: IntentModel) -> dict[str, float]:
    """A copy of ``model``'s learned thresholds: its manifest's, a key missing there taken
    from the head (the same rule as :meth:`Thresholds.for_model`, before the intent
    file's fixed values)."""
    return {k: float(v) for k, v in {**model.head.thresholds_, **model.manifest.thresholds}.items()}


def with_thresholds(model: IntentModel, thresholds: dict[str, float]) -> IntentModel:
    """A new model served with these learned ``thresholds`` (from :func:`retune`): its
    manifest says so; the fitted head is shared and never changed."""
    manifest = replace(model.manifest, thresholds={k: float(v) for k, v in thresholds.items()})
    return replace(model, manifest=manifest, path=None)


def retune(model: IntentModel, recent: LabelledSet, target_precision: float, llm_budget: float | None,
           traffic: TrafficSample | None = None) -> tuple[dict[str, Any], dict[str, float]]:
    """Re-tune the global ``confident`` cutoff: ``(info, thresholds)``, what was done and
    the new learned thresholds (``model`` is not changed; serve them with
    :func:`with_thresholds`).

    The cutoff is the precision cutoff on ``recent`` (for ``target_precision``, relative
    to the precision layer 2 reaches on its surest answers; see
    :func:`classifier.layer2.head.precision_cutoff`), lowered when needed so that at most
    ``llm_budget`` of the traffic goes to the LLM. The budget is measured on ``traffic``
    (weighted) when given, else on ``recent``. Fewer than :data:`MIN_TUNE_ROWS` recent
    rows: the cross-validation cutoff is kept. When the cutoff alone cannot meet the
    budget, ``oos_confident``, ``oos`` or ``ambiguous_ratio`` may be relaxed as well
    (see the module docs); ``info`` says which, under ``relaxed_escalations``.
    """
    learned = learned_thresholds(model)
    cv = learned["confident"]
    info: dict[str, Any] = {"on": "recent", "n": len(recent), "target_precision": target_precision,
                            "llm_budget": llm_budget, "cv_confident": cv, "confident": cv}
    if model.intents.thresholds.confident is not None:
        info["note"] = ("the intent file fixes thresholds.confident; the tuned value is recorded "
                        "but serving uses the fixed one")
    th = Thresholds.for_model(model)
    if target_kind(model.intents.thresholds.target) == "llm_share" and llm_budget is None:
        info["method"] = "target llm_share (out of fold, as fitted)"   # its cutoffs are the target's
        return info, learned
    if th.defer is not None and (len(recent) >= MIN_TUNE_ROWS or traffic is not None):  # the risk rule
        classes = np.array([str(c) for c in model.manifest.labels], dtype=object)
        state = layer2_state(model, th, classes, recent.vectors) if len(recent) else None
        if state is not None and state[0].risk is not None:
            info["risk_ece_recent"] = risk_ece(state, recent.labels)
        learned["defer"] = _risk_cutoff(model, state, traffic, llm_budget, info)
        return info, learned
    if len(recent) < MIN_TUNE_ROWS:
        info["method"] = "cross-validation"
        info["why"] = f"recent-traffic slice has {len(recent)} rows (< {MIN_TUNE_ROWS}); kept the CV cutoff"
        return info, learned
    classes = np.array([str(c) for c in model.manifest.labels], dtype=object)
    state = layer2_state(model, th, classes, recent.vectors)
    if state[0].risk is not None:
        info["risk_ece_recent"] = risk_ece(state, recent.labels)
    found = _precision_cutoff(state, recent.labels, th, target_precision)
    t_prec = info["precision_cutoff"] = 1.0 if found is None else float(found)
    chosen = t_prec
    info["method"] = "target_precision"
    if found is None and llm_budget is None:
        chosen = cv  # unreachable on recent traffic: never send everything to the LLM
        info["method"] = "cross-validation"
        info["why"] = "target precision not reachable on recent traffic; kept the CV cutoff"
    if llm_budget is not None:
        t_budget, relaxed = _budget_cutoff(model, th, classes, recent, state, traffic, llm_budget, learned, info)
        learned.update(relaxed)
        chosen = min(t_prec, t_budget)
        info["method"] = "llm_budget" if t_budget < t_prec else "target_precision (within the LLM budget)"
    learned["confident"] = info["confident"] = float(chosen)
    return info, learned


def risk_ece(state: tuple, labels: list[str | None]) -> float:
    """ECE of the risk model on labelled rows: 1 - P(wrong) against layer 2's answer
    (its top intent, or out of scope when rejected) being right."""
    from flywheel.classifier.layer2.calibration import expected_calibration_error

    s, conf, second, rejected, close, top = state
    answer = np.where(rejected, None, top)
    right = np.array([a == y for a, y in zip(answer, labels)], dtype=bool)
    return expected_calibration_error(1.0 - np.asarray(s.risk), right)


def _risk_cutoff(model: IntentModel, state: tuple | None, traffic: TrafficSample | None,
                 llm_budget: float | None, info: dict[str, Any]) -> float:
    """The ``risk`` rule's cutoff: layer 2 defers a query when its P(wrong) is above it.

    Deferring a query trades its risk for the teacher's error rate (1 - the teacher's
    assumed ``confidence``), so expected errors are lowest when every query riskier
    than the teacher is deferred; with ``llm_budget``, the cutoff rises until at most
    that share of the traffic (the weighted sample, else ``recent``) is deferred, but
    never above 0.5: a query layer 2 more likely gets wrong than right is deferred even
    over budget (``budget_reachable`` False), the tiers rule's guard too."""
    teacher_error = 1.0 - float(model.intents.teacher.confidence)
    info["method"] = "risk"
    info["teacher_error"] = teacher_error
    cutoff = teacher_error
    if llm_budget is not None:
        if traffic is not None and len(traffic) >= MIN_TUNE_ROWS:
            risk, w = np.asarray(model.head.scores(traffic.vectors).risk), np.asarray(traffic.weights, float)
            info["budget_on"] = traffic.describe()
        elif state is not None:
            risk, w = np.asarray(state[0].risk), np.ones(len(state[1]))
            info["budget_on"] = "recent teacher-labelled slice"
        else:
            info["defer"] = cutoff
            return cutoff
        order = np.argsort(-risk, kind="stable")           # deferred first
        r, cw = risk[order], np.cumsum(w[order]) / max(float(w.sum()), 1e-12)
        k = int(np.searchsorted(cw, llm_budget + 1e-9, side="right"))   # the riskiest k fit the budget
        budget_cut = float(r[k]) if k < len(r) else 0.0
        info["budget_cutoff"] = budget_cut
        # as with the tiers rule, a budget never buys a cheaper wrong answer: a query layer 2
        # is more likely wrong than right still goes to the LLM, over budget if need be
        cap = 1.0 - RELAX_MIN_ACCURACY
        info["budget_reachable"] = budget_cut <= cap
        cutoff = max(cutoff, min(budget_cut, cap))
        deferred = risk > cutoff
        info["llm_share_expected"] = round(float(w[deferred].sum() / max(w.sum(), 1e-12)), 4)
        info["expected_error_rate"] = round(float((np.where(deferred, teacher_error, risk) * w).sum()
                                                  / max(w.sum(), 1e-12)), 4)
    info["defer"] = float(cutoff)
    return float(cutoff)


def _precision_cutoff(state: tuple, labels: list[str | None], th: Thresholds, target: float) -> float | None:
    """The precision cutoff on the rows the global cutoff decides (None: unreachable)."""
    s, conf, second, rejected, close, top = state
    correct = np.array([t == y for t, y in zip(top, labels)])
    own = np.array([t in th.per_intent for t in top])
    glob = ~rejected & ~close & ~own
    return precision_cutoff(conf[glob], correct[glob], target, unreachable=None)


def _budget_cutoff(model: IntentModel, th: Thresholds, classes: np.ndarray, recent: LabelledSet, state: tuple,
                   traffic: TrafficSample | None, llm_budget: float, learned: dict[str, float],
                   info: dict[str, Any]) -> tuple[float, dict[str, float]]:
    """The strictest cutoff within ``llm_budget`` and the relaxed escalation thresholds
    (none unless the cutoff alone cannot meet it); records what it did in ``info``."""
    s, conf, second, rejected, close, top = state
    user = model.intents.thresholds
    allow, kinds = _relax_allowed(recent, s, conf, second, rejected,
                                  s.oos_confidence >= th.oos_confident, close, top,
                                  th.ambiguous_ratio, {"oos": user.oos is not None or  # a recall target's
                                                       target_kind(user.target) == "oos_recall",
                                                       "ambiguous_ratio": user.ambiguous_ratio is not None})
    if traffic is not None and len(traffic) >= MIN_TUNE_ROWS:
        s, conf, second, rejected, close, top = layer2_state(model, th, classes, traffic.vectors)
        w = np.asarray(traffic.weights, dtype=np.float64)
        info["budget_on"] = traffic.describe()
    else:
        w = np.ones(len(conf))
        info["budget_on"] = "recent teacher-labelled slice"
    own = np.array([t in th.per_intent for t in top])
    glob = ~rejected & ~close & ~own
    oos_sure = s.oos_confidence >= th.oos_confident
    pi_cut = np.array([th.per_intent.get(t, 0.0) for t in top])
    per_intent_w = float(w[~rejected & ~close & own & (conf < pi_cut)].sum())
    budget_w = llm_budget * float(w.sum())
    fixed = float(w[(rejected & ~oos_sure) | (~rejected & close)
                    | (~rejected & ~close & own & (conf < pi_cut))].sum())
    relaxed: dict[str, float] = {}
    if budget_w - fixed < 0:
        # the cutoff alone cannot meet the budget: out-of-scope answers layer 2 is not
        # sure of and near-ties already exceed it. Decide the surest of those at layer 2
        # too (share the budget between them by their weights), but only in a way it
        # gets right more often than not; the rest still go to the LLM.
        t_budget = 0.0
        info["budget_reachable"] = False
        info["relaxed_escalations"] = kinds
        # per-intent cutoffs still escalate their own rows: they take their share first
        relaxed = _relax_for_budget(learned, s, conf, second, rejected & ~oos_sure, ~rejected & close,
                                    w, max(0.0, budget_w - per_intent_w), allow, th.ambiguous_ratio)
        info.update(relaxed)
    else:
        order = np.argsort(conf[glob], kind="stable")
        c, cw = conf[glob][order], w[glob][order]
        k = _fits(cw, budget_w - fixed)
        t_budget = 1.0 if k >= len(c) else float(c[k])
        info["budget_reachable"] = True
    info["budget_cutoff"] = t_budget
    return t_budget, relaxed


def at_target(model: IntentModel, target: dict[str, float] | None,
              rows: LabelledSet) -> tuple[IntentModel, dict | None]:
    """``model`` (a champion) cut at the run's ``target`` (``oos_recall`` or ``llm_share``),
    and how: unchanged when it was fitted at that target (its out-of-fold cut), else its
    cutoff chosen on ``rows`` (held-out labelled rows with its vectors), or unchanged with
    the reason when they are too few. ``(model, None)`` for no target or ``precision``."""
    kind = target_kind(target)
    if target is None or kind not in ("oos_recall", "llm_share"):
        return model, None
    if model.intents.thresholds.target == target:
        return model, {"how": "fitted at it", **(model.manifest.metrics.get("operating_point") or {})}
    n_oos = sum(1 for y in rows.labels if y is None)
    if len(rows) < MIN_TUNE_ROWS or (kind == "oos_recall" and n_oos < MIN_KIND_ROWS):
        return model, {"how": f"not cut: {len(rows)} held-out rows ({n_oos} out of scope) are too few to choose on"}
    cut, chosen = cut_at(model, target, model.head.scores(rows.vectors), list(rows.labels), "recent held-out rows")
    return cut, {"how": "cut on held-out rows", **chosen}


def cut_at(model: IntentModel, target: dict[str, float], scores: HeadScores, truth: list[str | None],
           on: str) -> tuple[IntentModel, dict[str, Any]]:
    """``model`` served at the cutoff ``target`` (``oos_recall`` or ``llm_share``) picks on
    these labelled rows' ``scores`` (:func:`classifier.layer2.operating_point.choose_cutoff`; ``on``
    names them), its manifest's ``operating_point`` saying so; and that choice. The fitted
    head is shared and never changed."""
    th = Thresholds.for_model(model)
    classes = [str(c) for c in model.manifest.labels]
    chosen = choose_cutoff(target, scores, classes, truth, th, on)
    cut = with_thresholds(model, {**learned_thresholds(model), chosen["cutoff"]: chosen["value"]})
    metrics = {**cut.manifest.metrics, "operating_point": chosen}
    return replace(cut, manifest=replace(cut.manifest, metrics=metrics)), chosen
