"""Where this process's traffic log and model registry live: one machine, or a fleet.

:func:`open_site` decides it once, from ``cfg.store``, and every entry point (the serving
runtime, the offline commands) asks the site it returns instead of deciding again:

- :class:`LocalSite` (no store): the models home ``<home>/models`` and the DuckDB log at
  ``cfg.log_path``; nothing here touches the network.
- :class:`FleetSite` (``store = s3://BUCKET/PREFIX``): one :class:`~fleet.objects.ObjectStore`
  for the bucket, opened here and shared by all the parts: the bucket's registry in front
  of the local home (:class:`~fleet.registry.BucketRegistry`), the log mirrored from the
  bucket before it is read (:func:`fleet.mirror.mirror`), labels written to the bucket
  (:class:`~fleet.bucket_labels.BucketLabels`), a serving sink whose spool an
  :class:`~fleet.shipper.ObjectShipper` empties, and a :class:`~fleet.sync.RegistrySync`
  that makes a replica follow the fleet's ``models/CURRENT``.

Both offer the :class:`Site` Protocol. Tests pass a fake site where a command takes one.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from flywheel.classifier.errors import FlywheelError, IntentSetMismatch
from flywheel.classifier.protocols import Registry
from flywheel.classifier.settings.config import Config
from flywheel.classifier.settings.intents import IntentSet
from flywheel.classifier.versions.model import IntentModel
from flywheel.classifier.versions.registry import CURRENT, ModelRegistry, VersionInfo
from flywheel.classifier.versions.served import IntentContract, ServedVersion, home_choice, intent_digest
from flywheel.fleet.bucket_labels import BucketLabels
from flywheel.fleet.config import StoreConfig
from flywheel.fleet.human_labels import HumanLabels
from flywheel.fleet.mirror import mirror
from flywheel.fleet.objects import ObjectStore
from flywheel.fleet.registry import MODELS, BucketRegistry, BucketVersion
from flywheel.fleet.retention import PruneReport, prune_log
from flywheel.fleet.shipper import ObjectShipper
from flywheel.fleet.sync import FIRST_SYNC_TIMEOUT_S, RegistrySync
from flywheel.logstore import LabelSink, LocalIngest, LogStore, SpoolDrain, SpoolSink

__all__ = ["FIRST_SYNC_TIMEOUT_S", "FleetSite", "ListedRegistry", "LocalSite", "ServingLog", "Site",
           "home_reports", "mirror_progress", "open_site"]

REPORT = "report.json"   # a version's retrain report (training.report), beside its manifest

log = logging.getLogger("flywheel.serving")

class ListedRegistry(Registry, Protocol):
    """A :class:`~classifier.protocols.Registry` that also lists its versions, by name
    (``flywheel models list``): the local home's, or the bucket's (same field names)."""

    def versions(self) -> Sequence[VersionInfo | BucketVersion]: ...

    def history(self) -> list[str]:
        """The promoted versions, oldest first (what a rollback walks back through)."""
        ...


@dataclass(frozen=True)
class ServingLog:
    """What a serving process logs to: ``store`` is the local DuckDB log (``None`` in fleet
    mode: a replica opens none), ``sink`` the decision sink this site opened (``None`` when
    the caller brings its own, locally), ``labels`` where human labels and audit answers go."""

    store: LogStore | None = None
    sink: SpoolSink | None = None
    labels: LabelSink | None = None


class Site(Protocol):
    """Where the log and the registry live (see the module docs)."""

    cfg: Config

    @property
    def fleet(self) -> bool:
        """Whether the log and the registry are the fleet's, in an object store."""
        ...

    def registry(self, models: Path | None = None) -> ListedRegistry:
        """The registry to read and promote in; ``models`` overrides the local home."""
        ...

    def open_log(self, *, progress: bool = False) -> LogStore:
        """The traffic log for offline work, brought up to date with the fleet's first."""
        ...

    def labels(self, store: LogStore) -> LabelSink:
        """Where an offline command's labels of ``store``'s decisions go."""
        ...

    def contract(self) -> IntentContract:
        """The intent set this deployment is configured for (the ``intents`` setting, read
        now; without one, any set fits); :class:`~classifier.errors.IntentFileError` when
        the file cannot be read."""
        ...

    def served(self) -> ServedVersion:
        """What this deployment serves now, the one answer every command asks for (read from
        manifests and bundled intent files; no head is loaded or downloaded): on a fleet the
        bucket's ``models/CURRENT`` (so a host that has not synced sees the fleet's version);
        else the configured ``model``, or the models home's ``CURRENT`` under the configured
        intent set as a serving process picks it (:func:`~classifier.versions.served.home_choice`);
        else the default model (trained or not yet). Raises
        :class:`~classifier.errors.IntentSetMismatch` when nothing may be served."""
        ...

    def served_labels(self) -> tuple[str, ...] | None:
        """The labels of :meth:`served`, read once per call; while no version of the configured
        file is stored, the file's (what the next retrain trains); ``None`` when none can be read."""
        ...

    def check_move(self, reg: Registry, name: str, *, doing: str, fix: str = "") -> None:
        """Raise :class:`~classifier.errors.IntentSetMismatch` (exit 2) unless version ``name``
        of ``reg`` was trained on the configured intent set (:meth:`contract`): the check
        every move of the served pointer passes first (``doing`` names the move in the
        error, ``fix`` what to do instead). Without an ``intents`` setting, any version fits."""
        ...

    def served_model(self, *, progress: bool = True) -> IntentModel:
        """The model served now, loaded (a fleet's current version is downloaded into the
        local home and verified first); trains the default model on first use."""
        ...

    def human_labels(self, store: LogStore) -> HumanLabels:
        """The one writer of an offline command's human labels of ``store``'s decisions:
        parsed against :meth:`served_labels` (read once), into :meth:`labels`."""
        ...

    def version_reports(self) -> list[tuple[str, dict]]:
        """``(version, report.json)`` of every version in the registry that has a retrain
        report (the dashboard's retrain history), by name."""
        ...

    def serving_log(self, *, own_sink: bool = True) -> ServingLog:
        """The log a serving process writes; ``own_sink=False``: the caller brings its own
        decision sink (a fleet site opens one all the same: labels go through it)."""
        ...

    def drain(self) -> SpoolDrain:
        """Where a serving spool's finished segments go."""
        ...

    def follow(self, on_new: Callable[[], object]) -> RegistrySync | None:
        """What makes the local models home follow the fleet's, not started and not synced
        yet (``None``: nothing to follow); ``on_new`` is called after it installed a newly
        promoted version. A starting replica's first sync is the caller's
        (:meth:`RegistrySync.sync_once`, at most :data:`FIRST_SYNC_TIMEOUT_S`)."""
        ...

    def prune_log(self, store: LogStore | None, days: float, *, progress: bool = False) -> PruneReport:
        """Delete raw query text older than ``days`` days from the log (and the bucket's)."""
        ...

    def apply_retention(self, store: LogStore, *, progress: bool = False) -> PruneReport | None:
        """:meth:`prune_log` with ``cfg.log_retention_days`` (``None``: keep all, nothing run)."""
        ...


