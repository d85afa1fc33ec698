"""The traffic log's write path: :class:`SpoolSink`, its writer thread and its drain thread.

``SpoolSink.write`` (and its label methods) only append to an in-memory deque. The
writer thread (:class:`_Writer`) turns queued records into Arrow IPC segment files in
the spool (decisions ``seg-*``, labels ``lab-*``), and nothing else. A second thread
(:class:`_Drainer`) hands the finished segments to the sink's
:class:`~logstore.drain.SpoolDrain` every ``drain_interval_s``, backing off when it
fails, so a slow or refusing drain can delay shipping but never a write. The spool is
bounded: past ``max_spool_bytes`` of undrained segments new batches are dropped and
counted (``dropped``) instead of filling the disk. See :mod:`logstore.store` for the
whole design (durability, back-pressure, locking);
:meth:`logstore.store.LogStore.open_sink` opens a sink that drains into the local DuckDB.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, Sequence, Union, cast

import pyarrow as pa

from flywheel.classifier.protocols import DecisionRecord
from flywheel.logstore.connection import DEFAULT_BUSY_TIMEOUT_S
from flywheel.logstore.drain import SpoolDrain
from flywheel.logstore.errors import LogStoreError
from flywheel.logstore.label_records import LabelRecord, label_records_to_table
from flywheel.logstore.segments import DECISIONS, LABELS, records_to_table, spool_id, spool_usage, write_segment

if TYPE_CHECKING:  # pragma: no cover
    from flywheel.classifier.shadow import ShadowAnswer

log = logging.getLogger("flywheel.logstore")  # the same logger as before the split

__all__ = ["DEFAULT_DRAIN_INTERVAL_S", "DEFAULT_MAX_SPOOL_BYTES", "SpoolSink"]

#: Default bound of a spool's undrained segments (``max_spool_bytes``). A segment takes
#: about 2.0 KB per decision with a 384-dim embedding (4.5 KB with bge-m3's 1024 dims),
#: so 256 MiB hold about 135k decisions (60k with bge-m3): at 50 decisions/s, 45 minutes
#: (20) of the drain's destination being away, which a shipper outlives on backoff. It is
#: also a small slice of a pod's ephemeral storage (the spool is an ``emptyDir``) and
#: bounds how much raw text a replica can hold. Past it, new records are dropped and
#: counted (``dropped``), never written: a full disk would stop more than the log.
DEFAULT_MAX_SPOOL_BYTES = 256 * 2**20
DEFAULT_DRAIN_INTERVAL_S = 10.0
_MAX_DRAIN_BACKOFF_S = 60.0     # a failing drain is retried at most this far apart
_RESCAN_EVERY_S = 1.0           # over the bound, the writer re-reads the spool this often


#: What the sink queues: decisions, and labels (the label methods).
_Record = Union[DecisionRecord, LabelRecord]


class _Marker:
    __slots__ = ("event", "written")

    def __init__(self) -> None:
        self.event = threading.Event()
        self.written = 0


class _Usage:
    """Bytes and count of the spool's finished segments: counted up by the writer,
    re-read from the folder by the drain thread after each drain (and by readers)."""

    def __init__(self, spool: Path) -> None:
        self.spool = spool
        self.lock = threading.Lock()
        self.added = (0, 0)  # (bytes, segments) written since the start, for rescans
        self.bytes = self.segments = 0
        self.scanned_at = 0.0
        self.rescan()

    def add(self, nbytes: int) -> None:
        with self.lock:
            self.bytes += nbytes
            self.segments += 1
            self.added = (self.added[0] + nbytes, self.added[1] + 1)

    def rescan(self) -> tuple[int, int]:
        with self.lock:
            before = self.added
        nbytes, count = spool_usage(self.spool)
        with self.lock:  # what was written during the scan may count twice: until the next one
            self.bytes = nbytes + self.added[0] - before[0]
            self.segments = count + self.added[1] - before[1]
            self.scanned_at = time.monotonic()
            return self.bytes, self.segments


def _groups(items: list[_Record]) -> list[tuple[str, list[_Record]]]:
    """Split a batch into its decisions and its labels (decisions first)."""
    labels: list[_Record] = [i for i in items if i.__class__ is LabelRecord]
    if not labels:
        return [(DECISIONS, items)]
    decisions = [i for i in items if i.__class__ is not LabelRecord]
    return ([(DECISIONS, decisions)] if decisions else []) + [(LABELS, labels)]


def _convert(kind: str, records: list[_Record]) -> pa.Table:
    """A group of :func:`_groups` as a segment table (all decisions or all labels)."""
    if kind == DECISIONS:
        return records_to_table(cast("list[DecisionRecord]", records))
    return label_records_to_table(cast("list[LabelRecord]", records))


class _Writer:
    """The state shared by a sink and its writer thread (which never references the
    sink itself, so an abandoned sink can be garbage collected and finalized)."""

    def __init__(self, spool: Path, usage: _Usage, *, busy_timeout_s: float, flush_interval_s: float,
                 batch_size: int, max_buffer: int, max_spool_bytes: int | None, fsync: bool) -> None:
        self.spool, self.usage = spool, usage
        self.busy_timeout_s = busy_timeout_s
        self.flush_interval_s = flush_interval_s
        self.batch_size = batch_size
        self.max_buffer = max_buffer
        self.max_spool_bytes = max_spool_bytes
        self.fsync = fsync
        self.buf: deque[_Record | _Marker] = deque()
        self.wake = threading.Event()
        self.room = threading.Condition(threading.Lock())
        self.drain_lock = threading.Lock()
        self.stopping = False
        self.written = 0            # rows durably in segments
        self.rejected = 0           # records that could not be converted (programming errors)
        self.dropped = 0            # rows not written: the spool was over its bound
        self.dropping = 0           # rows dropped in the current episode (0: none)
        self.segments = 0
        self.stuck: tuple[list[tuple[str, list[_Record]]], _Marker | None] | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="flywheel-logsink", daemon=True)
        self.thread.start()

    # -- background thread
    def _run(self) -> None:
        retry = 0.0
        give_up_at = None
        while True:
            stopping = self.stopping
            if not stopping:
                self.wake.wait(retry or self.flush_interval_s)
                self.wake.clear()
            ok = self._drain()
            retry = 0.0 if ok else min(max(retry * 2, 0.05), 2.0)
            if stopping:
                if ok:
                    return
                give_up_at = give_up_at or time.monotonic() + self.busy_timeout_s
                if time.monotonic() >= give_up_at:
                    return
                time.sleep(retry)

    def _take(self) -> tuple[list[_Record], _Marker | None]:
        buf = self.buf
        out: list[_Record] = []
        while len(out) < self.batch_size:
            try:
                item = buf.popleft()
            except IndexError:
                break
            if isinstance(item, _Marker):
                return out, item
            out.append(item)
        return out, None

    def _drain(self) -> bool:
        """Write everything queued, in batches; False when a write failed (kept in ``stuck``)."""
        with self.drain_lock:
            return self._drain_locked()

    def _drain_locked(self) -> bool:
        while True:
            if self.stuck is not None:
                groups, marker = self.stuck
            else:
                items, marker = self._take()
                if not items and marker is None:
                    return True
                groups = _groups(items) if items else []
            while groups:
                try:
                    self._write(*groups[0])
                except Exception as exc:  # disk full, spool removed, ... : keep and retry
                    if self.error is None:
                        log.error("traffic log: cannot write %d records to %s (%s); "
                                  "buffering and retrying", len(groups[0][1]), self.spool, exc)
                    self.stuck, self.error = (groups, marker), exc
                    return False
                groups = groups[1:]
            self.stuck = self.error = None
            if marker is not None:
                marker.written = self.written
                marker.event.set()
            with self.room:
                self.room.notify_all()

    def _table(self, kind: str, records: list[_Record]) -> pa.Table | None:
        try:
            return _convert(kind, records)
        except Exception:
            good = []
            for r in records:
                try:
                    _convert(kind, [r])
                    good.append(r)
                except Exception as exc:
                    self.rejected += 1
                    log.error("traffic log: dropping malformed record %r: %s",
                              getattr(getattr(r, "decision", r), "id", r), exc)
            return _convert(kind, good) if good else None

    def _over_bound(self) -> bool:
        limit, usage = self.max_spool_bytes, self.usage
        if limit is None or usage.bytes <= limit:
            return False
        if time.monotonic() - usage.scanned_at >= _RESCAN_EVERY_S:
            usage.rescan()  # the drain or a reader may have emptied it meanwhile
        return usage.bytes > limit

    def _write(self, kind: str, records: list[_Record]) -> None:
        table = self._table(kind, records)
        if table is None:
            return
        if self._over_bound():
            if not self.dropping:
                log.error("traffic log: spool %s holds %d bytes of undrained segments, over its bound "
                          "of %d; dropping new records until it drains", self.spool, self.usage.bytes,
                          self.max_spool_bytes)
            self.dropped += table.num_rows
            self.dropping += table.num_rows
            return
        path = write_segment(self.spool, table, kind=kind, fsync=self.fsync)
        try:
            self.usage.add(path.stat().st_size)
        except FileNotFoundError:  # drained already
            pass
        self.segments += 1
        self.written += table.num_rows
        if self.dropping:
            log.warning("traffic log: spool %s is under its bound again; %d records were dropped",
                        self.spool, self.dropping)
            self.dropping = 0

    # -- caller side
    def wait_for_room(self) -> None:
        with self.room:
            while len(self.buf) >= self.max_buffer and self.thread.is_alive():
                self.wake.set()
                self.room.wait(0.1)

    def flush(self, timeout: float | None) -> int:
        marker = _Marker()
        self.buf.append(marker)
        self.wake.set()
        start = time.monotonic()
        err_since = None
        while not marker.event.wait(0.02):
            now = time.monotonic()
            if not self.thread.is_alive():
                self._drain()  # thread gone (closing): finish here
                if not marker.event.is_set():
                    raise LogStoreError(f"traffic log writer stopped; records for {self.spool} "
                                        f"not written: {self.error}")
                break
            if self.error is not None:
                err_since = err_since or now
                if now - err_since >= self.busy_timeout_s:
                    raise LogStoreError(
                        f"traffic log cannot write to {self.spool}: {self.error} "
                        f"({len(self.buf)} records buffered, still retrying)")
            else:
                err_since = None
            if timeout is not None and now - start >= timeout:
                raise LogStoreError(f"traffic log flush timed out after {timeout:g}s")
        return marker.written

    def close(self) -> None:
        self.stopping = True
        self.wake.set()
        self.thread.join()
        if self.buf or self.stuck:  # a write raced with close, or the writer gave up
            self._drain()
        if self.stuck is not None or self.buf:
            n = sum(len(g) for _, g in self.stuck[0]) if self.stuck else 0
            raise LogStoreError(f"traffic log closed with {n + len(self.buf)} records unwritten "
                                f"to {self.spool}: {self.error}")


class _Drainer:
    """The drain thread: calls ``drain.drain(spool, busy_timeout_s)`` every
    ``interval_s`` (at once at the start when segments are left from before), backs off
    after a failure, and on stop drains until the spool is empty or the deadline passed
    (one attempt without a deadline), then closes the drain."""

    def __init__(self, spool: Path, drain: SpoolDrain, usage: _Usage, *, interval_s: float,
                 busy_timeout_s: float) -> None:
        self.spool, self.drain, self.usage = spool, drain, usage
        self.interval_s, self.busy_timeout_s = interval_s, busy_timeout_s
        self.lock = threading.Lock()        # one drain call at a time
        self.wake = threading.Event()
        self.stopping = False
        self.deadline: float | None = None
        self.drained = 0
        self.errors = 0
        self.last_error: str | None = None
        self.thread = threading.Thread(target=self._run, name="flywheel-logdrain", daemon=True)
        self.thread.start()

    def _attempt(self, timeout_s: float) -> int:
        """One drain call (the caller holds ``lock``); counts, logs once per episode, raises."""
        try:
            n = int(self.drain.drain(self.spool, max(0.0, timeout_s)) or 0)
        except Exception as exc:
            self.errors += 1
            if self.last_error is None:
                log.warning("traffic log: drain of %s failed (%s); segments stay in the spool, retrying",
                            self.spool, exc)
            self.last_error = f"{type(exc).__name__}: {exc}"
            self.usage.rescan()
            raise
        self.drained += n      # before the rescan: an empty spool never shows rows not counted as drained
        self.usage.rescan()
        if self.last_error is not None:
            log.info("traffic log: drain of %s works again", self.spool)
            self.last_error = None
        return n

    def run_once(self, timeout_s: float) -> int:
        if not self.lock.acquire(timeout=max(0.0, timeout_s)):
            raise LogStoreError(f"traffic log: a drain of {self.spool} is still running after {timeout_s:g}s")
        try:
            return self._attempt(timeout_s)
        finally:
            self.lock.release()

    def _run(self) -> None:
        delay = 0.0 if self.usage.segments else self.interval_s
        failures = 0
        try:
            while True:
                self.wake.wait(delay)
                self.wake.clear()
                if self.stopping:
                    break
                try:
                    with self.lock:
                        self._attempt(self.busy_timeout_s)
                    failures, delay = 0, self.interval_s
                except Exception:
                    failures += 1
                    delay = min(self.interval_s * 2 ** failures, max(self.interval_s, _MAX_DRAIN_BACKOFF_S))
            with self.lock:
                self._final()
        finally:
            try:
                self.drain.close()
            except Exception as exc:
                log.warning("traffic log: closing the drain of %s failed: %s", self.spool, exc)

    def _final(self) -> None:
        if self.deadline is None:
            try:
                self._attempt(self.busy_timeout_s)
            except Exception:
                pass
            return
        pause = 0.02
        while self.usage.rescan()[1]:
            left = self.deadline - time.monotonic()
            if left <= 0:
                return
            try:
                n = self._attempt(left)
            except Exception:
                n = 0
            if n == 0 and self.usage.segments:
                time.sleep(max(0.0, min(pause, self.deadline - time.monotonic())))
                pause = min(pause * 2, 1.0)

    def stop(self, deadline: float | None) -> None:
        self.deadline = deadline
        self.stopping = True
        self.wake.set()
        wait = self.busy_timeout_s + 1.0 if deadline is None else max(0.0, deadline - time.monotonic()) + 0.5
        self.thread.join(wait)
        if self.thread.is_alive():
            log.warning("traffic log: the drain of %s is still running at close; what it has not moved "
                        "stays in the spool for the next start", self.spool)


class SpoolSink:
    """A :class:`~classifier.protocols.LogSink` and :class:`~logstore.drain.LabelSink`
    that never blocks the request path on I/O.

    ``write`` (and ``add_human_label`` / ``add_teacher_label``, which check nothing but
    the label's type: the decision may have been logged elsewhere) enqueue; the writer
    thread writes batches as segments into ``spool``; the drain thread hands them to
    ``drain`` every ``drain_interval_s`` (none without a drain: the segments wait in the
    spool for whoever ingests it). Past ``max_spool_bytes`` (``None``: no bound) of
    undrained segments, new batches are dropped and counted in :attr:`dropped`. See the
    module docstring. Records passed to ``write`` must not be mutated afterwards. Flushed
    and closed at interpreter exit if still open. :meth:`LogStore.open_sink` opens one
    that drains into that store.
    """

    def __init__(self, spool: str | Path, drain: SpoolDrain | None = None, *,
                 drain_interval_s: float = DEFAULT_DRAIN_INTERVAL_S,
                 max_spool_bytes: int | None = DEFAULT_MAX_SPOOL_BYTES,
                 flush_interval_s: float = 0.5, batch_size: int = 1000, max_buffer: int = 100_000,
                 fsync: bool = True, busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S) -> None:
        if batch_size < 1 or max_buffer < batch_size or flush_interval_s <= 0 or drain_interval_s <= 0:
            raise ValueError("need batch_size >= 1, max_buffer >= batch_size, flush_interval_s > 0, "
                             "drain_interval_s > 0")
        if max_spool_bytes is not None and max_spool_bytes <= 0:
            raise ValueError("max_spool_bytes must be positive (or None: unbounded)")
        self.spool = Path(spool)
        try:
            self.spool.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise LogStoreError(f"traffic log spool {self.spool} cannot be created: {exc}") from exc
        self.busy_timeout_s = float(busy_timeout_s)
        usage = _Usage(self.spool)
        self._w = _Writer(self.spool, usage, busy_timeout_s=self.busy_timeout_s,
                          flush_interval_s=flush_interval_s, batch_size=batch_size, max_buffer=max_buffer,
                          max_spool_bytes=max_spool_bytes, fsync=fsync)
        self._d = None if drain is None else _Drainer(self.spool, drain, usage, interval_s=drain_interval_s,
                                                      busy_timeout_s=self.busy_timeout_s)
        self._buf, self._wake, self._max = self._w.buf, self._w.wake, max_buffer
        self._batch = batch_size
        self._closed = False
        self._finalizer = weakref.finalize(self, _close_quietly, self._w, self._d)

    def __repr__(self) -> str:
        return f"SpoolSink({str(self.spool)!r}, {None if self._d is None else self._d.drain!r})"

    def write(self, record: DecisionRecord | LabelRecord) -> None:
        """Enqueue ``record`` (O(1)); blocks only while ``max_buffer`` records are queued.
        (A :class:`LabelRecord` too: what the label methods enqueue.)"""
        if self._w.stopping:  # closed, or flushed and stopped at interpreter exit
            raise LogStoreError(f"traffic log sink for {self.spool} is closed")
        buf = self._buf
        n = len(buf)
        if n >= self._batch:
            if n >= self._max:
                self._w.wait_for_room()
            self._wake.set()
        buf.append(record)

    def add_human_label(self, decision_id: str, label: str | None, *, author: str | None = None,
                        label_uid: str | None = None) -> bool:
        """Enqueue a human label (``None`` = out of scope) for the spool; see :class:`LabelSink`
        (the spool cannot tell a repeat: always ``True``; the log counts a repeat once)."""
        self.write(LabelRecord.human(decision_id, label, author=author, label_uid=label_uid))
        return True

    def add_teacher_label(self, decision_id: str, label: str | None, model: str, valid: bool,
                          latency_ms: float | None = None,
                          candidates: Sequence[str | None] | None = None) -> None:
        """Enqueue a teacher answer (an audit's, a back-filled one) for the spool; see :class:`LabelSink`."""
        self.write(LabelRecord.teacher(decision_id, label, model, valid, latency_ms, candidates))

    def add_shadow_answer(self, answer: ShadowAnswer) -> None:
        """Enqueue a shadow version's answer (a :class:`classifier.shadow.ShadowAnswer`) for
        the spool, as a ``source='shadow'`` label record of the decision."""
        self.write(LabelRecord.shadow(answer.decision_id, answer.version, answer.label,
                                      answer.confidence, answer.tier, answer.sure))

    def flush(self, timeout: float | None = None) -> int:
        """Block until every record written before this call is in a segment (or dropped
        by the spool bound); return the total number of rows this sink has written.
        Raises :class:`LogStoreError` when the spool stayed unwritable for
        ``busy_timeout_s`` (records stay buffered)."""
        if self._w.stopping:
            return self._w.written
        return self._w.flush(timeout)

    def drain_now(self, timeout_s: float | None = None) -> int:
        """Flush, then run one drain on this thread (after the drain thread's current one,
        if any); return the rows it moved. The drain's own error is raised (and counted).
        ``timeout_s`` (default ``busy_timeout_s``) bounds the wait and the drain."""
        if self._closed or self._w.stopping:
            raise LogStoreError(f"traffic log sink for {self.spool} is closed")
        if self._d is None:
            raise LogStoreError(f"traffic log sink for {self.spool} has no drain")
        timeout = self.busy_timeout_s if timeout_s is None else float(timeout_s)
        start = time.monotonic()
        self.flush(timeout)
        return self._d.run_once(timeout - (time.monotonic() - start))

    def close(self, grace_s: float | None = None) -> None:
        """Write what is queued to segments, then drain: until the spool is empty or
        ``grace_s`` (counted from this call) has passed, or, with ``None``, one attempt
        bounded by ``busy_timeout_s``. What is left stays in the spool for the next start.
        Stops both threads and closes the drain. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._finalizer.detach()
        _close(self._w, self._d, grace_s)

    @property
    def spool_id(self) -> str:
        """This spool's random id (see :func:`logstore.segments.spool_id`)."""
        return spool_id(self.spool)

    @property
    def written(self) -> int:
        """Rows (decisions and labels) written to segments."""
        return self._w.written

    @property
    def buffered(self) -> int:
        return len(self._buf)

    @property
    def rejected(self) -> int:
        """Malformed records dropped (no id/text/layer, wrong types): programming errors."""
        return self._w.rejected

    @property
    def dropped(self) -> int:
        """Rows not written because the spool held more than ``max_spool_bytes``."""
        return self._w.dropped

    @property
    def spool_bytes(self) -> int:
        """Bytes of finished segments in the spool, not drained yet (read now)."""
        return self._w.usage.rescan()[0]

    @property
    def spool_segments(self) -> int:
        """Finished segments in the spool, not drained yet (read now)."""
        return self._w.usage.rescan()[1]

    @property
    def drained(self) -> int:
        """Rows the drain has moved out of the spool."""
        return 0 if self._d is None else self._d.drained

    @property
    def drain_errors(self) -> int:
        """Drain calls that failed."""
        return 0 if self._d is None else self._d.errors

    @property
    def last_drain_error(self) -> str | None:
        """The latest drain failure, ``None`` once a drain succeeds again."""
        return None if self._d is None else self._d.last_error

    def __enter__(self) -> "SpoolSink":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _close(writer: _Writer, drainer: _Drainer | None, grace_s: float | None) -> None:
    deadline = None if grace_s is None else time.monotonic() + max(0.0, float(grace_s))
    try:
        writer.close()
    finally:
        if drainer is not None:
            drainer.stop(deadline)


def _close_quietly(writer: _Writer, drainer: _Drainer | None) -> None:
    try:
        _close(writer, drainer, None)
    except Exception as exc:  # at exit nobody can catch it
        log.error("%s", exc)
