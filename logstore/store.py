"""The DuckDB traffic log: every decision, its labels and its layer-2 embedding.

Design (why it is not "keep the database open")
-----------------------------------------------
DuckDB lets one process open a file read-write, and a second process opening the
same file, even read-only, fails with a lock error. A serving process keeps logging
for days while cron jobs (retrain, stats, the feedback CLI) read the log and add
labels, so nobody may hold the file for long:

1. **Write path: memory -> spool segment.** :meth:`SpoolSink.write` only appends
   the record to an in-memory deque (about a microsecond). A background writer thread
   turns the queued records into one pyarrow Table every ``flush_interval_s`` (or as
   soon as ``batch_size`` are queued) and writes it as an Arrow IPC *segment* file into
   the spool, ``<path>.spool/`` (write to ``*.tmp``, fsync, atomic rename, fsync the
   folder). Labels given to the sink become label segments (``lab-*``) the same way.
   The serving process never needs DuckDB's lock to make a decision durable, so a
   reader holding the database can neither slow nor back up the serving process.
2. **Drain: spool -> somewhere durable.** A second thread of the sink hands the
   finished segments to its :class:`~logstore.drain.SpoolDrain` every
   ``drain_interval_s``: :class:`~logstore.drain.LocalIngest` (what :meth:`open_sink`
   uses) ingests them into this database, the fleet's shipper uploads them. A drain
   deletes a segment only after its destination acknowledged it, and a slow, failing or
   hanging drain delays only the drain thread (it backs off), never a write.
3. **Ingest: spool -> DuckDB.** Whoever opens the database through :class:`LogStore`
   (any read or label method, and :class:`LocalIngest`) first moves the finished
   segments into the tables with one bulk ``INSERT ... BY NAME SELECT`` from the
   registered Arrow table, records the segment names in ``ingested_segments`` *in the
   same transaction*, commits, and only then deletes the files. A crash between commit
   and delete is healed on the next ingest (the names say the files are already in), so
   each row lands exactly once. Objects mirrored from elsewhere go in through
   :meth:`insert_objects`, whose keys are kept in ``ingested_objects`` (same transaction)
   and whose rows are deduplicated by decision id and label uid.
4. **Every open is short.** Each operation opens a connection, ingests, runs its
   query, fetches the result into memory and closes. All opens go through
   :func:`connect`, which retries DuckDB's lock error with bounded, jittered
   exponential backoff (``busy_timeout_s``, default 30 s) and only then raises
   :class:`LogStoreBusyError` ("log database is busy ..."). The sink's local ingest
   tries once and simply tries again later: its rows are already durable.
   Within one process all opens of a file are serialised by one lock.

What a hard crash (``kill -9``, power loss) can lose: only records still in memory,
i.e. those handed to ``write`` less than about ``flush_interval_s`` (+ one batch write,
~40 ms per 1,000 rows) before the crash; if the writer is behind, at most
``max_buffer`` records. Everything :meth:`SpoolSink.flush` acknowledged is in a
fsynced segment or committed in the database (or wherever the drain put it), and a
segment is deleted only after its rows are committed (acknowledged). Buffer full
(``max_buffer`` queued, e.g. the disk is failing): ``write`` *blocks* until the writer
has made room (back-pressure, never a drop); the failure itself is logged and raised
by ``flush``/``close``. **Spool full** (more than ``max_spool_bytes`` of undrained
segments, default :data:`~logstore.sink.DEFAULT_MAX_SPOOL_BYTES` = 256 MiB, because the
drain's destination has been away for long): new batches are *dropped*, counted in
``SpoolSink.dropped`` and logged once per episode, so the disk never fills; ``flush``
does not fail for them. ``close(grace_s)`` drains within the grace period; what is left
stays in the spool and drains at the next start.

Rules for callers: do not mutate a record after ``write``; open sinks after forking
(the sink's threads do not survive ``fork``); readers are cheap (~30 ms) but each
write method (labels) opens the file and checkpoints on close (~50-250 ms).

Labels: human labels (:meth:`LogStore.add_human_label`) and back-filled teacher
labels (:meth:`LogStore.add_teacher_label`; both :class:`~logstore.drain.LabelSink`
methods, also offered by the sink) are append-only, each with a ``label_uid``; the latest of each kind
wins, and :class:`LabelledRow` exposes both. **A human label always wins over the
teacher's** (:attr:`LabelledRow.target`). A teacher answer logged with
``valid=False`` is kept for statistics but never reported as a teacher label.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence, TypeVar, cast

import duckdb
import numpy as np
import pyarrow as pa

from flywheel.classifier.protocols import HistoryEntry
from flywheel.logstore.connection import DEFAULT_BUSY_TIMEOUT_S, arrow_table, connect, process_lock, scalar
from flywheel.logstore.drain import LocalIngest
from flywheel.logstore.errors import LogStoreError, UnknownDecisionError
from flywheel.logstore.label_records import LabelRecord
from flywheel.logstore.reads import NamedReads
from flywheel.logstore.schema import apply_migrations, current_version, utcnow
from flywheel.logstore.segments import ingest_spool, insert_objects
from flywheel.logstore.sink import DEFAULT_MAX_SPOOL_BYTES, SpoolSink

log = logging.getLogger("flywheel.logstore")
_T = TypeVar("_T")

__all__ = ["LogStore", "LabelledRow"]


def _to_utc(ts: float | datetime) -> datetime:
    if isinstance(ts, datetime):
        return ts.astimezone(timezone.utc).replace(tzinfo=None) if ts.tzinfo else ts
    return datetime.fromtimestamp(float(ts), timezone.utc).replace(tzinfo=None)


# --------------------------------------------------------------------------- the store

@dataclass(frozen=True)
class LabelledRow:
    """One logged decision with the labels it got, for the retrain job.

    ``teacher_label`` is the latest *valid* teacher answer (inline or back-filled;
    ``None`` with ``has_teacher_label`` = out of scope); ``teacher_labels`` all of
    them, oldest first. ``human_label`` is the latest human label (``None`` with
    ``has_human_label`` = out of scope). Use :attr:`target`: a human label always
    wins over the teacher's.
    """

    decision_id: str
    text: str
    created_at: float                 # unix seconds
    layer: str
    label: str | None                 # what the classifier answered
    confidence: float | None
    l2_label: str | None              # what layer 2 said (NULL when layer 2 did not run)
    l2_confidence: float | None
    teacher_label: str | None
    teacher_model: str | None
    has_teacher_label: bool
    teacher_labels: tuple[str | None, ...]
    human_label: str | None
    human_author: str | None
    has_human_label: bool
    encoder_id: str | None
    session_id: str | None = None
    history: tuple[HistoryEntry, ...] = ()
    human_at: float | None = None     # unix seconds of the latest human label

    @property
    def target(self) -> tuple[str | None, str | None]:
        """``(label, source)``: the human label if any, else the teacher's; source is
        ``"human"``, ``"teacher"`` or ``None`` (no label at all)."""
        if self.has_human_label:
            return self.human_label, "human"
        if self.has_teacher_label:
            return self.teacher_label, "teacher"
        return None, None


def _vectors(column: Any) -> list[np.ndarray]:
    """A FLOAT[] Arrow column as float32 1-D arrays (views into one buffer)."""
    if len(column) == 0:
        return []
    vec = column.combine_chunks()
    values = vec.flatten().to_numpy(zero_copy_only=False).astype(np.float32, copy=False)
    offsets = vec.offsets.to_numpy()
    return [values[offsets[i]:offsets[i + 1]] for i in range(len(vec))]


def _strings(column: pa.ChunkedArray) -> list[str]:
    """A string column its query keeps free of NULLs (ids, texts, labels it filters on)."""
    return cast("list[str]", column.to_pylist())


def _history(items: Iterable[Mapping[str, str]] | None) -> tuple[HistoryEntry, ...]:
    return tuple(HistoryEntry(h["label"], h["snippet"]) for h in (items or ()))


_LABELLED_SQL = """
SELECT d.decision_id, d.text, epoch_us(d.created_at), d.layer, d.label, d.confidence,
       d.l2_label, d.l2_confidence, l.teacher_labels, l.teacher_models, l.human_labels,
       l.human_authors, d.encoder_id, d.session_id, d.history, epoch_us(l.human_at)
