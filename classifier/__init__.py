"""flywheel's runtime: the three-layer intent classifier.

>>> from flywheel.classifier import Classifier, classify            # doctest: +SKIP
>>> classify("What is addVar in AVAP?").label              # doctest: +SKIP
'RETRIEVAL'

Modules, by layer:

- :mod:`~classifier.pipeline`: the :class:`Classifier`: declared type / rules -> embeddings -> teacher
- :mod:`~classifier.bundle`: the served bundle (a version, its encoder, rules and cutoffs), warmed before a swap
- :mod:`~classifier.decision`: what a classification returns (:class:`Decision`, tiers, layers)
- :mod:`~classifier.protocols`: the pluggable parts (embedder, teacher, log sink) as protocols
- :mod:`~classifier.text`: input checks and normalisation shared by every layer
- :mod:`~classifier.rules`: layer 1, deterministic rules in priority order
- :mod:`~classifier.encoders`: layer 2's encoders, the only importer of a model library
- :mod:`~classifier.head`: layer 2's head, fitted with scikit-learn (cutoffs by cross-validation)
- :mod:`~classifier.scoring`: layer 2's scoring in numpy alone, what serving runs
- :mod:`~classifier.calibration`: softmax, temperature scaling, expected calibration error
- :mod:`~classifier.tiers`: layer-2 scores to confident / ambiguous / weak / no_match
- :mod:`~classifier.operating_point`: the trade curves as one cutoff moves, and the cutoff a target picks
- :mod:`~classifier.negatives`: synthetic nonsense that trains the out-of-scope class
- :mod:`~classifier.teachers`: layer 3: the shared base and circuit breaker, Ollama, an
  OpenAI-compatible server, the call budget (a minute, a UTC day) and the factory
- :mod:`~classifier.audit`: background teacher audits with a bounded backlog
- :mod:`~classifier.anchoring`: whether the teacher echoes the history instead of the query
- :mod:`~classifier.history`: the compact per-session intent history
- :mod:`~classifier.intents`: intent files (intents, rules, thresholds, embedder, teacher)
- :mod:`~classifier.model`: a model version on disk, checked whole on load
- :mod:`~classifier.trainer`: fit layer 2 from an intent set into a model version
- :mod:`~classifier.registry`: model versions, ``CURRENT``, hot reload
- :mod:`~classifier.served`: what a deployment serves, and whether a version fits its intent set
- :mod:`~classifier.shadow`: a shadow version scored beside the champion
- :mod:`~classifier.default`: the default classifier behind :func:`classify`
- :mod:`~classifier.config`: settings, flag > environment > config file > default
- :mod:`~classifier.listen`: the addresses a server listens on, checked before it tries
- :mod:`~classifier.masking`: masking of personal data before logging
- :mod:`~classifier.label_names`: a label as a string, one meaning for "out of scope"
- :mod:`~classifier.errors`: the named exceptions
- :mod:`~classifier.output`: the command line's JSON lines
"""

from __future__ import annotations

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
from flywheel.classifier.intents import IntentSet, load_intents
from flywheel.classifier.model import IntentModel
from flywheel.classifier.pipeline import Classifier

__all__ = [
    "Candidate", "Classifier", "ConfigError", "Decision", "EmbedderError", "FlywheelError", "IntentFileError",
    "IntentModel", "IntentSet", "InvalidInputError", "Layer", "ModelError", "TeacherCall", "TeacherError",
    "Tier", "UnknownLabelError", "classify", "load_intents",
]


def classify(text: str, **kwargs: Any) -> Decision:
    """Classify with the default model (see :mod:`classifier.default`)."""
    from flywheel.classifier.default import default_classifier

    return default_classifier().classify(text, **kwargs)
