"""flywheel's Python entry: classify, and log the decision so the flywheel turns.

:func:`classify` and :func:`open_classifier` serve what ``flywheel classify`` and the gRPC
sidecar serve, the way they do (:func:`flywheel.service.runtime.open_runtime`): the configured
model, every decision logged to the traffic log (the local DuckDB file, or the fleet's bucket),
audits, the shadow version, promotions followed on a watcher thread. ``flywheel retrain``
learns from that log. (:func:`flywheel.classifier.classify` and
:class:`~flywheel.classifier.Classifier` log nothing.)

The process-wide default
------------------------
:func:`classify` opens one :class:`LoggedClassifier` for the whole process on its first call,
from the configuration as :func:`~flywheel.classifier.settings.config.load_config` reads it
then (``$FLYWHEEL_HOME``, the config file), and keeps it: every later call, from any thread,
uses it. It is closed at interpreter exit (:mod:`atexit`), which flushes the log. :func:`close`
closes it now (tests; after changing the configuration); the next :func:`classify` opens a
new one. A child process made by ``fork`` opens its own (the parent's log threads do not
survive a fork). Closing while another thread is inside :func:`classify` is the caller's
race to avoid, as with any resource.
"""

from __future__ import annotations

import atexit
import os
import threading
from collections.abc import Iterable, Sequence
from types import TracebackType
from typing import Any

from flywheel.classifier.decision import Decision
from flywheel.classifier.pipeline import Classifier
from flywheel.classifier.protocols import Embedder, Teacher
from flywheel.classifier.settings.config import Config, load_config
from flywheel.service.runtime import Runtime, open_runtime

__all__ = ["LoggedClassifier", "classify", "close", "open_classifier"]


class LoggedClassifier:
    """A classifier wired to the traffic log, made by :func:`open_classifier`.

    Each decision is logged (unless opened with ``log_decisions=False``), a promotion is
    swapped in without a restart, and :meth:`close` (or leaving the ``with`` block) stops the
    watchers, finishes the audits in flight and flushes the log. ``runtime`` is what was
    opened around the classifier (:class:`~flywheel.service.runtime.Runtime`: the log store,
    the human-label writer, the shadow, ...)."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self._closed = False
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"serving {self.runtime.classifier.model_version}"
        return f"<LoggedClassifier {state}>"

    @property
    def classifier(self) -> Classifier:
        """The :class:`~flywheel.classifier.Classifier` it serves with (its model, intents, encoder)."""
        return self.runtime.classifier

    @property
    def model_version(self) -> str:
        """The version serving now (it changes when a promotion is swapped in)."""
        return self.runtime.classifier.model_version

    @property
    def closed(self) -> bool:
        return self._closed

    def classify(self, text: str, *, history: Iterable[Any] | None = None, declared_type: str | None = None,
                 session_id: str | None = None) -> Decision:
        """Classify one query and log the decision; the arguments are
        :meth:`Classifier.classify`'s (``history``: earlier turns as ``(label, text)`` pairs,
        ``declared_type``: bypasses every layer, ``session_id``: keeps a bounded history)."""
        self._check_open()
        return self.runtime.classifier.classify(text, history=history, declared_type=declared_type,
                                                session_id=session_id)

    def classify_many(self, texts: Sequence[str], *, history: Iterable[Any] | None = None,
                      declared_type: str | None = None, session_id: str | None = None) -> list[Decision]:
        """Classify several queries (layer 2 encodes them in batches) and log each decision."""
        self._check_open()
        return self.runtime.classifier.classify_many(texts, history=history, declared_type=declared_type,
                                                     session_id=session_id)

    def close(self, grace_s: float | None = None) -> None:
        """Stop following promotions, finish the audits in flight, then flush the log (locally,
        into the DuckDB file; in fleet mode, shipped within ``grace_s`` seconds, the rest at
        the next start). A second call does nothing."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self.runtime.close(grace_s=grace_s)

    def __enter__(self) -> LoggedClassifier:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this classifier is closed: open another with flywheel.open_classifier()")


def open_classifier(cfg: Config | None = None, *, log_decisions: bool = True, background_reload: bool = True,
                    progress: bool = True, embedder: Embedder | None = None,
                    teacher: Teacher | None = None) -> LoggedClassifier:
    """Open the classifier ``cfg`` describes (default: :func:`load_config`, from the environment
    and the config file) with its traffic log, as ``flywheel classify`` and the sidecar do.
    Use it in a ``with`` block, or call :meth:`~LoggedClassifier.close` when done::

        with flywheel.open_classifier() as clf:
            clf.classify("What is addVar in AVAP?")

    ``log_decisions=False``: log nothing (as ``flywheel classify --no-log``).
    ``background_reload``: follow promotions on a watcher thread (else checked before a
    request, on the caller's thread). ``progress``: say so on stderr when the default model
    is trained on first use. ``embedder``, ``teacher``: replace the configured encoder and
    teacher (a teacher given here is the caller's to close). Raises
    :class:`~flywheel.logstore.LogStoreError` when the log is not writable, before any model
    is loaded."""
    cfg = cfg if cfg is not None else load_config()
    return LoggedClassifier(open_runtime(cfg, log_decisions=log_decisions, progress=progress,
                                         background_reload=background_reload, embedder=embedder, teacher=teacher))


_lock = threading.Lock()
_default: LoggedClassifier | None = None
_at_exit = False


def classify(text: str, *, history: Iterable[Any] | None = None, declared_type: str | None = None,
             session_id: str | None = None) -> Decision:
    """Classify ``text`` with the process-wide classifier and log the decision to the
    configured traffic log (see the module docs: opened on first use, closed at exit or by
    :func:`close`). The arguments are :meth:`LoggedClassifier.classify`'s."""
    return _default_classifier().classify(text, history=history, declared_type=declared_type, session_id=session_id)


def close() -> None:
    """Close the process-wide classifier of :func:`classify`, flushing its log; the next
    :func:`classify` opens a new one with the configuration as it is then. Without one open,
    nothing happens. It runs at interpreter exit by itself."""
    global _default
    with _lock:
        old, _default = _default, None
    if old is not None:
        old.close()


def _default_classifier() -> LoggedClassifier:
    global _default, _at_exit
    with _lock:
        if _default is None:
            _default = open_classifier()
            if not _at_exit:
                atexit.register(close)
                _at_exit = True
        return _default


def _forget_in_child() -> None:
    """After ``fork``, in the child: the parent's classifier is the parent's to close (its log
    threads did not come along); the child's first :func:`classify` opens its own."""
    global _default, _lock
    _default, _lock = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)
