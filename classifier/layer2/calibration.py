"""Probability helpers: softmax, temperature scaling, expected calibration error."""

from __future__ import annotations

import numpy as np
from scipy.optimize import minimize_scalar

from flywheel.classifier.layer2.scoring import softmax


def fit_temperature(logits: np.ndarray, y: np.ndarray) -> float:
    """The temperature T minimising the negative log-likelihood of ``softmax(logits / T)``.

    Examples
    --------
    >>> import numpy as np
    >>> z = np.array([[4.0, 0.0], [4.0, 0.0], [0.0, 4.0], [4.0, 0.0]])
    >>> y = np.array([0, 1, 1, 0])  # overconfident: one of the sure answers is wrong
    >>> fit_temperature(z, y) > 1.0
    True
    """
    z = np.asarray(logits, dtype=np.float64)
    idx = np.arange(len(y))

    def nll(log_t: float) -> float:
        p = softmax(z, float(np.exp(log_t)))
        return float(-np.log(np.clip(p[idx, y], 1e-12, None)).mean())

    res = minimize_scalar(nll, bounds=(np.log(0.02), np.log(50.0)), method="bounded")
    return float(np.exp(res.x))


def expected_calibration_error(confidence: np.ndarray, correct: np.ndarray, n_bins: int = 15) -> float:
    """ECE with equal-width bins: sum over bins of |accuracy - confidence| weighted by bin size.

    Examples
    --------
    >>> import numpy as np
    >>> expected_calibration_error(np.array([0.9, 0.9]), np.array([1, 1]))
    0.1
    """
    conf = np.asarray(confidence, dtype=np.float64)
    ok = np.asarray(correct, dtype=np.float64)
    if conf.size == 0:
        return 0.0
    bins = np.minimum((conf * n_bins).astype(int), n_bins - 1)
    ece = 0.0
    for b in range(n_bins):
        m = bins == b
        if m.any():
            ece += m.mean() * abs(ok[m].mean() - conf[m].mean())
    return round(float(ece), 6)


def reliability_bins(confidence: np.ndarray, correct: np.ndarray, n_bins: int = 15) -> list[tuple[float, float, int]]:
    """(mean confidence, accuracy, count) per non-empty bin, for reliability diagrams."""
    conf = np.asarray(confidence, dtype=np.float64)
    ok = np.asarray(correct, dtype=np.float64)
    bins = np.minimum((conf * n_bins).astype(int), n_bins - 1)
    return [(float(conf[bins == b].mean()), float(ok[bins == b].mean()), int((bins == b).sum()))
            for b in range(n_bins) if (bins == b).any()]
