"""On-disk format of the traffic log: numbered schema migrations and spool segments.

The two change together: a column added by a migration is also a field of
:data:`SEGMENT_SCHEMA` (the Arrow schema of the spool segments, which mirrors the
``decisions`` table plus the ``embedding`` column) and is filled by
:func:`records_to_table`. :func:`ingest_spool` moves segments into the tables.

``MIGRATIONS`` is an ordered list of ``(number, sql)``. :func:`apply_migrations`
records each applied number in ``schema_version`` inside the same transaction as
the migration itself, so applying is idempotent and a crash half-way leaves either
the old or the new version, never a mix. A database whose recorded version is newer
than :data:`SCHEMA_VERSION` (written by a newer flywheel) is refused with a
:class:`~training.logstore.LogStoreError` instead of being half-understood.

Rules for adding a migration: append ``(SCHEMA_VERSION + 1, sql)``; never edit or
reorder an applied one. Spool segments written by older code are ingested with
``INSERT ... BY NAME``, so new columns must be nullable or have a default.

Tables (all timestamps are naive UTC ``TIMESTAMP``):

- ``decisions``: one row per logged decision (the :class:`DecisionRecord`, flattened;
  ``teacher_*`` is the inline LLM call, kept even when invalid, with
  ``teacher_valid``; ``l2_label``/``l2_confidence`` is what layer 2 said).
- ``embeddings``: the layer-2 vector of a decision with the encoder that made it.
- ``labels``: append-only human labels and back-filled teacher labels
  (``label`` NULL = out of scope; ``valid`` false rows are kept for stats only).
- ``resolutions``: pending decisions that the retrain job has dealt with.
- ``ingested_segments``: bookkeeping that makes spool ingestion exactly-once.
"""

from __future__ import annotations

import itertools
import logging
import os
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Sequence

import duckdb
import numpy as np
import pyarrow as pa

from classifier.decision import Layer, Tier
from classifier.protocols import DecisionRecord

log = logging.getLogger("flywheel.logstore")

SEGMENT_SUFFIX = ".arrow"
_STALE_TMP_S = 3600.0
_MAX_ROWS_PER_INGEST_TXN = 200_000

MIGRATIONS: list[tuple[int, str]] = [
    (1, """
CREATE TABLE decisions (
    decision_id        VARCHAR NOT NULL,
    created_at         TIMESTAMP NOT NULL,
    session_id         VARCHAR,
    text               VARCHAR NOT NULL,
    history            STRUCT(label VARCHAR, snippet VARCHAR)[],
    declared_type      VARCHAR,
    layer              VARCHAR NOT NULL,
    label              VARCHAR,
    confidence         DOUBLE,
    tier               VARCHAR,
    reason             VARCHAR,
    alternatives       STRUCT(label VARCHAR, confidence DOUBLE)[],
    model_version      VARCHAR,
    encoder_id         VARCHAR,
    latency_ms         MAP(VARCHAR, DOUBLE),
    teacher_model      VARCHAR,
    teacher_label      VARCHAR,
    teacher_valid      BOOLEAN,
    teacher_latency_ms DOUBLE,
    teacher_error      VARCHAR,
    audit              BOOLEAN NOT NULL DEFAULT FALSE,
    pending            BOOLEAN NOT NULL DEFAULT FALSE,
    l2_label           VARCHAR,
    l2_confidence      DOUBLE,
    logged_at          TIMESTAMP
);
CREATE TABLE embeddings (
    decision_id VARCHAR NOT NULL,
    encoder_id  VARCHAR NOT NULL,
    dim         INTEGER NOT NULL,
    vector      FLOAT[] NOT NULL
);
CREATE SEQUENCE labels_seq;
CREATE TABLE labels (
    label_id    BIGINT NOT NULL DEFAULT nextval('labels_seq'),
    decision_id VARCHAR NOT NULL,
    source      VARCHAR NOT NULL CHECK (source IN ('human', 'teacher')),
    label       VARCHAR,
    model       VARCHAR,
    valid       BOOLEAN NOT NULL,
    latency_ms  DOUBLE,
    author      VARCHAR,
    created_at  TIMESTAMP NOT NULL
);
CREATE TABLE resolutions (
    decision_id VARCHAR NOT NULL,
    resolved_at TIMESTAMP NOT NULL
);
CREATE TABLE ingested_segments (
    name        VARCHAR PRIMARY KEY,
    rows        BIGINT NOT NULL,
    ingested_at TIMESTAMP NOT NULL
);
"""),
]

