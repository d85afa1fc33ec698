"""A classifier assembled from the configuration, without the traffic log.

:func:`build_classifier` joins the parts :class:`~classifier.settings.config.Config` describes:
the served model (:func:`~classifier.versions.default.served_model`: the configured ``model``,
else the models home's ``CURRENT``, else the default model trained on first use), the
teacher its intent set names (the configuration overrides it), and one
:class:`~classifier.pipeline.Classifier` that follows the models home. :func:`default_classifier`
is the process-wide one behind :func:`flywheel.classifier.classify`.

**Nothing here logs a decision.** A classifier that feeds the traffic log (so that
``flywheel retrain`` learns from it) is :func:`flywheel.classify` /
:func:`flywheel.open_classifier`, built on ``service.runtime.open_runtime``, which resolves the
model the same way.
"""

from __future__ import annotations

import threading

from flywheel.classifier.pipeline import Classifier
from flywheel.classifier.protocols import Embedder, ManagedTeacher, Teacher
from flywheel.classifier.settings.config import Config, load_config
from flywheel.classifier.teachers.factory import build_teacher
from flywheel.classifier.versions.default import served_model

__all__ = ["build_classifier", "default_classifier", "reset_default"]

_lock = threading.Lock()
_default: Classifier | None = None


def build_classifier(cfg: Config | None = None, *, progress: bool = True, background_reload: bool = False,
                     embedder: Embedder | None = None, teacher: Teacher | None = None) -> Classifier:
    """The classifier ``cfg`` describes (default: :func:`~classifier.settings.config.load_config`),
    logging nothing.

    ``embedder``: the encoder to serve with (default: the one the model's manifest names, built
    lazily, caching under ``cfg``'s home); ``teacher``: layer 3 (default: the one ``cfg`` and the
    intent set describe, :func:`~classifier.teachers.factory.build_teacher`; ``cfg.teacher =
    "off"`` for none). Served from a models home, it follows promotions: on a watcher thread
    with ``background_reload``, else checked on the calling thread before a request.
    ``progress``: say so on stderr when the default model is trained on first use."""
    cfg = cfg or load_config()
    # the parts first: the served model, then the teacher its intent set names (the config
    # overrides it), then one Classifier that joins them
    served = served_model(cfg, progress=progress)
    if teacher is None:
        teacher = build_teacher(cfg, served.model.intents)
    clf = Classifier(served.model, embedder=embedder, teacher=teacher, follow=served.home,
                     cache_root=cfg.cache_root)
    if background_reload and clf.watcher is not None:
        clf.watcher.start()
    return clf


def default_classifier() -> Classifier:
    """The process-wide classifier behind :func:`flywheel.classifier.classify`, built on first
    use from the environment's configuration (it logs nothing; see :func:`flywheel.classify`)."""
    global _default
    with _lock:
        if _default is None:
            _default = build_classifier()
        return _default


def reset_default() -> None:
    """Forget the default classifier (tests; after changing configuration), closing it
    and the teacher :func:`build_classifier` opened for it."""
    global _default
    with _lock:
        old, _default = _default, None
    if old is not None:
        try:
            old.close()
        finally:
            if isinstance(old.teacher, ManagedTeacher):
                old.teacher.close()
