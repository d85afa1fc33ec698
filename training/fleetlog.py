"""The offline commands' view of the log and the registry, local or fleet.

Every training command (``stats``, ``label``, ``feedback``, ``retrain``, ``models``,
``prune-log``) opens the traffic log and the model registry through here, so that with a
store configured (``store = s3://BUCKET/PREFIX``) each one sees every replica's decisions
and labels and the fleet's ``models/CURRENT``:

- :func:`open_log` opens the local DuckDB log and, in fleet mode, first mirrors the bucket's
  log objects into it (:func:`fleet.mirror.mirror`: only new objects, exactly once);
- :func:`label_sink` is where labels go: the local log, or the bucket (and the local copy);
- :func:`open_registry` is the local models home, or the bucket registry in front of it;
- :func:`apply_retention` deletes raw text past ``log_retention_days`` (the retrain runs it).

Without a store nothing here touches the network.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from flywheel.classifier.config import Config
from flywheel.classifier.registry import ModelRegistry
from flywheel.logstore import LabelSink, LogStore

__all__ = ["open_objects", "open_log", "label_sink", "open_registry", "apply_retention", "prune_log_now",
           "mirror_progress"]


def _say(progress: bool, msg: str) -> None:
    if progress:
        print(f"flywheel: {msg}", file=sys.stderr, flush=True)


def open_objects(cfg: Config) -> Any:
    """The fleet's :class:`fleet.objects.ObjectStore`, or ``None`` without a store."""
    if not cfg.store:
        return None
    from flywheel.fleet.config import StoreConfig
    from flywheel.fleet.objects import ObjectStore

    return ObjectStore(StoreConfig.parse(cfg.store))


def open_log(cfg: Config, *, progress: bool = False, objects: Any = None) -> LogStore:
    """The traffic log at ``cfg.log_path``; in fleet mode brought up to date with the bucket."""
    store = LogStore(cfg.log_path)
    objects = objects if objects is not None else open_objects(cfg)
    if objects is not None:
        from flywheel.fleet.mirror import mirror

        _say(progress, f"mirroring the fleet's log from {objects} ...")
        rep = mirror(objects, store, progress=mirror_progress() if progress else None)
        _say(progress, f"mirrored {rep.objects:,} new objects ({rep.rows:,} rows, {rep.bytes / 2**20:.1f} MiB) "
                       f"in {rep.seconds:.1f}s" + (f"; {rep.bad} unreadable, left for the next run" if rep.bad
                                                   else ""))
    return store


def mirror_progress(every_s: float = 5.0):
    """A :func:`fleet.mirror.mirror` progress callback that prints a line at most every ``every_s``."""
    import time

    last = [time.monotonic()]

    def report(done: int, total: int, rows: int) -> None:
        now = time.monotonic()
        if now - last[0] >= every_s or done == total:
            last[0] = now
            _say(True, f"  mirrored {done:,} of {total:,} new objects ({rows:,} rows)")
    return report


def label_sink(cfg: Config, store: LogStore, *, objects: Any = None) -> LabelSink:
    """Where a command's labels go: ``store``, or in fleet mode the bucket (and ``store``)."""
    objects = objects if objects is not None else open_objects(cfg)
    if objects is None:
        return store
    from flywheel.fleet.labels import BucketLabels

    return BucketLabels(objects, store)


def open_registry(cfg: Config, models: Path | None = None, *, objects: Any = None) -> Any:
    """The registry commands promote in: the local models home (``models`` or
    ``<home>/models``), or in fleet mode the bucket's ``models/`` with that home as its
    local copy."""
    local = ModelRegistry(Path(models).expanduser() if models else cfg.models_dir)
    objects = objects if objects is not None else open_objects(cfg)
    if objects is None:
        return local
    from flywheel.fleet.registry import BucketRegistry

    return BucketRegistry(objects, local)


def prune_log_now(cfg: Config, store: LogStore | None, days: float, *, objects: Any = None,
                  progress: bool = False) -> Any:
    """Delete raw query text older than ``days`` days from the bucket (fleet mode) and
    from ``store``'s files; returns the :class:`fleet.retention.PruneReport`."""
    from flywheel.fleet.retention import prune_log

    objects = objects if objects is not None else open_objects(cfg)
    rep = prune_log(objects, store, days=days)
    _say(progress, f"retention {days:g} days: text before {rep.cutoff:%Y-%m-%d %H:%M} UTC removed from "
                   f"{rep.redacted} objects ({rep.deleted} originals deleted) and {rep.local_rows:,} local rows")
    return rep


def apply_retention(cfg: Config, store: LogStore, *, objects: Any = None, progress: bool = False) -> Any:
    """:func:`prune_log_now` with the configured ``log_retention_days`` (``None``: keep all)."""
    if cfg.log_retention_days is None:
        return None
    return prune_log_now(cfg, store, cfg.log_retention_days, objects=objects, progress=progress)