def open_site(cfg: Config) -> LocalSite | FleetSite:
    """The site ``cfg`` describes. Raises :class:`~fleet.errors.StoreConfigError` for a bad
    store URL, missing credentials or a missing ``flywheel-intent[fleet]`` extra; connects
    to nothing."""
    if not cfg.store:
        return LocalSite(cfg)
    return FleetSite(cfg, ObjectStore(StoreConfig.parse(cfg.store)))


def home_reports(models: Path) -> list[tuple[str, dict]]:
    """``(version, report.json)`` of every version directory under the models home ``models``
    that has a readable report, by name (:meth:`Site.version_reports` of a local site)."""
    out = []
    for d in sorted(models.iterdir()) if models.is_dir() else ():
        try:
            report = _report_doc((d / REPORT).read_bytes()) if (d / REPORT).is_file() else None
        except OSError:
            report = None
        if report is not None:
            out.append((d.name, report))
    return out


def _report_doc(data: bytes) -> dict | None:
    """A version's ``report.json`` as a dict; ``None`` when it is not one."""
    import json

    try:
        doc = json.loads(data.decode("utf-8"))
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def _say(progress: bool, msg: str) -> None:
    if progress:
        print(f"flywheel: {msg}", file=sys.stderr, flush=True)


def mirror_progress(every_s: float = 5.0) -> Callable[[int, int, int], None]:
    """A :func:`fleet.mirror.mirror` progress callback that prints a line at most every ``every_s``."""
    last = [time.monotonic()]

    def report(done: int, total: int, rows: int) -> None:
        now = time.monotonic()
        if now - last[0] >= every_s or done == total:
            last[0] = now
            _say(True, f"  mirrored {done:,} of {total:,} new objects ({rows:,} rows)")
    return report