FROM decisions d
{join} JOIN decision_labels l ON l.decision_id = d.decision_id
WHERE {where}
ORDER BY d.created_at, d.decision_id
"""


# human labels that repeat the decision's previous human label (same label, same author)
# are one label; teacher labels count each valid answer
_COUNT_NEW_LABELS_SQL = """
WITH l AS (
    SELECT decision_id, source, valid, created_at, logged_at,
           source = 'human' AND lag(label_id) OVER w IS NOT NULL
               AND lag(label) OVER w IS NOT DISTINCT FROM label
               AND lag(author) OVER w IS NOT DISTINCT FROM author AS repeat
    FROM labels WHERE source = 'human' OR (source = 'teacher' AND valid)
    WINDOW w AS (PARTITION BY decision_id, source ORDER BY created_at, label_id)
)
SELECT (SELECT count(*) FROM decisions WHERE teacher_valid AND coalesce(logged_at, created_at) > ?)
     + (SELECT count(*) FROM l JOIN decisions d ON d.decision_id = l.decision_id
        WHERE NOT l.repeat
          AND greatest(coalesce(l.logged_at, l.created_at), coalesce(d.logged_at, d.created_at)) > ?)
"""


_FORGET_SQL = """
UPDATE decisions SET text = '',
    history = list_transform(history, lambda h: {'label': h.label, 'snippet': ''}),
    teacher_error = split_part(teacher_error, ':', 1)
