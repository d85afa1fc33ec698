"""The runtime wiring shared by ``flywheel classify``, the gRPC sidecar and Python callers.

:func:`open_runtime` opens the classifier that ``cfg`` describes together with what
serving needs around it, and :class:`Runtime` owns all of it and closes it in order:

- **Local mode** (no ``store`` configured): the DuckDB traffic log's non-blocking sink
  (:class:`logstore.SpoolSink` draining into the local database), labels (``Feedback`` and
  audit answers) written to that database, and, when the model comes from a models home,
  the watcher that follows promotions.
- **Fleet mode** (``store = s3://BUCKET/PREFIX``, see :mod:`fleet`): the sink's spool is a
  buffer that an :class:`fleet.shipper.ObjectShipper` empties into the object store
  (never on the request path); labels go through the same spool; a
  :class:`fleet.sync.RegistrySync` follows the fleet's ``models/CURRENT``, installs each
  promoted version into the local models home, and the classifier's watcher swaps it in.
  A fresh replica syncs once before it loads a model, so it starts on the fleet's version.
  No local DuckDB is opened: raw text stays on the replica only until it has shipped.

A long-running process (the sidecar) passes ``background_reload=True``: the watcher and the
sync then run on their own threads, never on a request.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flywheel.classifier.config import Config
from flywheel.classifier.decision import TeacherCall
from flywheel.classifier.default import build_classifier, default_model_dir
from flywheel.classifier.errors import FlywheelError
from flywheel.classifier.pipeline import Classifier
from flywheel.classifier.protocols import DecisionRecord
from flywheel.classifier.registry import CURRENT, ModelRegistry
from flywheel.logstore import LabelSink, LogStore, SpoolSink

__all__ = ["Runtime", "open_runtime", "FIRST_SYNC_TIMEOUT_S"]

log = logging.getLogger("flywheel.serving")

#: How long a starting replica waits for the fleet's current model before it serves what
#: it has (the store may be down: serving never waits for it longer than this).
FIRST_SYNC_TIMEOUT_S = 30.0


@dataclass
class Runtime:
    """A classifier and what was opened around it, closed by :meth:`close` in order.

    ``labels`` takes human labels and audit answers (``None`` without a traffic log);
    ``store`` is the local DuckDB log (``None`` in fleet mode or without a log); ``sink`` is
    the log sink this runtime opened (``None`` when the caller brought one); ``sync`` follows
    the fleet's model (fleet mode only); ``teacher`` is closed when this runtime built it."""

    classifier: Classifier
    labels: LabelSink | None = None
    store: LogStore | None = None
    sink: SpoolSink | None = None
    sync: Any = None
    teacher: Any = None
    shadow: Any = None            # a classifier.shadow.ShadowScorer (serving from a models home, with a log)
    shadow_watcher: Any = None    # the ModelWatcher on the models home's SHADOW pointer

    @property
    def fleet(self) -> bool:
        """Whether this runtime ships to an object store and follows the fleet's model."""
        return self.sync is not None

    def close(self, grace_s: float | None = None) -> None:
        """Stop the model sync and watcher, finish admitted audits, then flush the log and
        ship (or ingest) it within ``grace_s`` seconds; what is left ships at the next start."""
        try:
            if self.sync is not None:
                self.sync.stop()
            if self.shadow_watcher is not None:
                self.shadow_watcher.stop()
            if self.shadow is not None:       # its last answers go to the log before it closes
                self.shadow.close()
            self.classifier.close(close_sink=self.sink is None)
        finally:
            try:
                if self.sink is not None:
                    self.sink.close(grace_s=grace_s)
            finally:
                close = getattr(self.teacher, "close", None)
                if close is not None:
                    close()


def open_runtime(cfg: Config, *, log_decisions: bool = True, progress: bool = True,
                 background_reload: bool = False, **kwargs: Any) -> Runtime:
    """Build the default classifier for ``cfg`` with its traffic log, labels and audits.

    ``kwargs`` go to :class:`~classifier.pipeline.Classifier` (an ``embedder``, a
    ``teacher``, a ``log_sink`` of the caller's, ...). Raises
    :class:`~logstore.LogStoreError` when the log is not writable and
    :class:`fleet.errors.StoreConfigError` for a bad store URL or missing credentials,
    before any model is loaded.
    """
    if cfg.mask_pii:
        from flywheel.classifier.masking import mask_pii

        kwargs.setdefault("redact", mask_pii)
    if cfg.store:
        return _open_fleet(cfg, log_decisions, progress, background_reload, kwargs)
    store = LogStore(cfg.log_path) if log_decisions else None
    sink = None
    if store is not None and "log_sink" not in kwargs:  # a caller's own sink is used as is
        sink = kwargs["log_sink"] = store.open_sink()
    return _build(cfg, kwargs, progress, background_reload,
                  Runtime(None, labels=store, store=store, sink=sink))  # type: ignore[arg-type]