def _bundled_intents(reg: Registry, name: str) -> IntentSet:
    """The intent set version ``name`` of ``reg`` bundles, read without loading its head: a
    local home's bundled file, the bucket's (one GET each for the manifest and the file)."""
    if isinstance(reg, BucketRegistry):
        return reg.bundled_intents(name)
    if isinstance(reg, ModelRegistry):
        served = ServedVersion.read(reg.version_dir(name), "models home")
        if served.intents is not None:
            return served.intents
    return reg.load(name).intents


class _SiteBase:
    """What both sites share: the local home and log, and retention."""

    objects: ObjectStore | None = None
    fleet: bool

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg

    def _local(self, models: Path | None = None) -> ModelRegistry:
        return ModelRegistry(Path(models).expanduser() if models else self.cfg.models_dir)

    def _promoted(self) -> str | None:
        """The version the registry serves when it is not the local home's (``None``)."""
        return None

    def labels(self, store: LogStore) -> LabelSink:
        return store

    def contract(self) -> IntentContract:
        return IntentContract.from_file(self.cfg.intents)

    def served(self) -> ServedVersion:
        from flywheel.classifier.settings.config import starter_intents_path
        from flywheel.classifier.settings.intents import load_intents
        from flywheel.classifier.versions.default import cached_model_dir
        from flywheel.classifier.versions.model import MANIFEST

        name = None if self.cfg.model else self._promoted()
        if name is not None:   # the fleet's CURRENT: its manifest and intent file, nothing downloaded
            bucket = self._bucket()
            intents = bucket.bundled_intents(name)
            manifest, _ = bucket.manifest(name)
            return ServedVersion(name, intent_digest(intents), tuple(intents.labels),
                                 str(manifest.encoder.get("id", "")), "fleet", None, intents)
        path = Path(self.cfg.model).expanduser() if self.cfg.model else self.cfg.models_dir
        if (path / CURRENT).is_file():
            choice = home_choice(ModelRegistry(path), self.contract(), last_good=self.cfg.serve_last_good)
            if choice is None:
                raise IntentSetMismatch(f"{path} serves {ModelRegistry(path).current_name()}, trained on another "
                                        f"intent set than {self.cfg.intents}, and no stored version was trained on "
                                        f"it")
            return choice[0]
        if self.cfg.model:
            return ServedVersion.read(path, "model setting")
        source = Path(self.cfg.intents).expanduser() if self.cfg.intents else starter_intents_path()
        cached = cached_model_dir(self.cfg, source)
        if (cached / MANIFEST).is_file():
            return ServedVersion.read(cached, "default model")
        intents = load_intents(source)   # not trained yet: the set it will be trained from
        return ServedVersion(f"{cached.name} (not trained yet)", intent_digest(intents), tuple(intents.labels),
                             intents.embedder.backend, "default model", None, intents)

    def served_labels(self) -> tuple[str, ...] | None:
        try:
            return self.served().labels
        except IntentSetMismatch:   # no version of the file yet: its labels are what the next one learns
            intents = self.contract().intents
            return None if intents is None else tuple(intents.labels)
        except (FlywheelError, OSError, ValueError, KeyError):
            return None

    def check_move(self, reg: Registry, name: str, *, doing: str, fix: str = "") -> None:
        contract = self.contract()
        if contract.intents is None:
            return
        contract.check(name, _bundled_intents(reg, name), doing=doing, fix=fix)

    def served_model(self, *, progress: bool = True) -> IntentModel:
        from flywheel.classifier.versions.default import served_model

        name = None if self.cfg.model else self._promoted()
        if name is not None:
            return self._bucket().load(name)
        return served_model(self.cfg, progress=progress).model

    def human_labels(self, store: LogStore) -> HumanLabels:
        return HumanLabels(self.labels(store), self.served_labels, fleet=self.fleet)

    def version_reports(self) -> list[tuple[str, dict]]:
        return home_reports(self.cfg.models_dir)

    def _bucket(self) -> BucketRegistry:
        raise NotImplementedError

    def prune_log(self, store: LogStore | None, days: float, *, progress: bool = False) -> PruneReport:
        rep = prune_log(self.objects, store, days=days)
        _say(progress, f"retention {days:g} days: text before {rep.cutoff:%Y-%m-%d %H:%M} UTC removed from "
                       f"{rep.redacted} objects ({rep.deleted} originals deleted) and {rep.local_rows:,} local rows")
        return rep

    def apply_retention(self, store: LogStore, *, progress: bool = False) -> PruneReport | None:
        if self.cfg.log_retention_days is None:
            return None
        return self.prune_log(store, self.cfg.log_retention_days, progress=progress)


