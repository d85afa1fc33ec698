"""The retrain job's options and error, importable without scikit-learn (the CLI reads
its defaults from here, so each is stated once)."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from flywheel.classifier.errors import FlywheelError, TuneSettingsError
from flywheel.classifier.settings.intents import EmbedderSettings, TuneSettings, retrain_tuning
from flywheel.training.trainset import SELF_TRAINING_MAX

if TYPE_CHECKING:
    from flywheel.classifier.settings.config import Config

__all__ = ["DEFAULT_MAX_TEACHER_NOISE", "DEFAULT_UNLABELLED_SHARE", "RetrainError", "RetrainOptionError",
           "RetrainOptions", "TUNE_FLAGS", "resolve_tune", "tune_for"]

#: ``RetrainOptions.max_teacher_noise``'s default: above the ~10% the flywheel benchmark's simulated
#: teacher makes (BENCHMARKS.md §15: estimates 8.4-12.5%, 95% upper bounds at most 17.1%)
DEFAULT_MAX_TEACHER_NOISE = 0.30


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
    tune : TuneSettings, optional
        Fine-tune the encoder too (:mod:`training.tuner.finetune`): a second challenger on a tuned
        encoder competes with the head-only one and the champion (see
        :mod:`training.retrain`). ``None`` (the default): off. The CLI resolves it as train
        and eval do (:func:`tune_for`): the flags and the ``tune_encoder`` setting over the
        intent file's ``embedder.tune``, on by default for an encoder tuned by default.
    tune_why : str
        Why tuning is on or off, in words, for the report's ``encoder_tuning`` (the CLI says
        which flag, file setting or default decided it); empty: not said.
    teacher_filter : bool
        Drop the teacher labels the evidence contradicts before fitting
        (:mod:`training.teacher_noise`: out-of-scope labels deep inside an intent's cluster,
        labels humans keep correcting to the row's runner-up). Off by default until the
        flywheel benchmark shows it helps (BENCHMARKS.md §4: a precise out-of-scope guard
        still made layer 2 worse); off, the report still says what it would drop. The noise
        estimate is made either way.
    candidate_pairs : bool
        With ``tune``: the intent pairs the teacher's candidate sets name most are hard
        negatives for the tuner, after the champion's confusions (on by default; a candidate
        set is never a training label either way).
    promote_untested : bool
        Promote a challenger the gate cannot measure (fewer than ``MIN_GATE_ROWS`` gate rows
        and no significant gain: :func:`training.gate.decide`) all the same; off, such a
        challenger is kept out ("cannot tell").
    max_teacher_noise : float
        The noise level (0 to 1) above which the teacher's labels are not distilled as they
        are: when the lower bound of the 95% interval of the teacher-noise estimate
        (``teacher_noise["low"]``, from decisions with a teacher and a human label) is above
        it, the teacher rows of every label whose own noise (``teacher_noise_by_intent``,
        else the overall estimate) is above it are dropped before fitting
        (:func:`training.teacher_noise.guard_teacher_rows`; intent examples, human labels and
        self-training rows are never touched). Too few human labels for the interval to
        exceed it: nothing is dropped and a note says so. 1 turns it off. Default
        :data:`DEFAULT_MAX_TEACHER_NOISE`.
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
    tune: TuneSettings | None = None
    tune_why: str = ""
    teacher_filter: bool = False
    candidate_pairs: bool = True
    promote_untested: bool = False
    max_teacher_noise: float = DEFAULT_MAX_TEACHER_NOISE

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
        if isinstance(self.max_teacher_noise, bool) or not isinstance(self.max_teacher_noise, (int, float)) \
                or not 0.0 <= self.max_teacher_noise <= 1.0:
            raise RetrainOptionError(f"max_teacher_noise (--max-teacher-noise) must be a share between 0 and 1 "
                                     f"(1 turns the teacher-noise guard off), got {self.max_teacher_noise!r}")
        if self.tune is not None and not isinstance(self.tune, TuneSettings):   # which checks itself
            raise RetrainOptionError(f"tune must be TuneSettings or None, got {type(self.tune).__name__}")
        for name in ("teacher_filter", "candidate_pairs", "promote_untested"):
            if not isinstance(getattr(self, name), bool):
                raise RetrainOptionError(f"{name} must be true or false, got {getattr(self, name)!r}")

    def run_at(self) -> float:
        """The run's time for the report (unix seconds)."""
        now = self.now
        return now.timestamp() if isinstance(now, datetime) else float(now) if now is not None else time.time()


