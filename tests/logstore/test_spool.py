"""Tests of the spool seams: SpoolSink's drain thread and bound, label segments,
exactly-once object inserts, migration 3, the spool id and decision-id tags."""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path

import duckdb
import pytest

from flywheel.classifier import decision as decision_mod
from flywheel.classifier.decision import (
    Decision,
    Layer,
    Tier,
    carries_this_process_tag,
    looks_like_decision_id,
    made_by_this_process,
    new_decision_id,
)
from flywheel.classifier.protocols import DecisionRecord
from flywheel.logstore import (
    LABEL_SCHEMA,
    LabelRecord,
    LabelSink,
    LocalIngest,
    LogStore,
    LogStoreError,
    SpoolDrain,
    SpoolSink,
    UnknownDecisionError,
    from_parquet,
    label_records_to_table,
    segment_kind,
    spool_id,
    to_parquet,
)
from flywheel.logstore.schema import MIGRATIONS, SCHEMA_VERSION
from flywheel.logstore.segments import insert_objects, list_segments, read_segment, records_to_table


def rec(did: str, text: str = "hello", embedding=None) -> DecisionRecord:
    d = Decision(label="billing", confidence=0.9, tier=Tier.CONFIDENT, layer=Layer.EMBEDDING,
                 reason="t", id=did)
    return DecisionRecord(decision=d, text=text, created_at=time.time(), encoder_id="enc-test",
                          embedding=embedding)


def wait_until(pred, timeout: float = 10.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.01)
    return pred()


class Mover:
    """A SpoolDrain that moves segments into a list: ``per_call`` at most each call,
    after ``delay_s``; ``fail`` makes it raise; ``hang`` blocks it until released."""

    def __init__(self, *, per_call: int | None = None, delay_s: float = 0.0) -> None:
        self.per_call, self.delay_s = per_call, delay_s
        self.moved: list[tuple[str, object]] = []
        self.fail: Exception | None = None
        self.hang = threading.Event()
        self.hang.set()
        self.entered = threading.Event()
        self.calls = 0
        self.closed = False

    def drain(self, spool: Path, timeout_s: float) -> int:
        self.calls += 1
        self.entered.set()
        assert self.hang.wait(20.0), "test drain never released"
        if self.fail is not None:
            raise self.fail
        time.sleep(self.delay_s)
        rows = 0
        for name in list_segments(spool)[:self.per_call]:
            table = read_segment(spool / name)
            self.moved.append((name, table))
            os.unlink(spool / name)  # acknowledged, then deleted
            rows += table.num_rows
        return rows

    def close(self) -> None:
        self.closed = True


# ---------------------------------------------------------------- protocols and names

def test_protocols_are_implemented(tmp_path):
    store = LogStore(tmp_path / "p.duckdb")
    sink = store.open_sink(ingest_interval_s=None)
    assert isinstance(LocalIngest(store.path), SpoolDrain) and isinstance(Mover(), SpoolDrain)
    assert isinstance(sink, LabelSink) and isinstance(store, LabelSink)
    sink.close()


def test_segment_kind():
    assert segment_kind("seg-00000000000000000001-12-00000000.arrow") == "decisions"
    assert segment_kind("lab-00000000000000000001-12-00000000.arrow") == "labels"
    assert segment_kind("log/labels/date=2026-01-02/0123456789ab-lab-0001-2-3.parquet") == "labels"
    assert segment_kind("log/decisions/date=2026-01-02/0123456789ab-seg-0001-2-3.parquet") == "decisions"
    with pytest.raises(ValueError):
        segment_kind("SPOOL_ID")


# ---------------------------------------------------------------- the drain thread

