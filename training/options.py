"""The retrain job's options and error, importable without scikit-learn (the CLI reads
its defaults from here, so each is stated once)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from flywheel.classifier.errors import FlywheelError
from flywheel.training.trainset import SELF_TRAINING_MAX

__all__ = ["RetrainError", "RetrainOptionError", "RetrainOptions"]


class RetrainError(FlywheelError):
    """The retrain job could not run (e.g. the challenger cannot be trained)."""

    exit_code = 1


class RetrainOptionError(RetrainError):
    """A retrain option is out of range: bad input, exit code 2 like every usage error."""

    exit_code = 2


@dataclass(frozen=True)
class RetrainOptions:
    """How one run of :func:`training.retrain.retrain` behaves, checked here once (an
    option out of range raises :class:`RetrainError`).

    Attributes
    ----------
    min_new_labels : int
        Skip unless at least this many labels arrived since the champion was trained.
    dry_run : bool
        Do everything except saving and promoting.
    tolerance : float
        How much worse (accuracy, out-of-scope recall) the challenger may be.
    target_precision : float, optional
        Precision of layer 2's sure answers the confident cutoff is tuned for (default:
        the intent set's ``thresholds.target_precision``).
    llm_budget : float, optional
        Largest share of recent traffic layer 2 may leave to the teacher; the cutoff is
        the lower of the precision cutoff and the strictest one within the budget.
    progress : bool
        Progress messages on stderr.
    now : float or datetime, optional
        The run's time for the report (default: now).
    self_training : float
        Weight (0 to 1) of self-training rows: layer 2's own confident decisions from
        the log, trained on with this weight and never used to fit the gate or the
        cutoffs (see :mod:`training.trainset`). 0 (the default) leaves them out.
    self_training_max : int
        At most this many of them, the newest.
    shadow : bool
        A challenger that passes the gate is published as the shadow version (replicas
        score it on live traffic, enforcing nothing; ``flywheel models promote
        --from-shadow`` promotes it) instead of being promoted. Outcome ``shadowed``.
    """

    min_new_labels: int = 0
    dry_run: bool = False
    tolerance: float = 0.01
    target_precision: float | None = None
    llm_budget: float | None = None
    progress: bool = False
    now: Any = None
    self_training: float = 0.0
    self_training_max: int = SELF_TRAINING_MAX
    shadow: bool = False

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise :class:`RetrainOptionError` (a :class:`RetrainError`) naming the first option out of range."""
        if not 0.0 <= self.self_training <= 1.0:
            raise RetrainOptionError(f"self_training must be between 0 and 1, got {self.self_training}")
        if self.self_training_max < 0:
            raise RetrainOptionError(f"self_training_max must be >= 0, got {self.self_training_max}")
        if not 0.0 <= self.tolerance <= 1.0:
            raise RetrainOptionError(f"tolerance must be between 0 and 1, got {self.tolerance}")
        if self.llm_budget is not None and not 0.0 <= self.llm_budget <= 1.0:
            raise RetrainOptionError(f"llm_budget must be between 0 and 1, got {self.llm_budget}")
        if self.target_precision is not None and not 0.0 < self.target_precision <= 1.0:
            raise RetrainOptionError(f"target_precision must be in (0, 1], got {self.target_precision}")
        if self.min_new_labels < 0:
            raise RetrainOptionError(f"min_new_labels must be >= 0, got {self.min_new_labels}")

    def run_at(self) -> float:
        """The run's time for the report (unix seconds)."""
        now = self.now
        return now.timestamp() if isinstance(now, datetime) else float(now) if now is not None else time.time()
