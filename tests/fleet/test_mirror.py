"""fleet.mirror and fleet.bucket_labels against a real S3 server: the fleet's log into a local
DuckDB, every decision and label exactly once; labels from the command line."""

from __future__ import annotations

import time

import numpy as np
import pytest

from flywheel.classifier.decision import TeacherCall
from flywheel.fleet.bucket_labels import BucketLabels
from flywheel.fleet.mirror import MirrorReport, mirror
from flywheel.fleet.retention import redact_table
from flywheel.logstore import LabelRecord, LabelSink, LogStore, from_parquet, label_records_to_table, to_parquet
from flywheel.logstore.segments import records_to_table
from tests.support.bucket import log_keys, shipping_sink
from tests.support.records import rec

pytestmark = pytest.mark.slow   # every test here talks to the weed server


def ship(tmp_path, objects, name: str, records, labels=()) -> None:
    """Ship ``records`` (and ``(decision_id, label)`` human labels) through a replica's spool."""
    sink, _ = shipping_sink(tmp_path / name, objects)
    for r in records:
        sink.write(r)
    for did, label in labels:
        sink.add_human_label(did, label, author=name)
    sink.drain_now(10.0)
    sink.close(grace_s=10.0)


def test_mirror_twice_adds_nothing_the_second_time(tmp_path, objects):
    records = [rec(f"query {i}") for i in range(40)]
    ship(tmp_path, objects, "r1", records[:20], [(records[0].decision.id, "shipping")])
    ship(tmp_path, objects, "r1", records[20:])
    store = LogStore(tmp_path / "log.duckdb")
    calls = []
    first = mirror(objects, store, progress=lambda *a: calls.append(a), batch_rows=15)
    assert isinstance(first, MirrorReport)
    assert (first.objects, first.rows, first.skipped, first.bad) == (3, 41, 0, 0)
    assert first.bytes == sum(o.size for o in objects.list("log")) and first.seconds >= 0
    assert calls and calls[-1] == (3, 3, 41)
    again = mirror(objects, store)
    assert (again.objects, again.rows, again.skipped) == (0, 0, 3)
    assert store.count() == 40
    assert store.query("SELECT count(*) FROM labels")[0][0] == 1
    assert sorted(store.ingested_keys()) == log_keys(objects)
    vec = store.embeddings("enc-test", [records[7].decision.id])[records[7].decision.id]
    assert np.allclose(vec, records[7].embedding)


def test_two_replicas_one_mirror_every_row_exactly_once(tmp_path, objects):
    a = [rec(f"replica a {i}") for i in range(25)]
    b = [rec(f"replica b {i}", teacher=TeacherCall("llm", "billing", True, 9.0)) for i in range(25)]
    # each replica labels a decision the other one logged (Feedback at any replica)
    ship(tmp_path, objects, "a", a, [(b[0].decision.id, "shipping")])
    ship(tmp_path, objects, "b", b, [(a[0].decision.id, "billing"), (a[1].decision.id, None)])
    ship(tmp_path, objects, "a", [], [(b[0].decision.id, "refund")])   # a later correction wins
    store = LogStore(tmp_path / "log.duckdb")
    report = mirror(objects, store, batch_rows=7, workers=3)
    assert report.rows == 50 + 4 and report.bad == 0
    assert store.count() == 50
    assert store.query("SELECT count(DISTINCT decision_id), count(*) FROM decisions")[0] == (50, 50)
    assert store.query("SELECT count(*) FROM embeddings")[0][0] == 50
    rows = {r.decision_id: r for r in store.labelled_rows()}
    assert rows[b[0].decision.id].target == ("refund", "human")
    assert rows[b[0].decision.id].human_author == "a"
    assert rows[a[0].decision.id].target == ("billing", "human")
    assert rows[a[1].decision.id].target == (None, "human")
    assert rows[b[5].decision.id].target == ("billing", "teacher")
    assert len(rows) == 2 + 25
    assert mirror(objects, store).rows == 0


