"""Retention: remove raw query text older than N days from the bucket and from the
retrain host's files, so that the bytes are gone, not only the rows.

:func:`prune_log` (``flywheel prune-log --days N``, and the retrain when its retention
key is set) works in two steps.

**Bucket.** Every decision object ``log/decisions/date=D/<name>`` whose rows are all
older than the cutoff (only objects with ``D`` on or before the cutoff's date are read)
is rewritten without text as ``log/redacted/date=D/<name>`` (create-only; an existing
copy, left by an interrupted run, counts as done) and then the original is deleted. The
copy keeps every column but the text: ``text`` becomes ``''``, history snippets ``''``
(their labels stay) and ``teacher_error`` its kind (the part before ``:``, since it may
quote the LLM's answer); ids, times, answers, inline teacher labels, an unsure answer's
candidate set (``teacher_candidates``: intent names, data), layer-2 answers and
embeddings are kept. An object of the cutoff's own day that still holds newer rows waits
for the next run (:attr:`PruneReport.waiting`). Label objects hold no query text and
stay. The object store frees a deleted object's bytes when it compacts its volumes
(SeaweedFS: ``volume.vacuum``; S3: at once for the reader, physically as the provider
does).

**Local.** With a :class:`~logstore.store.LogStore`: the redacted copies go in at once
(:meth:`~logstore.store.LogStore.insert_objects`, so the next mirror does not download
them again), then :meth:`~logstore.store.LogStore.forget_text` blanks the same fields of
every local decision created before the cutoff, and
:meth:`~logstore.store.LogStore.compact` rewrites the DuckDB file (an ``UPDATE`` and a
``CHECKPOINT`` leave the old strings in free blocks; the rewrite copies only live data
and swaps the file in atomically while it is locked). The file is rewritten only when
rows changed; a marker file (``<db>.prune-pending``) makes a run interrupted between
the two rewrite next time. Quarantined (``*.bad``) and abandoned (``*.tmp``) spool files older
than the cutoff are deleted: they may hold text that was never ingested.

What the retrain can still do with a decision whose text is gone
----------------------------------------------------------------
- Its stored layer-2 vector and its labels (teacher, human, inline) are kept, and it still
  counts in ``flywheel stats`` (layer shares, tiers, audit agreement, confusions).
- The retrain trains on it with the **same encoder**: :mod:`training.trainset` keys a
  text-less row by its decision id (never merged with others, never held out for
  evaluation) and uses its logged vector and its own label (human, else the valid
  teacher majority); the report counts them under ``text_removed``. A row without a
  logged vector of that encoder is skipped, and a **new encoder** can never use it (no
  text to encode), nor can the teacher, self-training or the held-out split (a hash of
  the text). ``LogStore.pending`` leaves it out (nothing to ask the teacher).

Mirrored copies behave the same: :func:`fleet.mirror.mirror` brings redacted objects
into a fresh store with their vectors and labels, and never the originals' text.
"""

from __future__ import annotations

import logging
import os
import re
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Iterable

import pyarrow as pa
import pyarrow.compute as pc

from flywheel.fleet.objects import NOT_MODIFIED, ObjectStore
from flywheel.fleet.parallel import ordered_map
from flywheel.fleet.shipper import LOG_PREFIX
from flywheel.logstore.segments import DECISIONS, from_parquet, to_parquet
from flywheel.logstore.store import LogStore

__all__ = ["PruneReport", "prune_log", "redact_table"]

log = logging.getLogger("flywheel.fleet")

_DATE = re.compile(r"/date=(\d{4}-\d{2}-\d{2})/")
_LOCAL_BATCH_ROWS = 100_000
PENDING_SUFFIX = ".prune-pending"


@dataclass(frozen=True)
class PruneReport:
    """What :func:`prune_log` did. ``cutoff``: naive UTC; text of decisions created before
    it is gone. Bucket: ``redacted`` objects rewritten without text now, ``deleted``
    originals removed (also those whose copy an interrupted run had made), ``waiting``
    objects of the cutoff's day with newer rows (next run). Local: ``local_rows``
    decisions blanked, ``compacted_bytes`` the rewritten file's size (``None``: not
    rewritten, as nothing changed, or no local store), ``spool_files`` leftovers deleted. ``seconds``: wall time."""

    cutoff: datetime
    redacted: int = 0
    deleted: int = 0
    waiting: int = 0
    local_rows: int = 0
    compacted_bytes: int | None = None
    spool_files: int = 0
    seconds: float = 0.0


def _utc(ts: float | datetime | None) -> datetime:
    if ts is None:
        return datetime.now(timezone.utc).replace(tzinfo=None)
    if isinstance(ts, datetime):
        return ts.astimezone(timezone.utc).replace(tzinfo=None) if ts.tzinfo else ts
    return datetime.fromtimestamp(float(ts), timezone.utc).replace(tzinfo=None)


def redact_table(table: pa.Table) -> pa.Table:
    """``table`` (decision rows) without query text: ``text`` ``''``, history snippets
    ``''`` (labels kept), ``teacher_error`` cut to its kind; every other column as is."""
    names = table.schema.names

    def put(name: str, values: list) -> None:
        nonlocal table
        i = names.index(name)
        table = table.set_column(i, table.schema.field(i), pa.array(values, table.schema.field(i).type))

    if "text" in names:
        put("text", [None if t is None else "" for t in table.column("text").to_pylist()])
    if "history" in names:
        put("history", [None if hs is None else [None if e is None else {"label": e["label"], "snippet": ""}
                                                   for e in hs]
                        for hs in table.column("history").to_pylist()])
    if "teacher_error" in names:
        put("teacher_error", [None if e is None else e.split(":", 1)[0]
                              for e in table.column("teacher_error").to_pylist()])
    return table


