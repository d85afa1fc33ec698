"""Label records: what a human or the teacher said about a logged decision.

A :class:`LabelRecord` travels like a decision: written by a
:class:`~logstore.sink.SpoolSink` into a label segment (``lab-*.arrow``, rows of
:data:`LABEL_SCHEMA`) and ingested into the ``labels`` table, or inserted directly by
:class:`~logstore.store.LogStore`. ``label_uid`` makes each record count once however
often its segment is shipped or mirrored.
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import pyarrow as pa

from flywheel.logstore.arrow_build import build, numeric
from flywheel.logstore.errors import LogStoreError
from flywheel.logstore.schema import SCHEMA_VERSION

__all__ = ["LABEL_COLUMNS_V3", "LABEL_SCHEMA", "LABEL_SOURCES", "LabelColumnError", "LabelRecord",
           "conform_labels", "label_records_to_table", "new_label_uid", "stable_label_uid"]

LABEL_SOURCES = ("human", "teacher", "shadow")

#: Columns a label segment of schema version 3 has; later columns are optional (filled
#: with nulls by :func:`conform_labels`).
LABEL_COLUMNS_V3 = ("label_uid", "decision_id", "source", "label", "model", "valid", "latency_ms", "author",
                    "created_at")

_LABEL_FIELDS: list[tuple[str, pa.DataType]] = [
    ("label_uid", pa.string()), ("decision_id", pa.string()), ("source", pa.string()),
    ("label", pa.string()), ("model", pa.string()), ("valid", pa.bool_()),
    ("latency_ms", pa.float64()), ("author", pa.string()), ("created_at", pa.timestamp("us")),
    # a shadow model's answer (source "shadow", model = its version): its confidence, its
    # tier, and whether it was sure (would have decided without the teacher)
    ("confidence", pa.float64()), ("tier", pa.string()), ("sure", pa.bool_()),
    # a teacher's unsure answer (schema version 5): the labels it could not pick between
    # (null among them: out of scope), [] for "cannot tell"; null when it was sure
    ("teacher_candidates", pa.list_(pa.string())),
]
LABEL_SCHEMA = pa.schema(_LABEL_FIELDS,
                         metadata={"flywheel.schema_version": str(SCHEMA_VERSION), "flywheel.kind": "labels"})


class LabelColumnError(LogStoreError, ValueError):
    """A column of :data:`LABEL_SCHEMA` has no builder in :func:`label_records_to_table` (a
    column added to the schema and forgotten there), or a builder has no column. ``column``
    names it."""

    def __init__(self, column: str, message: str) -> None:
        self.column = column
        super().__init__(f"label column {column!r}: {message}")


def new_label_uid() -> str:
    """A random id for one label record (32 hex chars)."""
    return os.urandom(16).hex()


def stable_label_uid(*parts: str | None) -> str:
    """The id of a label that an import may bring more than once (32 hex chars), the same
    for the same ``parts`` (say: where it comes from, the decision, the label, who gave it
    and the annotation's own id and time): written twice, it is still one label
    (:meth:`LogStore.add_human_label`, and every segment or object ingestion, keep each
    ``label_uid`` once)."""
    text = "\x1f".join("\x00" if p is None else p for p in parts)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


@dataclass(frozen=True)
class LabelRecord:
    """One label of one decision. ``label`` ``None`` = out of scope; ``source`` is
    ``"human"``, ``"teacher"`` or ``"shadow"`` (a shadow model version's answer, never a
    training label); a teacher record with ``valid=False`` is kept for statistics only;
    ``created_at`` is unix seconds. ``confidence``, ``tier`` and ``sure`` are set for
    shadow answers only; ``teacher_candidates`` for a teacher's unsure answer only
    (:attr:`classifier.decision.TeacherCall.candidates`: ``()`` "cannot tell", else the
    set; such a record is never valid)."""

    decision_id: str
    source: str
    label: str | None
    model: str | None = None
    valid: bool = True
    latency_ms: float | None = None
    author: str | None = None
    created_at: float = field(default_factory=time.time)
    label_uid: str = field(default_factory=new_label_uid)
    confidence: float | None = None
    tier: str | None = None
    sure: bool | None = None
    teacher_candidates: tuple[str | None, ...] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.decision_id, str) or not self.decision_id:
            raise LogStoreError(f"a label needs a decision id, got {self.decision_id!r}")
        if self.source not in LABEL_SOURCES:
            raise LogStoreError(f"label source must be one of {LABEL_SOURCES}, got {self.source!r}")
        if self.label is not None and not isinstance(self.label, str):
            raise LogStoreError(f"label must be a string or None, got {self.label!r}")
        if self.teacher_candidates is not None:
            if self.source != "teacher" or self.valid:
                raise LogStoreError("only a teacher's answer that is not valid (an unsure one) has candidates")
            if any(c is not None and not isinstance(c, str) for c in self.teacher_candidates):
                raise LogStoreError(f"candidates must be strings or None, got {self.teacher_candidates!r}")
            object.__setattr__(self, "teacher_candidates", tuple(self.teacher_candidates))

    @classmethod
    def human(cls, decision_id: str, label: str | None, *, author: str | None = None,
              label_uid: str | None = None) -> "LabelRecord":
        """A human label; ``label_uid`` for one an import may bring again
        (:func:`stable_label_uid`), else a new random one."""
        if label_uid is None:
            return cls(decision_id, "human", label, author=author)
        return cls(decision_id, "human", label, author=author, label_uid=label_uid)

    @classmethod
    def teacher(cls, decision_id: str, label: str | None, model: str, valid: bool,
                latency_ms: float | None = None,
                candidates: Sequence[str | None] | None = None) -> "LabelRecord":
        """A teacher's answer (an audit's or a back-filled one); ``candidates``: an unsure
        answer's set (``()``: "cannot tell"), with ``valid=False``."""
        return cls(decision_id, "teacher", label, model=model, valid=bool(valid),
                   latency_ms=None if latency_ms is None else float(latency_ms),
                   teacher_candidates=None if candidates is None else tuple(candidates))

    @classmethod
    def shadow(cls, decision_id: str, version: str, label: str | None, confidence: float, tier: str,
               sure: bool) -> "LabelRecord":
        """Shadow model ``version``'s answer for a decision the champion made."""
        return cls(decision_id, "shadow", label, model=version, confidence=float(confidence), tier=str(tier),
                   sure=bool(sure))


