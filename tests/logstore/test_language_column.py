"""The language of every query in the log (issue 34 item 4): ``decisions.language``, added by
migration 6 (an older database upgrades, its rows NULL), written from the decision through
the spool segments, and NULL for a segment or bucket object written before the column."""

from __future__ import annotations

import duckdb

from flywheel.logstore import LogStore
from flywheel.logstore.schema import MIGRATIONS, SCHEMA_VERSION
from flywheel.logstore.segments import SEGMENT_SCHEMA, insert_segments, records_to_table
from tests.support.records import make_record


def _record(did: str, language: str | None):
    return make_record(did, language=language)


def test_migration_6_adds_the_column_to_an_older_database(tmp_path):
    path = tmp_path / "v5.duckdb"
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE schema_version (version INTEGER PRIMARY KEY, applied_at TIMESTAMP NOT NULL)")
    for number, sql in MIGRATIONS[:5]:
        con.execute(sql)
        con.execute("INSERT INTO schema_version VALUES (?, now()::TIMESTAMP)", [number])
    con.execute("INSERT INTO decisions (decision_id, created_at, text, layer) "
                "VALUES ('old', TIMESTAMP '2025-01-01 00:00:00', 'hola', 'embedding')")
    con.close()
    store = LogStore(path)
    assert store.migrations_applied == [6] and store.schema_version == SCHEMA_VERSION
    assert store.query("SELECT decision_id, language FROM decisions") == [("old", None)]
    assert LogStore(path).migrations_applied == []


def test_the_language_is_written_through_the_spool(tmp_path):
    store = LogStore(tmp_path / "log.duckdb")
    assert SEGMENT_SCHEMA.field("language").type == "string"
    sink = store.open_sink()
    for did, lang in (("es-1", "es"), ("en-1", "en"), ("unk", "unknown"), ("none", None)):
        sink.write(_record(did, lang))
    sink.close()
    assert dict(store.query("SELECT decision_id, language FROM decisions")) == {
        "es-1": "es", "en-1": "en", "unk": "unknown", "none": None}


def test_a_segment_or_object_from_before_the_column_ingests_with_null(tmp_path):
    store = LogStore(tmp_path / "log.duckdb")
    old = records_to_table([_record("old-seg", "es")]).drop_columns(["language"])
    new = records_to_table([_record("new-seg", "es")])
    con = duckdb.connect(store.path)
    try:
        assert insert_segments(con, [("seg-0001.arrow", old), ("seg-0002.arrow", new)]) == 2
    finally:
        con.close()
    older = records_to_table([_record("old-obj", "en")]).drop_columns(["language"])
    assert store.insert_objects([("k/old", "decisions", older)]) == 1
    assert dict(store.query("SELECT decision_id, language FROM decisions")) == {
        "old-seg": None, "new-seg": "es", "old-obj": None}
