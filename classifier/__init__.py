"""flywheel's runtime: the three-layer intent classifier.

>>> from flywheel.classifier import Classifier, classify            # doctest: +SKIP
>>> classify("What is addVar in AVAP?").label              # doctest: +SKIP
'RETRIEVAL'

This room never opens the traffic log: :func:`classify` here logs nothing. The entry that
feeds the flywheel (every decision logged, so ``flywheel retrain`` learns from it) is
:func:`flywheel.classify` / :func:`flywheel.open_classifier`.

Modules, by layer:

- :mod:`~classifier.pipeline`: the :class:`Classifier`: declared type / rules -> embeddings -> teacher
- :mod:`~classifier.assembly`: a classifier built from the configuration, and the process-wide
  default behind :func:`classify` (neither logs)
- :mod:`~classifier.bundle`: the served bundle (a version, its encoder, rules and cutoffs), warmed before a swap
- :mod:`~classifier.decision`: what a classification returns (:class:`Decision`, tiers, layers)
- :mod:`~classifier.protocols`: the pluggable parts (embedder, teacher, log sink) as protocols
- :mod:`~classifier.text`: input checks and normalisation shared by every layer
- :mod:`~classifier.language`: the language of a query
- :mod:`~classifier.rules`: layer 1, deterministic rules in priority order
- :mod:`~classifier.encoders`: layer 2's encoders, the only importer of a model library
- :mod:`~classifier.layer2`: layer 2's head, scoring, calibration, tiers and cutoffs (a wing)
- :mod:`~classifier.teachers`: layer 3: the shared base and circuit breaker, Ollama, an
  OpenAI-compatible server, the call budget (a minute, a UTC day) and the factory
- :mod:`~classifier.audit`: background teacher audits with a bounded backlog
- :mod:`~classifier.anchoring`: whether the teacher echoes the history instead of the query
- :mod:`~classifier.history`: the compact per-session intent history
- :mod:`~classifier.followup`: whether a query leans on the previous turn, and how layer 2 scores it then
- :mod:`~classifier.shadow`: a shadow version scored beside the champion
- :mod:`~classifier.versions`: model versions, their registry, and what is served (a wing)
- :mod:`~classifier.settings`: the intent file, settings and the command line's helpers (a wing)
- :mod:`~classifier.masking`: masking of personal data before logging
- :mod:`~classifier.errors`: the named exceptions
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from flywheel.classifier.decision import Candidate, Decision, Layer, TeacherCall, Tier
from flywheel.classifier.errors import (
    ConfigError,
    EmbedderError,
    FlywheelError,
    IntentFileError,
    InvalidInputError,
    ModelError,
    TeacherError,
    UnknownLabelError,
)
from flywheel.classifier.pipeline import Classifier
from flywheel.classifier.settings.intents import IntentSet, load_intents
from flywheel.classifier.versions.model import IntentModel

__all__ = [
    "Candidate", "Classifier", "ConfigError", "Decision", "EmbedderError", "FlywheelError", "IntentFileError",
    "IntentModel", "IntentSet", "InvalidInputError", "Layer", "ModelError", "TeacherCall", "TeacherError",
    "Tier", "UnknownLabelError", "classify", "load_intents",
]


def classify(text: str, *, history: Iterable[Any] | None = None, declared_type: str | None = None,
             session_id: str | None = None) -> Decision:
    """Classify with the default model (:func:`~classifier.assembly.default_classifier`), the
    arguments as :meth:`Classifier.classify` takes them.

    **The decision is not logged**, so the flywheel never learns from it: use
    :func:`flywheel.classify` (the same call, logged to the configured traffic log) unless you
    mean to keep the query out of the log."""
    from flywheel.classifier.assembly import default_classifier

    return default_classifier().classify(text, history=history, declared_type=declared_type, session_id=session_id)
