"""Layer 2's scoring in numpy alone: what a fitted head computes for a query.

:class:`~classifier.layer2.head.IntentHead` (scikit-learn) is the estimator that *fits*; once
fitted, scoring a query needs only its arrays: the logistic regression's weights, the
temperature, the nearest-example references and the gate. :class:`ServingHead` holds
exactly those, computes :meth:`ServingHead.scores` with the same function the estimator
uses (:func:`score`), and saves to / loads from one ``.npz`` file without pickle. So a
process that only serves (``flywheel classify``, the sidecar) never imports
scikit-learn or SciPy, which was about a second of every CLI call (BENCHMARKS.md, section 9).

Both heads are a :class:`Head`: the contract by which a model version holds, serves and
saves its head, whichever of the two it loaded.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Mapping, Protocol, runtime_checkable

import numpy as np

from flywheel.classifier.errors import ModelError

__all__ = ["Head", "HeadScores", "RiskModel", "ServingHead", "score", "softmax", "normalise_rows", "gate_features",
           "p_oos_from_similarity", "binary_logits", "risk_features"]


def softmax(z: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    z = np.asarray(z, dtype=np.float64) / temperature
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def normalise_rows(X: Any) -> np.ndarray:
    X = np.asarray(X, dtype=np.float32)
    if X.ndim != 2:
        raise ValueError(f"expected a 2-d array of embeddings, got shape {X.shape}")
    n = np.linalg.norm(X, axis=1, keepdims=True)
    return X / np.where(n > 0, n, 1.0)


@dataclass(frozen=True)
class HeadScores:
    """Layer-2 scores for a batch.

    probs : (n, n_classes) calibrated probabilities of the in-scope labels.
    oos_class : (n,) calibrated probability of the out-of-scope class (0 without one).
    p_oos : (n,) the gate's probability that the query is out of scope.
    similarity : (n,) cosine similarity to the nearest in-scope training example.
    risk : (n,) calibrated probability that layer 2's answer is wrong (:class:`RiskModel`),
        or ``None`` for a head fitted before there was one.
    """

    probs: np.ndarray
    oos_class: np.ndarray
    p_oos: np.ndarray
    similarity: np.ndarray
    risk: np.ndarray | None = None

    def rejected(self, oos_cutoff: float) -> np.ndarray:
        """Rows layer 2 answers as out of scope at this ``oos`` cutoff: the gate says so,
        or the out-of-scope class is at least as likely as the top intent (the rule
        :func:`classifier.layer2.tiers.assign_tiers` builds on)."""
        return (self.p_oos >= oos_cutoff) | (self.oos_class >= self.probs.max(axis=1))

    @property
    def oos_confidence(self) -> np.ndarray:
        """How sure layer 2 is of an out-of-scope answer: the larger of the gate's
        ``p_oos`` and the out-of-scope class (compared with ``oos_confident``)."""
        return np.maximum(np.asarray(self.p_oos, float), np.asarray(self.oos_class, float))


def binary_logits(d: np.ndarray) -> np.ndarray:
    """A binary logistic regression's one logit as two class logits, split symmetrically."""
    return np.column_stack([-d / 2.0, d / 2.0])


def gate_features(probs: np.ndarray, sim: np.ndarray, n_in: int) -> np.ndarray:
    """The gate's inputs: log top in-scope probability, log out-of-scope class probability,
    similarity to the nearest example."""
    pmax = probs[:, :n_in].max(axis=1)
    poos = probs[:, n_in] if probs.shape[1] > n_in else np.zeros(len(probs))
    return np.column_stack([np.log(np.clip(pmax, 1e-9, None)), np.log(np.clip(poos, 1e-9, None)), sim])


def risk_features(probs: np.ndarray, p_oos: np.ndarray) -> np.ndarray:
    """The deferral model's inputs: the top in-scope probability, the margin between the
    top two, and the gate's out-of-scope probability (Ramírez et al. 2024 find the margin
    the best single deferral signal)."""
    p = np.asarray(probs, dtype=np.float64)
    if p.shape[1] > 1:
        top2 = -np.partition(-p, 1, axis=1)[:, :2]
        top, margin = top2[:, 0], top2[:, 0] - top2[:, 1]
    else:
        top = margin = p[:, 0]
    return np.column_stack([top, margin, np.asarray(p_oos, dtype=np.float64)])


TIE_BREAK = 1e-6


@dataclass(frozen=True)
class RiskModel:
    """P(layer 2 is wrong): a logistic score of :func:`risk_features`, mapped to a
    probability by an isotonic fit (breakpoints ``x`` -> ``y``, increasing) on
    out-of-fold predictions. Fitted by :class:`~classifier.layer2.head.IntentHead`."""

    coef: np.ndarray
    intercept: float
    x: np.ndarray
    y: np.ndarray

    def logit(self, features: np.ndarray) -> np.ndarray:
        return features @ self.coef + self.intercept

    def __call__(self, probs: np.ndarray, p_oos: np.ndarray) -> np.ndarray:
        s = 1.0 / (1.0 + np.exp(-self.logit(risk_features(probs, p_oos))))
        # the isotonic map is flat on each of its steps; a tie-break of 1e-6 times the score
        # keeps the order within a step, so a cutoff can split a step (an LLM budget that
        # ends inside one would otherwise defer all of it or none of it)
        return np.clip(np.interp(s, self.x, self.y) + TIE_BREAK * s, 0.0, 1.0)


