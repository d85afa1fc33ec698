"""Spool segments: the Arrow IPC files the sink writes and the store ingests.

:data:`SEGMENT_SCHEMA` mirrors the ``decisions`` table (see :mod:`logstore.schema`)
plus the ``embedding`` column; :func:`records_to_table` fills it from
:class:`~classifier.protocols.DecisionRecord` objects; :func:`write_segment` writes one
atomically; :func:`ingest_spool` moves finished segments into the tables, exactly once.
"""

from __future__ import annotations

import itertools
import logging
import os
import time
from pathlib import Path
from typing import Any, Sequence

import duckdb
import numpy as np
import pyarrow as pa

from classifier.decision import Layer, Tier
from classifier.protocols import DecisionRecord
from logstore.schema import SCHEMA_VERSION, utcnow

__all__ = ["SEGMENT_SCHEMA", "SEGMENT_SUFFIX", "records_to_table", "write_segment", "list_segments",
           "ingest_spool"]

log = logging.getLogger("flywheel.logstore")

SEGMENT_SUFFIX = ".arrow"
_STALE_TMP_S = 3600.0
_MAX_ROWS_PER_INGEST_TXN = 200_000

_HISTORY_T = pa.list_(pa.struct([("label", pa.string()), ("snippet", pa.string())]))
_ALTS_T = pa.list_(pa.struct([("label", pa.string()), ("confidence", pa.float64())]))
_LAT_T = pa.map_(pa.string(), pa.float64())
SEGMENT_SCHEMA = pa.schema([
    ("decision_id", pa.string()), ("created_at", pa.timestamp("us")),
    ("session_id", pa.string()), ("text", pa.string()), ("history", _HISTORY_T),
    ("declared_type", pa.string()), ("layer", pa.string()), ("label", pa.string()),
    ("confidence", pa.float64()), ("tier", pa.string()), ("reason", pa.string()),
    ("alternatives", _ALTS_T), ("model_version", pa.string()), ("encoder_id", pa.string()),
    ("latency_ms", _LAT_T), ("teacher_model", pa.string()), ("teacher_label", pa.string()),
    ("teacher_valid", pa.bool_()), ("teacher_latency_ms", pa.float64()),
    ("teacher_error", pa.string()), ("audit", pa.bool_()), ("pending", pa.bool_()),
    ("l2_label", pa.string()), ("l2_confidence", pa.float64()), ("l2_tier", pa.string()),
    ("embedding", pa.list_(pa.float32())),
], metadata={"flywheel.schema_version": str(SCHEMA_VERSION)})


_ENUM_VALUES: dict[Any, str] = {m: m.value for e in (Tier, Layer) for m in e}


def _v(x: Any) -> Any:
    """An enum's value (fast path for Tier/Layer, whose ``.value`` is a slow descriptor)."""
    if x is None:
        return None
    v = _ENUM_VALUES.get(x)
    return v if v is not None else getattr(x, "value", x)


def records_to_table(records: Sequence[DecisionRecord]) -> pa.Table:
    """Flatten decision records into one Arrow table of :data:`SEGMENT_SCHEMA`."""
    ds = [r.decision for r in records]
    ts = [r.decision.teacher for r in records]
    l2 = [r.layer2 for r in records]
    created = np.fromiter(((time.time() if r.created_at is None else r.created_at)
                           for r in records), dtype=np.float64, count=len(records))
    embs = [r.embedding for r in records]
    mask = np.fromiter((e is None for e in embs), dtype=bool, count=len(embs))
    vecs = [np.asarray(e, dtype=np.float32).reshape(-1) for e in embs if e is not None]
    lengths = np.zeros(len(embs), dtype=np.int64)
    lengths[~mask] = [v.size for v in vecs]
    offsets = np.zeros(len(embs) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    values = np.concatenate(vecs) if vecs else np.zeros(0, np.float32)
    emb = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, pa.float32()),
                                   mask=pa.array(mask) if mask.any() else None)
    for r, d in zip(records, ds):
        if d.id is None or r.text is None or d.layer is None:
            raise ValueError("a decision record needs decision.id, text and decision.layer")
    cols = [
        pa.array([d.id for d in ds], pa.string()),
        pa.array((created * 1e6).astype(np.int64), pa.timestamp("us")),
        pa.array([r.session_id for r in records], pa.string()),
        pa.array([r.text for r in records], pa.string()),
        pa.array([[{"label": h.label, "snippet": h.snippet} for h in r.history]
                  for r in records], _HISTORY_T),
        pa.array([_v(r.declared_type) for r in records], pa.string()),
        pa.array([_v(d.layer) for d in ds], pa.string()),
        pa.array([d.label for d in ds], pa.string()),
        pa.array([float(d.confidence) for d in ds], pa.float64()),
        pa.array([_v(d.tier) for d in ds], pa.string()),
        pa.array([d.reason for d in ds], pa.string()),
        pa.array([[{"label": c.label, "confidence": float(c.confidence)} for c in d.alternatives]
                  for d in ds], _ALTS_T),
        pa.array([d.model_version for d in ds], pa.string()),
        pa.array([r.encoder_id for r in records], pa.string()),
        pa.array([list(d.latency_ms.items()) for d in ds], _LAT_T),
        pa.array([t.model if t else None for t in ts], pa.string()),
        pa.array([t.label if t else None for t in ts], pa.string()),
        pa.array([bool(t.valid) if t else None for t in ts], pa.bool_()),
        pa.array([float(t.latency_ms) if t else None for t in ts], pa.float64()),
        pa.array([t.error if t else None for t in ts], pa.string()),
        pa.array([bool(r.audit) for r in records], pa.bool_()),
        pa.array([bool(r.pending) for r in records], pa.bool_()),
        pa.array([a.label if a else None for a in l2], pa.string()),
        pa.array([float(a.confidence) if a else None for a in l2], pa.float64()),
        pa.array([_v(a.tier) if a else None for a in l2], pa.string()),
        emb,
    ]
    return pa.Table.from_arrays(cols, schema=SEGMENT_SCHEMA)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_segment(spool: Path, table: pa.Table, *, fsync: bool = True,
                  _seq=itertools.count()) -> Path:
    """Write ``table`` atomically as a new segment in ``spool``; return its path."""
    name = f"seg-{time.time_ns():020d}-{os.getpid()}-{next(_seq):08d}{SEGMENT_SUFFIX}"
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, table.schema) as w:
        w.write_table(table)
    tmp, final = spool / (name + ".tmp"), spool / name
    with open(tmp, "wb") as f:
        f.write(sink.getvalue())
        if fsync:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, final)
    if fsync:
        _fsync_dir(spool)
    return final


