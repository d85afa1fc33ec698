"""The mirror: the fleet's log in the bucket -> the local DuckDB, every row exactly once.

:func:`mirror` lists the log objects (``log/redacted/``, then ``log/decisions/``, then
``log/labels/``: decisions before the labels that name them), skips the keys the local
store already holds (:meth:`logstore.LogStore.ingested_keys`), downloads the rest in
parallel and inserts them in batches of about ``batch_rows`` rows with
:meth:`logstore.LogStore.insert_objects`: rows and keys commit in one transaction, so a
crash or a dead store mid-run leaves whole objects in or out, and the next run picks up
where this one stopped. Rows are deduplicated by ``decision_id`` and ``label_uid``, so
the same row under two keys (a decision object and its redacted copy) counts once.

A ``log/redacted/`` object is the text-free copy of a decision object made by
:func:`fleet.retention.prune_log`, which deletes the original afterwards. The redacted
copies go in first, and an original whose redacted copy is already there is not read
at all: text past retention never comes back into a local store.

Memory is bounded by one batch (``batch_rows``, default 100,000 rows, about 200 MB with
384-dim vectors) plus the downloads in flight (``workers``). An object that cannot be
read, or whose columns are not those of a decision or label object of this version, is
logged, counted in :attr:`MirrorReport.bad` and left for the next run. A store that
cannot be reached raises :class:`~fleet.errors.StoreUnavailable` and a database error
:class:`~logstore.errors.LogStoreError` (what committed before stays).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable

import pyarrow as pa

from flywheel.fleet.objects import NOT_MODIFIED, ObjectStore
from flywheel.fleet.parallel import ordered_map
from flywheel.fleet.shipper import LOG_PREFIX
from flywheel.logstore.label_records import LABEL_COLUMNS_V3, LABEL_SCHEMA
from flywheel.logstore.segments import DECISIONS, LABELS, SEGMENT_SCHEMA, from_parquet
from flywheel.logstore.store import LogStore

__all__ = ["DEFAULT_BATCH_ROWS", "MirrorReport", "ProgressFn", "mirror"]

log = logging.getLogger("flywheel.fleet")

DEFAULT_BATCH_ROWS = 100_000
DEFAULT_WORKERS = 8

#: ``progress(objects_done, objects_total, rows_inserted)``, called after each committed batch.
ProgressFn = Callable[[int, int, int], None]


@dataclass(frozen=True)
class MirrorReport:
    """What one :func:`mirror` run did. ``objects``: objects whose rows went in now;
    ``rows``: rows inserted (decisions + labels; a row already in counts 0);
    ``skipped``: objects already mirrored, superseded by their redacted copy, or gone
    meanwhile; ``seconds``: wall time; ``bad``: objects that could not be read (left for
    the next run); ``bytes``: bytes downloaded."""

    objects: int
    rows: int
    skipped: int
    seconds: float
    bad: int = 0
    bytes: int = 0


def _kind(key: str) -> str:
    return LABELS if key.startswith(LOG_PREFIX[LABELS] + "/") else DECISIONS


def _todo(objects: ObjectStore, done: set[str]) -> tuple[list[str], int]:
    """The keys to mirror, in order (redacted, decisions, labels), and how many were skipped."""
    listed = {p: [o.key for o in objects.list(LOG_PREFIX[p]) if o.key.endswith(".parquet")]
              for p in ("redacted", DECISIONS, LABELS)}
    redacted_names = {k[len(LOG_PREFIX["redacted"]):] for k in listed["redacted"]}
    keys, skipped = [], 0
    for part in ("redacted", DECISIONS, LABELS):
        for key in listed[part]:
            superseded = part == DECISIONS and key[len(LOG_PREFIX[DECISIONS]):] in redacted_names
            if key in done or superseded:
                skipped += 1
            else:
                keys.append(key)
    return keys, skipped


_REQUIRED = {DECISIONS: {"decision_id", "created_at", "text", "layer", "embedding"},
             LABELS: set(LABEL_COLUMNS_V3)}
_KNOWN = {DECISIONS: set(SEGMENT_SCHEMA.names), LABELS: set(LABEL_SCHEMA.names)}


def _checked(kind: str, table: pa.Table) -> pa.Table:
    """``table`` if its columns fit ``kind``; else ValueError (a foreign or newer object)."""
    names = set(table.schema.names)
    missing, unknown = _REQUIRED[kind] - names, names - _KNOWN[kind]
    if missing or unknown:
        raise ValueError(f"not a {kind} object of this flywheel: missing columns {sorted(missing)}, "
                         f"unknown columns {sorted(unknown)}")
    return table


def _download(objects: ObjectStore, key: str) -> tuple[str, pa.Table | None, int, Exception | None]:
    """``(key, table, bytes, error)``; table ``None`` and no error: the object is gone."""
    got = objects.get(key)
    if got is None or got is NOT_MODIFIED:
        return key, None, 0, None
    data = got[0]
    try:
        return key, _checked(_kind(key), from_parquet(data)), len(data), None
    except (pa.ArrowException, OSError, ValueError) as exc:
        return key, None, len(data), exc


class _Run:
    def __init__(self, store: LogStore, total: int, progress: ProgressFn | None) -> None:
        self.store, self.total, self.progress = store, total, progress
        self.objects = self.rows = self.bad = self.bytes = self.gone = 0

    def insert(self, batch: list[tuple[str, str, pa.Table]]) -> None:
        """Insert one batch: rows and keys in one transaction."""
        self.rows += self.store.insert_objects(batch)
        self.objects += len(batch)
        if self.progress is not None:
            self.progress(self.objects + self.bad + self.gone, self.total, self.rows)


def mirror(objects: ObjectStore, store: LogStore, *, progress: ProgressFn | None = None,
           batch_rows: int = DEFAULT_BATCH_ROWS, workers: int = DEFAULT_WORKERS) -> MirrorReport:
    """Bring every log object of the bucket into ``store``, exactly once (see the module
    docstring); ``progress(objects_done, objects_total, rows_inserted)`` is called after
    each committed batch."""
    if batch_rows < 1 or workers < 1:
        raise ValueError("batch_rows and workers must be >= 1")
    t0 = time.monotonic()
    keys, skipped = _todo(objects, store.ingested_keys())
    run = _Run(store, len(keys), progress)
    batch: list[tuple[str, str, pa.Table]] = []
    batch_n = 0
    for key, table, nbytes, exc in ordered_map(lambda k: _download(objects, k), keys, workers=workers,
                                               name="flywheel-mirror"):
        run.bytes += nbytes
        if exc is not None:
            run.bad += 1
            log.error("fleet mirror: object %s cannot be read (%s); left for the next run", key, exc)
            continue
        if table is None:
            run.gone += 1  # deleted since the listing (e.g. replaced by its redacted copy)
            continue
        batch.append((key, _kind(key), table))
        batch_n += table.num_rows
        if batch_n >= batch_rows:
            run.insert(batch)
            batch, batch_n = [], 0
    if batch:
        run.insert(batch)
    return MirrorReport(objects=run.objects, rows=run.rows, skipped=skipped + run.gone,
                        seconds=round(time.monotonic() - t0, 3), bad=run.bad, bytes=run.bytes)
