"""The runtime wiring shared by ``flywheel classify`` and the gRPC sidecar.

:func:`open_runtime` opens the classifier that ``cfg`` describes together with what
serving needs around it: the traffic log's non-blocking sink, audit sampling whose
answers become teacher labels, and, when the model comes from a models home, the
watcher that follows promotions. :class:`Runtime` closes them in the right order
(watcher, audits, then the log is flushed).

A long-running process (the sidecar) passes ``background_reload=True``: the watcher
then loads and swaps a promoted version on its own thread, never on a request.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from classifier.config import Config
from classifier.decision import TeacherCall
from classifier.default import build_classifier
from classifier.errors import FlywheelError
from classifier.pipeline import Classifier
from classifier.protocols import DecisionRecord
from logstore import LogStore, SpoolSink

__all__ = ["Runtime", "open_runtime"]

log = logging.getLogger("flywheel.serving")


@dataclass
class Runtime:
    """A classifier wired to the traffic log (``store`` is ``None`` without one; the sink
    is the classifier's ``log_sink``)."""

    classifier: Classifier
    store: LogStore | None

    def close(self) -> None:
        """Stop the watcher, finish admitted audits, flush and close the log."""
        self.classifier.close()


def open_runtime(cfg: Config, *, log_decisions: bool = True, progress: bool = True,
                 background_reload: bool = False, **kwargs: Any) -> Runtime:
    """Build the default classifier for ``cfg`` with the DuckDB log and audit sampling.

    ``kwargs`` go to :class:`~classifier.pipeline.Classifier` (an ``embedder``, a
    ``teacher``, ...). Raises :class:`~logstore.LogStoreError` when the log is not
    writable, before any model is loaded.
    """
    store = LogStore(cfg.log_path) if log_decisions else None
    sink: SpoolSink | None = None
    if store is not None:
        if "log_sink" not in kwargs:  # a caller's own sink is used as is: no second writer thread
            sink = kwargs["log_sink"] = store.open_sink()
        kwargs.setdefault("audit_rate", cfg.audit_rate)
        kwargs.setdefault("audit_callback", _audit_recorder(store))
    try:
        clf = build_classifier(cfg, progress=progress, background_reload=background_reload, **kwargs)
    except BaseException:
        if sink is not None:
            sink.close()
        raise
    return Runtime(clf, store)


def _audit_recorder(store: LogStore):
    """The audit callback: the teacher's answer becomes a teacher label of the decision."""
    def on_audit(record: DecisionRecord, call: TeacherCall) -> None:
        try:
            store.add_teacher_label(record.decision.id, call.label, call.model, call.valid, call.latency_ms)
        except FlywheelError as exc:
            log.warning("audit answer for %s not stored: %s", record.decision.id, exc)
    return on_audit
