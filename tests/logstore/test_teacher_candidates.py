"""A teacher's unsure answer is data (issue 33): ``teacher_candidates`` on ``decisions`` (the
inline call) and on ``labels`` (an audit's or a back-filled answer), read through the
``unsure_answers`` view; migration 5 turns the prose older code wrote into ``teacher_error``
(``unsure: teacher unsure between A, B``) into the column once, and so does ingesting a
segment written by older code; older label segments ingest with no set."""

from __future__ import annotations

import time

import duckdb

from flywheel.classifier.decision import TeacherCall
from flywheel.logstore import LabelRecord, LogStore, label_records_to_table
from flywheel.logstore.label_records import LABEL_COLUMNS_V3
from flywheel.logstore.schema import MIGRATIONS, SCHEMA_VERSION
from flywheel.logstore.segments import insert_segments, records_to_table
from tests.support.records import make_record

OLD_UNSURE = [   # (decision_id, teacher_valid, teacher_error) as code before migration 5 logged them
    ("set", False, "unsure: teacher unsure between billing, OUT_OF_SCOPE, shipping"),
    ("cannot", False, "unsure: teacher cannot tell"),
    ("cut", False, "unsure"),                          # retention cut it to its kind
    ("failed", False, "timeout: no answer in 5 s"),
    ("sure", True, None),
]


def _v4_database(path) -> None:
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE schema_version (version INTEGER PRIMARY KEY, applied_at TIMESTAMP NOT NULL)")
    for number, sql in MIGRATIONS[:4]:
        con.execute(sql)
        con.execute("INSERT INTO schema_version VALUES (?, now()::TIMESTAMP)", [number])
    for i, (did, valid, error) in enumerate(OLD_UNSURE):
        con.execute("INSERT INTO decisions (decision_id, created_at, text, layer, teacher_model, teacher_valid, "
                    "teacher_error) VALUES (?, TIMESTAMP '2025-01-01 00:00:00' + to_seconds(?), 'hi', 'llm', "
                    "'m', ?, ?)", [did, i, valid, error])
    con.execute("INSERT INTO labels (decision_id, source, label, model, valid, created_at) "
                "VALUES ('failed', 'teacher', NULL, 'm', false, TIMESTAMP '2025-01-02 00:00:00')")
    con.close()


def test_migration_5_moves_the_old_unsure_prose_into_the_column(tmp_path):
    path = tmp_path / "v4.duckdb"
    _v4_database(path)
    store = LogStore(path)
    assert store.migrations_applied == [5, 6] and store.schema_version == SCHEMA_VERSION == 6
    rows = dict(((r[0]), r[1:]) for r in store.query(
        "SELECT decision_id, teacher_candidates, teacher_error FROM decisions"))
    assert rows == {"set": (["billing", None, "shipping"], None), "cannot": ([], None), "cut": ([], None),
                    "failed": (None, "timeout: no answer in 5 s"), "sure": (None, None)}
    assert store.query("SELECT teacher_candidates FROM labels") == [(None,)]   # an old label has no set
    assert store.unsure_teacher_answers() == 3
    assert store.unsure_candidate_sets() == [("billing", None, "shipping")]
    assert LogStore(path).migrations_applied == []


def test_a_segment_written_before_migration_5_ingests_with_its_set(tmp_path):
    store = LogStore(tmp_path / "log.duckdb")
    old = [make_record("old-set", teacher=TeacherCall("m", None, False, 3.0,
                                                      "unsure: teacher unsure between billing, shipping")),
           make_record("old-fail", teacher=TeacherCall("m", None, False, 3.0, "malformed: not JSON"))]
    v4 = records_to_table(old).drop_columns(["teacher_candidates"])
    new = records_to_table([make_record("new-set", teacher=TeacherCall("m", None, False, 3.0,
                                                                      candidates=("shipping", "billing")))])
    con = duckdb.connect(store.path)
    try:
        assert insert_segments(con, [("seg-0001.arrow", v4), ("seg-0002.arrow", new)]) == 3
    finally:
        con.close()
    got = dict((r[0], r[1:]) for r in store.query("SELECT decision_id, teacher_candidates, teacher_error "
                                                  "FROM decisions"))
    assert got == {"old-set": (["billing", "shipping"], None), "old-fail": (None, "malformed: not JSON"),
                   "new-set": (["shipping", "billing"], None)}
    # a bucket object written before it, too (the fleet's mirror)
    older = records_to_table([make_record("obj-set", teacher=TeacherCall(
        "m", None, False, 3.0, "unsure: teacher cannot tell"))]).drop_columns(["teacher_candidates"])
    assert store.insert_objects([("k/old", "decisions", older)]) == 1
    assert store.query("SELECT teacher_candidates FROM decisions WHERE decision_id = 'obj-set'") == [([],)]


def test_a_label_segment_written_before_migration_5_ingests_without_a_set(tmp_path):
    store = LogStore(tmp_path / "log.duckdb")
    store.insert_objects([("k/d", "decisions", records_to_table([make_record("d1")]))])
    v3 = label_records_to_table([LabelRecord.teacher("d1", None, "m", False, 2.0)]).select(list(LABEL_COLUMNS_V3))
    assert store.insert_objects([("k/l", "labels", v3)]) == 1
    assert store.query("SELECT valid, teacher_candidates FROM labels") == [(False, None)]
    assert store.unsure_teacher_answers() == 0


def test_an_audit_or_back_filled_unsure_answer_is_logged_with_its_set(tmp_path):
    store = LogStore(tmp_path / "log.duckdb")
    sink = store.open_sink()
    sink.write(make_record("inline", teacher=TeacherCall("m", None, False, 1.0, candidates=("billing", "shipping"))))
    for did in ("audited", "spooled", "cannot"):
        sink.write(make_record(did))
    sink.close()
    store.add_teacher_label("audited", None, "m", False, 4.0, candidates=("shipping", None))   # straight in
    spool = store.open_sink()
    spool.add_teacher_label("spooled", None, "m", False, 4.0, candidates=("billing", "shipping", None))
    spool.add_teacher_label("cannot", None, "m", False, 4.0, candidates=())
    spool.add_teacher_label("elsewhere", None, "m", False, 4.0, candidates=("a", "b"))   # decision not in yet
    spool.close()
    assert store.query("SELECT decision_id, teacher_candidates FROM labels ORDER BY decision_id") == [
        ("audited", ["shipping", None]), ("cannot", []), ("elsewhere", ["a", "b"]),
        ("spooled", ["billing", "shipping", None])]
    assert store.unsure_teacher_answers() == 4            # inline, audited, spooled, cannot
    assert store.invalid_teacher_answers() == 4
    assert store.unsure_candidate_sets() == [("billing", "shipping"), ("shipping", None),
                                             ("billing", "shipping", None)]
    assert store.unsure_candidate_sets(since=time.time() + 60) == []
    assert store.labelled_rows() == []                    # never a training label