SCHEMA_VERSION: int = MIGRATIONS[-1][0]


def _check_list() -> None:
    numbers = [n for n, _ in MIGRATIONS]
    if numbers != list(range(1, len(numbers) + 1)):
        raise RuntimeError(f"MIGRATIONS must be numbered 1..n in order, got {numbers}")


_check_list()


def current_version(con) -> int:
    """The schema version recorded in the open database (0 for a new file)."""
    exists = con.execute(
        "SELECT count(*) FROM information_schema.tables "
        "WHERE table_schema = 'main' AND table_name = 'schema_version'").fetchone()[0]
    if not exists:
        return 0
    row = con.execute("SELECT max(version) FROM schema_version").fetchone()
    return int(row[0]) if row and row[0] is not None else 0


def apply_migrations(con, path: str = "<database>") -> list[int]:
    """Bring the database on ``con`` up to :data:`SCHEMA_VERSION`; return the numbers applied.

    Raises :class:`~training.logstore.LogStoreError` when the file was written by a
    newer schema than this code knows.
    """
    from training.logstore import LogStoreError  # late: logstore imports this module

    con.execute("CREATE TABLE IF NOT EXISTS schema_version ("
                "version INTEGER PRIMARY KEY, applied_at TIMESTAMP NOT NULL)")
    version = current_version(con)
    if version > SCHEMA_VERSION:
        raise LogStoreError(
            f"log database {path} has schema version {version}, newer than this flywheel "
            f"knows ({SCHEMA_VERSION}); upgrade flywheel or use another log path")
    applied: list[int] = []
    for number, sql in MIGRATIONS:
        if number <= version:
            continue
        con.execute("BEGIN TRANSACTION")
        try:
            con.execute(sql)
            con.execute("INSERT INTO schema_version VALUES (?, ?)", [number, _utcnow()])
            con.execute("COMMIT")
        except Exception as exc:
            con.execute("ROLLBACK")
            raise LogStoreError(f"log database {path}: migration {number} failed: {exc}") from exc
        applied.append(number)
    return applied


def _utcnow() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


# --------------------------------------------------------------------------- segments

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
    ("l2_label", pa.string()), ("l2_confidence", pa.float64()),
    ("embedding", pa.list_(pa.float32())),
], metadata={"flywheel.schema_version": str(SCHEMA_VERSION)})


_ENUM_VALUES: dict[Any, str] = {m: m.value for e in (Tier, Layer) for m in e}


def _v(x: Any) -> Any:
    """An enum's value (fast path for Tier/Layer, whose ``.value`` is a slow descriptor)."""
    if x is None:
        return None
    v = _ENUM_VALUES.get(x)
    return v if v is not None else getattr(x, "value", x)


def _layer2(d) -> tuple[str | None, float | None]:
    """What layer 2 said: the decision itself when layer 2 decided; for an LLM decision
    the top alternative (layer 2's ranking offered to the teacher), when there is one."""
    layer = d.layer
    if layer == "embedding":
        return d.label, float(d.confidence)
    if layer == "llm" and d.alternatives:
        return d.alternatives[0].label, float(d.alternatives[0].confidence)
    return None, None


def records_to_table(records: Sequence[DecisionRecord]) -> pa.Table:
    """Flatten decision records into one Arrow table of :data:`SEGMENT_SCHEMA`."""
    ds = [r.decision for r in records]
    ts = [r.decision.teacher for r in records]
    l2 = [_layer2(d) for d in ds]
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
        pa.array([x[0] for x in l2], pa.string()),
        pa.array([x[1] for x in l2], pa.float64()),
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


def _list_segments(spool: Path) -> list[str]:
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
    now = _utcnow()
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
    names = _list_segments(spool)
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