def test_a_row_under_two_keys_counts_once_and_a_redacted_copy_supersedes_its_original(tmp_path, objects):
    records = [rec(f"kept apart {i}") for i in range(5)]
    table = records_to_table(records)
    objects.put_if_absent("log/decisions/date=2026-01-01/aaaaaaaaaaaa-seg-1.parquet", to_parquet(table))
    objects.put_if_absent("log/decisions/date=2026-01-01/bbbbbbbbbbbb-seg-1.parquet", to_parquet(table.slice(2)))
    objects.put_if_absent("log/decisions/date=2026-01-01/cccccccccccc-seg-9.parquet", to_parquet(table))
    objects.put_if_absent("log/redacted/date=2026-01-01/cccccccccccc-seg-9.parquet",
                          to_parquet(redact_table(table)))
    fresh = LogStore(tmp_path / "fresh.duckdb")
    report = mirror(objects, fresh)
    assert (report.objects, report.skipped) == (3, 1)   # the original with a redacted copy is not read
    assert report.rows == 5 and fresh.count() == 5
    assert {t for (t,) in fresh.query("SELECT text FROM decisions")} == {""}   # the redacted copy went first
    assert "log/decisions/date=2026-01-01/cccccccccccc-seg-9.parquet" not in fresh.ingested_keys()


def test_an_unreadable_or_foreign_object_is_reported_and_does_not_block_the_rest(tmp_path, objects, caplog):
    objects.put_if_absent("log/decisions/date=2026-01-01/junk.parquet", b"not parquet")
    objects.put_if_absent("log/labels/date=2026-01-01/foreign.parquet",
                          to_parquet(records_to_table([rec()])))   # decisions under labels/
    objects.put_if_absent("log/decisions/date=2026-01-01/notes.txt", b"ignored")
    ship(tmp_path, objects, "r", [rec("good")])
    store = LogStore(tmp_path / "log.duckdb")
    report = mirror(objects, store)
    assert (report.objects, report.rows, report.bad) == (1, 1, 2)
    assert "junk.parquet" in caplog.text and "foreign.parquet" in caplog.text
    assert mirror(objects, store).bad == 2   # left for the next run, never recorded as in


def test_labels_from_the_command_line_win_by_time_and_count_once(tmp_path, objects):
    records = [rec("where is my parcel", teacher=TeacherCall("llm", "billing", True, 5.0)), rec("other")]
    ship(tmp_path, objects, "r", records)
    store = LogStore(tmp_path / "log.duckdb")
    mirror(objects, store)
    did = records[0].decision.id
    labels = BucketLabels(objects, store)
    assert isinstance(labels, LabelSink)

    labels.add_human_label(did, "shipping", author="ann")       # seen locally at once, no mirror
    assert {r.decision_id: r for r in store.labelled_rows()}[did].target == ("shipping", "human")
    time.sleep(0.01)
    labels.add_human_label(did, "refund", author="bob")         # the latest human label wins
    time.sleep(0.01)
    labels.add_teacher_label(did, "billing", "llm-2", True, 3.0)   # ... and beats any teacher label
    key = labels.add_many([LabelRecord.teacher(records[1].decision.id, "refund", "llm-2", True),
                           LabelRecord.teacher(records[1].decision.id, None, "llm-2", False)])
    assert key.startswith("log/labels/date=") and "/cli-" in key
    labels.add_human_label("decision-from-nowhere", "billing")   # accepted: checked at retrain by the join
    assert labels.add_many([]) is None

    row = {r.decision_id: r for r in store.labelled_rows()}[did]
    assert row.target == ("refund", "human") and row.human_author == "bob"
    assert row.teacher_labels == ("billing", "billing")
    assert mirror(objects, store).rows == 0                    # the CLI's objects are already in
    assert store.invalid_teacher_answers() == 1

    fresh = LogStore(tmp_path / "fresh.duckdb")                 # another host sees the same labels
    mirror(objects, fresh)
    frow = {r.decision_id: r for r in fresh.labelled_rows()}[did]
    assert (frow.target, frow.human_author, frow.teacher_labels) == (row.target, "bob", row.teacher_labels)
    assert fresh.query("SELECT count(*) FROM labels")[0][0] == store.query("SELECT count(*) FROM labels")[0][0] == 6
    assert labels.written_objects == 5 and labels.written_rows == 6


def test_a_label_object_written_twice_counts_once(tmp_path, objects):
    ship(tmp_path, objects, "r", [r := rec()])
    store = LogStore(tmp_path / "log.duckdb")
    mirror(objects, store)
    record = LabelRecord.human(r.decision.id, "billing")
    labels = BucketLabels(objects, store)
    key = labels.add_many([record])
    assert labels.add_many([record]) == key                     # a retry: "already exists" is the ack
    table = from_parquet(objects.get(key)[0])
    assert table.equals(label_records_to_table([record]))
    assert store.query("SELECT count(*) FROM labels")[0][0] == 1
    assert BucketLabels(objects).add_many([record]) == key      # without a local store
    assert len(log_keys(objects, "labels")) == 1
