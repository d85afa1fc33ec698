"""The traffic log: every decision flywheel makes, its labels and its layer-2 embedding,
in DuckDB.

Used as equals by the serving side (:mod:`service`, which writes through a
:class:`DuckDBLogSink`) and the offline side (:mod:`training`, which reads and labels
through a :class:`LogStore`). It depends on :mod:`classifier` only for the record types.

Modules: :mod:`~logstore.errors`, :mod:`~logstore.connection` (opening the file, lock
retries), :mod:`~logstore.schema` (migrations and the ``decision_labels`` view),
:mod:`~logstore.segments` (the spool's Arrow segments and their ingest),
:mod:`~logstore.sink` (the non-blocking write path) and :mod:`~logstore.store` (the
store and every query on the log's tables but ``flywheel stats``' report).
"""

from __future__ import annotations

from logstore.errors import LogStoreBusyError, LogStoreError, UnknownDecisionError
from logstore.schema import SCHEMA_VERSION
from logstore.sink import DuckDBLogSink
from logstore.store import LabelledRow, LogStore

__all__ = ["DuckDBLogSink", "LabelledRow", "LogStore", "LogStoreBusyError", "LogStoreError",
           "SCHEMA_VERSION", "UnknownDecisionError"]
