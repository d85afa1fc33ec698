"""Labels from the command line on a host with a store: :class:`BucketLabels`.

``flywheel feedback`` and ``flywheel label`` run where no replica's spool is at hand,
so their labels go straight to the bucket: each call writes one Parquet object of
:data:`~logstore.label_records.LABEL_SCHEMA` rows, create-only, under
``log/labels/date=YYYY-MM-DD/cli-<label_uid>.parquet`` (the first record's uid and UTC
date). When a local :class:`~logstore.store.LogStore` is given, the same table is then
inserted into it under that key (:meth:`~logstore.store.LogStore.insert_objects`), so
``stats`` and ``retrain`` on this host see the label at once and the next mirror skips
the object: it counts once.

A :class:`~logstore.drain.LabelSink` that cannot check decision ids: the decision may
have been logged by a replica whose segment has not been mirrored yet. Every id is
accepted, even one the local store does not know; the retrain's join counts the label
once its decision is in. The latest human label wins and always beats the teacher's,
as everywhere (the labels keep their own ``created_at``).
"""

from __future__ import annotations

import logging
from datetime import datetime, timezone
from typing import Sequence

from flywheel.fleet.objects import ObjectStore
from flywheel.fleet.shipper import LOG_PREFIX
from flywheel.logstore.errors import LogStoreError
from flywheel.logstore.label_records import LabelRecord, label_records_to_table
from flywheel.logstore.segments import LABELS, to_parquet
from flywheel.logstore.store import LogStore

__all__ = ["BucketLabels"]

log = logging.getLogger("flywheel.fleet")


class BucketLabels:
    """A :class:`~logstore.drain.LabelSink` writing to the bucket of ``objects`` (and, when
    given, into ``store`` at once); see the module docstring. Raises
    :class:`~fleet.errors.StoreUnavailable` / :class:`~fleet.errors.FleetError` when the
    bucket refuses (nothing was written then). A local store that is busy only delays
    the local copy (logged; the next mirror brings it)."""

    def __init__(self, objects: ObjectStore, store: LogStore | None = None) -> None:
        self.objects = objects
        self.store = store
        self.written_rows = 0
        self.written_objects = 0

    def __repr__(self) -> str:
        return f"BucketLabels({self.objects!r}, {self.store!r})"

    def add_human_label(self, decision_id: str, label: str | None, *, author: str | None = None,
                        label_uid: str | None = None) -> bool:
        """Record a human label (``None`` = out of scope); the latest one wins. ``False``,
        and nothing written, when the local store already holds it
        (:meth:`~logstore.store.LogStore.is_recorded`: its ``label_uid``, or the same latest
        label from the same author). A ``label_uid`` given again names the same object
        (``cli-<label_uid>.parquet``, create-only), so two hosts that import the same
        export write it once, and every mirror keeps each ``label_uid`` once."""
        rec = LabelRecord.human(decision_id, label, author=author, label_uid=label_uid)
        if self.store is not None and self.store.is_recorded(rec):
            return False
        self.add_many([rec])
        return True

    def add_teacher_label(self, decision_id: str, label: str | None, model: str, valid: bool,
                          latency_ms: float | None = None,
                          candidates: Sequence[str | None] | None = None) -> None:
        """Record a teacher answer made after the decision (``valid=False``: kept for
        statistics only; ``candidates``: an unsure answer's set, see :class:`~logstore.drain.LabelSink`)."""
        self.add_many([LabelRecord.teacher(decision_id, label, model, valid, latency_ms, candidates)])

    def add_many(self, records: Sequence[LabelRecord]) -> str | None:
        """Write ``records`` as ONE object (create-only) and, with a store, insert them
        locally under its key; return the key (``None`` for no records)."""
        records = list(records)
        if not records:
            return None
        for r in records:
            if not isinstance(r, LabelRecord):
                raise TypeError(f"expected LabelRecord, got {type(r).__name__}")
        table = label_records_to_table(records)
        first = records[0]
        date = datetime.fromtimestamp(first.created_at, timezone.utc).strftime("%Y-%m-%d")
        key = f"{LOG_PREFIX[LABELS]}/date={date}/cli-{first.label_uid}.parquet"
        if not self.objects.put_if_absent(key, to_parquet(table)):
            log.info("labels: %s was already in the store (a retry)", key)
        self.written_rows += len(records)
        self.written_objects += 1
        if self.store is not None:
            try:
                self.store.insert_objects([(key, LABELS, table)])
            except LogStoreError as exc:  # the label is safe in the bucket
                log.warning("labels: %s is in the store but not yet in %s (%s); the next mirror brings it",
                            key, self.store.path, exc)
        return key

    def close(self) -> None:
        """Nothing to release."""

