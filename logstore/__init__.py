"""The traffic log: every decision flywheel makes, its labels and its layer-2 embedding,
in DuckDB.

Used as equals by the serving side (:mod:`service`, which writes through a
:class:`SpoolSink`) and the offline side (:mod:`training`, which reads and labels
through a :class:`LogStore`). It depends on :mod:`classifier` only for the record types.

Every SQL statement of the project is in this package (``tests/test_architecture.py``
checks that no other room holds one): the offline side asks its questions through named
reads with typed rows (:class:`LogReader`), never with SQL of its own.

Modules: :mod:`~logstore.errors`, :mod:`~logstore.connection` (opening the file, lock
retries), :mod:`~logstore.schema` (migrations and the ``decision_labels`` view),
:mod:`~logstore.label_records` (label records), :mod:`~logstore.segments` (the spool's Arrow
segments, their wire format and how their rows get in, exactly once),
:mod:`~logstore.arrow_build` (their arrays, built from buffers: no pandas import),
:mod:`~logstore.drain` (the :class:`SpoolDrain` and :class:`LabelSink` seams and
:class:`LocalIngest`), :mod:`~logstore.sink` (the non-blocking write path),
:mod:`~logstore.store` (the store: opening, ingesting, labels, retention, and the reads of
rows and vectors the retrain builds its training set from) and :mod:`~logstore.reads`
(the named reads behind ``flywheel stats``, the review queue, page and dashboard and the
teacher-noise estimate, and the :class:`LogReader` protocol they make up).
"""

from __future__ import annotations

from flywheel.logstore.drain import LabelSink, LocalIngest, SpoolDrain
from flywheel.logstore.errors import LogStoreBusyError, LogStoreError, UnknownDecisionError
from flywheel.logstore.label_records import LABEL_SCHEMA, LabelRecord, label_records_to_table
from flywheel.logstore.reads import LogReader
from flywheel.logstore.schema import SCHEMA_VERSION
from flywheel.logstore.segments import (
    SEGMENT_SCHEMA,
    from_parquet,
    insert_objects,
    segment_kind,
    spool_id,
    to_parquet,
)
from flywheel.logstore.sink import DEFAULT_MAX_SPOOL_BYTES, SpoolSink
from flywheel.logstore.store import LabelledRow, LogStore

__all__ = ["DEFAULT_MAX_SPOOL_BYTES", "LABEL_SCHEMA", "LabelRecord", "LabelSink", "LabelledRow", "LocalIngest",
           "LogReader", "LogStore", "LogStoreBusyError", "LogStoreError", "SCHEMA_VERSION", "SEGMENT_SCHEMA",
           "SpoolDrain", "SpoolSink", "UnknownDecisionError", "from_parquet", "insert_objects",
           "label_records_to_table", "segment_kind", "spool_id", "to_parquet"]
