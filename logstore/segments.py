"""Spool segments: the Arrow IPC files the sink writes, and how their rows get in.

:data:`SEGMENT_SCHEMA` mirrors the ``decisions`` table (see :mod:`logstore.schema`)
plus the ``embedding`` column; :func:`records_to_table` fills it, column by name, from
:class:`~classifier.protocols.DecisionRecord` objects (:class:`SegmentColumnError` for a
column it cannot fill). Label segments hold rows of
:data:`logstore.label_records.LABEL_SCHEMA`. :func:`write_segment` writes one segment
atomically: decisions as ``seg-<time_ns>-<pid>-<seq>.arrow``, labels as
``lab-<time_ns>-<pid>-<seq>.arrow`` (:func:`segment_kind` tells them apart);
:func:`spool_id` is the spool's own random id (``<spool>/SPOOL_ID``).

Getting rows in, exactly once, always rows and bookkeeping in one transaction:
:func:`ingest_spool` (a local spool; names in ``ingested_segments``, forgotten once the
files are gone) and :func:`insert_objects` (shipped objects, e.g. mirrored from a
bucket; keys in ``ingested_objects``, kept, and rows deduplicated by ``decision_id``
and ``label_uid``). :func:`to_parquet` / :func:`from_parquet` are the wire format.
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable, Sequence, TypeVar, cast

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from flywheel.classifier.decision import Decision, Layer, Layer2Answer, TeacherCall, Tier
from flywheel.classifier.protocols import DecisionRecord
from flywheel.logstore.arrow_build import buffer_of, build, numeric
from flywheel.logstore.errors import LogStoreError
from flywheel.logstore.label_records import conform_labels
from flywheel.logstore.schema import SCHEMA_VERSION, UNSURE_FROM_ERROR, utcnow

__all__ = ["DECISIONS", "LABELS", "SEGMENT_SCHEMA", "SEGMENT_SUFFIX", "SPOOL_ID_FILE", "from_parquet",
           "ingest_spool", "insert_objects", "insert_segments", "list_segments", "read_segment",
           "records_to_table", "REQUIRED_COLUMNS", "SegmentColumnError", "segment_kind", "spool_id", "spool_usage",
           "to_parquet", "write_segment"]

log = logging.getLogger("flywheel.logstore")
_T = TypeVar("_T")

SEGMENT_SUFFIX = ".arrow"
SPOOL_ID_FILE = "SPOOL_ID"
DECISIONS, LABELS = "decisions", "labels"
_PREFIX_OF_KIND = {DECISIONS: "seg-", LABELS: "lab-"}
_KIND_OF_PREFIX = {p: k for k, p in _PREFIX_OF_KIND.items()}
_STALE_TMP_S = 3600.0
_MAX_ROWS_PER_INGEST_TXN = 200_000

_HISTORY_T = pa.list_(pa.struct([("label", pa.string()), ("snippet", pa.string())]))
_ALTS_T = pa.list_(pa.struct([("label", pa.string()), ("confidence", pa.float64())]))
_LAT_T = pa.map_(pa.string(), pa.float64())
_SEGMENT_FIELDS: list[tuple[str, pa.DataType]] = [
    ("decision_id", pa.string()), ("created_at", pa.timestamp("us")),
    ("session_id", pa.string()), ("text", pa.string()), ("history", _HISTORY_T),
    ("declared_type", pa.string()), ("layer", pa.string()), ("label", pa.string()),
    ("confidence", pa.float64()), ("tier", pa.string()), ("reason", pa.string()),
    ("alternatives", _ALTS_T), ("model_version", pa.string()), ("encoder_id", pa.string()),
    ("latency_ms", _LAT_T), ("teacher_model", pa.string()), ("teacher_label", pa.string()),
    ("teacher_valid", pa.bool_()), ("teacher_latency_ms", pa.float64()),
    ("teacher_error", pa.string()), ("audit", pa.bool_()), ("pending", pa.bool_()),
    ("l2_label", pa.string()), ("l2_confidence", pa.float64()), ("l2_tier", pa.string()),
    ("embedding", pa.list_(pa.float32())), ("degraded", pa.string()),
    ("teacher_candidates", pa.list_(pa.string())), ("language", pa.string()),
]
SEGMENT_SCHEMA = pa.schema(_SEGMENT_FIELDS, metadata={"flywheel.schema_version": str(SCHEMA_VERSION)})


_ENUM_VALUES: dict[Any, str] = {m: m.value for e in (Tier, Layer) for m in e}


def _v(x: Any) -> Any:
    """An enum's value (fast path for Tier/Layer, whose ``.value`` is a slow descriptor)."""
    if x is None:
        return None
    v = _ENUM_VALUES.get(x)
    return v if v is not None else getattr(x, "value", x)