def list_segments(spool: Path) -> list[str]:
    names = []
    now = time.time()
    try:
        entries = list(os.scandir(spool))
    except FileNotFoundError:
        return []
    for e in entries:
        if e.name.endswith(SEGMENT_SUFFIX):
            names.append(e.name)
        elif e.name.endswith(".tmp"):
            try:  # left by a writer killed mid-write; never acknowledged
                if now - e.stat().st_mtime > _STALE_TMP_S:
                    os.unlink(e.path)
            except OSError:
                pass
    return sorted(names)


_DATA_ERRORS = (duckdb.ConstraintException, duckdb.ConversionException, duckdb.BinderException,
                duckdb.InvalidInputException, pa.ArrowException)


def _quarantine(spool: Path, name: str, why: object) -> None:
    log.error("traffic log: spool segment %s cannot be ingested (%s); moved aside as %s.bad",
              name, why, name)
    try:
        os.replace(spool / name, spool / (name + ".bad"))
    except OSError:
        pass


def _insert_segments(con, chunk: list[tuple[str, pa.Table]], clear_names: bool = False) -> None:
    """Insert the segments' rows and names in one transaction (all or nothing); with
    ``clear_names`` first forget the names of earlier segments (their files are gone)."""
    seg = pa.concat_tables([t for _, t in chunk], promote_options="default")
    names = pa.table({"name": [n for n, _ in chunk], "rows": [t.num_rows for _, t in chunk]})
    now = utcnow()
    con.register("_flywheel_seg", seg)
    con.register("_flywheel_names", names)
    try:
        con.execute("BEGIN TRANSACTION")
        if clear_names:
            con.execute("DELETE FROM ingested_segments")
        con.execute("INSERT INTO decisions BY NAME SELECT * EXCLUDE (embedding), "
                    "?::TIMESTAMP AS logged_at FROM _flywheel_seg", [now])
        con.execute("INSERT INTO embeddings (decision_id, encoder_id, dim, vector) "
                    "SELECT decision_id, encoder_id, len(embedding), embedding "
                    "FROM _flywheel_seg WHERE embedding IS NOT NULL AND encoder_id IS NOT NULL")
        con.execute("INSERT INTO ingested_segments SELECT name, rows, ?::TIMESTAMP "
                    "FROM _flywheel_names", [now])
        con.execute("COMMIT")
    except BaseException:
        try:
            con.execute("ROLLBACK")
        except duckdb.Error:
            pass
        raise
    finally:
        con.unregister("_flywheel_seg")
        con.unregister("_flywheel_names")


def ingest_spool(con, spool: Path) -> int:
    """Move finished segments from ``spool`` into the tables, exactly once. Returns rows.

    The caller holds the database (so no other process ingests at the same time).
    A segment that cannot be read or inserted (never expected: records are checked
    when the segment is written) is renamed ``*.bad`` so it cannot block the rest.
    """
    names = list_segments(spool)
    if not names:
        return 0
    done = {r[0] for r in con.execute("SELECT name FROM ingested_segments").fetchall()}
    for n in names:
        if n in done:  # committed, but the process died before deleting the file
            _unlink(spool / n)
    # every recorded name is now gone from disk, and names are never reused: forget them
    # (with the next insert, to spare a transaction)
    clear = bool(done)
    todo = [n for n in names if n not in done]
    total, i = 0, 0
    while i < len(todo):
        chunk: list[tuple[str, pa.Table]] = []
        rows = 0
        while i < len(todo) and rows < _MAX_ROWS_PER_INGEST_TXN:
            n = todo[i]
            i += 1
            try:
                t = pa.ipc.open_file(pa.memory_map(str(spool / n))).read_all()
            except FileNotFoundError:
                continue
            except pa.ArrowInvalid as exc:  # not a complete Arrow file
                _quarantine(spool, n, exc)
                continue
            chunk.append((n, t))
            rows += t.num_rows
        if not chunk:
            continue
        try:
            _insert_segments(con, chunk, clear)
            clear = False
        except _DATA_ERRORS:
            rows = 0
            for n, t in chunk:  # find the bad one(s), keep the rest
                try:
                    _insert_segments(con, [(n, t)], clear)
                    clear = False
                except _DATA_ERRORS as exc:
                    _quarantine(spool, n, exc)
                    continue
                _unlink(spool / n)
                rows += t.num_rows
            total += rows
            continue
        for n, _ in chunk:
            _unlink(spool / n)
        total += rows
    if clear:
        con.execute("DELETE FROM ingested_segments")
    return total


def _unlink(p: Path) -> None:
    try:
        os.unlink(p)
    except FileNotFoundError:
        pass
