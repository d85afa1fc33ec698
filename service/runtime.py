"""The runtime wiring shared by ``flywheel classify``, the gRPC sidecar and Python callers.

:func:`open_runtime` opens the classifier that ``cfg`` describes together with what
serving needs around it, and :class:`Runtime` owns all of it and closes it in order. Where
the log and the registry live is the site's to say (:func:`fleet.site.open_site`):

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

The parts are built first (log, model sync and its first sync, the served model
(:func:`~classifier.versions.default.served_model`, as :func:`~classifier.assembly.build_classifier`
resolves it), teacher, shadow), then joined in one :class:`~classifier.pipeline.Classifier`,
built with the models home it follows (its watcher hot-swaps each promotion); the parts
built before it that call into it (the sync's "swap it now", the shadow's encoder check)
reach it through a :class:`_ClassifierSlot`, filled once, right after it is built.

A long-running process (the sidecar) passes ``background_reload=True``: the watchers and the
sync then run on their own threads, never on a request.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Callable

from flywheel.classifier.decision import TeacherCall
from flywheel.classifier.errors import FlywheelError
from flywheel.classifier.pipeline import Classifier
from flywheel.classifier.protocols import DecisionRecord, Embedder, LogSink, ManagedTeacher, Teacher
from flywheel.classifier.settings.config import Config
from flywheel.classifier.shadow import ShadowScorer, ShadowSink
from flywheel.classifier.teachers import build_teacher
from flywheel.classifier.versions.default import served_model
from flywheel.classifier.versions.model import IntentModel
from flywheel.classifier.versions.registry import SHADOW, WATCH_INTERVAL_S, ModelRegistry, ModelWatcher
from flywheel.classifier.versions.served import ServedVersion
from flywheel.fleet.human_labels import HumanLabels
from flywheel.fleet.site import ServingLog, Site, open_site
from flywheel.fleet.sync import FIRST_SYNC_TIMEOUT_S, RegistrySync
from flywheel.logstore import LabelSink, LogStore, SpoolSink

__all__ = ["Runtime", "open_runtime", "FIRST_SYNC_TIMEOUT_S"]

log = logging.getLogger("flywheel.serving")


@dataclass(frozen=True)
class Runtime:
    """A classifier and what was opened around it, closed by :meth:`close` in order.

    ``labels`` takes human labels and audit answers (``None`` without a traffic log), human
    labels through ``human_labels``, the one writer (:class:`fleet.human_labels.HumanLabels`),
    which parses them against the model served at the time;
    ``store`` is the local DuckDB log (``None`` in fleet mode or without a log); ``sink`` is
    the log sink this runtime opened (``None`` when the caller brought one); ``sync`` follows
    the fleet's model (fleet mode only); ``teacher`` is closed when this runtime built it;
    ``shadow`` scores the models home's shadow version and ``shadow_watcher`` follows its
    ``SHADOW`` pointer (serving from a models home, with a log); ``served`` is the version it
    started on and ``serving_note`` why that is not the home's ``CURRENT`` ('' when it is)."""

    classifier: Classifier
    labels: LabelSink | None = None
    store: LogStore | None = None
    sink: SpoolSink | None = None
    sync: RegistrySync | None = None
    teacher: Teacher | None = None
    shadow: ShadowScorer | None = None
    shadow_watcher: ModelWatcher | None = None
    human_labels: HumanLabels | None = None
    served: ServedVersion | None = None
    serving_note: str = ""

    @property
    def other_intent_set(self) -> bool:
        """Whether it started on a version of another intent set than the configured file
        (``serve_last_good``); a later reload serves only versions of the file."""
        return self.served is not None and self.served.source.startswith("last good")

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
                if isinstance(self.teacher, ManagedTeacher):
                    self.teacher.close()


class _ClassifierSlot:
    """Where the classifier will be, for the parts built before it that call into it: the
    fleet's sync asks its watcher to swap a promoted version in at once (:meth:`reload_now`),
    the shadow checks a version's encoder against the serving one (:meth:`check_encoder`).
    :meth:`fill` puts the classifier in, once, right after it is built; nothing calls these
    before (the first sync, which comes earlier, finds nothing to reload: the model is
    loaded after it)."""

    def __init__(self) -> None:
        self._classifier: Classifier | None = None

    def fill(self, classifier: Classifier) -> Classifier:
        if self._classifier is not None:
            raise RuntimeError("the classifier slot is filled once")
        self._classifier = classifier
        return classifier

    @property
    def classifier(self) -> Classifier:
        if self._classifier is None:
            raise RuntimeError("the classifier is not built yet")
        return self._classifier

    def check_encoder(self, model: IntentModel) -> None:
        self.classifier.check_encoder(model)

    def reload_now(self) -> None:
        watcher = self._classifier.watcher if self._classifier is not None else None
        if watcher is not None:   # swap a version in as soon as the sync has installed it
            watcher.poll(force=True)