def _newest(table: pa.Table) -> datetime | None:
    if not table.num_rows or "created_at" not in table.schema.names:
        return None
    return pc.max(table.column("created_at")).as_py()


def _prune_object(objects: ObjectStore, key: str, cutoff: datetime
                  ) -> tuple[str, tuple[str, pa.Table, bool] | None]:
    """Redact one decision object: ``(outcome, done)``; outcome ``"done"`` (``done``: the
    redacted key, the redacted table and whether this call created it), ``"waiting"`` (newer
    rows) or ``"gone"`` (``done`` ``None`` for both)."""
    got = objects.get(key)
    if got is None or got is NOT_MODIFIED:
        return "gone", None
    table = from_parquet(got[0])
    newest = _newest(table)
    if newest is not None and newest >= cutoff:
        return "waiting", None
    red = redact_table(table)
    rkey = LOG_PREFIX["redacted"] + key[len(LOG_PREFIX[DECISIONS]):]
    created = objects.put_if_absent(rkey, to_parquet(red))
    objects.delete(key)
    return "done", (rkey, red, created)


def _prune_bucket(objects: ObjectStore, store: LogStore | None, cutoff: datetime, workers: int) -> dict[str, int]:
    last_day = cutoff.strftime("%Y-%m-%d")
    keys = []
    for o in objects.list(LOG_PREFIX[DECISIONS]):
        m = _DATE.search("/" + o.key)
        if m and m.group(1) <= last_day and o.key.endswith(".parquet"):
            keys.append(o.key)
    counts = {"redacted": 0, "deleted": 0, "waiting": 0}
    local: list[tuple[str, str, pa.Table]] = []
    local_rows = 0

    def flush_local() -> None:
        nonlocal local, local_rows
        if store is not None and local:
            store.insert_objects(local)
        local, local_rows = [], 0

    for outcome, done in ordered_map(lambda k: _prune_object(objects, k, cutoff), keys,
                                                   workers=workers, name="flywheel-prune"):
        if outcome == "waiting":
            counts["waiting"] += 1
        elif done is not None:   # outcome "done"
            rkey, red, created = done
            counts["deleted"] += 1
            counts["redacted"] += int(created)
            local.append((rkey, DECISIONS, red))
            local_rows += red.num_rows
            if local_rows >= _LOCAL_BATCH_ROWS:
                flush_local()
    flush_local()
    return counts


def _prune_spool(spool: Path, cutoff: datetime) -> int:
    """Delete ``*.bad`` and ``*.tmp`` files in ``spool`` last modified before ``cutoff``."""
    limit = cutoff.replace(tzinfo=timezone.utc).timestamp()
    n = 0
    try:
        entries = list(os.scandir(spool))
    except FileNotFoundError:
        return 0
    for e in entries:
        if e.name.endswith((".bad", ".tmp")):
            try:
                if e.stat().st_mtime < limit:
                    os.unlink(e.path)
                    n += 1
            except FileNotFoundError:
                pass
    return n


def _prune_local(store: LogStore, cutoff: datetime) -> tuple[int, int | None]:
    """Blank the text before ``cutoff`` and, when that changed rows (or an earlier run was
    interrupted before its rewrite), rewrite the file: ``(rows, new size or None)``."""
    marker = Path(store.path + PENDING_SUFFIX)
    interrupted = marker.exists()
    marker.touch()
    rows = store.forget_text(cutoff)
    size = store.compact() if rows or interrupted else None
    marker.unlink(missing_ok=True)
    return rows, size


def prune_log(objects: ObjectStore | None, store: LogStore | None, *, days: float,
              now: float | datetime | None = None, spools: Iterable[str | os.PathLike] = (),
              workers: int = 4) -> PruneReport:
    """Remove query text of decisions created more than ``days`` days before ``now``
    (default: now; unix seconds or datetime) from the bucket of ``objects`` and from
    ``store``'s DuckDB file and spool (either may be ``None``), and delete stale
    ``*.bad``/``*.tmp`` files of the other ``spools`` given. See the module docstring."""
    if not days >= 0:
        raise ValueError(f"days must be >= 0, got {days!r}")
    if workers < 1:
        raise ValueError("workers must be >= 1")
    t0 = time.monotonic()
    cutoff = _utc(now) - timedelta(days=float(days))
    counts = {"redacted": 0, "deleted": 0, "waiting": 0}
    if objects is not None:
        counts = _prune_bucket(objects, store, cutoff, workers)
    local_rows, size, spool_files = 0, None, 0
    if store is not None:
        local_rows, size = _prune_local(store, cutoff)
        spool_files += _prune_spool(store.spool_dir, cutoff)
    for spool in spools:
        spool_files += _prune_spool(Path(spool), cutoff)
    report = PruneReport(cutoff=cutoff, local_rows=local_rows, compacted_bytes=size, spool_files=spool_files,
                         seconds=round(time.monotonic() - t0, 3), **counts)
    log.info("prune-log: text before %s removed: %d bucket objects redacted (%d deleted, %d waiting), "
             "%d local decisions, %d spool files", cutoff.isoformat(timespec="seconds"), report.redacted,
             report.deleted, report.waiting, report.local_rows, report.spool_files)
    return report
