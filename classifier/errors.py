"""The named exceptions of flywheel.

Everything the library raises on purpose derives from :class:`FlywheelError`, so a
caller (the CLI, the gRPC servicer) can map it to an exit code or a status code
without catching bare ``Exception``.
"""

from __future__ import annotations


class FlywheelError(Exception):
    """Base class of every error flywheel raises on purpose."""

    exit_code = 1


class ConfigError(FlywheelError):
    """A configuration value or file is invalid."""

    exit_code = 2


class IntentFileError(ConfigError):
    """An intent definition file is invalid.

    The message names the file, the intent (when there is one) and the problem.
    """

    def __init__(self, path: str, problem: str, intent: str | None = None) -> None:
        self.path = str(path)
        self.intent = intent
        self.problem = problem
        where = f"{self.path}"
        if intent is not None:
            where += f": intent {intent!r}"
        super().__init__(f"{where}: {problem}")


class TrainingError(FlywheelError):
    """Layer 2 cannot be fitted from the data given (too few examples, one intent, ...)."""

    exit_code = 2


class InvalidInputError(FlywheelError):
    """The text (or another argument) given to ``classify`` is unusable."""

    exit_code = 2


class UnknownLabelError(InvalidInputError):
    """A label (declared type, feedback label) is not in the intent set."""


class TuneSettingsError(InvalidInputError):
    """An encoder-tuning setting is out of range: raised by ``TuneSettings`` itself, the one
    check, whether the value came from ``embedder.tune`` or a ``--tune-*`` flag (``via``)."""

    def __init__(self, field: str, problem: str, via: str | None = None) -> None:
        self.field = field
        self.problem = problem
        self.via = via
        super().__init__(f"{via}: tune.{field} {problem}" if via else f"tune.{field} {problem}")


class ModelError(FlywheelError):
    """A model version is missing, corrupt or does not match its encoder."""

    exit_code = 3


class IntentSetMismatch(ConfigError, ModelError):
    """A model version was trained on another intent set than the one the deployment is
    configured for (the ``intents`` setting): refused before it is served or pointed at.
    A configuration error (exit 2) and a model error (a watcher refuses the version)."""

    exit_code = 2


class NotFittedError(ModelError):
    """A head or model was used before it was fitted."""


class EmbedderError(FlywheelError):
    """An embedding backend could not be loaded or failed to encode."""

    exit_code = 3


class UnknownBackendError(EmbedderError):
    """No encoder backend has this name (:func:`classifier.encoders.backends.backend_spec`);
    ``known`` lists the names there are."""

    def __init__(self, name: object, known: tuple[str, ...]) -> None:
        self.name = name
        self.known = known
        super().__init__(f"unknown embedder backend {name!r} (known: {', '.join(known)})")


class TeacherError(FlywheelError):
    """The LLM teacher failed: unreachable, slow, or answered something unusable.

    ``kind`` is a short machine-readable cause: ``unavailable``, ``timeout``,
    ``malformed``, ``unknown_label``, ``circuit_open``, ``budget`` (the call budget of
    :mod:`classifier.teachers.budget` is spent) or ``error``.
    """

    def __init__(self, kind: str, message: str) -> None:
        self.kind = kind
        self.detail = message   # the message without the kind
        super().__init__(f"{kind}: {message}")

    def reason(self) -> str:
        """The words a degraded decision's reason gets, by what went wrong
        (:data:`TEACHER_FAILURE_WORDS`): ``llm unavailable: <detail>`` when it could not be
        reached, ``llm unavailable (timeout): <detail>`` (and ``circuit_open``) when it did
        not answer in time or is held off, ``llm not asked (budget): ...`` when the call
        budget is spent, ``llm answer unusable (malformed): ...`` (and ``unknown_label``) when
        it answered something that is no label, ``llm failed (error): ...`` otherwise."""
        words = TEACHER_FAILURE_WORDS.get(self.kind, "llm failed")
        said = words if self.kind == "unavailable" else f"{words} ({self.kind})"
        return f"{said}: {self.detail}" if self.detail else said


#: What a degraded reason says of the teacher, by :class:`TeacherError` kind ("unavailable"
#: only where it could not answer: a malformed answer is an answer, just not a usable one).
TEACHER_FAILURE_WORDS = {"unavailable": "llm unavailable", "timeout": "llm unavailable",
                         "circuit_open": "llm unavailable", "budget": "llm not asked",
                         "malformed": "llm answer unusable", "unknown_label": "llm answer unusable",
                         "error": "llm failed"}


#: :class:`TeacherError` kinds raised before any call reached the LLM (its circuit breaker
#: was open, the call budget was spent): there is no call to record, and no budget to spend.
NOT_CALLED_KINDS = frozenset({"circuit_open", "budget"})
