"""The traffic log's seams: where spooled segments go (:class:`SpoolDrain`) and who
takes labels (:class:`LabelSink`), with the local implementation of the first,
:class:`LocalIngest` (into the DuckDB file next to the spool).

A :class:`~logstore.sink.SpoolSink` writes segments into its spool and hands them to
its drain from a thread of its own; the fleet's shipper (``fleet.shipper``) is the
other drain, and :class:`~logstore.store.LogStore` and the sink are the two label sinks.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Protocol, Sequence, runtime_checkable

from flywheel.logstore.connection import connect, process_lock
from flywheel.logstore.errors import LogStoreBusyError, LogStoreError
from flywheel.logstore.segments import ingest_spool, list_segments

__all__ = ["LabelSink", "LocalIngest", "SpoolDrain"]


@runtime_checkable
class SpoolDrain(Protocol):
    """Moves a spool's finished segments somewhere durable.

    Contract:

    - ``drain(spool, timeout_s)`` moves the finished segments of ``spool``
      (:func:`logstore.segments.list_segments`, both kinds) and returns the rows moved.
      A segment file is deleted only after its destination acknowledged it, so a crash
      at any point loses nothing; the destination must make a segment moved twice
      count once. ``timeout_s`` bounds the call: no wait for a busy destination and no
      new work starts past it. A destination that is busy for now returns what it moved
      (maybe 0) and leaves the rest for the next call; a failure raises (the sink counts
      it, logs it once and backs off). Segments it cannot ever move are renamed aside
      (``*.bad``), never left to block the rest.
    - Called from one thread at a time (the sink's drain thread, or ``drain_now`` and
      ``close`` on the caller's thread), never from the request path.
    - ``close()`` releases what the drain holds; the sink calls it once, last.
    """

    def drain(self, spool: Path, timeout_s: float) -> int: ...

    def close(self) -> None: ...


@runtime_checkable
class LabelSink(Protocol):
    """Takes labels of logged decisions.

    Contract: ``label`` ``None`` means out of scope; a non-string label raises
    :class:`~logstore.errors.LogStoreError`. Labels are append-only: the latest human
    label of a decision wins, and always beats the teacher's. A teacher answer with
    ``valid=False`` is kept for statistics and never used as a label. An
    implementation that can check the decision id (:class:`~logstore.store.LogStore`)
    raises :class:`~logstore.errors.UnknownDecisionError` for one not in the log; one
    that cannot (:class:`~logstore.sink.SpoolSink`: the decision may have been logged
    by another replica) accepts it, and the label counts once its decision is in.

    The same label for the same decision from the same author is recorded once:
    ``add_human_label`` returns ``False`` (and writes nothing) when the log already holds a
    label of that ``label_uid`` (an import given again: :func:`~logstore.label_records.stable_label_uid`)
    or the decision's latest human label is this one from this author; ``True`` when it
    wrote (or queued) it. A sink that cannot look (the spool) queues it, and the log
    counts a repeat once (:meth:`~logstore.store.LogStore.count_new_labels`).

    ``add_teacher_label`` takes a teacher answer made after the decision (an audit's, a
    back-filled one). An unsure answer comes with ``valid=False`` and ``candidates``, its
    set as data (:attr:`classifier.decision.TeacherCall.candidates`: ``()`` "cannot
    tell", ``None`` out of scope among them), logged as ``labels.teacher_candidates``.
    """

    def add_human_label(self, decision_id: str, label: str | None, *, author: str | None = None,
                        label_uid: str | None = None) -> bool: ...

    def add_teacher_label(self, decision_id: str, label: str | None, model: str, valid: bool,
                          latency_ms: float | None = None,
                          candidates: Sequence[str | None] | None = None) -> None: ...


class LocalIngest:
    """A :class:`SpoolDrain` into the DuckDB traffic log at ``path``
    (:func:`logstore.segments.ingest_spool`: rows and segment names in one transaction,
    then the files are deleted).

    ``busy_timeout_s`` is the longest one drain waits for the database (capped by its
    ``timeout_s``): 0 (the default, what :meth:`LogStore.open_sink` uses) tries once.
    Busy -- a reader of this process holds the file (and ingests the spool itself) or
    another process does -- returns 0 and the rows wait, durable, for the next drain.
    Any other failure raises :class:`LogStoreError`.
    """

    def __init__(self, path: str | os.PathLike[str], busy_timeout_s: float = 0.0) -> None:
        self.path = str(path)
        self.busy_timeout_s = float(busy_timeout_s)

    def __repr__(self) -> str:
        return f"LocalIngest({self.path!r})"

    def drain(self, spool: Path, timeout_s: float) -> int:
        wait = max(0.0, min(self.busy_timeout_s, timeout_s))
        lock = process_lock(self.path)
        if not (lock.acquire(timeout=wait) if wait > 0 else lock.acquire(False)):
            return 0  # a reader of this process holds it, and ingests for us
        try:
            if not list_segments(spool):
                return 0
            con = connect(self.path, wait)
            try:
                return ingest_spool(con, spool)
            finally:
                con.close()
        except LogStoreBusyError:
            return 0  # another process holds the file; rows are durable in the spool
        except LogStoreError:
            raise
        except Exception as exc:
            raise LogStoreError(f"ingest of {spool} into {self.path} failed: {exc}") from exc
        finally:
            lock.release()

    def close(self) -> None:
        pass