# the --tune-* flag that sets each TuneSettings field, for the one-line error
#: the unlabelled stage's share of the tuning budget when texts are given and no share is
#: (``flywheel eval --unlabelled FILE``; ``embedder.tune.unlabelled`` sets it in a file)
DEFAULT_UNLABELLED_SHARE = 0.3
TUNE_FLAGS = {"budget_s": "--tune-budget", "objective": "--tune-objective", "epochs": "--tune-epochs",
              "holdout": "--tune-holdout", "calibration": "--tune-calibration", "unlabelled": "--tune-unlabelled"}


def resolve_tune(from_intents: TuneSettings | None, tune_encoder: bool | None = None,
                 budget_s: float | None = None, **overrides: Any) -> TuneSettings | None:
    """The tuning settings of train, eval and retrain (``RetrainOptions.tune``):
    ``--tune-encoder`` / ``--no-tune-encoder`` (``tune_encoder`` True / False) win over the
    intent file's ``embedder.tune`` (``from_intents``; ``None``: off), which applies when
    neither is given (``tune_encoder=None``). ``--tune-budget`` (``budget_s``) and the other
    ``--tune-*`` flags (``overrides``, by field name; ``None``: not given) override its
    fields, checked by :class:`TuneSettings` itself (:class:`TuneSettingsError` naming the
    flag); they are refused when tuning ends up off.

    >>> resolve_tune(None, True, 60).budget_s
    60.0
    >>> resolve_tune(TuneSettings(), False) is None
    True
    """
    changes = {k: v for k, v in {"budget_s": budget_s, **overrides}.items() if v is not None}
    if tune_encoder is False:
        settings = None
    elif tune_encoder:
        settings = from_intents if from_intents is not None else TuneSettings()
    else:
        settings = from_intents
    tuned = _with(settings or TuneSettings(), changes)   # a bad value is refused first, as a flag
    if settings is None:
        if changes:
            flag = TUNE_FLAGS.get(next(iter(changes)), "--tune-*")
            what = "the budget of encoder tuning" if flag == "--tune-budget" else "encoder tuning"
            raise RetrainOptionError(f"{flag} sets {what}, which is off here: add --tune-encoder or set "
                                     "embedder.tune in the intent file")
        return None
    return tuned


# why the encoder is tuned or not when a setting says (classifier.settings.config: flag > env > file)
_TUNE_SOURCES = {
    "flag": {True: "on: --tune-encoder", False: "off: --no-tune-encoder"},
    "env": {True: "on: FLYWHEEL_TUNE_ENCODER", False: "off: FLYWHEEL_TUNE_ENCODER"},
    "file": {True: "on: tune_encoder in the config file", False: "off: tune_encoder in the config file"}}


def tune_for(settings: EmbedderSettings, cfg: Config, budget_s: float | None = None,
             **overrides: Any) -> tuple[TuneSettings | None, str]:
    """Whether and how ``flywheel train``, ``eval`` and ``retrain`` tune the encoder, and why
    in words (the retrain's report says it): the one default of the three commands.

    The ``tune_encoder`` setting (``--tune-encoder`` / ``--no-tune-encoder``, else
    ``FLYWHEEL_TUNE_ENCODER``, else the config file: ``cfg.tune_encoder``) wins; left unset,
    the intent file's ``embedder`` decides (:func:`classifier.settings.intents.retrain_tuning`):
    its ``embedder.tune``, off with ``tune: off``, else on with the defaults for an encoder
    that is tuned by default (``minilm``, ``e5-multilingual``). ``budget_s`` and
    ``overrides`` are the ``--tune-*`` flags (:func:`resolve_tune`)."""
    by_file, why = retrain_tuning(settings)
    tune = resolve_tune(by_file, cfg.tune_encoder, budget_s, **overrides)
    if cfg.tune_encoder is not None:
        why = _TUNE_SOURCES[cfg.sources.get("tune_encoder", "flag")][cfg.tune_encoder]
    return tune, why


def _with(settings: TuneSettings, changes: dict[str, Any]) -> TuneSettings:
    try:
        return replace(settings, **changes)
    except TuneSettingsError as exc:
        raise TuneSettingsError(exc.field, exc.problem, via=TUNE_FLAGS.get(exc.field)) from None