def p_oos_from_similarity(sim: np.ndarray, quantiles: np.ndarray) -> np.ndarray:
    """Share of in-scope training queries at least as far from their nearest example."""
    q = np.asarray(quantiles)
    return 1.0 - np.interp(sim, q, np.linspace(0, 1, len(q)))


def score(X: np.ndarray, *, coef: np.ndarray, intercept: np.ndarray, temperature: float, ref: np.ndarray,
          n_in: int, has_oos: bool, gate_coef: np.ndarray | None, gate_intercept: float | None,
          sim_quantiles: np.ndarray | None, risk: RiskModel | None = None) -> HeadScores:
    """Scores of unit-norm rows ``X`` (see :class:`HeadScores`)."""
    z = X @ coef.T + intercept
    if z.shape[1] == 1:  # a binary logistic regression: one logit
        z = binary_logits(z[:, 0])
    probs = softmax(z, temperature)
    sim = (X @ ref.T).max(axis=1) if len(ref) else np.zeros(len(X))
    if gate_coef is not None:
        g = gate_features(probs, sim, n_in) @ gate_coef + gate_intercept
        p_oos = 1.0 / (1.0 + np.exp(-g))
    elif sim_quantiles is not None:
        p_oos = p_oos_from_similarity(sim, sim_quantiles)
    else:  # ServingHead refuses this at construction
        raise ModelError("a head needs a gate or similarity quantiles")
    oos_class = probs[:, n_in] if has_oos else np.zeros(len(X))
    pin = probs[:, :n_in]
    return HeadScores(probs=pin, oos_class=oos_class, p_oos=p_oos, similarity=sim,
                      risk=None if risk is None else risk(pin, p_oos))


@runtime_checkable
class Head(Protocol):
    """Layer 2's fitted head, as a model version (:attr:`classifier.versions.model.IntentModel.head`)
    serves and saves it: both the scikit-learn :class:`~classifier.layer2.head.IntentHead` that
    fits (a version just trained, or loaded with ``estimator=True``) and the numpy-only
    :class:`ServingHead` a served version loads from ``head.npz``.

    Contract:

    - ``classes_``: the in-scope labels, in the order of the columns of ``scores(X).probs``
      (a version's manifest ``labels``).
    - ``n_features_in_``: the dimension of the vectors it scores (its encoder's).
    - ``thresholds_``: the cutoffs learned when it was fitted (``confident``,
      ``ambiguous_ratio``, ``oos``, ``oos_confident``, and ``defer``, ``set`` and ``coverage``
      for heads fitted with them). A version's manifest overrides them
      (:meth:`classifier.layer2.tiers.Thresholds.for_model`). Read only.
    - ``metrics_``: the out-of-fold metrics of its fit. Read only.
    - ``scores(X)``: the :class:`HeadScores` of the rows of ``X``
      (``(n, n_features_in_)`` vectors; rows are L2-normalised first). The same rows get the
      same scores from either head of one fit; safe to call from several threads.
    - ``serving_head()``: the numpy-only :class:`ServingHead` that scores exactly as this head
      does (a ``ServingHead`` is its own): what
      :meth:`classifier.versions.model.IntentModel.save` writes as ``head.npz``.

    ``isinstance(x, Head)`` checks that ``x`` has every member (how a version refuses a
    ``head.joblib`` that unpickles to something else).
    """

    @property
    def classes_(self) -> np.ndarray: ...

    @property
    def n_features_in_(self) -> int: ...

    @property
    def thresholds_(self) -> Mapping[str, float]: ...

    @property
    def metrics_(self) -> Mapping[str, Any]: ...

    def scores(self, X: Any) -> HeadScores: ...

    def serving_head(self) -> "ServingHead": ...


_ARRAYS = ("coef", "intercept", "ref", "classes", "gate_coef", "sim_quantiles", "risk_coef", "risk_x", "risk_y")


