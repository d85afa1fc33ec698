"""Layer 2's head: logistic regression on normalised embeddings, temperature-scaled,
with an out-of-scope gate and cutoffs learned by cross-validation.

Follows the scikit-learn estimator conventions: parameters are stored in
``__init__`` (no work there), ``fit`` returns ``self`` and sets fitted attributes
with a trailing underscore.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, NamedTuple, Sequence, overload

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import StratifiedKFold

from flywheel.classifier.errors import NotFittedError
from flywheel.classifier.layer2.calibration import expected_calibration_error, fit_temperature
from flywheel.classifier.layer2.scoring import (
    HeadScores,
    RiskModel,
    ServingHead,
    binary_logits,
    gate_features,
    p_oos_from_similarity,
    risk_features,
    softmax,
)
from flywheel.classifier.layer2.scoring import normalise_rows as _normalise

OOS = "__oos__"
OOS_CUTOFF = 0.5   # the out-of-scope cutoff on the (class-balanced) gate's probability


class _Rows(NamedTuple):
    """Training rows as :meth:`IntentHead.fit` uses them: normalised vectors, label indices
    into ``lr_classes_`` (out of scope last), in-scope flags and sample weights."""

    X: np.ndarray
    yi: np.ndarray
    in_scope: np.ndarray
    w: np.ndarray

    def take(self, mask: np.ndarray) -> _Rows:
        return _Rows(self.X[mask], self.yi[mask], self.in_scope[mask], self.w[mask])


class _Outcome(NamedTuple):
    """The out-of-fold answers judged: each row's top intent, whether it is right, whether
    the head rejects it as out of scope, and whether the answer is wrong (an in-scope row
    rejected, or an accepted row whose top intent is not its label)."""

    top: np.ndarray
    correct: np.ndarray
    answered_oos: np.ndarray
    wrong: np.ndarray

    @classmethod
    def of(cls, oof: HeadScores, cv: _Rows, oos_cutoff: float) -> _Outcome:
        top = oof.probs.argmax(axis=1)
        correct = (top == cv.yi) & cv.in_scope
        answered_oos = oof.rejected(oos_cutoff)
        return cls(top, correct, answered_oos, np.where(answered_oos, cv.in_scope, ~correct))


class CrossFitView(NamedTuple):
    """One encoder's view of the training rows, for cross-fitted calibration
    (:meth:`IntentHead.fit`'s ``cv_views``).

    ``X`` holds the rows' vectors by an encoder that was tuned on some of them (the first
    ``len(X)`` rows of ``fit``'s ``X``; rows appended after them, such as synthetic
    negatives, take no part in the view). ``predict`` flags the rows that encoder never
    saw: the head fits a regression on the view's other rows and predicts these, so their
    scores are what serving sees for unseen traffic."""

    X: np.ndarray
    predict: np.ndarray


class IntentHead(ClassifierMixin, BaseEstimator):
    """Calibrated logistic regression with an out-of-scope gate.

    Parameters
    ----------
    C : float
        Inverse regularisation strength of the logistic regression.
    cv : int or "auto"
        Folds for the out-of-fold predictions that fit the temperature, the gate
        and the cutoffs. ``"auto"``: 5, or 3 above 5,000 examples.
    target_precision : float
        The confident cutoff is the lowest confidence at which out-of-fold
        precision reaches this.
    max_ref_per_class : int
        Training embeddings kept per intent for the nearest-example distance.
    novelty_quantile : float
        Without out-of-scope examples, a query is out of scope when its similarity
        to the nearest example is below this quantile of in-scope queries.
    cv_max_samples : int or None
        Out-of-fold predictions (for the temperature, the gate and the cutoffs) use at
        most this many examples, a stratified sample; the final model uses all of them.
    coverage : float
        Nominal coverage of the conformal prediction set (split-conformal on the
        out-of-fold probabilities of the true intent).
    random_state : int
    max_iter : int
    operating_point : dict or None
        An intent file's ``thresholds.target`` (:mod:`classifier.layer2.operating_point`):
        ``{"oos_recall": R}`` sets the ``oos`` cutoff, ``{"llm_share": S}`` the ``confident``
        and ``defer`` cutoffs, at the point the out-of-fold rows give (``metrics_`` has it
        under ``operating_point``); ``precision`` is ``target_precision``.

    Attributes
    ----------
    classes_ : ndarray of str
        The in-scope labels.
    has_oos_ : bool
        Whether out-of-scope examples (label ``None``) were in the training data.
    lr_ : LogisticRegression
    temperature_ : float
    gate_ : LogisticRegression or None
    thresholds_ : dict
        ``confident``, ``ambiguous_ratio``, ``oos``, ``oos_confident``; ``defer`` (the
        default P(wrong) cutoff of the ``risk`` deferral rule, 1 - ``target_precision``),
        ``set`` (an intent's probability needed for the prediction set) and ``coverage``.
    risk_ : RiskModel
        Calibrated P(layer 2 is wrong) from the top probability, the margin and the gate,
        fitted on out-of-fold answers.
    metrics_ : dict
        Out-of-fold metrics (accuracy, ECE before/after scaling, ...).

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> centres = np.eye(4, 16)
    >>> X = np.vstack([c + 0.05 * rng.standard_normal((20, 16)) for c in centres])
    >>> y = ["a"] * 20 + ["b"] * 20 + ["c"] * 20 + [None] * 20
    >>> head = IntentHead(cv=3).fit(X, y)
    >>> list(head.classes_)
    ['a', 'b', 'c']
    >>> head.predict(X[:1])[0]
    'a'
    """

    def __init__(self, C: float = 20.0, cv: int | str = "auto", target_precision: float = 0.95,
                 max_ref_per_class: int = 200, novelty_quantile: float = 0.01,
                 cv_max_samples: int | None = 20000, coverage: float = 0.95, random_state: int = 0,
                 max_iter: int = 2000, operating_point: dict[str, float] | None = None) -> None:
        self.C = C
        self.cv = cv
        self.target_precision = target_precision
        self.max_ref_per_class = max_ref_per_class
        self.novelty_quantile = novelty_quantile
        self.cv_max_samples = cv_max_samples
        self.coverage = coverage
        self.random_state = random_state
        self.max_iter = max_iter
        self.operating_point = operating_point

    # ---------------------------------------------------------------- fitting
    def _lr(self) -> LogisticRegression:
        return LogisticRegression(C=self.C, max_iter=self.max_iter)

    def fit(self, X: Any, y: Sequence[str | None], sample_weight: Any = None,
            fit_only: Any = None, cv_views: Sequence[CrossFitView] | None = None) -> "IntentHead":
        """Fit the logistic regression, then the temperature, the gate and the cutoffs on
        out-of-fold predictions.

        Parameters
        ----------
        X : array of shape (n, dim)
        y : sequence of str or None (out of scope)
        sample_weight : array of shape (n,), optional
            Weights for the logistic regression (the gate and cutoffs are unweighted).
        fit_only : boolean array of shape (n,), optional
            Rows that are always in the training folds and never predicted out of fold,
            so the temperature, the gate and the cutoffs are learned on the other rows
            only (for rows that are not a sample of the traffic those must fit, such as
            pseudo-labels that are all easy queries).
        cv_views : sequence of CrossFitView, optional
            Cross-fitted calibration: instead of the k folds over ``X``, each view predicts
            its rows (those its encoder was not tuned on) from a regression on its other
            rows, in its own encoder's space. A row predicted by no view (or fit-only) is
            never predicted; no row may be predicted twice. The model that serves is still
            fitted on ``X``.
        """
        # the inputs checked, the labels encoded, the rows to predict out of fold
        X, y_arr, w, fo = self._validate_fit_inputs(X, y, sample_weight, fit_only)
        rows = _Rows(X, self._encode_labels(y_arr), y_arr != OOS, w)
        # out of fold: the temperature, the gate, the cutoffs, the risk, the prediction sets
        if cv_views:
            cv, logits, sim, fo = self._view_scores(rows, fo, cv_views)
            k = len(cv_views)
        else:
            cv, fixed, fo, k = self._cv_rows(rows, fo)
            logits, sim = self._oof_scores(cv, fixed, k)
        self.temperature_ = fit_temperature(logits, cv.yi)
        probs = softmax(logits, self.temperature_)
        is_oos = ~cv.in_scope
        p_oos = self._fit_gate(probs, sim, is_oos)
        n_in = len(self.classes_)
        # the out-of-fold scores as serving sees them: every rejection below is HeadScores.rejected,
        # the rule classifier.layer2.tiers.assign_tiers builds on
        oof = HeadScores(probs=probs[:, :n_in], oos_class=probs[:, n_in] if self.has_oos_ else np.zeros(len(probs)),
                         p_oos=p_oos, similarity=sim)
        chosen = self._at_target(oof, cv.yi, is_oos, "oos_recall")   # the oos cutoff the rest is learned at
        self.thresholds_ = self._learn_thresholds(oof, cv.yi, is_oos, chosen["value"] if chosen else None)
        outcome = _Outcome.of(oof, cv, self.thresholds_["oos"])
        self.risk_ = fit_risk(oof.probs, p_oos, outcome.wrong)
        self.thresholds_.update(conformal_cutoff(oof.probs[cv.in_scope], cv.yi[cv.in_scope], self.coverage),
                                defer=float(1.0 - self.target_precision))
        chosen = chosen or self._at_target(oof, cv.yi, is_oos, "llm_share")
        self.metrics_: dict[str, Any] = self._oof_metrics(oof, outcome, cv, logits, k, fit_only_rows=int(fo.sum()))
        if chosen:
            self.metrics_["operating_point"] = chosen
        # the model that serves, on every row
        self.lr_ = self._lr().fit(rows.X, rows.yi, sample_weight=rows.w)
        self.ref_, self.ref_labels_ = self._references(rows.X[rows.in_scope], rows.yi[rows.in_scope])
        self.n_features_in_ = rows.X.shape[1]
        return self

    @staticmethod
    def _validate_fit_inputs(X: Any, y: Sequence[str | None], sample_weight: Any, fit_only: Any
                             ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``fit``'s inputs checked and as arrays: the normalised rows, the labels (``OOS`` for
        out of scope), the weights (1 when not given) and the fit-only flags (none when not
        given). Raises ``ValueError`` where their lengths or the weights are wrong."""
        X = _normalise(X)
        y_arr = np.array([OOS if v is None else str(v) for v in y], dtype=object)
        if len(y_arr) != len(X):
            raise ValueError(f"X has {len(X)} rows but y has {len(y_arr)} labels")
        w = np.ones(len(X)) if sample_weight is None else np.asarray(sample_weight, dtype=np.float64)
        if w.shape != (len(X),) or not np.all(np.isfinite(w)) or (w <= 0).any():
            raise ValueError("sample_weight must be one positive finite number per row")
        fo = np.zeros(len(X), bool) if fit_only is None else np.asarray(fit_only, dtype=bool)
        if fo.shape != (len(X),):
            raise ValueError(f"fit_only must have one flag per row ({len(X)})")
        return X, y_arr, w, fo

    def _encode_labels(self, y_arr: np.ndarray) -> np.ndarray:
        """Set ``has_oos_``, ``classes_`` and ``lr_classes_`` (out of scope last) and return
        each row's index into ``lr_classes_``. Raises ``ValueError`` for too few intents or a
        label with fewer than 2 examples."""
        in_mask = y_arr != OOS
        classes = np.array(sorted(set(y_arr[in_mask])), dtype=object)
        if len(classes) == 0:
            raise ValueError("no in-scope examples to train on")
        self.has_oos_ = bool((~in_mask).any())
        if len(classes) < 2 and not self.has_oos_:
            raise ValueError("need at least two intents, or one intent and out-of-scope examples")
        self.classes_ = classes
        self.lr_classes_ = np.concatenate([classes, [OOS]]) if self.has_oos_ else classes
        yi = np.searchsorted(self.lr_classes_, y_arr) if not self.has_oos_ else \
            np.array([len(classes) if v == OOS else int(np.searchsorted(classes, v)) for v in y_arr])
        counts = np.bincount(yi, minlength=len(self.lr_classes_))
        if counts.min() < 2:
            bad = self.lr_classes_[int(counts.argmin())]
            raise ValueError(f"label {'out-of-scope' if bad == OOS else bad!r} has fewer than 2 examples")
        return yi

    def _cv_rows(self, rows: _Rows, fit_only: np.ndarray) -> tuple[_Rows, _Rows, np.ndarray, int]:
        """The rows predicted out of fold (at most ``cv_max_samples``, a stratified sample), the
        fit-only rows that are in every training fold, the fit-only flags and the number of
        folds. A label with fewer than 2 rows that are not fit-only cannot be cross-validated:
        its rows become fit-only."""
        cv_counts = np.bincount(rows.yi[~fit_only], minlength=len(self.lr_classes_))
        fit_only = fit_only | (cv_counts[rows.yi] < 2)
        if fit_only.all():
            raise ValueError("fit_only leaves no rows to cross-validate")
        cv, fixed = rows.take(~fit_only), rows.take(fit_only)
        counts = np.bincount(cv.yi, minlength=len(self.lr_classes_))
        counts = counts[counts > 0]
        k = self.cv if isinstance(self.cv, int) else (5 if len(cv.X) <= 5000 else 3)
        k = int(max(2, min(k, counts.min())))
        if self.cv_max_samples is not None and len(cv.X) > self.cv_max_samples:
            cv = _Rows(*self._subsample(cv.X, cv.yi, cv.in_scope, cv.w, self.cv_max_samples))
        return cv, fixed, fit_only, k

    def _oof_scores(self, cv: _Rows, fixed: _Rows, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Out-of-fold logits over ``lr_classes_`` and similarities to the nearest in-scope
        training example, for the rows of ``cv`` (stratified ``k``-fold)."""
        logits = np.zeros((len(cv.X), len(self.lr_classes_)))
        sim = np.zeros(len(cv.X))
        folds = StratifiedKFold(n_splits=k, shuffle=True, random_state=self.random_state)
        for tr, va in folds.split(cv.X, cv.yi):
            logits[va], sim[va] = self._score_fold(cv, fixed, tr, va)
        return logits, sim

    def _score_fold(self, cv: _Rows, fixed: _Rows, tr: np.ndarray, va: np.ndarray
                    ) -> tuple[np.ndarray, np.ndarray]:
        """One fold: fit on ``cv``'s rows ``tr`` and the fit-only rows, then the logits (-1e4 for
        a label missing from the fold) and nearest-example similarities of the rows ``va``."""
        lr = self._lr().fit(np.vstack([cv.X[tr], fixed.X]), np.concatenate([cv.yi[tr], fixed.yi]),
                            sample_weight=np.concatenate([cv.w[tr], fixed.w]))
        z = np.full((len(va), len(self.lr_classes_)), -1e4)
        z[:, lr.classes_] = lr.decision_function(cv.X[va]) if len(lr.classes_) > 2 else \
            binary_logits(lr.decision_function(cv.X[va]))
        ref = np.vstack([cv.X[tr][cv.in_scope[tr]], fixed.X[fixed.in_scope]])
        return z, (cv.X[va] @ ref.T).max(axis=1)

    def _view_scores(self, rows: _Rows, fit_only: np.ndarray, views: Sequence[CrossFitView]
                     ) -> tuple[_Rows, np.ndarray, np.ndarray, np.ndarray]:
        """Cross-fitted scores (see ``fit``'s ``cv_views``): the rows predicted, their logits
        over ``lr_classes_`` and similarities to the nearest in-scope training row of their
        view, and the flags of the rows never predicted. Raises ``ValueError`` for a view of
        the wrong shape, a row predicted twice or no row predicted."""
        n, dim = rows.X.shape
        masks = []
        for i, view in enumerate(views):
            vx, vp = np.asarray(view.X), np.asarray(view.predict, dtype=bool)
            if vx.ndim != 2 or vx.shape[0] > n or vx.shape[1] != dim or vp.shape != (len(vx),):
                raise ValueError(f"cv_views[{i}] must hold at most {n} rows of {dim} values and one flag per row")
            mask = np.zeros(n, bool)
            mask[: len(vx)] = vp
            masks.append(mask & ~fit_only)
        if (np.sum(masks, axis=0) > 1).any():
            raise ValueError("cv_views predict a row more than once")
        predicted = np.any(masks, axis=0)
        if not predicted.any():
            raise ValueError("cv_views predict no row")
        logits = np.full((n, len(self.lr_classes_)), -1e4)
        sim = np.zeros(n)
        for view, mask in zip(views, masks):
            vx = _normalise(view.X)
            m = len(vx)
            part = _Rows(vx, rows.yi[:m], rows.in_scope[:m], rows.w[:m])
            tr, va = np.flatnonzero(~mask[:m]), np.flatnonzero(mask[:m])
            if len(va):
                logits[va], sim[va] = self._score_fold(part, part.take(np.zeros(m, bool)), tr, va)
        return rows.take(predicted), logits[predicted], sim[predicted], ~predicted

    def _at_target(self, oof: HeadScores, yi: np.ndarray, is_oos: np.ndarray, kind: str) -> dict[str, Any] | None:
        """The ``operating_point`` of this ``kind`` on the out-of-fold rows: the cutoff it picks
        and what those rows give there (``None`` for another kind or none). ``oos_recall``:
        the ``oos`` cutoff (``fit`` learns the others at it); ``llm_share``: the ``confident``
        cutoff and the risk rule's ``defer``, set in ``thresholds_`` (either rule serves at it)."""
        from flywheel.classifier.layer2.operating_point import choose_cutoff
        from flywheel.classifier.layer2.targets import target_kind
        from flywheel.classifier.layer2.tiers import Thresholds

        if target_kind(self.operating_point) != kind:
            return None
        assert self.operating_point is not None, "a target kind comes from a target"
        if kind == "oos_recall" and self.gate_ is None:
            raise ValueError("thresholds.target.oos_recall needs out-of-scope examples to learn the oos cutoff on")
        n_in = len(self.classes_)
        truth = [None if o else str(self.classes_[i]) for i, o in zip(np.minimum(yi, n_in - 1), is_oos)]
        t: dict[str, float] = self.thresholds_ if kind == "llm_share" else {   # oos_recall: only oos matters
            "confident": 1.0, "ambiguous_ratio": 0.5, "oos": OOS_CUTOFF, "oos_confident": 1.1}
        th = Thresholds(t["confident"], t["ambiguous_ratio"], t["oos"], t["oos_confident"], set_cutoff=t.get("set"))
        classes = [str(c) for c in self.classes_]
        chosen = choose_cutoff(self.operating_point, oof, classes, truth, th, "out-of-fold training rows")
        if kind == "llm_share":
            risky = HeadScores(oof.probs, oof.oos_class, oof.p_oos, oof.similarity, self.risk_(oof.probs, oof.p_oos))
            by_risk = choose_cutoff(self.operating_point, risky, classes, truth, replace(th, defer=t["defer"]),
                                    chosen["on"])
            t.update(confident=chosen["value"], defer=by_risk["value"])
            chosen["defer"] = {k: by_risk[k] for k in ("value", "reached", "llm_share")}
        return chosen

    def _fit_gate(self, probs: np.ndarray, sim: np.ndarray, is_oos: np.ndarray) -> np.ndarray:
        """Set the out-of-scope gate (``gate_``: a class-balanced logistic regression on
        :func:`~classifier.layer2.scoring.gate_features`, or, without out-of-scope rows, ``None`` and
        the similarity quantiles ``sim_quantiles_``); return its out-of-fold P(out of scope)."""
        if self.has_oos_ and is_oos.any():
            feats = gate_features(probs, sim, len(self.classes_))
            self.gate_ = LogisticRegression(C=1.0, class_weight="balanced", max_iter=1000).fit(feats, is_oos)
            self.sim_quantiles_ = None
            return self.gate_.predict_proba(feats)[:, 1]
        self.gate_ = None
        self.sim_quantiles_ = np.quantile(sim, np.linspace(0, 1, 201))
        return p_oos_from_similarity(sim, self.sim_quantiles_)

    def _oof_metrics(self, oof: HeadScores, outcome: _Outcome, cv: _Rows, logits: np.ndarray, k: int,
                     *, fit_only_rows: int) -> dict[str, Any]:
        """``metrics_``: accuracy, calibration, out-of-scope recall, risk calibration, prediction
        sets and the confident cutoff's precision, all out of fold."""
        in_mask, correct, answered_oos = cv.in_scope, outcome.correct, outcome.answered_oos
        raw = softmax(logits, 1.0)[:, : len(self.classes_)]
        metrics: dict[str, Any] = {
            "cv_folds": k,
            "oof_top1_accuracy": float(correct[in_mask].mean()),
            "oof_ece_raw": expected_calibration_error(raw.max(1)[in_mask], correct[in_mask]),
            "oof_ece": expected_calibration_error(oof.probs.max(1)[in_mask], correct[in_mask]),
            "temperature": self.temperature_,
        }
        if self.gate_ is not None:
            metrics["oof_oos_recall"] = float(answered_oos[~in_mask].mean())
        metrics["oof_in_scope_accuracy"] = float((correct & ~answered_oos)[in_mask].mean())
        metrics["oof_risk_ece"] = risk_ece_cross_fitted(oof.probs, oof.p_oos, outcome.wrong, self.random_state)
        metrics["oof_set_coverage"], metrics["oof_mean_set_size"] = set_coverage(
            oof.probs[in_mask], cv.yi[in_mask], self.thresholds_["set"])
        metrics["cutoff_precision"] = cutoff_precision(
            self.classes_, outcome.top, correct, oof.probs.max(axis=1), ~answered_oos, self.thresholds_["confident"])
        metrics["cv_samples"] = int(len(cv.X))
        metrics["fit_only_rows"] = fit_only_rows
        return metrics

    def _subsample(self, X: np.ndarray, yi: np.ndarray, in_mask: np.ndarray, w: np.ndarray, n_max: int
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """A stratified sample of ``n_max`` (``cv_max_samples``) rows, keeping >= 2 of every label."""
        rng = np.random.default_rng(self.random_state)
        share = n_max / len(X)
        keep = []
        for c in np.unique(yi):
            idx = np.flatnonzero(yi == c)
            n = min(len(idx), max(2, int(round(share * len(idx)))))
            keep.append(rng.choice(idx, n, replace=False))
        sel = np.sort(np.concatenate(keep))
        return X[sel], yi[sel], in_mask[sel], w[sel]

    def _references(self, X: np.ndarray, yi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng(self.random_state)
        keep = []
        for c in np.unique(yi):
            idx = np.flatnonzero(yi == c)
            if len(idx) > self.max_ref_per_class:
                idx = rng.choice(idx, self.max_ref_per_class, replace=False)
            keep.append(idx)
        sel = np.sort(np.concatenate(keep))
        return X[sel].astype(np.float16), yi[sel].astype(np.int32)

    def _learn_thresholds(self, oof: HeadScores, yi: np.ndarray, is_oos: np.ndarray,
                          oos_cutoff: float | None = None) -> dict[str, float]:
        pin = oof.probs
        top, conf = pin.argmax(axis=1), pin.max(axis=1)
        in_mask = ~is_oos
        correct = (top == yi) & in_mask
        if self.gate_ is not None:
            # The class-balanced gate's own decision point: it weighs out-of-scope recall and
            # in-scope acceptance equally (CLINC150's two measures), like an argmax over a grid
            # of cutoffs, but is a smooth fit instead of an argmax over a few dozen noisy
            # out-of-scope labels, which swung from 0.28 to 0.58 between retrains (BENCHMARKS.md 12).
            oos_t = OOS_CUTOFF
        else:
            oos_t = 1.0 - self.novelty_quantile
        oos_t = oos_t if oos_cutoff is None else oos_cutoff     # an operating point's
        rejected = oof.rejected(oos_t)
        # a rejection is sure when its served confidence reaches the cutoff; never sure
        # without out-of-scope training data
        oos_conf = (precision_cutoff(oof.oos_confidence[rejected], is_oos[rejected], self.target_precision)
                    if self.gate_ is not None else 1.1)
        accepted = ~rejected
        confident = precision_cutoff(conf[accepted], correct[accepted], self.target_precision)
        amb = 0.5   # one intent (against out of scope) has no runner-up to be torn with
        if pin.shape[1] > 1:
            order = np.argsort(-pin, axis=1)
            second_true = in_mask & (order[:, 1] == yi)
            if second_true.any():
                ratios = np.take_along_axis(pin, order[:, 1:2], 1)[:, 0] / np.clip(conf, 1e-12, None)
                amb = float(np.clip(np.median(ratios[second_true]), 0.2, 0.9))
        return {"confident": confident, "ambiguous_ratio": amb, "oos": oos_t, "oos_confident": oos_conf}

    # ------------------------------------------------------------- predicting
    def _check(self) -> None:
        if not hasattr(self, "lr_"):
            raise NotFittedError("IntentHead is not fitted; call fit() first")

    def scores(self, X: Any) -> HeadScores:
        """Calibrated in-scope probabilities, out-of-scope probabilities and similarity.

        Computed by the fitted head's :class:`~classifier.layer2.scoring.ServingHead` (plain numpy:
        the same numbers as ``decision_function``/``predict_proba`` without sklearn's per-call
        input validation, and exactly what a served model computes)."""
        return self._serving().scores(X)

    def serving_head(self) -> ServingHead:
        """The arrays :meth:`scores` needs, as a numpy-only :class:`~classifier.layer2.scoring.ServingHead`."""
        self._check()
        return ServingHead(classes=self.classes_, coef=self.lr_.coef_, intercept=self.lr_.intercept_,
                           temperature=self.temperature_, ref=self.ref_, has_oos=self.has_oos_,
                           gate_coef=None if self.gate_ is None else self.gate_.coef_[0],
                           gate_intercept=None if self.gate_ is None else float(self.gate_.intercept_[0]),
                           sim_quantiles=self.sim_quantiles_, thresholds=self.thresholds_, metrics=self.metrics_,
                           risk=getattr(self, "risk_", None))

    def _serving(self) -> ServingHead:
        # built once per fitted head (nothing changes a fitted estimator), never pickled
        cached = self.__dict__.get("_serving_cache")
        if cached is None:
            cached = self.__dict__["_serving_cache"] = self.serving_head()
        return cached

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("_serving_cache", None)
        state.pop("_ref32_cache", None)  # the cache of versions before ServingHead
        return state

    def predict_proba(self, X: Any) -> np.ndarray:
        """In-scope probabilities (rows sum to 1 minus the out-of-scope class share)."""
        return self._serving().predict_proba(X)

    def predict(self, X: Any) -> np.ndarray:
        """Top label per row, or ``None`` where the gate says out of scope."""
        return self._serving().predict(X)


@overload
def precision_cutoff(conf: np.ndarray, correct: np.ndarray, target: float, *, top_share: float = ...,
                     min_top: int = ..., unreachable: float = ...) -> float: ...
@overload
def precision_cutoff(conf: np.ndarray, correct: np.ndarray, target: float, *, top_share: float = ...,
                     min_top: int = ..., unreachable: float | None) -> float | None: ...
def precision_cutoff(conf: np.ndarray, correct: np.ndarray, target: float, *, top_share: float = 0.1,
                     min_top: int = 10, unreachable: float | None = 1.0) -> float | None:
    """The lowest confidence t such that the precision of {conf >= t} reaches ``target``
    times the *precision ceiling* (``unreachable``, default 1.0, when it never does).

    The ceiling is the precision of the ``top_share`` most confident answers (at least
    ``min_top``). On clean labels it is 1.0 and the target is absolute; on labels from
    a noisy teacher (say 90% right) no cutoff can measure 95% precision, and an
    absolute target would send all traffic to the LLM, so the target is taken
    relative to the agreement layer 2 reaches where it is surest.

    Examples
    --------
    >>> import numpy as np
    >>> conf = np.array([0.99, 0.9, 0.8, 0.6, 0.5])
    >>> precision_cutoff(conf, np.array([1, 1, 1, 0, 0]), 0.95, min_top=1)
    0.8
    """
    if conf.size == 0:
        return unreachable
    order = np.argsort(-conf)
    c, ok = conf[order], np.asarray(correct, dtype=float)[order]
    prec = np.cumsum(ok) / np.arange(1, len(ok) + 1)
    k = min(len(ok), max(min_top, int(np.ceil(top_share * len(ok)))))
    ceiling = float(prec[k - 1])
    good = np.flatnonzero(prec >= target * min(1.0, ceiling) - 1e-12)
    if good.size == 0:
        return unreachable
    return float(c[good[-1]])


def fit_risk(probs: np.ndarray, p_oos: np.ndarray, wrong: np.ndarray) -> RiskModel:
    """P(wrong) from :func:`~classifier.layer2.scoring.risk_features`: a logistic score, then an
    isotonic map of it to the observed error rate (so the output is a calibrated
    probability; the isotonic step is what makes it one). All right or all wrong: the
    constant rate."""
    from sklearn.isotonic import IsotonicRegression

    feats = risk_features(probs, p_oos)
    wrong = np.asarray(wrong, dtype=bool)
    rate = float(wrong.mean()) if wrong.size else 0.0
    if wrong.all() or not wrong.any():
        return RiskModel(coef=np.zeros(feats.shape[1]), intercept=0.0, x=np.array([0.0, 1.0]),
                         y=np.array([rate, rate]))
    lr = LogisticRegression(C=1.0, max_iter=1000).fit(feats, wrong)
    score = lr.predict_proba(feats)[:, 1]
    iso = IsotonicRegression(y_min=0.0, y_max=1.0, out_of_bounds="clip").fit(score, wrong.astype(float))
    return RiskModel(coef=lr.coef_[0].astype(np.float64), intercept=float(lr.intercept_[0]),
                     x=np.asarray(iso.X_thresholds_, np.float64), y=np.asarray(iso.y_thresholds_, np.float64))


def risk_ece_cross_fitted(probs: np.ndarray, p_oos: np.ndarray, wrong: np.ndarray, seed: int = 0) -> float:
    """ECE of :func:`fit_risk` on rows it was not fitted on (two halves, each scored by the
    model fitted on the other): an isotonic fit is calibrated on its own rows by design."""
    n = len(wrong)
    if n < 4:
        return 0.0
    half = np.random.default_rng(seed).permutation(n) < n // 2
    risk = np.empty(n)
    for a in (half, ~half):
        risk[~a] = fit_risk(probs[a], p_oos[a], wrong[a])(probs[~a], p_oos[~a])
    return expected_calibration_error(1.0 - risk, ~np.asarray(wrong, bool))


def conformal_cutoff(probs: np.ndarray, yi: np.ndarray, coverage: float) -> dict[str, float]:
    """Split-conformal prediction sets: the probability an intent needs to be in the set so
    that the set holds the true intent with probability ``coverage``, from held-out
    (out-of-fold) probabilities of in-scope rows (nonconformity: 1 - p(true intent);
    the finite-sample quantile ceil((n + 1) coverage) / n)."""
    if not 0.0 < coverage < 1.0:
        raise ValueError(f"coverage must be between 0 and 1, got {coverage}")
    n = len(yi)
    if n == 0:
        return {"set": 0.0, "coverage": float(coverage)}
    scores = 1.0 - probs[np.arange(n), yi]
    level = min(1.0, np.ceil((n + 1) * coverage) / n)
    qhat = float(np.quantile(scores, level, method="inverted_cdf"))   # the k-th smallest, k = ceil((n + 1) coverage)
    return {"set": float(max(0.0, 1.0 - qhat)), "coverage": float(coverage)}


def set_coverage(probs: np.ndarray, yi: np.ndarray, cutoff: float) -> tuple[float, float]:
    """Empirical coverage and mean size of the prediction sets ``{p >= cutoff}``."""
    if len(yi) == 0:
        return 0.0, 0.0
    in_set = probs >= cutoff
    return float(in_set[np.arange(len(yi)), yi].mean()), float(in_set.sum(axis=1).mean())


def cutoff_precision(classes: np.ndarray, top: np.ndarray, correct: np.ndarray, conf: np.ndarray,
                     answered: np.ndarray, cutoff: float) -> dict[str, Any]:
    """What the ``confident`` cutoff buys on held-out rows: the precision (and count) of
    the in-scope answers at or above it, overall and by answered intent."""
    sel = answered & (conf >= cutoff)
    per: dict[str, dict[str, float]] = {}
    for i, name in enumerate(classes):
        m = sel & (top == i)
        if m.any():
            per[str(name)] = {"precision": round(float(correct[m].mean()), 4), "n": int(m.sum())}
    return {"cutoff": float(cutoff), "n": int(sel.sum()),
            "precision": round(float(correct[sel].mean()), 4) if sel.any() else None, "per_intent": per}