def test_hanging_drain_never_blocks_write(tmp_path):
    drain = Mover()
    drain.hang.clear()  # every drain call blocks until released
    sink = SpoolSink(tmp_path / "spool", drain, drain_interval_s=0.01, flush_interval_s=0.01,
                     batch_size=100, fsync=False, busy_timeout_s=1.0)
    try:
        sink.write(rec("first"))
        assert sink.flush(timeout=5.0) == 1
        assert drain.entered.wait(5.0), "the drain thread never called the drain"
        t0 = time.perf_counter()
        for i in range(3000):
            sink.write(rec(f"w{i}"))
        assert time.perf_counter() - t0 < 1.0
        assert sink.flush(timeout=5.0) == 3001  # segments keep being written meanwhile
        assert sink.spool_segments >= 2 and sink.drained == 0
        with pytest.raises(LogStoreError, match="still running"):
            sink.drain_now(timeout_s=0.2)
    finally:
        drain.hang.set()
    assert wait_until(lambda: sink.drained == 3001)
    assert sink.spool_segments == 0 and sink.spool_bytes == 0
    sink.close(grace_s=2.0)
    assert drain.closed


def test_failing_drain_is_counted_backs_off_and_recovers(tmp_path, caplog):
    drain = Mover()
    drain.fail = OSError("store refused")
    sink = SpoolSink(tmp_path / "spool", drain, drain_interval_s=0.05, flush_interval_s=0.01, fsync=False)
    for i in range(10):
        sink.write(rec(f"f{i}"))
    with caplog.at_level(logging.INFO, logger="flywheel.logstore"):
        with pytest.raises(OSError, match="refused"):
            sink.drain_now(timeout_s=5.0)
        assert wait_until(lambda: sink.drain_errors >= 3)
        time.sleep(0.3)
        assert drain.calls <= 8, "a failing drain must be retried with backoff"
        assert sink.last_drain_error == "OSError: store refused"
        assert sink.written == 10 and sink.spool_segments == 1
        drain.fail = None
        assert sink.drain_now(timeout_s=5.0) == 10
    assert sink.last_drain_error is None and sink.drained == 10
    assert caplog.text.count("failed (store refused)") == 1 and "works again" in caplog.text
    sink.close()


def test_drain_now_with_local_ingest(tmp_path):
    store = LogStore(tmp_path / "d.duckdb")
    sink = store.open_sink(ingest_interval_s=60.0, fsync=False)
    for i in range(5):
        sink.write(rec(f"n{i}"))
    assert sink.drain_now() == 5 and sink.drained == 5 and sink.spool_segments == 0
    sink.close()
    assert store.count() == 5
    with pytest.raises(LogStoreError, match="closed"):
        sink.drain_now()


# ---------------------------------------------------------------- the spool bound

def test_spool_bound_drops_counts_and_recovers(tmp_path, caplog):
    drain = Mover()
    sink = SpoolSink(tmp_path / "spool", drain, drain_interval_s=3600.0, max_spool_bytes=1,
                     flush_interval_s=0.01, fsync=False)
    with caplog.at_level(logging.WARNING, logger="flywheel.logstore"):
        sink.write(rec("kept"))
        assert sink.flush(timeout=5.0) == 1  # an empty spool takes a batch of any size
        assert sink.spool_bytes > 1
        for i in range(3):  # three more batches: each dropped
            sink.write(rec(f"x{i}"))
            sink.write(rec(f"y{i}"))
            assert sink.flush(timeout=5.0) == 1
        sink.add_human_label("kept", "billing")
        sink.flush(timeout=5.0)
        assert sink.dropped == 7 and sink.written == 1 and sink.spool_segments == 1
        assert caplog.text.count("dropping new records") == 1
        assert sink.drain_now(timeout_s=5.0) == 1  # shipped: under the bound again
        sink.write(rec("after"))
        assert sink.flush(timeout=5.0) == 2
    assert "under its bound again; 7 records were dropped" in caplog.text
    assert sink.dropped == 7
    sink.close(grace_s=5.0)
    moved = [t.column("decision_id").to_pylist() for _, t in drain.moved]
    assert moved == [["kept"], ["after"]]


# ---------------------------------------------------------------- close(grace_s)