class ServingHead:
    """A fitted head's scoring arrays; the same :meth:`scores` as the estimator, numpy only.

    Attributes ``classes_``, ``thresholds_``, ``metrics_``, ``has_oos_`` and
    ``n_features_in_`` mirror :class:`~classifier.layer2.head.IntentHead`'s: both are a
    :class:`Head`.
    """

    def __init__(self, *, classes: Any, coef: Any, intercept: Any, temperature: float, ref: Any,
                 has_oos: bool, gate_coef: Any = None, gate_intercept: float | None = None,
                 sim_quantiles: Any = None, thresholds: dict[str, Any] | None = None,
                 metrics: dict[str, Any] | None = None, risk: RiskModel | None = None) -> None:
        self.classes_ = np.asarray(classes, dtype=object)
        self._coef = np.ascontiguousarray(coef, dtype=np.float64)
        self._intercept = np.asarray(intercept, dtype=np.float64)
        self.temperature_ = float(temperature)
        self._ref = np.ascontiguousarray(ref, dtype=np.float32)
        self.has_oos_ = bool(has_oos)
        self._gate_coef = None if gate_coef is None else np.asarray(gate_coef, dtype=np.float64)
        self._gate_intercept = None if gate_intercept is None else float(gate_intercept)
        self._sim_quantiles = None if sim_quantiles is None else np.asarray(sim_quantiles, dtype=np.float64)
        if self._gate_coef is None and self._sim_quantiles is None:
            raise ModelError("a head needs a gate or similarity quantiles")
        self.thresholds_ = dict(thresholds or {})
        self.metrics_ = dict(metrics or {})
        self.n_features_in_ = int(self._coef.shape[1])
        self.risk_ = risk

    def scores(self, X: Any) -> HeadScores:
        """Calibrated in-scope probabilities, out-of-scope probabilities and similarity."""
        X = normalise_rows(X)
        if X.shape[1] != self.n_features_in_:
            raise ModelError(f"head expects {self.n_features_in_}-d embeddings, got {X.shape[1]}-d")
        return score(X, coef=self._coef, intercept=self._intercept, temperature=self.temperature_, ref=self._ref,
                     n_in=len(self.classes_), has_oos=self.has_oos_, gate_coef=self._gate_coef,
                     gate_intercept=self._gate_intercept, sim_quantiles=self._sim_quantiles, risk=self.risk_)

    def serving_head(self) -> "ServingHead":
        """Itself: the arrays :meth:`scores` needs (as the estimator's ``serving_head()`` gives
        them), so a version whose head was loaded from ``head.npz`` saves one again."""
        return self

    def predict_proba(self, X: Any) -> np.ndarray:
        return self.scores(X).probs

    def predict(self, X: Any) -> np.ndarray:
        """Top label per row, or ``None`` where layer 2 says out of scope."""
        s = self.scores(X)
        labels = self.classes_[s.probs.argmax(axis=1)]   # a new object array: None fits in
        labels[s.rejected(self.thresholds_["oos"])] = None
        return labels

    # ------------------------------------------------------------------ files
    def save(self, path: str | os.PathLike[str]) -> None:
        """One ``.npz`` (no pickle): the arrays, plus the scalars and dicts as JSON."""
        meta = {"temperature": self.temperature_, "has_oos": self.has_oos_, "gate_intercept": self._gate_intercept,
                "thresholds": self.thresholds_, "metrics": self.metrics_}
        arrays: dict[str, np.ndarray] = {
            "coef": self._coef, "intercept": self._intercept, "ref": self._ref.astype(np.float16),
            "classes": np.asarray([str(c) for c in self.classes_], dtype=str)}
        if self._gate_coef is not None:
            arrays["gate_coef"] = self._gate_coef
        if self._sim_quantiles is not None:
            arrays["sim_quantiles"] = self._sim_quantiles
        if self.risk_ is not None:
            arrays.update(risk_coef=self.risk_.coef, risk_x=self.risk_.x, risk_y=self.risk_.y)
            meta["risk_intercept"] = self.risk_.intercept
        with open(path, "wb") as f:   # allow_pickle: savez's default, named so **arrays cannot be it
            np.savez(f, allow_pickle=True, meta=np.asarray(json.dumps(meta, default=float)), **arrays)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> "ServingHead":
        """Read a file written by :meth:`save`; raises :class:`ModelError` naming what is wrong."""
        try:
            with np.load(path, allow_pickle=False) as z:
                meta = json.loads(str(z["meta"]))
                arrays = {k: z[k] for k in _ARRAYS if k in z.files}
        except (OSError, ValueError, KeyError) as exc:
            raise ModelError(f"{path}: cannot read the serving head: {type(exc).__name__}: {exc}") from None
        missing = [k for k in ("coef", "intercept", "ref", "classes") if k not in arrays]
        if missing:
            raise ModelError(f"{path}: the serving head is missing {', '.join(missing)}")
        risk = None
        if "risk_coef" in arrays:  # heads saved before the deferral model have none
            risk = RiskModel(coef=arrays["risk_coef"], intercept=float(meta["risk_intercept"]),
                             x=arrays["risk_x"], y=arrays["risk_y"])
        return cls(classes=arrays["classes"].tolist(), coef=arrays["coef"], intercept=arrays["intercept"],
                   temperature=meta["temperature"], ref=arrays["ref"], has_oos=meta["has_oos"],
                   gate_coef=arrays.get("gate_coef"), gate_intercept=meta.get("gate_intercept"),
                   sim_quantiles=arrays.get("sim_quantiles"), thresholds=meta.get("thresholds"),
                   metrics=meta.get("metrics"), risk=risk)