def conform_labels(table: pa.Table) -> pa.Table:
    """``table`` (label rows of this or an older schema version) with every column of
    :data:`LABEL_SCHEMA`, the ones it lacks as nulls."""
    names = set(table.schema.names)
    for f in LABEL_SCHEMA:
        if f.name not in names:
            table = table.append_column(f, pa.nulls(table.num_rows, f.type))
    return table


def _created_at(records: Sequence[LabelRecord], t: pa.DataType) -> pa.Array:
    created = np.fromiter((r.created_at for r in records), dtype=np.float64, count=len(records))
    return numeric((created * 1e6).astype(np.int64), t)


#: How each column of :data:`LABEL_SCHEMA` is filled, by name: ``(records, arrow type) ->
#: array``. :func:`label_records_to_table` refuses a schema column missing here, and one
#: here missing from the schema.
_COLUMNS: dict[str, Callable[[Sequence[LabelRecord], pa.DataType], pa.Array]] = {
    "label_uid": lambda rs, t: build([r.label_uid for r in rs], t),
    "decision_id": lambda rs, t: build([r.decision_id for r in rs], t),
    "source": lambda rs, t: build([r.source for r in rs], t),
    "label": lambda rs, t: build([r.label for r in rs], t),
    "model": lambda rs, t: build([r.model for r in rs], t),
    "valid": lambda rs, t: build([bool(r.valid) for r in rs], t),
    "latency_ms": lambda rs, t: build([None if r.latency_ms is None else float(r.latency_ms) for r in rs], t),
    "author": lambda rs, t: build([r.author for r in rs], t),
    "created_at": _created_at,
    "confidence": lambda rs, t: build([r.confidence for r in rs], t),
    "tier": lambda rs, t: build([r.tier for r in rs], t),
    "sure": lambda rs, t: build([r.sure for r in rs], t),
    "teacher_candidates": lambda rs, t: build([None if r.teacher_candidates is None
                                                  else list(r.teacher_candidates) for r in rs], t),
}


def label_records_to_table(records: Sequence[LabelRecord]) -> pa.Table:
    """Label records as one Arrow table of :data:`LABEL_SCHEMA`, column by column name.

    Raises :class:`LabelColumnError` (a ``ValueError``) for a schema column without a
    builder here, or a builder without a column."""
    extra = sorted(set(_COLUMNS) - set(LABEL_SCHEMA.names))
    if extra:
        raise LabelColumnError(extra[0], "is built but not in LABEL_SCHEMA")
    cols: list[pa.Array] = []
    for f in LABEL_SCHEMA:
        build = _COLUMNS.get(f.name)
        if build is None:
            raise LabelColumnError(f.name, "is in LABEL_SCHEMA but nothing fills it")
        cols.append(build(records, f.type))
    return pa.Table.from_arrays(cols, schema=LABEL_SCHEMA)