def test_close_drains_within_grace_and_leaves_the_rest(tmp_path):
    spool = tmp_path / "spool"
    slow = Mover(per_call=1, delay_s=0.25)
    sink = SpoolSink(spool, slow, drain_interval_s=3600.0, batch_size=1, max_buffer=10,
                     flush_interval_s=0.01, fsync=False)
    for i in range(12):
        sink.write(rec(f"g{i}"))
    sink.flush(timeout=5.0)
    assert sink.spool_segments == 12
    t0 = time.monotonic()
    sink.close(grace_s=1.0)
    took = time.monotonic() - t0
    assert took < 2.0, took
    assert 1 <= len(slow.moved) < 12 and slow.closed
    left = list_segments(spool)
    assert len(left) == 12 - len(slow.moved)
    # the next start drains what was left, at once
    fast = Mover()
    again = SpoolSink(spool, fast, drain_interval_s=3600.0, fsync=False)
    assert wait_until(lambda: again.drained == len(left), 5.0)
    again.close(grace_s=1.0)
    ids = [t.column("decision_id")[0].as_py() for _, t in slow.moved + fast.moved]
    assert sorted(ids) == sorted(f"g{i}" for i in range(12))


def test_close_grace_with_hanging_drain_returns(tmp_path):
    drain = Mover()
    drain.hang.clear()
    sink = SpoolSink(tmp_path / "spool", drain, drain_interval_s=0.01, flush_interval_s=0.01, fsync=False)
    sink.write(rec("h"))
    sink.flush(timeout=5.0)
    assert drain.entered.wait(5.0)
    t0 = time.monotonic()
    sink.close(grace_s=0.3)
    assert time.monotonic() - t0 < 2.0
    assert (tmp_path / "spool").exists() and len(list_segments(tmp_path / "spool")) == 1
    drain.hang.set()


# ---------------------------------------------------------------- labels through the spool

def test_labels_through_the_spool_land_with_label_uid(tmp_path):
    store = LogStore(tmp_path / "l.duckdb")
    sink = store.open_sink(ingest_interval_s=None, fsync=False)
    sink.write(rec("d1"))
    sink.add_human_label("d1", "refund", author="ann")
    sink.add_teacher_label("d1", "billing", "llama3", True, 12.5)
    sink.add_teacher_label("elsewhere", "billing", "llama3", True)  # made at another replica
    with pytest.raises(LogStoreError, match="string or None"):
        sink.add_human_label("d1", 3)  # type: ignore[arg-type]
    assert sink.flush() == 4
    sink.close()
    kinds = sorted(segment_kind(n) for n in list_segments(store.spool_dir))
    assert kinds == ["decisions", "labels"]
    (row,) = store.labelled_rows()
    assert row.decision_id == "d1" and row.target == ("refund", "human") and row.human_author == "ann"
    assert row.teacher_label == "billing"
    rows = store.query("SELECT decision_id, source, label_uid, latency_ms, logged_at IS NOT NULL FROM labels "
                       "ORDER BY decision_id, source")
    assert [r[:2] for r in rows] == [("d1", "human"), ("d1", "teacher"), ("elsewhere", "teacher")]
    assert all(len(r[2]) == 32 for r in rows) and len({r[2] for r in rows}) == 3
    assert rows[1][3] == 12.5 and all(r[4] for r in rows)
    assert store.count_new_labels(None) == 2  # the label of a decision not in yet does not count
    store.add_human_label("d1", "billing")
    assert store.query("SELECT count(DISTINCT label_uid) FROM labels") == [(4,)]
    with pytest.raises(UnknownDecisionError):
        store.add_human_label("", "billing")