class LocalSite(_SiteBase):
    """One machine: the models home and the DuckDB log under the configured home."""

    fleet = False

    def __repr__(self) -> str:
        return f"LocalSite({self.cfg.models_dir}, {self.cfg.log_path})"

    def registry(self, models: Path | None = None) -> ModelRegistry:
        return self._local(models)

    def open_log(self, *, progress: bool = False) -> LogStore:
        return LogStore(self.cfg.log_path)

    def serving_log(self, *, own_sink: bool = True) -> ServingLog:
        store = LogStore(self.cfg.log_path)
        return ServingLog(store=store, sink=store.open_sink() if own_sink else None, labels=store)

    def drain(self) -> SpoolDrain:
        return LocalIngest(self.cfg.log_path, busy_timeout_s=0.0)

    def follow(self, on_new: Callable[[], object]) -> None:
        return None


class FleetSite(_SiteBase):
    """A fleet: the log and the registry in the bucket of ``objects``, the configured home
    as their local copy."""

    fleet = True

    def __init__(self, cfg: Config, objects: ObjectStore) -> None:
        super().__init__(cfg)
        self.objects: ObjectStore = objects
        self._reports: dict[str, dict | None] = {}   # create-only in the bucket ("the first upload stays")

    def _bucket(self) -> BucketRegistry:
        return self.registry()

    def _promoted(self) -> str | None:
        """The fleet's ``models/CURRENT`` (one GET); ``None`` before the first promotion."""
        return self._bucket().current()[0]

    def version_reports(self) -> list[tuple[str, dict]]:
        """The bucket's versions' reports: one listing, then one GET per version not read before."""
        names = sorted({info.key.split("/")[1] for info in self.objects.list(MODELS)
                        if info.key.count("/") == 2 and info.key.endswith("/" + REPORT)})
        for name in names:
            if self._reports.get(name) is None:   # an unreadable one is read again next time
                got = self.objects.get(f"{MODELS}/{name}/{REPORT}")
                self._reports[name] = _report_doc(got[0]) if isinstance(got, tuple) else None
        return [(n, r) for n in names if (r := self._reports.get(n)) is not None]

    def __repr__(self) -> str:
        return f"FleetSite({self.objects})"

    def registry(self, models: Path | None = None) -> BucketRegistry:
        return BucketRegistry(self.objects, self._local(models), by=self.cfg.replica)   # None: user@host

    def open_log(self, *, progress: bool = False) -> LogStore:
        store = LogStore(self.cfg.log_path)
        _say(progress, f"mirroring the fleet's log from {self.objects} ...")
        rep = mirror(self.objects, store, progress=mirror_progress() if progress else None)
        _say(progress, f"mirrored {rep.objects:,} new objects ({rep.rows:,} rows, {rep.bytes / 2**20:.1f} MiB) "
                       f"in {rep.seconds:.1f}s" + (f"; {rep.bad} unreadable, left for the next run" if rep.bad
                                                   else ""))
        return store

    def labels(self, store: LogStore) -> LabelSink:
        return BucketLabels(self.objects, store)

    def serving_log(self, *, own_sink: bool = True) -> ServingLog:
        spool = Path(str(self.cfg.log_path) + ".spool")
        sink = SpoolSink(spool, drain=self.drain(), drain_interval_s=self.cfg.ship_interval_s,
                         max_spool_bytes=int(self.cfg.spool_max_mb * 2**20))
        return ServingLog(sink=sink, labels=sink)

    def drain(self) -> SpoolDrain:
        return ObjectShipper(self.objects)

    def follow(self, on_new: Callable[[], object]) -> RegistrySync:
        """A :class:`RegistrySync` into the local models home, neither synced nor started."""
        return RegistrySync(self.objects, self._local(), interval_s=self.cfg.store_poll_s, on_new=on_new)
