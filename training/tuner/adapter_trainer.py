"""An adapter trained on a fixed encoder's frozen vectors (issue 22 item 5):
:class:`AdapterTrainer`.

For an encoder that cannot be fine-tuned in place (the numpy USE default, a bge-m3 served
as is), the retrain can still learn from its labels in the vector space: an affine map
``v -> normalise(v @ W + b)`` on the frozen vectors, served in numpy by
:class:`~classifier.encoders.adapter.AdaptedEmbedder`.

- **Start at the identity** (``W = I``, ``b = 0``), so an untrained adapter is the frozen
  encoder, and pull ``W`` back towards the identity (``identity_decay`` times the squared
  Frobenius distance): with 10 rows per intent an unconstrained map memorises its rows,
  which is how the probe's MLP adapter lost 1.6 points on USE
  (``../shared/design/encoder-tuning-probe-2026-11-26.md``).
- **Objective**: the same cosine-softmax cross-entropy as the encoder tuner
  (:mod:`training.tuner.finetune`): class weights start at the centred class centroids, out-of-scope
  rows aim at the uniform distribution and are never a class.
- **Full batch** on the vectors: each epoch is one step (milliseconds for a few thousand
  rows), bounded by ``epochs`` and ``budget_s``.

torch is imported inside :meth:`AdapterTrainer.fit`; ``__init__`` only stores parameters,
``fit`` returns ``self`` and sets ``weight_``, ``bias_`` and ``report_``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from flywheel.classifier.encoders.adapter import apply_adapter
from flywheel.training.tuner.finetune import TuningError

__all__ = ["AdapterTrainer"]


class AdapterTrainer:
    """Fit an identity-started affine adapter on frozen vectors (see the module docs).

    Parameters
    ----------
    epochs : int
        Full-batch steps (if the budget allows).
    learning_rate : float
        Adam's step size for the map; the class weights use ten times it.
    identity_decay : float
        Weight of ``||W - I||^2`` (plus ``||b||^2``) in the loss.
    scale : float
        The cosine-softmax's inverse temperature.
    budget_s : float, optional
        Wall-clock seconds for ``fit``; it stops between steps and says so in ``report_``.
    seed : int
        Seeds torch inside a forked RNG state.
    """

    def __init__(self, *, epochs: int = 200, learning_rate: float = 1e-3, identity_decay: float = 1.0,
                 scale: float = 20.0, budget_s: float | None = None, seed: int = 0) -> None:
        self.epochs = epochs
        self.learning_rate = learning_rate
        self.identity_decay = identity_decay
        self.scale = scale
        self.budget_s = budget_s
        self.seed = seed

    def _check(self, vectors: np.ndarray, labels: Sequence[str | None]) -> None:
        if int(self.epochs) < 1:
            raise TuningError(f"epochs must be at least 1, got {self.epochs!r}")
        if not float(self.learning_rate) > 0 or not float(self.identity_decay) >= 0 or not float(self.scale) > 0:
            raise TuningError("learning_rate and scale must be positive and identity_decay at least 0, got "
                              f"{self.learning_rate!r}, {self.scale!r} and {self.identity_decay!r}")
        if vectors.ndim != 2 or len(vectors) != len(labels):
            raise TuningError(f"one vector per label is needed, got {vectors.shape} for {len(labels)} labels")
        if len({label for label in labels if label is not None}) < 2:
            raise TuningError("an adapter needs labelled rows of at least two intents")

    def fit(self, vectors: np.ndarray, labels: Sequence[str | None],
            sample_weight: Sequence[float] | None = None) -> "AdapterTrainer":
        """Fit on ``vectors`` (the frozen encoder's rows) and ``labels`` (``None``: out of scope)."""
        import torch

        x = np.asarray(vectors, dtype=np.float32)
        self._check(x, labels)
        t0 = time.perf_counter()
        classes = sorted({label for label in labels if label is not None})
        index = {c: i for i, c in enumerate(classes)}
        y = np.array([index.get(label, -1) if label is not None else -1 for label in labels])
        w = np.ones(len(x), np.float32) if sample_weight is None else np.asarray(sample_weight, np.float32)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(self.seed))
            losses, stopped, steps = self._train(torch, x, y, w, len(classes), t0)
            self.weight_ = self._w.detach().numpy().astype(np.float32)
            self.bias_ = self._b.detach().numpy().astype(np.float32)
        del self._w, self._b
        self.report_: dict[str, Any] = {
            "objective": "adapter", "device": "cpu", "n_rows": int(len(x)), "n_intents": len(classes),
            "steps": steps, "epochs_done": steps, "stopped_early": stopped,
            "loss_first": round(losses[0], 4) if losses else None,
            "loss_last": round(losses[-1], 4) if losses else None,
            "seconds": round(time.perf_counter() - t0, 2),
            "identity_distance": round(float(np.linalg.norm(self.weight_ - np.eye(x.shape[1]))), 4)}
        return self

    def _train(self, torch: Any, x: np.ndarray, y: np.ndarray, w: np.ndarray, n_classes: int,
               t0: float) -> tuple[list[float], bool, int]:
        F = torch.nn.functional
        xt, yt, wt = torch.as_tensor(x), torch.as_tensor(y), torch.as_tensor(w)
        d = x.shape[1]
        eye = torch.eye(d)
        self._w = torch.nn.Parameter(eye.clone())
        self._b = torch.nn.Parameter(torch.zeros(d))
        inscope = yt >= 0
        cent = torch.zeros(n_classes, d).index_add_(0, yt[inscope], xt[inscope])
        cent = cent / torch.bincount(yt[inscope], minlength=n_classes).clamp(min=1).unsqueeze(1).float()
        classes = torch.nn.Parameter(F.normalize(cent - cent.mean(dim=0, keepdim=True), dim=-1))
        opt = torch.optim.Adam([{"params": [self._w, self._b], "lr": float(self.learning_rate)},
                                {"params": [classes], "lr": 10 * float(self.learning_rate)}])
        losses: list[float] = []
        step_s: list[float] = []
        for step in range(int(self.epochs)):
            if self.budget_s is not None and (time.perf_counter() - t0 + (np.mean(step_s) if step_s else 0.0)
                                              > float(self.budget_s)):
                return losses, True, step
            ts = time.perf_counter()
            v = F.normalize(xt @ self._w + self._b, dim=-1)
            logp = F.log_softmax(float(self.scale) * (v @ F.normalize(classes, dim=-1).T), dim=-1)
            per_row = torch.where(inscope, -logp.gather(1, yt.clamp(min=0)[:, None])[:, 0], -logp.mean(dim=-1))
            loss = (per_row * wt).sum() / wt.sum()
            loss = loss + float(self.identity_decay) * (((self._w - eye) ** 2).sum() + (self._b ** 2).sum())
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
            step_s.append(time.perf_counter() - ts)
        return losses, False, int(self.epochs)

    def transform(self, vectors: np.ndarray) -> np.ndarray:
        """The adapted vectors (what serving computes)."""
        if not hasattr(self, "weight_"):
            raise TuningError("the adapter is not fitted: call fit first")
        return apply_adapter(vectors, self.weight_, self.bias_)