def test_label_records_and_parquet_round_trip():
    recs = [LabelRecord.human("a" * 32, None, author="bob"),
            LabelRecord.teacher("b" * 32, "billing", "m", False, 3.0),
            LabelRecord.teacher("c" * 32, None, "m", False, 3.0, candidates=("billing", None))]
    table = label_records_to_table(recs)
    assert table.schema.equals(LABEL_SCHEMA, check_metadata=True)
    back = from_parquet(to_parquet(table))
    # (Parquet names a list's item "element": equal types, other child-field names)
    assert back.schema.equals(LABEL_SCHEMA) and back.schema.metadata == LABEL_SCHEMA.metadata
    assert back.equals(table) and back.column("teacher_candidates").to_pylist() == [None, None, ["billing", None]]
    dec = records_to_table([rec("p1"), rec("p2", embedding=None)])
    assert from_parquet(to_parquet(dec)).equals(dec)
    with pytest.raises(LogStoreError):
        LabelRecord("x", "robot", "billing")


# ---------------------------------------------------------------- insert_objects

def test_insert_objects_exactly_once(tmp_path):
    import numpy as np

    store = LogStore(tmp_path / "o.duckdb")
    emb = np.ones(4, np.float32)
    a = records_to_table([rec("a1", embedding=emb), rec("a2", embedding=emb)])
    b = records_to_table([rec("a2", embedding=emb), rec("b1", embedding=emb)])  # a2 again
    lab = LabelRecord.human("a1", "refund")
    orphan = LabelRecord.teacher("zz", "refund", "m", True)
    labels1 = label_records_to_table([lab, orphan])
    labels2 = label_records_to_table([lab, LabelRecord.human("b1", "shipping")])  # lab again
    parquet = from_parquet(to_parquet(a))
    n = store.insert_objects([("k/a", "decisions", parquet), ("k/a", "decisions", parquet),
                              ("k/l1", "labels", labels1)])
    assert n == 2 + 2
    assert store.insert_objects([("k/a", "decisions", a)]) == 0  # same key again: skipped whole
    assert store.insert_objects([("k/b", "decisions", b), ("k/l2", "labels", labels2)]) == 1 + 1
    assert store.insert_objects([("k/b", "decisions", b), ("k/l1", "labels", labels1)]) == 0
    c = records_to_table([rec("c1", embedding=emb), rec("c1", embedding=emb)])
    assert store.insert_objects([("k/c", "decisions", c), ("k/c2", "decisions", c)]) == 1  # one call
    assert store.ingested_keys() == {"k/a", "k/l1", "k/b", "k/l2", "k/c", "k/c2"}
    assert sorted(r[0] for r in store.query("SELECT decision_id FROM decisions")) == ["a1", "a2", "b1", "c1"]
    assert store.query("SELECT count(*), count(DISTINCT decision_id) FROM embeddings") == [(4, 4)]
    assert store.query("SELECT count(*) FROM labels") == [(3,)]  # lab once, the orphan kept, b1's
    assert store.query("SELECT kind, rows FROM ingested_objects ORDER BY key") == [
        ("decisions", 2), ("decisions", 2), ("decisions", 2), ("decisions", 2), ("labels", 2), ("labels", 2)]
    rows = {r.decision_id: r.target for r in store.labelled_rows()}
    assert rows == {"a1": ("refund", "human"), "b1": ("shipping", "human")}
    with pytest.raises(ValueError, match="kind"):
        store.insert_objects([("k/x", "other", a)])


def test_insert_objects_is_one_transaction(tmp_path):
    store = LogStore(tmp_path / "t.duckdb")
    good = records_to_table([rec("t1")])
    bad = label_records_to_table([LabelRecord.human("t1", "x")]).set_column(
        2, "source", __import__("pyarrow").array(["robot"]))  # violates the CHECK constraint
    con = duckdb.connect(store.path)
    try:
        with pytest.raises(duckdb.Error):
            insert_objects(con, [("g", "decisions", good), ("b", "labels", bad)])
        assert con.execute("SELECT count(*) FROM decisions").fetchall() == [(0,)]
        assert con.execute("SELECT count(*) FROM ingested_objects").fetchall() == [(0,)]
        assert insert_objects(con, [("g", "decisions", good)]) == 1
    finally:
        con.close()


