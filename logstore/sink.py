"""The traffic log's write path: :class:`DuckDBLogSink` and its background writer.

``DuckDBLogSink.write`` only appends to an in-memory deque; the writer thread
(:class:`_Writer`) turns queued records into Arrow IPC segment files in
``<path>.spool/`` and, every ``ingest_interval_s``, tries once to ingest them into
DuckDB. See :mod:`logstore.store` for the whole design (durability, back-pressure,
locking); :meth:`logstore.store.LogStore.open_sink` opens sinks.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections import deque
from pathlib import Path

from classifier.protocols import DecisionRecord
from logstore.connection import DEFAULT_BUSY_TIMEOUT_S, connect, process_lock
from logstore.errors import LogStoreBusyError, LogStoreError
from logstore.segments import ingest_spool, list_segments, records_to_table, write_segment

log = logging.getLogger("flywheel.logstore")  # the same logger as before the split

__all__ = ["DuckDBLogSink"]


class _Marker:
    __slots__ = ("event", "written")

    def __init__(self) -> None:
        self.event = threading.Event()
        self.written = 0


class _Writer:
    """The state shared by a sink and its background thread (which never references
    the sink itself, so an abandoned sink can be garbage collected and finalized)."""

    def __init__(self, path: str, spool: Path, *, busy_timeout_s: float, flush_interval_s: float,
                 batch_size: int, max_buffer: int, ingest_interval_s: float | None, fsync: bool) -> None:
        self.path, self.spool = path, spool
        self.busy_timeout_s = busy_timeout_s
        self.flush_interval_s = flush_interval_s
        self.batch_size = batch_size
        self.max_buffer = max_buffer
        self.ingest_interval_s = ingest_interval_s
        self.fsync = fsync
        self.buf: deque = deque()
        self.wake = threading.Event()
        self.room = threading.Condition(threading.Lock())
        self.drain_lock = threading.Lock()
        self.stopping = False
        self.written = 0            # rows durably in segments
        self.rejected = 0           # records that could not be converted (programming errors)
        self.segments = 0
        self.ingested = 0
        self.stuck: tuple[list, _Marker | None] | None = None
        self.error: BaseException | None = None
        self.ingest_error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="flywheel-logsink", daemon=True)
        self.thread.start()

    # -- background thread
    def _run(self) -> None:
        next_ingest = time.monotonic() + (self.ingest_interval_s or 0.0)
        retry = 0.0
        give_up_at = None
        while True:
            stopping = self.stopping
            if not stopping:
                self.wake.wait(retry or self.flush_interval_s)
                self.wake.clear()
            ok = self._drain()
            retry = 0.0 if ok else min(max(retry * 2, 0.05), 2.0)
            if ok and self.ingest_interval_s is not None and not stopping \
                    and time.monotonic() >= next_ingest:
                self._try_ingest(0.0)
                next_ingest = time.monotonic() + self.ingest_interval_s
            if stopping:
                if ok:
                    if self.ingest_interval_s is not None:
                        self._try_ingest(min(2.0, self.busy_timeout_s))
                    return
                give_up_at = give_up_at or time.monotonic() + self.busy_timeout_s
                if time.monotonic() >= give_up_at:
                    return
                time.sleep(retry)

    def _take(self) -> tuple[list, _Marker | None]:
        buf, out = self.buf, []
        while len(out) < self.batch_size:
            try:
                item = buf.popleft()
            except IndexError:
                break
            if item.__class__ is _Marker:
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
                records, marker = self.stuck
            else:
                records, marker = self._take()
                if not records and marker is None:
                    return True
            if records:
                try:
                    self.written += self._write(records)
                except Exception as exc:  # disk full, spool removed, ... : keep and retry
                    if self.error is None:
                        log.error("traffic log: cannot write %d records to %s (%s); "
                                  "buffering and retrying", len(records), self.spool, exc)
                    self.stuck, self.error = (records, marker), exc
                    return False
            self.stuck = self.error = None
            if marker is not None:
                marker.written = self.written
                marker.event.set()
            with self.room:
                self.room.notify_all()

    def _write(self, records: list) -> int:
        try:
            table = records_to_table(records)
        except Exception:
            good = []
            for r in records:
                try:
                    records_to_table([r])
                    good.append(r)
                except Exception as exc:
                    self.rejected += 1
                    log.error("traffic log: dropping malformed record %r: %s",
                              getattr(getattr(r, "decision", None), "id", r), exc)
            if not good:
                return 0
            table = records_to_table(good)
        write_segment(self.spool, table, fsync=self.fsync)
        self.segments += 1
        return table.num_rows

    def _try_ingest(self, busy_timeout_s: float) -> None:
        lock = process_lock(self.path)
        got = lock.acquire(timeout=busy_timeout_s) if busy_timeout_s > 0 else lock.acquire(False)
        if not got:  # a reader of this process holds it, and ingests for us
            return
        try:
            if not list_segments(self.spool):
                return
            con = connect(self.path, busy_timeout_s)
            try:
                self.ingested += ingest_spool(con, self.spool)
                self.ingest_error = None
            finally:
                con.close()
        except LogStoreBusyError:
            pass  # a reader holds the file; rows are durable in the spool, try later
        except Exception as exc:
            if self.ingest_error is None:
                log.warning("traffic log: ingest into %s failed (%s); rows stay in %s",
                            self.path, exc, self.spool)
            self.ingest_error = exc
        finally:
            lock.release()

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
            n = len(self.stuck[0]) if self.stuck else 0
            raise LogStoreError(f"traffic log closed with {n + len(self.buf)} records unwritten "
                                f"to {self.spool}: {self.error}")


class DuckDBLogSink:
    """A :class:`~classifier.protocols.LogSink` that never blocks the request path on I/O.

    ``write`` enqueues; a background thread writes batches to the spool; see the module
    docstring. Records passed to ``write`` must not be mutated afterwards. Get one from
    :meth:`logstore.store.LogStore.open_sink` (which has migrated ``path``). Flushed and
    closed at interpreter exit if still open.
    """

    def __init__(self, path: str, spool: Path, *, busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S,
                 flush_interval_s: float = 0.5, batch_size: int = 1000, max_buffer: int = 100_000,
                 ingest_interval_s: float | None = 10.0, fsync: bool = True) -> None:
        if batch_size < 1 or max_buffer < batch_size or flush_interval_s <= 0:
            raise ValueError("need batch_size >= 1, max_buffer >= batch_size, flush_interval_s > 0")
        self.path = path
        self._w = _Writer(path, spool, busy_timeout_s=busy_timeout_s, flush_interval_s=flush_interval_s,
                          batch_size=batch_size, max_buffer=max_buffer,
                          ingest_interval_s=ingest_interval_s, fsync=fsync)
        self._buf, self._wake, self._max = self._w.buf, self._w.wake, max_buffer
        self._batch = batch_size
        self._closed = False
        self._finalizer = weakref.finalize(self, _close_quietly, self._w)

    def write(self, record: DecisionRecord) -> None:
        """Enqueue ``record`` (O(1)); blocks only while ``max_buffer`` records are queued."""
        if self._w.stopping:  # closed, or flushed and stopped at interpreter exit
            raise LogStoreError(f"traffic log sink for {self.path} is closed")
        buf = self._buf
        n = len(buf)
        if n >= self._batch:
            if n >= self._max:
                self._w.wait_for_room()
            self._wake.set()
        buf.append(record)

    def flush(self, timeout: float | None = None) -> int:
        """Block until every record written before this call is durable; return the
        total number of rows this sink has written. Raises :class:`LogStoreError` when
        the spool stayed unwritable for ``busy_timeout_s`` (records stay buffered)."""
        if self._w.stopping:
            return self._w.written
        return self._w.flush(timeout)

    def close(self) -> None:
        """Flush, try a last ingest into DuckDB, stop the thread. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._finalizer.detach()
        self._w.close()

    @property
    def written(self) -> int:
        return self._w.written

    @property
    def buffered(self) -> int:
        return len(self._buf)

    @property
    def rejected(self) -> int:
        """Malformed records dropped (no id/text/layer, wrong types): programming errors."""
        return self._w.rejected

    def __enter__(self) -> "DuckDBLogSink":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _close_quietly(writer: _Writer) -> None:
    try:
        writer.close()
    except Exception as exc:  # at exit nobody can catch it
        log.error("%s", exc)