def open_runtime(cfg: Config, *, log_decisions: bool = True, progress: bool = True,
                 background_reload: bool = False, site: Site | None = None, embedder: Embedder | None = None,
                 teacher: Teacher | None = None, log_sink: LogSink | None = None) -> Runtime:
    """Build the default classifier for ``cfg`` with its traffic log, labels and audits.

    ``site`` is where the log and the registry live (default: :func:`fleet.site.open_site`
    of ``cfg``). ``embedder``: the encoder to serve with (default: the one the served model's
    manifest names). ``teacher``: layer 3, the caller's to close (default: the one ``cfg`` and
    the intent set describe, closed with the runtime; ``cfg.teacher = "off"`` for none).
    ``log_sink``: the caller's own decision sink, used as it is (default: the site's). Raises
    :class:`~logstore.LogStoreError` when the log is not writable and
    :class:`fleet.errors.StoreConfigError` for a bad store URL or missing credentials,
    before any model is loaded.

    The parts come first, in this order: the site, the log (store, sink, labels), the
    fleet's model sync (which syncs once when the models home serves), the served model,
    the teacher and the shadow; then one ``Classifier`` joins them, built with the models
    home it follows, and then the threads start. A part that fails closes what was opened
    before it.
    """
    redact: Callable[[str], str] | None = None
    if cfg.mask_pii:
        from flywheel.classifier.masking import mask_pii

        redact = mask_pii
    site = site if site is not None else open_site(cfg)
    slot = _ClassifierSlot()
    with contextlib.ExitStack() as undo:       # closes what is open if a later part fails
        served = site.serving_log(own_sink=log_sink is None) if log_decisions else ServingLog()
        if served.sink is not None:
            undo.callback(served.sink.close)
        sink = log_sink if log_sink is not None else served.sink   # a caller's own sink is used as is
        sync = site.follow(slot.reload_now)
        if sync is not None and cfg.model is None:   # a fresh replica starts on the fleet's version
            sync.sync_once(FIRST_SYNC_TIMEOUT_S)
        chosen = served_model(cfg, progress=progress, into_home=sync is not None)
        model, home = chosen.model, chosen.home
        own_teacher = teacher is None
        if own_teacher:
            teacher = build_teacher(cfg, model.intents)
        shadow_sink = served.sink if served.sink is not None else log_sink
        shadow, shadow_watcher = _shadow_parts(cfg, home, shadow_sink, slot)
        audit = None if served.labels is None else _audit_recorder(served.labels)   # audits need labels
        classifier = slot.fill(Classifier(model, embedder=embedder, teacher=teacher, log_sink=sink, redact=redact,
                                          audit_rate=0.0 if audit is None else cfg.audit_rate, audit_callback=audit,
                                          cache_root=cfg.cache_root, follow=home, shadow=shadow))
        undo.pop_all()
    _start(classifier.watcher, shadow_watcher, sync, background_reload)
    writer = None if served.labels is None else HumanLabels(     # the labels of the model served now
        served.labels, lambda: classifier.model.manifest.labels, fleet=site.fleet, live=True)
    return Runtime(classifier, labels=served.labels, store=served.store, sink=served.sink, sync=sync,
                   teacher=teacher if own_teacher else None, shadow=shadow, shadow_watcher=shadow_watcher,
                   human_labels=writer, served=chosen.served, serving_note=chosen.note)


def _shadow_parts(cfg: Config, home: ModelRegistry | None, sink: object,
                  slot: _ClassifierSlot) -> tuple[ShadowScorer | None, ModelWatcher | None]:
    """Score the models home's shadow version (``SHADOW``, see ``flywheel models shadow``)
    beside the champion, when the classifier is served from a models home and its decisions
    are logged to a sink that takes shadow answers (logged as ``source='shadow'`` labels):
    a :class:`~classifier.shadow.ShadowScorer` and a watcher on the pointer."""
    # a caller's own sink may take no shadow answers: then no shadow is scored
    if cfg.shadow_fraction <= 0 or home is None or not isinstance(sink, ShadowSink):
        return None, None
    scorer = ShadowScorer(sink.add_shadow_answer, fraction=cfg.shadow_fraction, check_encoder=slot.check_encoder)
    watcher = ModelWatcher(home, scorer.set_model, WATCH_INTERVAL_S, pointer=SHADOW)
    watcher.listeners.append(scorer.count_load)
    return scorer, watcher


def _start(watcher: ModelWatcher | None, shadow_watcher: ModelWatcher | None, sync: RegistrySync | None,
           background: bool) -> None:
    """Load the shadow version now, and with ``background`` run the watchers and the sync
    on their own threads (else the classifier polls its watcher before a request)."""
    if watcher is not None and background:
        watcher.start()
    if shadow_watcher is not None:
        try:
            shadow_watcher.poll(force=True)
        except Exception:  # noqa: BLE001 - a shadow never stops serving
            log.exception("loading the shadow version failed; serving without it")
        if background:
            shadow_watcher.start()
    if sync is not None and background:
        sync.start()


def _audit_recorder(labels: LabelSink) -> Callable[[DecisionRecord, TeacherCall], None]:
    """The audit callback: the teacher's answer becomes a teacher label of the decision
    (an unsure one with its candidate set)."""
    def on_audit(record: DecisionRecord, call: TeacherCall) -> None:
        try:
            labels.add_teacher_label(record.decision.id, call.label, call.model, call.valid, call.latency_ms,
                                     candidates=call.candidates)
        except FlywheelError as exc:
            log.warning("audit answer for %s not stored: %s", record.decision.id, exc)
    return on_audit