class SegmentColumnError(LogStoreError, ValueError):
    """A decision record cannot fill a column of :data:`SEGMENT_SCHEMA`: it lacks the value
    (no attribute, or ``None`` where the ``decisions`` table says ``NOT NULL``), or the
    column has no builder in :func:`records_to_table` (a column added to the schema and
    forgotten there). ``column`` names it."""

    def __init__(self, column: str, message: str) -> None:
        self.column = column
        super().__init__(f"segment column {column!r}: {message}")


class _Batch:
    """The records of one table and what several columns read from them (each read once,
    when a column first needs it, so a missing attribute names that column)."""

    def __init__(self, records: Sequence[DecisionRecord]) -> None:
        self.records = records

    @functools.cached_property
    def ds(self) -> list[Decision]:
        return [r.decision for r in self.records]

    @functools.cached_property
    def ts(self) -> list[TeacherCall | None]:
        return [d.teacher for d in self.ds]

    @functools.cached_property
    def l2(self) -> list[Layer2Answer | None]:
        return [r.layer2 for r in self.records]


def _created_at(b: _Batch, t: pa.DataType) -> pa.Array:
    created = np.fromiter(((time.time() if r.created_at is None else r.created_at)
                           for r in b.records), dtype=np.float64, count=len(b.records))
    return numeric((created * 1e6).astype(np.int64), t)


