"""Low-level access to the DuckDB traffic-log file, shared by the store and the sink.

:func:`connect` opens the file read-write, retrying DuckDB's lock error with bounded,
jittered exponential backoff, and raises :class:`LogStoreBusyError` when it stayed
locked for ``busy_timeout_s``; :func:`process_lock` serialises all opens of one file
within this process. Both :class:`logstore.store.LogStore` and the background writer
of :class:`logstore.drain.LocalIngest` go through here; see :mod:`logstore.store`
for the design.
"""

from __future__ import annotations

import os
import random
import threading
import time
from typing import Any, Sequence

import duckdb
import pyarrow as pa

from flywheel.logstore.errors import LogStoreBusyError, LogStoreError

__all__ = ["DEFAULT_BUSY_TIMEOUT_S", "stats", "connect", "process_lock", "arrow_table", "scalar"]

DEFAULT_BUSY_TIMEOUT_S = 30.0

#: Process-wide counters for diagnostics (benchmarks, tests): lock retries in :func:`connect`.
stats: dict[str, int] = {"opens": 0, "lock_retries": 0}

_process_locks: dict[str, threading.RLock] = {}
_process_locks_guard = threading.Lock()


def process_lock(path: str) -> threading.RLock:
    """The lock that serialises every open of the database at ``path`` in this process."""
    with _process_locks_guard:
        lock = _process_locks.get(path)
        if lock is None:
            lock = _process_locks[path] = threading.RLock()
        return lock


def _is_lock_error(exc: BaseException) -> bool:
    msg = str(exc).lower()
    return "lock" in msg and "permission denied" not in msg


def connect(path: str | os.PathLike[str],
            busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S) -> duckdb.DuckDBPyConnection:
    """Open ``path`` read-write, retrying DuckDB's lock error with bounded backoff.

    ``busy_timeout_s=0`` tries once. Raises :class:`LogStoreBusyError` when the file
    stayed locked that long and :class:`LogStoreError` for any other failure.
    """
    path = str(path)
    deadline = time.monotonic() + max(0.0, busy_timeout_s)
    delay = 0.005
    while True:
        try:
            con = duckdb.connect(path)
            stats["opens"] += 1
            return con
        except duckdb.IOException as exc:
            if not _is_lock_error(exc):
                raise LogStoreError(f"cannot open log database {path}: {exc}") from exc
            left = deadline - time.monotonic()
            if left <= 0:
                raise LogStoreBusyError(
                    f"log database is busy: {path} stayed locked by another process for "
                    f"{busy_timeout_s:g}s ({exc})") from exc
            stats["lock_retries"] += 1
            time.sleep(min(left, delay * (0.5 + random.random())))
            delay = min(delay * 2, 0.5)
        except duckdb.Error as exc:
            raise LogStoreError(f"cannot open log database {path}: {exc}") from exc


def scalar(con: duckdb.DuckDBPyConnection, sql: str, params: object = None) -> Any:
    """The first value of the one row ``sql`` returns (a count, an aggregate, ``INSERT``'s
    row count)."""
    row = con.execute(sql, params).fetchone()
    if row is None:
        raise LogStoreError(f"log database: no row from {sql!r}")
    return row[0]


def arrow_table(con: duckdb.DuckDBPyConnection, sql: str, params: Sequence[Any]) -> pa.Table:
    """Run a read query into an Arrow table (``to_arrow_table`` is ``arrow`` before duckdb 1.4)."""
    rel = con.sql(sql, params=list(params))
    fetch = getattr(rel, "to_arrow_table", None) or rel.arrow
    return fetch()