# ---------------------------------------------------------------- migration 3

def test_migration_3_on_a_v2_database(tmp_path):
    path = tmp_path / "v2.duckdb"
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE schema_version (version INTEGER PRIMARY KEY, applied_at TIMESTAMP NOT NULL)")
    for number, sql in MIGRATIONS[:2]:
        con.execute(sql)
        con.execute("INSERT INTO schema_version VALUES (?, now()::TIMESTAMP)", [number])
    con.execute("INSERT INTO decisions (decision_id, created_at, text, layer, label) "
                "VALUES ('old1', TIMESTAMP '2025-01-01 00:00:00', 'hi', 'embedding', 'billing')")
    con.execute("INSERT INTO labels (decision_id, source, label, valid, created_at) "
                "VALUES ('old1', 'human', 'refund', true, TIMESTAMP '2025-01-02 00:00:00')")
    con.close()
    store = LogStore(path)
    assert store.migrations_applied == [3, 4, 5, 6] and store.schema_version == SCHEMA_VERSION == 6
    (row,) = store.labelled_rows()
    assert row.target == ("refund", "human")
    assert store.query("SELECT label_uid, logged_at FROM labels") == [(None, None)]
    assert store.count_new_labels(None) == 1
    store.add_human_label("old1", "billing")
    assert store.labelled_rows()[0].target == ("billing", "human")
    assert store.ingested_keys() == set()
    assert LogStore(path).migrations_applied == []


# ---------------------------------------------------------------- spool id

def test_spool_id_is_created_once_and_stable(tmp_path):
    spool = tmp_path / "spool"
    spool.mkdir()
    got: list[str] = []
    threads = [threading.Thread(target=lambda: got.append(spool_id(spool))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(got)) == 1 and len(got[0]) == 12 and int(got[0], 16) >= 0
    assert spool_id(spool) == got[0] == (spool / "SPOOL_ID").read_text().strip()
    assert SpoolSink(spool, fsync=False).spool_id == got[0]
    assert not [p for p in spool.iterdir() if p.name.endswith(".tmp")]
    other = tmp_path / "other"
    other.mkdir()
    assert spool_id(other) != got[0]
    (other / "SPOOL_ID").write_text("not an id")
    with pytest.raises(LogStoreError, match="no spool id"):
        spool_id(other)


# ---------------------------------------------------------------- decision ids

def test_decision_ids_carry_the_process_tag():
    ids = [new_decision_id() for _ in range(100)]
    tag = decision_mod.PROCESS_TAG
    assert len(set(ids)) == 100 and len(tag) == 8
    assert all(looks_like_decision_id(i) and i.startswith(tag) and made_by_this_process(i) for i in ids)
    assert Decision(label=None, confidence=0.0, tier=Tier.NO_MATCH, layer=Layer.RULES, reason="r").id[:8] == tag
    other = ("0" * 8 if tag != "0" * 8 else "1" * 8) + "a" * 24
    assert looks_like_decision_id(other) and not made_by_this_process(other)
    forged = tag + ("b" * 24 if ids[0][8:] != "b" * 24 else "c" * 24)   # our tag, made up: the checksum fails
    assert carries_this_process_tag(forged) and not made_by_this_process(forged)
    flipped = ids[0][:-1] + ("0" if ids[0][-1] != "0" else "1")
    assert not made_by_this_process(flipped)
    for bad in ("", "xyz", ids[0].upper(), ids[0][:31], ids[0] + "0", None, 12):
        assert not looks_like_decision_id(bad) and not made_by_this_process(bad)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_forked_child_gets_its_own_tag():
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        try:
            os.write(w, (decision_mod.PROCESS_TAG + new_decision_id()).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        out = f.read()
    os.waitpid(pid, 0)
    child_tag, child_id = out[:8], out[8:]
    assert child_tag != decision_mod.PROCESS_TAG and child_id.startswith(child_tag)
    assert not made_by_this_process(child_id)