WHERE created_at < ? AND (text <> '' OR teacher_error LIKE '%:%'
    OR coalesce(len(list_filter(history, lambda h: coalesce(h.snippet, '') <> '')), 0) > 0)
"""


_LATEST_HUMAN_SQL = ("SELECT label, author FROM labels WHERE decision_id = ? AND source = 'human' "
                     "ORDER BY created_at DESC, label_id DESC LIMIT 1")


def _recorded(con: duckdb.DuckDBPyConnection, rec: LabelRecord) -> bool:
    """Whether the log on ``con`` already holds ``rec`` (see :meth:`LogStore.is_recorded`)."""
    if scalar(con, "SELECT count(*) FROM labels WHERE label_uid = ?", [rec.label_uid]):
        return True
    if rec.source != "human":
        return False
    latest = con.execute(_LATEST_HUMAN_SQL, [rec.decision_id]).fetchone()
    return latest is not None and (latest[0], latest[1]) == (rec.label, rec.author)


def _sql_str(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def _sql_ident(s: str) -> str:
    return '"' + s.replace('"', '""') + '"'


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _fsync(path: str, directory: bool = False) -> None:
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class LogStore(NamedReads):
    """The traffic log at ``path`` (a DuckDB file; segments spool in ``<path>.spool/``).
    A :class:`~logstore.drain.LabelSink` that checks the decision is in the log, and a
    :class:`~logstore.reads.LogReader` (the named reads of :mod:`logstore.reads`).

    Opening checks that the location is writable and applies the schema migrations,
    so a bad path fails here with :class:`LogStoreError`, not as a lost log later.
    No connection is kept: every method opens, ingests the spool, queries, fetches
    into memory and closes (see the module docstring).
    """

    def __init__(self, path: str | os.PathLike, *,
                 busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S) -> None:
        p = Path(os.path.realpath(Path(path).expanduser()))
        self.path = str(p)
        self.spool_dir = Path(self.path + ".spool")
        self.busy_timeout_s = float(busy_timeout_s)
        self._sinks: "weakref.WeakSet[SpoolSink]" = weakref.WeakSet()
        if p.is_dir():
            raise LogStoreError(f"log database path {self.path} is a directory")
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
            self.spool_dir.mkdir(exist_ok=True)
            probe = self.spool_dir / f".probe-{os.getpid()}-{threading.get_ident()}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            raise LogStoreError(f"log database path {self.path} is not writable: {exc}") from exc
        with process_lock(self.path):
            con = connect(self.path, self.busy_timeout_s)
            try:
                self.migrations_applied = apply_migrations(con, self.path)
                ingest_spool(con, self.spool_dir)
            except (duckdb.Error, OSError) as exc:
                raise LogStoreError(f"log database {self.path}: {exc}") from exc
            finally:
                con.close()

    def __repr__(self) -> str:
        return f"LogStore({self.path!r})"

    # -- plumbing
    def _run(self, fn: Callable[[duckdb.DuckDBPyConnection], _T], *, ingest: bool = True) -> _T:
        """Open (with lock retries), ingest the spool, run ``fn(con)``, close."""
        with process_lock(self.path):
            con = connect(self.path, self.busy_timeout_s)
            try:
                if ingest:
                    ingest_spool(con, self.spool_dir)
                return fn(con)
            except (duckdb.Error, OSError) as exc:
                raise LogStoreError(f"log database {self.path}: {exc}") from exc
            finally:
                con.close()

    def open_sink(self, *, flush_interval_s: float = 0.5, batch_size: int = 1000,
                  max_buffer: int = 100_000, ingest_interval_s: float | None = 10.0,
                  fsync: bool = True, max_spool_bytes: int | None = DEFAULT_MAX_SPOOL_BYTES) -> SpoolSink:
        """A :class:`SpoolSink` writing into this store's spool and draining it into the
        database with :class:`LocalIngest` (one try, no wait) every ``ingest_interval_s``;
        ``None``: no drain thread (the segments wait for the next read or :meth:`ingest`)."""
        drain = None if ingest_interval_s is None else LocalIngest(self.path, busy_timeout_s=0.0)
        sink = SpoolSink(self.spool_dir, drain, drain_interval_s=ingest_interval_s or 10.0,
                         max_spool_bytes=max_spool_bytes, flush_interval_s=flush_interval_s,
                         batch_size=batch_size, max_buffer=max_buffer, fsync=fsync,
                         busy_timeout_s=self.busy_timeout_s)
        self._sinks.add(sink)
        return sink

    def ingest(self) -> int:
        """Move spooled segments into the database now; return the rows moved."""
        return self._run(lambda con: ingest_spool(con, self.spool_dir), ingest=False)

    def ingested_keys(self) -> set[str]:
        """The object keys whose rows are in (``ingested_objects``; see :meth:`insert_objects`)."""
        return {r[0] for r in self._run(lambda con: con.execute("SELECT key FROM ingested_objects").fetchall())}

    def insert_objects(self, items: Sequence[tuple[str, str, pa.Table]]) -> int:
        """Insert shipped objects ``(key, kind, table)`` exactly once, rows and keys in one
        transaction; return the rows inserted (:func:`logstore.segments.insert_objects`)."""
        return int(self._run(lambda con: insert_objects(con, items)))

    @property
    def schema_version(self) -> int:
        return self._run(current_version)

    # -- retention (fleet.retention.prune_log)
    def forget_text(self, before: float | datetime) -> int:
        """Remove the raw query text of every decision created before ``before`` (unix
        seconds or datetime): ``text`` becomes ``''``, history snippets ``''`` (their
        labels stay) and ``teacher_error`` its kind (the part before ``:``, which may quote
        an answer). Ids, answers (an unsure one's candidate set too), labels and embeddings
        stay. Returns the decisions changed. The old strings stay in the file's free blocks
        until :meth:`compact`."""
        return int(self._run(lambda con: scalar(con, _FORGET_SQL, [_to_utc(before)])))

    def compact(self) -> int:
        """Rewrite the database file with only its live data, so that deleted and
        overwritten values are gone from the disk file (an ``UPDATE``/``DELETE`` with
        ``CHECKPOINT`` leaves old strings in free blocks). Copies everything
        (``COPY FROM DATABASE``: tables, views, sequences with their counters,
        constraints) into a new file next to it, then swaps it in atomically while the
        old file is still open and locked, so no other process can write in between.
        Needs free disk space for one more copy. Returns the new file's size in bytes."""
        tmp = self.path + ".compact.tmp"

        def op(con: duckdb.DuckDBPyConnection) -> int:
            con.execute("CHECKPOINT")
            name = scalar(con, "SELECT current_database()")
            for p in (tmp, tmp + ".wal"):  # left by a crash during an earlier compaction
                _remove(p)
            con.execute(f"ATTACH {_sql_str(tmp)} AS _flywheel_compact")
            try:
                try:
                    con.execute(f"COPY FROM DATABASE {_sql_ident(name)} TO _flywheel_compact")
                finally:
                    con.execute("DETACH _flywheel_compact")
                _fsync(tmp)
                os.replace(tmp, self.path)
            except BaseException:
                for p in (tmp, tmp + ".wal"):
                    _remove(p)
                raise
            _fsync(os.path.dirname(self.path), directory=True)
            return os.path.getsize(self.path)
        return int(self._run(op))

    # -- labels
    def _check_id(self, decision_id: object) -> None:
        if not isinstance(decision_id, str) or not decision_id:
            raise UnknownDecisionError(f"unknown decision id {decision_id!r}", log=self.path)

    def _add_label(self, rec: LabelRecord) -> bool:
        """Insert ``rec`` unless it is already recorded (:func:`_recorded`): ``True`` inserted,
        ``False`` already there; the check and the insert in one transaction."""
        decision_id = rec.decision_id

        def op(con: duckdb.DuckDBPyConnection) -> bool | None:
            if not scalar(con, "SELECT count(*) FROM decisions WHERE decision_id = ?", [decision_id]):
                return None
            con.execute("BEGIN TRANSACTION")
            try:
                if _recorded(con, rec):
                    con.execute("ROLLBACK")
                    return False
                now = utcnow()
                con.execute("INSERT INTO labels (decision_id, source, label, model, valid, latency_ms, author, "
                            "created_at, label_uid, logged_at, teacher_candidates) "
                            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                            [decision_id, rec.source, rec.label, rec.model, rec.valid, rec.latency_ms,
                             rec.author, now, rec.label_uid, now,
                             None if rec.teacher_candidates is None else list(rec.teacher_candidates)])
                con.execute("COMMIT")
            except BaseException:
                con.execute("ROLLBACK")
                raise
            return True

        done = self._run(op)
        if done is not None:
            return done
        for sink in list(self._sinks):  # maybe still buffered in this process
            sink.flush()
        done = self._run(op)
        if done is None:
            raise UnknownDecisionError(f"unknown decision id {decision_id!r}", log=self.path)
        return done

    def is_recorded(self, rec: LabelRecord) -> bool:
        """Whether the log already holds ``rec``: a label of its ``label_uid``, or (a human
        label) the decision's latest human label is the same label from the same author."""
        return bool(self._run(lambda con: _recorded(con, rec)))

    def add_human_label(self, decision_id: str, label: str | None, *,
                        author: str | None = None, label_uid: str | None = None) -> bool:
        """Record a human label (``None`` = out of scope); the latest one wins and it
        always beats the teacher's. Unknown ``decision_id`` -> :class:`UnknownDecisionError`.

        The same label for the same decision from the same author is recorded once: nothing
        is written, and ``False`` returned, when the log holds a label of ``label_uid``
        already (an import given again, :func:`~logstore.label_records.stable_label_uid`) or
        the decision's latest human label is this one from ``author``. ``True``: recorded."""
        self._check_id(decision_id)
        return self._add_label(LabelRecord.human(decision_id, label, author=author, label_uid=label_uid))

    def add_teacher_label(self, decision_id: str, label: str | None, model: str,
                          valid: bool, latency_ms: float | None = None,
                          candidates: Sequence[str | None] | None = None) -> None:
        """Record a teacher answer made after the decision (an audit's, a back-filled one).
        ``valid=False`` rows are kept for stats and never reported as a teacher label;
        ``candidates`` is an unsure answer's set (``()``: "cannot tell"), see :class:`LabelSink`."""
        self._check_id(decision_id)
        self._add_label(LabelRecord.teacher(decision_id, label, model, valid, latency_ms, candidates))

    def pending(self, limit: int | None = None) -> list[tuple[str, str, tuple[HistoryEntry, ...]]]:
        """Decisions that needed the teacher while it was unavailable and have neither a
        valid teacher label nor a resolution yet, oldest first: ``(id, text, history)``.
        Decisions whose text retention removed (:meth:`forget_text`) are left out: there
        is nothing to ask the teacher."""
        sql = ("SELECT d.decision_id, d.text, d.history FROM decisions d WHERE d.pending AND d.text <> '' "
               "AND NOT EXISTS (SELECT 1 FROM resolutions r WHERE r.decision_id = d.decision_id) "
               "AND NOT EXISTS (SELECT 1 FROM decision_labels l WHERE l.decision_id = d.decision_id "
               "AND l.has_teacher) ORDER BY d.created_at, d.decision_id")
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        rows = self._run(lambda con: con.execute(sql).fetchall())
        return [(r[0], r[1], _history(r[2])) for r in rows]

    def mark_resolved(self, decision_ids: Iterable[str]) -> int:
        """Take decisions off :meth:`pending`; returns how many known ids were newly marked."""
        ids = pa.table({"decision_id": pa.array(list(dict.fromkeys(decision_ids)), pa.string())})

        def op(con: duckdb.DuckDBPyConnection) -> int:
            con.register("_flywheel_ids", ids)
            try:
                return scalar(
                    con,
                    "INSERT INTO resolutions SELECT i.decision_id, ?::TIMESTAMP "
                    "FROM _flywheel_ids i "
                    "WHERE i.decision_id IN (SELECT decision_id FROM decisions) "
                    "AND i.decision_id NOT IN (SELECT decision_id FROM resolutions)",
                    [utcnow()])
            finally:
                con.unregister("_flywheel_ids")
        return int(self._run(op) or 0)

    # -- reads
    def labelled_rows(self, since: float | datetime | None = None, *,
                      labelled_only: bool = True) -> list[LabelledRow]:
        """Decisions with a human label or a valid teacher label (all decisions when
        ``labelled_only=False``), oldest first. With ``since`` (unix seconds or
        datetime): only rows whose decision *or* one of whose labels is that new."""
        conds, params = [], []
        if since is not None:
            conds.append("(d.created_at >= ? OR l.teacher_at >= ? OR l.human_at >= ?)")
            params += [_to_utc(since)] * 3
        sql = _LABELLED_SQL.format(join="" if labelled_only else "LEFT",
                                   where=" AND ".join(conds) or "TRUE")
        rows = self._run(lambda con: con.execute(sql, params).fetchall())
        out = []
        for (did, text, us, layer, label, conf, l2l, l2c, tls, tms, hls, has, enc, sid,
             hist, human_us) in rows:
            out.append(LabelledRow(
                decision_id=did, text=text, created_at=us / 1e6, layer=layer, label=label,
                confidence=conf, l2_label=l2l, l2_confidence=l2c,
                teacher_label=tls[-1] if tls else None, teacher_model=tms[-1] if tms else None,
                has_teacher_label=bool(tls), teacher_labels=tuple(tls or ()),
                human_label=hls[-1] if hls else None, human_author=has[-1] if has else None,
                has_human_label=bool(hls), encoder_id=enc, session_id=sid,
                history=_history(hist), human_at=None if human_us is None else human_us / 1e6))
        return out

    def embeddings(self, encoder_id: str, decision_ids: Iterable[str] | None = None, *,
                   texts: Iterable[str] | None = None) -> dict[str, np.ndarray]:
        """Stored layer-2 vectors made by ``encoder_id`` (float32, 1-D), keyed by decision
        id, or by text when ``texts`` is given (the newest vector of that text). With
        neither, every vector of that encoder, keyed by decision id."""
        if decision_ids is not None and texts is not None:
            raise ValueError("pass decision_ids or texts, not both")
        params: list = [encoder_id]
        if texts is not None:
            keys = pa.table({"k": pa.array(list(dict.fromkeys(texts)), pa.string())})
            sql = ("SELECT d.text AS k, arg_max(e.vector, d.created_at) AS v FROM embeddings e "
                   "JOIN decisions d ON d.decision_id = e.decision_id "
                   "JOIN _flywheel_keys q ON q.k = d.text WHERE e.encoder_id = ? GROUP BY d.text")
        elif decision_ids is not None:
            keys = pa.table({"k": pa.array(list(dict.fromkeys(decision_ids)), pa.string())})
            sql = ("SELECT e.decision_id AS k, e.vector AS v FROM embeddings e "
                   "JOIN _flywheel_keys q ON q.k = e.decision_id WHERE e.encoder_id = ?")
        else:
            keys = None
            sql = "SELECT decision_id AS k, vector AS v FROM embeddings WHERE encoder_id = ?"

        def op(con: duckdb.DuckDBPyConnection) -> pa.Table:
            if keys is not None:
                con.register("_flywheel_keys", keys)
            try:
                return arrow_table(con, sql, params)
            finally:
                if keys is not None:
                    con.unregister("_flywheel_keys")
        table = self._run(op)
        return dict(zip(_strings(table.column("k")), _vectors(table.column("v"))))

    def confident_layer2(self, encoder_id: str, limit: int
                         ) -> tuple[list[str], list[str], list[str], list[np.ndarray]]:
        """The newest ``limit`` in-scope decisions layer 2 made at tier ``confident`` with
        ``encoder_id``, with their logged vectors: ``(decision_ids, texts, labels, vectors)``,
        newest first (vectors as :meth:`embeddings` returns them). Decisions without a
        stored vector of that encoder are left out. (The retrain job's self-training rows;
        see :mod:`training.trainset`.)"""
        sql = ("SELECT d.decision_id AS i, d.text AS t, d.label AS l, e.vector AS v FROM decisions d "
               "JOIN embeddings e ON e.decision_id = d.decision_id AND e.encoder_id = d.encoder_id "
               "WHERE d.layer = 'embedding' AND d.tier = 'confident' AND d.label IS NOT NULL "
               "AND d.encoder_id = ? ORDER BY d.created_at DESC, d.decision_id LIMIT ?")
        table = self._run(lambda con: arrow_table(con, sql, [encoder_id, int(limit)]))
        return (_strings(table.column("i")), _strings(table.column("t")), _strings(table.column("l")),
                _vectors(table.column("v")))

    def has_decision(self, decision_id: str) -> bool:
        """Whether ``decision_id`` is in the log (after ingesting the spool)."""
        return bool(self._run(lambda con: con.execute(
            "SELECT count(*) FROM decisions WHERE decision_id = ?", [decision_id]).fetchall()[0][0]))

    def decision_languages(self, decision_ids: Iterable[str]) -> dict[str, str]:
        """The logged language (``decisions.language``) of each of ``decision_ids`` that is in
        the log and has one (rows logged before migration 6 have none)."""
        ids = pa.table({"decision_id": pa.array(list(dict.fromkeys(decision_ids)), pa.string())})

        def run(con: duckdb.DuckDBPyConnection) -> list[tuple[str, str]]:
            con.register("_flywheel_lang_ids", ids)
            try:
                return con.execute("SELECT d.decision_id, d.language FROM decisions d "
                                   "JOIN _flywheel_lang_ids i USING (decision_id) "
                                   "WHERE d.language IS NOT NULL").fetchall()
            finally:
                con.unregister("_flywheel_lang_ids")
        return {str(d): str(lang) for d, lang in self._run(run)}

    def decision_histories(self, decision_ids: Iterable[str]) -> dict[str, tuple[HistoryEntry, ...]]:
        """The compact history each of ``decision_ids`` was classified with (as logged,
        snippets redacted like the text; ``()`` when it had none), for those in the log."""
        ids = pa.table({"decision_id": pa.array(list(dict.fromkeys(decision_ids)), pa.string())})

        def run(con: duckdb.DuckDBPyConnection) -> list[tuple[str, Any]]:
            con.register("_flywheel_hist_ids", ids)
            try:
                return con.execute("SELECT d.decision_id, d.history FROM decisions d "
                                   "JOIN _flywheel_hist_ids i USING (decision_id)").fetchall()
            finally:
                con.unregister("_flywheel_hist_ids")
        return {str(d): _history(h) for d, h in self._run(run)}

    def count(self) -> int:
        """Number of logged decisions (after ingesting the spool)."""
        return int(self._run(lambda con: scalar(con, "SELECT count(*) FROM decisions")))

    def layer_counts(self) -> dict[str, int]:
        rows = self._run(lambda con: con.execute(
            "SELECT layer, count(*) FROM decisions GROUP BY layer ORDER BY layer").fetchall())
        return {layer: int(n) for layer, n in rows}

    # -- reads for the retrain job
    def count_new_labels(self, since: float | None) -> int:
        """Valid teacher answers (inline or back-filled) and human labels that reached the
        log after ``since`` (unix seconds; ``None``: all). An inline teacher answer counts
        from when its decision was ingested (``logged_at``), so a decision that was still
        spooled while a model was trained counts as new; a label from when both it and its
        decision are in (a label whose decision is not in yet does not count). A human
        label that repeats the decision's previous one (same label, same author: written
        twice through a sink that could not tell, say on two replicas) does not count."""
        ts = _to_utc(since if since is not None else 0.0)
        return int(self._run(lambda con: scalar(con, _COUNT_NEW_LABELS_SQL, [ts, ts])))

    def invalid_teacher_answers(self) -> int:
        """Teacher answers logged as invalid (inline or back-filled): never training data."""
        return int(self._run(lambda con: scalar(
            con, "SELECT (SELECT count(*) FROM decisions WHERE teacher_valid = false) + "
            "(SELECT count(*) FROM labels l WHERE source = 'teacher' AND NOT valid "
            "AND EXISTS (SELECT 1 FROM decisions d WHERE d.decision_id = l.decision_id))")))

    def unsure_teacher_answers(self) -> int:
        """Teacher answers that were a candidate set or "cannot tell" (the ``unsure_answers``
        view: inline, audits and back-fills, of decisions in the log): never training
        data, kept for review."""
        return int(self._run(lambda con: scalar(
            con, "SELECT count(*) FROM unsure_answers u "
            "WHERE EXISTS (SELECT 1 FROM decisions d WHERE d.decision_id = u.decision_id)")))

    def unsure_candidate_sets(self, since: float | None = None) -> list[tuple[str | None, ...]]:
        """The candidate sets of the unsure teacher answers (inline, audits and back-fills,
        of decisions in the log) made after ``since`` (all when ``None``), oldest first;
        "cannot tell" answers name none and are left out."""
        rows = self._run(lambda con: con.execute(
            "SELECT u.candidates FROM unsure_answers u WHERE len(u.candidates) >= 2 AND u.created_at >= ? "
            "AND EXISTS (SELECT 1 FROM decisions d WHERE d.decision_id = u.decision_id) "
            "ORDER BY u.created_at, u.ord, u.decision_id",
            [_to_utc(since if since is not None else 0.0)]).fetchall())
        return [tuple(r[0]) for r in rows]

    def query_texts(self, limit: int, seed: int = 0) -> list[str]:
        """Up to ``limit`` distinct logged query texts, a draw fixed by ``seed`` (the same log
        and seed give the same texts), for the unlabelled stage of encoder tuning (issue 35).
        Texts retention erased (``''``, :meth:`forget_text`) are never returned."""
        if int(limit) < 1:
            raise ValueError(f"limit must be at least 1, got {limit!r}")
        rows = self._run(lambda con: con.execute(
            "SELECT text FROM (SELECT DISTINCT text FROM decisions WHERE text IS NOT NULL AND trim(text) <> '') "
            "ORDER BY hash(text, ?::BIGINT), text LIMIT ?", [int(seed), int(limit)]).fetchall())
        return [r[0] for r in rows]

    def latest_decisions(self, encoder_id: str, n: int) -> list[tuple[str, str]]:
        """``(decision_id, text)`` of the newest ``n`` decisions logged with ``encoder_id``
        (layer 2 ran on them), newest first."""
        return self._run(lambda con: con.execute(
            "SELECT decision_id, text FROM decisions WHERE encoder_id = ? "
            "ORDER BY created_at DESC, decision_id DESC LIMIT ?", [encoder_id, int(n)]).fetchall())

    def _rows(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return self._run(lambda con: con.execute(sql, list(params)).fetchall())

    def query(self, sql: str, params: Sequence[Any] | None = None) -> list[tuple]:
        """Run one read-only SQL statement of your own and return all rows: for tests,
        benchmarks and an operator's question. The library asks through the named reads
        (:mod:`logstore.reads`), so no SQL lives outside :mod:`logstore`.

        The tables and the ``decision_labels`` view are described in :mod:`logstore.schema`."""
        return self._rows(sql, list(params or []))
