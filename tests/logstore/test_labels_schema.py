"""One shape, one owner: the label row. ``LABEL_SCHEMA`` (the label segments' Arrow schema),
the ``labels`` table that the migrations create, :class:`LabelRecord` and
``label_records_to_table`` (which fills the schema by column name) must agree, so a column
added to one and forgotten in another fails here instead of arriving as NULL."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timezone

import duckdb
import pyarrow as pa
import pytest

from flywheel.logstore import LogStore, LogStoreError, label_records
from flywheel.logstore.label_records import (
    LABEL_COLUMNS_V3,
    LABEL_SCHEMA,
    LabelColumnError,
    LabelRecord,
    conform_labels,
    label_records_to_table,
)

TABLE_ONLY = {"label_id", "logged_at"}   # filled when the rows reach the database


def _describe(rows) -> dict[str, tuple[str, bool]]:
    """``DESCRIBE``'s rows as ``{column: (type, nullable)}``."""
    return {name: (typ, null == "YES") for name, typ, null, *_ in rows}


@pytest.fixture(scope="module")
def labels_table(tmp_path_factory) -> dict[str, tuple[str, bool]]:
    log = LogStore(tmp_path_factory.mktemp("schema") / "log.duckdb")      # migrated to the newest version
    return _describe(log.query("DESCRIBE labels"))


def _schema_types() -> dict[str, str]:
    """The SQL type DuckDB reads each label column as (what ``INSERT ... SELECT`` gets)."""
    con = duckdb.connect()
    try:
        con.register("lab", LABEL_SCHEMA.empty_table())
        return {name: typ for name, (typ, _) in _describe(con.execute("DESCRIBE SELECT * FROM lab").fetchall()).items()}
    finally:
        con.close()


def test_label_columns_are_the_labels_table_columns_with_the_same_types(labels_table):
    schema = _schema_types()
    assert set(schema) == set(labels_table) - TABLE_ONLY
    assert TABLE_ONLY <= set(labels_table)
    assert schema == {n: labels_table[n][0] for n in schema}
    assert set(LABEL_COLUMNS_V3) <= set(schema)


def test_label_columns_are_the_record_fields():
    assert {f.name for f in dataclasses.fields(LabelRecord)} == set(LABEL_SCHEMA.names)


def test_every_not_null_column_is_filled_for_a_bare_record(labels_table):
    not_null = {n for n, (_, nullable) in labels_table.items() if not nullable} - TABLE_ONLY
    assert {"decision_id", "source", "valid", "created_at"} <= not_null
    table = label_records_to_table([LabelRecord.human("d-1", None)])
    assert table.schema == LABEL_SCHEMA and table.schema.metadata == LABEL_SCHEMA.metadata
    assert {n: table.column(n).null_count for n in sorted(not_null)} == dict.fromkeys(sorted(not_null), 0)


def _full_record() -> LabelRecord:
    """A record in which every column has a value (no real record fills them all: the
    shadow columns and an unsure teacher answer's candidates)."""
    return LabelRecord("d-1", "teacher", "billing", model="v2", valid=False, latency_ms=12.5, author="ana",
                       created_at=1_700_000_000.25, confidence=0.4, tier="weak", sure=False,
                       teacher_candidates=("billing", None))


def test_a_full_record_fills_every_column_of_the_labels_table(tmp_path):
    record = _full_record()
    table = label_records_to_table([record])
    assert [n for n in table.column_names if table.column(n).null_count] == []
    store = LogStore(tmp_path / "log.duckdb")
    assert store.insert_objects([("test-full", "labels", table)]) == 1
    names = [r[0] for r in store.query("DESCRIBE labels")]
    row = dict(zip(names, store.query("SELECT * FROM labels")[0]))
    assert [n for n, v in row.items() if v is None] == []
    assert {n: row[n] for n in LABEL_SCHEMA.names if n not in ("created_at", "teacher_candidates")} == {
        n: getattr(record, n) for n in LABEL_SCHEMA.names if n not in ("created_at", "teacher_candidates")}
    assert row["teacher_candidates"] == ["billing", None]
    assert row["created_at"] == datetime.fromtimestamp(record.created_at, timezone.utc).replace(tzinfo=None)


def test_older_label_rows_are_conformed_to_the_schema():
    v3 = label_records_to_table([_full_record()]).select(list(LABEL_COLUMNS_V3))
    table = conform_labels(v3)
    assert set(table.column_names) == set(LABEL_SCHEMA.names)
    assert [table.column(n).null_count for n in ("confidence", "tier", "sure", "teacher_candidates")] == [1] * 4


def test_only_an_unsure_teacher_answer_has_candidates():
    rec = LabelRecord.teacher("d-1", None, "m", False, candidates=["A", None])
    assert rec.teacher_candidates == ("A", None)
    assert LabelRecord.teacher("d-1", None, "m", False, candidates=()).teacher_candidates == ()
    with pytest.raises(LogStoreError, match="unsure"):
        LabelRecord.teacher("d-1", "A", "m", True, candidates=("A", "B"))
    with pytest.raises(LogStoreError, match="unsure"):
        LabelRecord("d-1", "human", "A", teacher_candidates=("A", "B"))
    with pytest.raises(LogStoreError, match="strings or None"):
        LabelRecord.teacher("d-1", None, "m", False, candidates=("A", 3))  # type: ignore[arg-type]


def test_a_schema_column_without_a_builder_is_refused(monkeypatch):
    monkeypatch.delitem(label_records._COLUMNS, "tier")
    with pytest.raises(LabelColumnError, match="'tier'.*nothing fills it") as err:
        label_records_to_table([_full_record()])
    assert err.value.column == "tier"
    assert isinstance(err.value, ValueError) and isinstance(err.value, LogStoreError)


def test_a_builder_without_a_schema_column_is_refused(monkeypatch):
    monkeypatch.setitem(label_records._COLUMNS, "forgotten", lambda rs, t: pa.nulls(len(rs)))
    with pytest.raises(LabelColumnError, match="'forgotten'.*not in LABEL_SCHEMA"):
        label_records_to_table([_full_record()])
