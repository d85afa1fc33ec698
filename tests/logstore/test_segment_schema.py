"""One shape, one owner: the log row. ``SEGMENT_SCHEMA`` (the spool segments' Arrow schema),
the ``decisions`` table that the migrations create, and ``records_to_table`` (which fills
the schema by column name) must agree, so a column added to one and forgotten in another
fails here instead of arriving as NULL."""

from __future__ import annotations

import dataclasses
import types

import duckdb
import numpy as np
import pyarrow as pa
import pytest

from flywheel.classifier.decision import Decision, Layer, Layer2Answer, TeacherCall, Tier
from flywheel.classifier.protocols import DecisionRecord
from flywheel.logstore import LogStore, LogStoreError, segments
from flywheel.logstore.segments import REQUIRED_COLUMNS, SEGMENT_SCHEMA, SegmentColumnError, records_to_table
from tests.support.records import make_record

SEGMENT_ONLY = {"embedding"}     # goes to the embeddings table (vector), not to decisions
TABLE_ONLY = {"logged_at"}       # filled when the rows reach the database


def _describe(rows) -> dict[str, tuple[str, bool]]:
    """``DESCRIBE``'s rows as ``{column: (type, nullable)}``."""
    return {name: (typ, null == "YES") for name, typ, null, *_ in rows}


@pytest.fixture(scope="module")
def log(tmp_path_factory) -> LogStore:
    return LogStore(tmp_path_factory.mktemp("schema") / "log.duckdb")       # migrated to the newest version


@pytest.fixture(scope="module")
def decisions(log) -> dict[str, tuple[str, bool]]:
    return _describe(log.query("DESCRIBE decisions"))


def _segment_types() -> dict[str, str]:
    """The SQL type DuckDB reads each segment column as (what ``INSERT ... BY NAME`` gets)."""
    con = duckdb.connect()
    try:
        con.register("seg", SEGMENT_SCHEMA.empty_table())
        return {name: typ for name, (typ, _) in _describe(con.execute("DESCRIBE SELECT * FROM seg").fetchall()).items()}
    finally:
        con.close()


def test_segment_columns_are_the_decisions_columns_with_the_same_types(log, decisions):
    seg = _segment_types()
    assert set(seg) - SEGMENT_ONLY == set(decisions) - TABLE_ONLY
    assert SEGMENT_ONLY <= set(seg) and TABLE_ONLY <= set(decisions)
    assert {n: seg[n] for n in set(seg) - SEGMENT_ONLY} == {n: decisions[n][0] for n in set(seg) - SEGMENT_ONLY}
    vector = _describe(log.query("DESCRIBE embeddings"))["vector"][0]
    assert seg["embedding"] == vector == "FLOAT[]"


def test_every_not_null_column_is_filled_for_a_bare_record(decisions):
    not_null = {n for n, (_, nullable) in decisions.items() if not nullable} - TABLE_ONLY
    assert set(REQUIRED_COLUMNS) <= not_null
    bare = DecisionRecord(decision=Decision(label=None, confidence=0.5, tier=Tier.NO_MATCH, layer=Layer.RULES,
                                            reason=""), text="x", created_at=None)
    table = records_to_table([bare])
    assert {n: table.column(n).null_count for n in sorted(not_null)} == dict.fromkeys(sorted(not_null), 0)


def _full_record() -> DecisionRecord:
    """A record in which every column has a value (no real call has both an error and candidates)."""
    r = make_record("full-1", embedding=np.ones(4, np.float32), audit=True, pending=True,
                    teacher=TeacherCall(model="m", label="billing", valid=False, latency_ms=12.5, error="none",
                                        candidates=("billing", None)), degraded="timeout", language="es")
    r.declared_type = "billing"
    r.layer2 = Layer2Answer(label="billing", confidence=0.4, tier=Tier.WEAK)
    return r


def test_a_full_record_fills_every_column_of_the_log(tmp_path):
    table = records_to_table([_full_record()])
    assert table.schema == SEGMENT_SCHEMA
    assert [n for n in table.column_names if table.column(n).null_count] == []
    store = LogStore(tmp_path / "log.duckdb")
    assert store.insert_objects([("test-full", "decisions", table)]) == 1
    names = [r[0] for r in store.query("DESCRIBE decisions")]
    row = dict(zip(names, store.query("SELECT * FROM decisions")[0]))
    assert [n for n, v in row.items() if v is None] == []
    assert (row["degraded"], row["l2_tier"], row["teacher_error"], row["declared_type"]) == (
        "timeout", "weak", "none", "billing")
    assert row["teacher_candidates"] == ["billing", None]
    assert row["language"] == "es"
    assert store.query("SELECT dim FROM embeddings") == [(4,)]


def test_a_schema_column_without_a_builder_is_refused(monkeypatch):
    monkeypatch.delitem(segments._COLUMNS, "degraded")
    with pytest.raises(SegmentColumnError, match="'degraded'.*nothing fills it") as err:
        records_to_table([make_record()])
    assert err.value.column == "degraded"


def test_a_builder_without_a_schema_column_is_refused(monkeypatch):
    monkeypatch.setitem(segments._COLUMNS, "forgotten", lambda b, t: pa.nulls(len(b.records)))
    with pytest.raises(SegmentColumnError, match="'forgotten'.*not in SEGMENT_SCHEMA"):
        records_to_table([make_record()])


def test_a_record_missing_a_column_is_refused():
    r = make_record()
    r.decision = dataclasses.replace(r.decision, id=None)
    with pytest.raises(SegmentColumnError, match="'decision_id'.*record #2 of 2") as err:
        records_to_table([make_record(), r])
    assert err.value.column == "decision_id"
    assert isinstance(err.value, ValueError) and isinstance(err.value, LogStoreError)
    r = make_record()
    r.text = None
    with pytest.raises(SegmentColumnError, match="'text'"):
        records_to_table([r])
    good = make_record()
    old = types.SimpleNamespace(**{k: v for k, v in vars(good).items() if k != "layer2"})   # no layer2
    with pytest.raises(SegmentColumnError, match="'l2_label'.*lacks its value") as err:
        records_to_table([old])
    assert err.value.column == "l2_label"