def _embedding(b: _Batch, t: pa.DataType) -> pa.Array:
    embs = [r.embedding for r in b.records]
    mask = np.fromiter((e is None for e in embs), dtype=bool, count=len(embs))
    vecs = [np.asarray(e, dtype=np.float32).reshape(-1) for e in embs if e is not None]
    lengths = np.zeros(len(embs), dtype=np.int64)
    lengths[~mask] = [v.size for v in vecs]
    offsets = np.zeros(len(embs) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    values = np.concatenate(vecs) if vecs else np.zeros(0, np.float32)
    value_type = cast(pa.ListType, t).value_type  # the column is a list<float>
    validity = buffer_of(np.packbits(~mask, bitorder="little")) if mask.any() else None
    return pa.Array.from_buffers(t, len(embs), [validity, buffer_of(offsets)],
                                 children=[numeric(values.astype(np.float32, copy=False), value_type)])


#: How each column of :data:`SEGMENT_SCHEMA` is filled, by name: ``(batch, arrow type) ->
#: array``. :func:`records_to_table` refuses a schema column missing here, and one here
#: missing from the schema.
_COLUMNS: dict[str, Callable[[_Batch, pa.DataType], pa.Array]] = {
    "decision_id": lambda b, t: build([d.id for d in b.ds], t),
    "created_at": _created_at,
    "session_id": lambda b, t: build([r.session_id for r in b.records], t),
    "text": lambda b, t: build([r.text for r in b.records], t),
    "history": lambda b, t: build([[{"label": h.label, "snippet": h.snippet} for h in r.history]
                                      for r in b.records], t),
    "declared_type": lambda b, t: build([_v(r.declared_type) for r in b.records], t),
    "layer": lambda b, t: build([_v(d.layer) for d in b.ds], t),
    "label": lambda b, t: build([d.label for d in b.ds], t),
    "confidence": lambda b, t: build([float(d.confidence) for d in b.ds], t),
    "tier": lambda b, t: build([_v(d.tier) for d in b.ds], t),
    "reason": lambda b, t: build([d.reason for d in b.ds], t),
    "alternatives": lambda b, t: build([[{"label": c.label, "confidence": float(c.confidence)}
                                            for c in d.alternatives] for d in b.ds], t),
    "model_version": lambda b, t: build([d.model_version for d in b.ds], t),
    "encoder_id": lambda b, t: build([r.encoder_id for r in b.records], t),
    "latency_ms": lambda b, t: build([list(d.latency_ms.items()) for d in b.ds], t),
    "teacher_model": lambda b, t: build([x.model if x else None for x in b.ts], t),
    "teacher_label": lambda b, t: build([x.label if x else None for x in b.ts], t),
    "teacher_valid": lambda b, t: build([bool(x.valid) if x else None for x in b.ts], t),
    "teacher_latency_ms": lambda b, t: build([float(x.latency_ms) if x else None for x in b.ts], t),
    "teacher_error": lambda b, t: build([x.error if x else None for x in b.ts], t),
    "audit": lambda b, t: build([bool(r.audit) for r in b.records], t),
    "pending": lambda b, t: build([bool(r.pending) for r in b.records], t),
    "l2_label": lambda b, t: build([a.label if a else None for a in b.l2], t),
    "l2_confidence": lambda b, t: build([float(a.confidence) if a else None for a in b.l2], t),
    "l2_tier": lambda b, t: build([_v(a.tier) if a else None for a in b.l2], t),
    "embedding": _embedding,
    "degraded": lambda b, t: build([d.degraded for d in b.ds], t),
    "language": lambda b, t: build([d.language for d in b.ds], t),
    "teacher_candidates": lambda b, t: build([list(x.candidates) if x and x.candidates is not None else None
                                                 for x in b.ts], t),
}

#: Columns a record must fill (``NOT NULL`` in ``decisions`` and not filled in for it, as
#: ``created_at`` is with the time of writing and ``audit``/``pending`` with false).
REQUIRED_COLUMNS = ("decision_id", "text", "layer")


def records_to_table(records: Sequence[DecisionRecord]) -> pa.Table:
    """Flatten decision records into one Arrow table of :data:`SEGMENT_SCHEMA`, column by
    column name.

    Raises :class:`SegmentColumnError` (a ``ValueError``) for a record that lacks a
    column's value (one of :data:`REQUIRED_COLUMNS` ``None``, or an attribute missing),
    and for a schema column without a builder here (or a builder without a column)."""
    extra = sorted(set(_COLUMNS) - set(SEGMENT_SCHEMA.names))
    if extra:
        raise SegmentColumnError(extra[0], "is built but not in SEGMENT_SCHEMA")
    batch = _Batch(records)
    cols: list[pa.Array] = []
    for f in SEGMENT_SCHEMA:
        build = _COLUMNS.get(f.name)
        if build is None:
            raise SegmentColumnError(f.name, "is in SEGMENT_SCHEMA but nothing fills it")
        try:
            col = build(batch, f.type)
        except AttributeError as exc:
            raise SegmentColumnError(f.name, f"a decision record lacks its value: {exc}") from exc
        if f.name in REQUIRED_COLUMNS and col.null_count:
            i = col.is_null().to_numpy(zero_copy_only=False).argmax()
            raise SegmentColumnError(f.name, f"decision record #{i + 1} of {len(records)} has none "
                                             "(a decision record needs decision.id, text and decision.layer)")
        cols.append(col)
    return pa.Table.from_arrays(cols, schema=SEGMENT_SCHEMA)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# --------------------------------------------------------------------------- segment files

def segment_kind(name: str) -> str:
    """``"decisions"`` or ``"labels"``: what a segment file or object holds, from its name
    (``seg-*`` / ``lab-*``, also behind a folder and a ``<spool_id>-`` prefix, any suffix).
    Raises ValueError for any other name."""
    base = name.rsplit("/", 1)[-1]
    if len(base) > 13 and base[12] == "-" and _is_spool_id(base[:12]):
        base = base[13:]
    for prefix, kind in _KIND_OF_PREFIX.items():
        if base.startswith(prefix):
            return kind
    raise ValueError(f"not a spool segment name: {name!r}")


def write_segment(spool: Path, table: pa.Table, *, kind: str | None = None, fsync: bool = True,
                  _seq: itertools.count[int] = itertools.count()) -> Path:
    """Write ``table`` atomically as a new segment in ``spool``; return its path.

    ``kind`` (``"decisions"``: ``seg-*``, ``"labels"``: ``lab-*``) defaults to what the
    table's columns say (a ``label_uid`` column: labels)."""
    if kind is None:
        kind = LABELS if "label_uid" in table.schema.names else DECISIONS
    prefix = _PREFIX_OF_KIND[kind]
    name = f"{prefix}{time.time_ns():020d}-{os.getpid()}-{next(_seq):08d}{SEGMENT_SUFFIX}"
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


def read_segment(path: Path) -> pa.Table:
    """A segment file's rows (raises ``pyarrow.ArrowInvalid`` for a file that is not one)."""
    return pa.ipc.open_file(pa.memory_map(str(path))).read_all()


def _order(name: str) -> tuple[str, str]:
    return name[4:], name  # by time of writing, whatever the kind


def list_segments(spool: Path) -> list[str]:
    """The finished segments in ``spool`` (both kinds), oldest first. Removes ``*.tmp``
    files left by a writer killed mid-write more than an hour ago."""
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
    return sorted(names, key=_order)


def spool_usage(spool: Path) -> tuple[int, int]:
    """``(bytes, segments)`` of the finished segments in ``spool`` (not yet drained)."""
    size = count = 0
    try:
        entries = list(os.scandir(spool))
    except FileNotFoundError:
        return 0, 0
    for e in entries:
        if e.name.endswith(SEGMENT_SUFFIX):
            try:
                size += e.stat().st_size
            except FileNotFoundError:  # drained meanwhile
                continue
            count += 1
    return size, count


def to_parquet(table: pa.Table) -> bytes:
    """``table`` as Parquet bytes (zstd); :func:`from_parquet` reads them back with the
    same Arrow schema (types and the schema's metadata)."""
    buf = pa.BufferOutputStream()
    # dictionary-encode only the string columns: on the float vectors it costs 4x the time
    # and makes the file larger (1,000 rows at 384-d: 41 ms and 2.0 MiB against 9 ms and 1.4 MiB)
    strings = [f.name for f in table.schema if pa.types.is_string(f.type)]
    # (pyarrow-stubs 20 type use_dictionary as a bool; pyarrow also takes a list of column names)
    pq.write_table(table, buf, compression="zstd", use_dictionary=strings,  # type: ignore[arg-type]
                   write_statistics=False)
    return buf.getvalue().to_pybytes()


def from_parquet(data: bytes) -> pa.Table:
    """The table that :func:`to_parquet` wrote."""
    return pq.read_table(pa.BufferReader(data))


# --------------------------------------------------------------------------- spool id

def _is_spool_id(s: str) -> bool:
    return len(s) == 12 and all(c in "0123456789abcdef" for c in s)


def spool_id(spool: Path) -> str:
    """The spool's random id (12 hex chars), created once in ``<spool>/SPOOL_ID``.

    Creation is atomic and create-only (a fsynced temporary file hard-linked into
    place), so concurrent first callers, in any process, all get the same id.
    Raises :class:`LogStoreError` when the file holds something else."""
    path = Path(spool) / SPOOL_ID_FILE
    try:
        sid = path.read_text(encoding="ascii").strip()
    except FileNotFoundError:
        sid = _create_spool_id(path)
    except (OSError, UnicodeDecodeError) as exc:
        raise LogStoreError(f"cannot read the spool id {path}: {exc}") from exc
    if not _is_spool_id(sid):
        raise LogStoreError(f"{path} holds no spool id (12 hex chars): {sid[:40]!r}")
    return sid


def _create_spool_id(path: Path) -> str:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with open(tmp, "w", encoding="ascii") as f:
            f.write(os.urandom(6).hex() + "\n")
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass  # another caller made it first: theirs is the id
        _fsync_dir(path.parent)
        return path.read_text(encoding="ascii").strip()
    except OSError as exc:
        raise LogStoreError(f"cannot create the spool id {path}: {exc}") from exc
    finally:
        try:
            os.unlink(tmp)
        except OSError:
            pass


# --------------------------------------------------------------------------- inserting rows

_DATA_ERRORS = (duckdb.ConstraintException, duckdb.ConversionException, duckdb.BinderException,
                duckdb.InvalidInputException, pa.ArrowException)

_LABEL_COLUMNS = ("decision_id, source, label, model, valid, latency_ms, author, created_at, label_uid, "
                  "confidence, tier, sure, teacher_candidates")


def _first_new(con: duckdb.DuckDBPyConnection, table: pa.Table, column: str, sql: str) -> pa.Table:
    """The rows of ``table`` whose ``column`` value is not in the log yet (``sql`` selects
    those that are, from the registered ``_flywheel_ids(id)``), the first of each value."""
    index = numeric(np.arange(table.num_rows, dtype=np.int64), pa.int64())
    firsts = table.select([column]).append_column("_i", index).group_by(column, use_threads=False) \
        .aggregate([("_i", "min")])
    ids = firsts.column(column)
    con.register("_flywheel_ids", pa.table({"id": ids}))
    try:
        known = [r[0] for r in con.execute(sql).fetchall()]
    finally:
        con.unregister("_flywheel_ids")
    keep = pc.filter(firsts.column("_i_min"), pc.invert(pc.is_in(ids, value_set=build(list(known), pa.string()))))
    if len(keep) == table.num_rows:
        return table
    return table.take(np.sort(keep.to_numpy()))


def _concat(tables: list[pa.Table]) -> pa.Table:
    return pa.concat_tables(tables, promote_options="default")


def _new_labels(con: duckdb.DuckDBPyConnection, lab: pa.Table) -> pa.Table:
    lab = conform_labels(lab)
    return _first_new(con, lab, "label_uid", "SELECT DISTINCT label_uid FROM labels "
                      "WHERE label_uid IN (SELECT id FROM _flywheel_ids)")


def _new_decisions(con: duckdb.DuckDBPyConnection, dec: pa.Table) -> pa.Table:
    return _first_new(con, dec, "decision_id", "SELECT DISTINCT decision_id FROM decisions "
                      "WHERE decision_id IN (SELECT id FROM _flywheel_ids)")


_INSERT_DECISIONS = ("INSERT INTO decisions BY NAME SELECT * EXCLUDE (embedding), ?::TIMESTAMP AS logged_at "
                     "FROM {0}")
_INSERT_EMBEDDINGS = ("INSERT INTO embeddings (decision_id, encoder_id, dim, vector) "
                      "SELECT decision_id, encoder_id, len(embedding), embedding "
                      "FROM {0} WHERE embedding IS NOT NULL AND encoder_id IS NOT NULL")
_INSERT_LABELS = (f"INSERT INTO labels ({_LABEL_COLUMNS}, logged_at) "
                  f"SELECT {_LABEL_COLUMNS}, ?::TIMESTAMP FROM {{0}} ORDER BY created_at, label_uid")


def _insert_rows(con: duckdb.DuckDBPyConnection, sql: str, table: pa.Table, params: list[Any]) -> int:
    """Run ``sql`` on ``table`` (registered for the statement); return the rows inserted."""
    if table.num_rows == 0:
        return 0
    con.register("_flywheel_rows", table)
    try:
        return con.execute(sql.format("_flywheel_rows"), params).fetchall()[0][0]
    finally:
        con.unregister("_flywheel_rows")


def _split(items: Sequence[tuple[str, pa.Table]],
           kind_of: Callable[[str], str]) -> tuple[pa.Table | None, pa.Table | None]:
    dec = [t for n, t in items if kind_of(n) == DECISIONS]
    lab = [t for n, t in items if kind_of(n) == LABELS]
    return (_concat(dec) if dec else None), (_concat(lab) if lab else None)


def _unsure_as_prose(items: Sequence[tuple[str, pa.Table]], kind_of: Callable[[str], str]) -> bool:
    """Whether a decisions table of ``items`` predates migration 5 (no ``teacher_candidates``:
    its unsure answers are prose in ``teacher_error``, which :data:`UNSURE_FROM_ERROR` moves
    once its rows are in)."""
    return any(kind_of(n) == DECISIONS and "teacher_candidates" not in t.schema.names for n, t in items)


def _transaction(con: duckdb.DuckDBPyConnection, tables: dict[str, pa.Table | None], body: Callable[[], _T]) -> _T:
    """Register ``tables`` (skipping ``None``), run ``body()`` in one transaction, clean up."""
    registered = [n for n, t in tables.items() if t is not None]
    for n in registered:
        con.register(n, tables[n])
    try:
        con.execute("BEGIN TRANSACTION")
        out = body()
        con.execute("COMMIT")
        return out
    except BaseException:
        try:
            con.execute("ROLLBACK")
        except duckdb.Error:
            pass
        raise
    finally:
        for n in registered:
            con.unregister(n)


def insert_segments(con: duckdb.DuckDBPyConnection, chunk: Sequence[tuple[str, pa.Table]],
                    clear_names: bool = False) -> int:
    """Insert spool segments' rows and names in one transaction (all or nothing); return
    the rows inserted. ``chunk`` holds ``(segment name, table)``; the name's kind
    (:func:`segment_kind`) says whether the rows are decisions (with their embeddings) or
    labels (each ``label_uid`` once; labels of decisions not in the log are kept). With
    ``clear_names`` first forget the names of earlier segments (their files are gone)."""
    dec, lab = _split(chunk, segment_kind)
    old = _unsure_as_prose(chunk, segment_kind)
    names = pa.table({"name": build([n for n, _ in chunk], pa.string()),
                      "rows": build([t.num_rows for _, t in chunk], pa.int64())})
    now = utcnow()

    def body() -> int:
        rows = 0
        if clear_names:
            con.execute("DELETE FROM ingested_segments")
        if dec is not None:
            rows += con.execute(_INSERT_DECISIONS.format("_flywheel_seg"), [now]).fetchall()[0][0]
            con.execute(_INSERT_EMBEDDINGS.format("_flywheel_seg"))
            if old:
                con.execute(UNSURE_FROM_ERROR)
        if lab is not None:
            rows += _insert_rows(con, _INSERT_LABELS, _new_labels(con, lab), [now])
        con.execute("INSERT INTO ingested_segments SELECT name, rows, ?::TIMESTAMP "
                    "FROM _flywheel_names", [now])
        return rows
    return int(_transaction(con, {"_flywheel_seg": dec, "_flywheel_names": names}, body))


def insert_objects(con: duckdb.DuckDBPyConnection, items: Sequence[tuple[str, str, pa.Table]]) -> int:
    """Insert objects' rows and keys in ONE transaction, exactly once; return the rows
    inserted (decisions + labels).

    ``items`` holds ``(key, kind, table)`` with ``kind`` ``"decisions"`` (rows of
    :data:`SEGMENT_SCHEMA`, any older version of it) or ``"labels"`` (rows of
    :data:`~logstore.label_records.LABEL_SCHEMA`). A key already in ``ingested_objects`` (or
    repeated in ``items``) is skipped whole; of the rest, a decision whose
    ``decision_id`` is already in the log (or earlier in ``items``) is skipped with its
    embedding, and so is a label whose ``label_uid`` is; labels of decisions not in the
    log are kept. The keys are recorded with the rows, so a crash leaves both or neither.
    """
    for key, kind, _ in items:
        if kind not in (DECISIONS, LABELS):
            raise ValueError(f"object {key!r}: kind must be {DECISIONS!r} or {LABELS!r}, got {kind!r}")
    firsts = list({key: (key, kind, t) for key, kind, t in reversed(items)}.values())[::-1]
    if not firsts:
        return 0
    keys = pa.table({"key": build([k for k, _, _ in firsts], pa.string()),
                     "kind": build([kd for _, kd, _ in firsts], pa.string()),
                     "rows": build([t.num_rows for _, _, t in firsts], pa.int64())})
    con.register("_flywheel_keys", keys)
    try:
        done = {r[0] for r in con.execute("SELECT o.key FROM ingested_objects o "
                                          "JOIN _flywheel_keys k ON k.key = o.key").fetchall()}
    finally:
        con.unregister("_flywheel_keys")
    todo = [(k, kd, t) for k, kd, t in firsts if k not in done]
    if not todo:
        return 0
    keys = keys.filter(build([k not in done for k, _, _ in firsts], pa.bool_()))
    kinds = {k: kd for k, kd, _ in todo}
    dec, lab = _split([(k, t) for k, _, t in todo], kinds.__getitem__)
    old = _unsure_as_prose([(k, t) for k, _, t in todo], kinds.__getitem__)
    now = utcnow()

    def body() -> int:
        rows = 0
        if dec is not None:
            new = _new_decisions(con, dec)
            rows += _insert_rows(con, _INSERT_DECISIONS, new, [now])
            _insert_rows(con, _INSERT_EMBEDDINGS, new, [])
            if old:
                con.execute(UNSURE_FROM_ERROR)
        if lab is not None:
            rows += _insert_rows(con, _INSERT_LABELS, _new_labels(con, lab), [now])
        con.execute("INSERT INTO ingested_objects SELECT key, kind, rows, ?::TIMESTAMP "
                    "FROM _flywheel_keys", [now])
        return rows
    return int(_transaction(con, {"_flywheel_keys": keys}, body))


# --------------------------------------------------------------------------- local ingest

def _quarantine(spool: Path, name: str, why: object) -> None:
    log.error("traffic log: spool segment %s cannot be ingested (%s); moved aside as %s.bad",
              name, why, name)
    try:
        os.replace(spool / name, spool / (name + ".bad"))
    except OSError:
        pass


def ingest_spool(con: duckdb.DuckDBPyConnection, spool: Path) -> int:
    """Move finished segments (decisions and labels) from ``spool`` into the tables,
    exactly once. Returns rows.

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
                segment_kind(n)
                t = read_segment(spool / n)
            except FileNotFoundError:
                continue
            except (pa.ArrowInvalid, ValueError) as exc:  # not a complete Arrow file, or a stray name
                _quarantine(spool, n, exc)
                continue
            chunk.append((n, t))
            rows += t.num_rows
        if not chunk:
            continue
        try:
            total += insert_segments(con, chunk, clear)
            clear = False
        except _DATA_ERRORS:
            for n, t in chunk:  # find the bad one(s), keep the rest
                try:
                    total += insert_segments(con, [(n, t)], clear)
                    clear = False
                except _DATA_ERRORS as exc:
                    _quarantine(spool, n, exc)
                    continue
                _unlink(spool / n)
            continue
        for n, _ in chunk:
            _unlink(spool / n)
    if clear:
        con.execute("DELETE FROM ingested_segments")
    return total


def _unlink(p: Path) -> None:
    try:
        os.unlink(p)
    except FileNotFoundError:
        pass
