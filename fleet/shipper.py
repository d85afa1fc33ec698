"""The shipper: a :class:`~logstore.drain.SpoolDrain` that moves a spool's finished
segments into the bucket, one Parquet object per segment.

A :class:`~logstore.sink.SpoolSink` built with ``drain=ObjectShipper(objects)`` calls
:meth:`ObjectShipper.drain` from its drain thread. For each finished segment, oldest
first (decisions ``seg-*`` and labels ``lab-*``), it reads the Arrow file, converts it
to Parquet (:func:`logstore.segments.to_parquet`) and writes it create-only under

- ``log/decisions/date=YYYY-MM-DD/<spool_id>-<segment stem>.parquet``
- ``log/labels/date=YYYY-MM-DD/<spool_id>-<segment stem>.parquet``

(``date=`` is the UTC date of the segment's first row; ``spool_id`` is the spool's own
random id, :func:`logstore.segments.spool_id`). The local file is deleted only after the
store acknowledged the object. "Already exists" is an acknowledgement: the key names the
segment, so it holds the same rows, and a segment shipped again after a crash between
the upload and the delete never makes a second object or a second row.

A store that cannot be reached (:class:`~fleet.errors.StoreUnavailable`) or refuses
(:class:`~fleet.errors.FleetError`) stops the drain at that segment: the rest stays in
the spool for the next call. The call raises when it shipped nothing (the sink counts
the error and backs off) and returns what it shipped otherwise (the next call meets the
error again and raises). A call starts no new segment after ``timeout_s``; one upload
can take up to the object store's own ``timeout_s``. A segment that cannot be read (or
whose name is not a segment's) is renamed ``*.bad`` and logged, as the local ingest
does, so it never blocks the rest. Error messages come from :mod:`fleet.objects` and
never hold a credential.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa

from flywheel.fleet.errors import FleetError
from flywheel.fleet.objects import ObjectStore
from flywheel.logstore.segments import (
    DECISIONS,
    LABELS,
    SEGMENT_SUFFIX,
    list_segments,
    read_segment,
    segment_kind,
    spool_id,
    to_parquet,
)

__all__ = ["LOG_PREFIX", "ObjectShipper", "object_key", "segment_date"]

log = logging.getLogger("flywheel.fleet")

#: Where each kind of log object lives in the bucket (keys relative to the store's prefix).
LOG_PREFIX = {DECISIONS: "log/decisions", LABELS: "log/labels", "redacted": "log/redacted"}


def segment_date(table: pa.Table, name: str) -> str:
    """``YYYY-MM-DD``: the UTC date of the table's first row (``created_at``), else of the
    segment's writing time in its name (``seg-<time_ns>-...``), else today."""
    if table.num_rows and "created_at" in table.schema.names:
        first = table.column("created_at")[0].as_py()
        if isinstance(first, datetime):
            return first.strftime("%Y-%m-%d")
    try:
        ns = int(name.rsplit("/", 1)[-1].split("-")[1])
        return datetime.fromtimestamp(ns / 1e9, timezone.utc).strftime("%Y-%m-%d")
    except (IndexError, ValueError, OverflowError, OSError):
        return datetime.now(timezone.utc).strftime("%Y-%m-%d")


def object_key(kind: str, date: str, sid: str, name: str) -> str:
    """The bucket key of segment ``name`` (``seg-....arrow``) of spool ``sid``."""
    stem = name[:-len(SEGMENT_SUFFIX)] if name.endswith(SEGMENT_SUFFIX) else name
    return f"{LOG_PREFIX[kind]}/date={date}/{sid}-{stem}.parquet"


class ObjectShipper:
    """A :class:`~logstore.drain.SpoolDrain` into the bucket of ``objects`` (see the
    module docstring). Counters (read them any time): :attr:`shipped_rows`,
    :attr:`shipped_objects` (segments acknowledged, including those already there),
    :attr:`shipped_bytes` (Parquet bytes uploaded), :attr:`already_there` (segments whose
    object existed: a retry after a crash), :attr:`quarantined` and :attr:`errors`."""

    def __init__(self, objects: ObjectStore) -> None:
        self.objects = objects
        self.shipped_rows = 0
        self.shipped_objects = 0
        self.shipped_bytes = 0
        self.already_there = 0
        self.quarantined = 0
        self.errors = 0
        self.last_error: str | None = None
        self._ids: dict[Path, str] = {}
        self._lock = threading.Lock()   # one drain at a time (the sink guarantees it; cheap insurance)

    def __repr__(self) -> str:
        return f"ObjectShipper({self.objects!r})"

    def counters(self) -> dict[str, int]:
        """The counters, for metrics."""
        return {"rows": self.shipped_rows, "objects": self.shipped_objects, "bytes": self.shipped_bytes,
                "already_there": self.already_there, "quarantined": self.quarantined, "errors": self.errors}

    def drain(self, spool: Path, timeout_s: float) -> int:
        """Ship the finished segments of ``spool``, oldest first; return the rows shipped."""
        spool = Path(spool)
        deadline = time.monotonic() + max(0.0, float(timeout_s))
        with self._lock:
            names = list_segments(spool)
            if not names:
                return 0
            sid = self._spool_id(spool)
            rows = 0
            for name in names:
                if time.monotonic() >= deadline:
                    break
                try:
                    rows += self._ship(spool, sid, name)
                except FleetError as exc:
                    self.errors += 1
                    self.last_error = str(exc)
                    if rows:  # keep the count; the next call meets the error again and raises
                        log.warning("traffic log: shipping %s stopped at %s: %s", spool, name, exc)
                        return rows
                    raise
            self.last_error = None
            return rows

    def _spool_id(self, spool: Path) -> str:
        sid = self._ids.get(spool)
        if sid is None:
            sid = self._ids[spool] = spool_id(spool)
        return sid

    def _ship(self, spool: Path, sid: str, name: str) -> int:
        """Ship one segment; its rows (0 when it vanished or was quarantined)."""
        path = spool / name
        try:
            kind = segment_kind(name)
            table = read_segment(path)
            data = to_parquet(table)
        except FileNotFoundError:
            return 0  # shipped by an earlier call that died before counting it
        except (pa.ArrowException, ValueError) as exc:
            self._quarantine(path, exc)
            return 0
        key = object_key(kind, segment_date(table, name), sid, name)
        try:
            created = self.objects.put_if_absent(key, data)
        except ValueError as exc:  # a name no key can hold (control characters, ...)
            self._quarantine(path, exc)
            return 0
        rows = table.num_rows
        del table  # release the memory map before the file goes
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        self.shipped_objects += 1
        self.shipped_rows += rows
        if created:
            self.shipped_bytes += len(data)
        else:
            self.already_there += 1
            log.info("traffic log: %s was already in the store (a retry); deleted locally", key)
        return rows

    def _quarantine(self, path: Path, why: object) -> None:
        self.quarantined += 1
        log.error("traffic log: spool segment %s cannot be shipped (%s); moved aside as %s.bad",
                  path, why, path.name)
        try:
            os.replace(path, path.with_name(path.name + ".bad"))
        except OSError:
            pass

    def close(self) -> None:
        """Nothing to release: the object store is shared and has no connection to close."""
