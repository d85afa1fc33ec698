"""flywheel's runtime: the three-layer intent classifier.

>>> from classifier import Classifier, classify            # doctest: +SKIP
>>> classify("What is addVar in AVAP?").label              # doctest: +SKIP
'RETRIEVAL'
"""

from __future__ import annotations

from typing import Any

from classifier.decision import Candidate, Decision, Layer, TeacherCall, Tier
from classifier.errors import (
    ConfigError,
    EmbedderError,
    FlywheelError,
    IntentFileError,
    InvalidInputError,
    ModelError,
    TeacherError,
    UnknownLabelError,
)
from classifier.intents import IntentSet, load_intents
from classifier.model import IntentModel
from classifier.pipeline import Classifier

__all__ = [
    "Candidate", "Classifier", "ConfigError", "Decision", "EmbedderError", "FlywheelError", "IntentFileError",
    "IntentModel", "IntentSet", "InvalidInputError", "Layer", "ModelError", "TeacherCall", "TeacherError",
    "Tier", "UnknownLabelError", "classify", "load_intents",
]


def classify(text: str, **kwargs: Any) -> Decision:
    """Classify with the default model (see :mod:`classifier.default`)."""
    from classifier.default import default_classifier

    return default_classifier().classify(text, **kwargs)