def _open_fleet(cfg: Config, log_decisions: bool, progress: bool, background_reload: bool,
                kwargs: dict[str, Any]) -> Runtime:
    from flywheel.fleet.config import StoreConfig
    from flywheel.fleet.objects import ObjectStore
    from flywheel.fleet.shipper import ObjectShipper
    from flywheel.fleet.sync import RegistrySync

    objects = ObjectStore(StoreConfig.parse(cfg.store))
    local = ModelRegistry(cfg.models_dir)
    sync = RegistrySync(objects, local, interval_s=cfg.store_poll_s)
    if cfg.model is None:
        sync.sync_once(FIRST_SYNC_TIMEOUT_S)
        _serve_from_models_home(cfg, local, progress)
    sink = None
    if log_decisions:
        spool = Path(str(cfg.log_path) + ".spool")
        sink = SpoolSink(spool, drain=ObjectShipper(objects), drain_interval_s=cfg.ship_interval_s,
                         max_spool_bytes=int(cfg.spool_max_mb * 2**20))
        if "log_sink" not in kwargs:
            kwargs["log_sink"] = sink
    rt = Runtime(None, labels=sink, sink=sink, sync=sync)  # type: ignore[arg-type]
    rt = _build(cfg, kwargs, progress, background_reload, rt)
    watcher = rt.classifier.watcher
    if watcher is not None:  # swap a version in as soon as the sync has installed it
        sync.on_new = lambda: watcher.poll(force=True)
    if background_reload:
        sync.start()
    return rt


def _serve_from_models_home(cfg: Config, local: ModelRegistry, progress: bool) -> None:
    """Before the fleet has promoted anything, serve the default model from the local models
    home (installed there once), so that the watcher follows the fleet's first promotion."""
    if (local.home / CURRENT).is_file():
        return
    path = default_model_dir(cfg, progress=progress)
    if (path / CURRENT).is_file():
        return
    name = local.publish(path)
    local.promote(name)
    log.info("replica: the fleet has promoted no model yet; serving %s locally until it does", name)


def _build(cfg: Config, kwargs: dict[str, Any], progress: bool, background_reload: bool,
           rt: Runtime) -> Runtime:
    """Build the classifier into ``rt``; on failure close what ``rt`` opened."""
    if rt.labels is not None:
        kwargs.setdefault("audit_rate", cfg.audit_rate)
        kwargs.setdefault("audit_callback", _audit_recorder(rt.labels))
    own_teacher = "teacher" not in kwargs
    try:
        rt.classifier = build_classifier(cfg, progress=progress, background_reload=background_reload, **kwargs)
    except BaseException:
        if rt.sink is not None:
            rt.sink.close()
        raise
    rt.teacher = rt.classifier.teacher if own_teacher else None
    _attach_shadow(cfg, rt, background_reload)
    return rt


def _attach_shadow(cfg: Config, rt: Runtime, background_reload: bool) -> None:
    """Score the models home's shadow version (``SHADOW``, see ``flywheel models shadow``)
    beside the champion, when the classifier is served from a models home and its decisions
    are logged (shadow answers are logged as ``source='shadow'`` labels): a
    :class:`~classifier.shadow.ShadowScorer` fed by the pipeline, and a watcher on the pointer
    (polled once now; on its own thread with ``background_reload``)."""
    clf = rt.classifier
    sink = rt.sink if rt.sink is not None else clf.log_sink
    add = getattr(sink, "add_shadow_answer", None)
    if cfg.shadow_fraction <= 0 or clf.watcher is None or add is None:
        return
    from flywheel.classifier.registry import SHADOW, ModelWatcher
    from flywheel.classifier.shadow import ShadowScorer

    scorer = ShadowScorer(add, fraction=cfg.shadow_fraction, check_encoder=clf.check_encoder)
    watcher = ModelWatcher(clf.watcher.registry, scorer.set_model, clf.watcher.interval_s, pointer=SHADOW)
    watcher.listeners.append(scorer.count_load)
    rt.shadow, rt.shadow_watcher = scorer, watcher
    clf.shadow = scorer
    try:
        watcher.poll(force=True)
    except Exception:  # noqa: BLE001 - a shadow never stops serving
        log.exception("loading the shadow version failed; serving without it")
    if background_reload:
        watcher.start()


def _audit_recorder(labels: LabelSink):
    """The audit callback: the teacher's answer becomes a teacher label of the decision."""
    def on_audit(record: DecisionRecord, call: TeacherCall) -> None:
        try:
            labels.add_teacher_label(record.decision.id, call.label, call.model, call.valid, call.latency_ms)
        except FlywheelError as exc:
            log.warning("audit answer for %s not stored: %s", record.decision.id, exc)
    return on_audit
