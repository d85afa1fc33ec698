"""Tests of the DuckDB traffic log (the logstore package), with real processes where it matters."""

from __future__ import annotations

import gc
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time

import duckdb
import numpy as np
import pytest

from flywheel.classifier.decision import Layer, Layer2Answer, TeacherCall, Tier
from flywheel.classifier.protocols import HistoryEntry, LogSink
from flywheel.logstore import LogStore, LogStoreBusyError, LogStoreError
from flywheel.logstore.connection import connect
from flywheel.logstore.connection import stats as logstore_stats
from flywheel.logstore.schema import MIGRATIONS, SCHEMA_VERSION, apply_migrations
from flywheel.logstore.segments import records_to_table, write_segment
from tests.support.paths import ROOT
from tests.support.records import make_record


@pytest.fixture
def store(tmp_path) -> LogStore:
    return LogStore(tmp_path / "logs" / "traffic.duckdb")


def write_all(store: LogStore, records) -> int:
    sink = store.open_sink(ingest_interval_s=None)
    for r in records:
        sink.write(r)
    n = sink.flush()
    sink.close()
    return n


def ids_in(store: LogStore) -> list[str]:
    return [r[0] for r in store.query("SELECT decision_id FROM decisions")]


def child_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


WRITER_SCRIPT = textwrap.dedent("""
    import sys, time
    from flywheel.classifier.decision import Decision, Layer, Tier
    from flywheel.classifier.protocols import DecisionRecord
    from flywheel.logstore import LogStore

    path, prefix = sys.argv[1], sys.argv[2]
    seconds, ingest_s = float(sys.argv[3]), float(sys.argv[4])
    store = LogStore(path)
    sink = store.open_sink(flush_interval_s=0.05, batch_size=200, ingest_interval_s=ingest_s)
    i, deadline = 0, time.monotonic() + seconds
    while time.monotonic() < deadline:
        for _ in range(50):
            d = Decision(label="billing", confidence=0.9, tier=Tier.CONFIDENT,
                         layer=Layer.EMBEDDING, reason="child", id=f"{prefix}{i:08d}")
            sink.write(DecisionRecord(decision=d, text=f"text {i}", created_at=time.time()))
            i += 1
        if i % 500 == 0:
            print("flushed", sink.flush(), flush=True)
        time.sleep(0.002)
    sink.close()
    from flywheel.logstore.connection import stats
    print("retries", stats["lock_retries"], file=sys.stderr)
    print("closed", sink.written, flush=True)
""")


# ---------------------------------------------------------------- schema / opening

def test_migrations_idempotent_and_version_recorded(tmp_path):
    path = tmp_path / "m.duckdb"
    first = LogStore(path)
    assert first.migrations_applied == [n for n, _ in MIGRATIONS]
    second = LogStore(path)
    assert second.migrations_applied == []
    assert second.schema_version == SCHEMA_VERSION
    versions = [r[0] for r in second.query("SELECT version FROM schema_version ORDER BY 1")]
    assert versions == [n for n, _ in MIGRATIONS]
    con = duckdb.connect(str(path))
    try:
        assert apply_migrations(con, str(path)) == []
    finally:
        con.close()


def test_newer_schema_version_is_refused(tmp_path):
    path = tmp_path / "new.duckdb"
    LogStore(path)
    con = duckdb.connect(str(path))
    con.execute("INSERT INTO schema_version VALUES (?, now()::TIMESTAMP)", [SCHEMA_VERSION + 5])
    con.close()
    with pytest.raises(LogStoreError, match="newer"):
        LogStore(path)


def test_unwritable_paths_fail_at_open(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(LogStoreError, match="afile"):
        LogStore(afile / "log.duckdb")
    with pytest.raises(LogStoreError, match="flywheel-nope"):
        LogStore("/proc/flywheel-nope/log.duckdb")
    with pytest.raises(LogStoreError, match="directory"):
        LogStore(tmp_path)
    assert issubclass(LogStoreError, Exception) and LogStoreError.exit_code == 2


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root ignores permissions")
def test_read_only_dir_fails_at_open(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        with pytest.raises(LogStoreError, match="not writable"):
            LogStore(ro / "log.duckdb")
    finally:
        ro.chmod(0o755)


# ---------------------------------------------------------------- writing

def test_fields_round_trip(store):
    emb = np.linspace(-1, 1, 384, dtype=np.float32)
    rec = make_record("d1", layer=Layer.LLM, label="refund", confidence=0.66,
                      teacher=TeacherCall("llama3", "refund", True, 812.5),
                      embedding=emb, pending=False, audit=True, created_at=1_700_000_000.25)
    rec.declared_type = "support"
    rec.layer2 = Layer2Answer("shipping", 0.4, Tier.AMBIGUOUS)
    assert write_all(store, [rec]) == 1
    row = store.query(
        "SELECT decision_id, epoch_us(created_at), session_id, text, history, declared_type, "
        "layer, label, confidence, tier, alternatives, model_version, encoder_id, latency_ms, "
        "teacher_model, teacher_label, teacher_valid, teacher_latency_ms, audit, pending, "
        "l2_label, l2_confidence, l2_tier FROM decisions")[0]
    assert row[0] == "d1" and row[1] == 1_700_000_000_250_000
    assert row[2:4] == ("sess-1", "where is my invoice")
    assert row[4][0] == {"label": "greeting", "snippet": "hello there"}
    assert row[4][1]["label"] is None and len(row[4][1]["snippet"]) == 60
    assert row[5:10] == ("support", "llm", "refund", 0.66, "confident")
    assert row[10] == [{"label": "shipping", "confidence": 0.1},
                       {"label": None, "confidence": 0.05}]
    assert row[11:13] == ("v7", "enc-test")
    assert dict(row[13]) == {"rules": 0.01, "embedding": 2.5}
    assert row[14:18] == ("llama3", "refund", True, 812.5)
    assert row[18:20] == (True, False)
    assert row[20:23] == ("shipping", 0.4, "ambiguous")  # layer 2's own answer, from the record
    assert store.layer_counts() == {"llm": 1}


def test_sink_is_a_logsink_and_flush_counts(store):
    sink = store.open_sink(batch_size=10, flush_interval_s=5.0, ingest_interval_s=None)
    assert isinstance(sink, LogSink)
    for i in range(25):
        sink.write(make_record(f"a{i}"))
    assert sink.flush() == 25
    for i in range(5):
        sink.write(make_record(f"b{i}"))
    assert sink.flush() == 30
    sink.close()
    sink.close()  # idempotent
    assert sink.flush() == 30
    with pytest.raises(LogStoreError, match="closed"):
        sink.write(make_record("late"))
    assert store.count() == 30


def test_many_threads_every_decision_exactly_once(store):
    sink = store.open_sink(batch_size=300, flush_interval_s=0.05, ingest_interval_s=0.2)
    expected = {f"t{t}-{i}" for t in range(8) for i in range(500)}

    def worker(t: int) -> None:
        for i in range(500):
            sink.write(make_record(f"t{t}-{i}"))

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert sink.flush() == 4000
    sink.close()
    got = ids_in(store)
    assert len(got) == 4000 and set(got) == expected
    assert LogStore(store.path).count() == 4000  # reopened: still exactly once


def test_garbage_collected_sink_is_flushed(store):
    sink = store.open_sink(flush_interval_s=60.0, ingest_interval_s=None)
    for i in range(10):
        sink.write(make_record(f"g{i}"))
    del sink
    gc.collect()
    assert store.count() == 10


def test_full_buffer_blocks_instead_of_dropping(tmp_path):
    store = LogStore(tmp_path / "b.duckdb", busy_timeout_s=0.5)
    sink = store.open_sink(batch_size=10, max_buffer=20, flush_interval_s=0.01,
                           ingest_interval_s=None)
    shutil.rmtree(store.spool_dir)  # every segment write now fails
    for i in range(5):
        sink.write(make_record(f"early{i}"))
    with pytest.raises(LogStoreError, match="cannot write"):
        sink.flush()  # reported on flush after busy_timeout_s, records kept
    done = threading.Event()

    def producer() -> None:
        for i in range(100):
            sink.write(make_record(f"f{i}"))
        done.set()

    th = threading.Thread(target=producer, daemon=True)
    th.start()
    assert not done.wait(0.5), "write() should block while the buffer is full"
    assert sink.buffered <= 20 + 1
    store.spool_dir.mkdir()
    assert done.wait(10.0)
    assert sink.flush(timeout=10.0) == 105
    sink.close()
    assert store.count() == 105


def test_segment_ingested_exactly_once_after_crash_between_commit_and_delete(store, tmp_path):
    sink = store.open_sink(ingest_interval_s=None)
    for i in range(7):
        sink.write(make_record(f"c{i}"))
    sink.flush()
    sink.close()
    segs = list(store.spool_dir.glob("*.arrow"))
    assert len(segs) == 1
    saved = tmp_path / "saved.arrow"
    shutil.copy(segs[0], saved)
    assert store.count() == 7  # ingests and deletes the segment
    shutil.copy(saved, segs[0])  # as if the process died right after COMMIT
    (store.spool_dir / "seg-partial.arrow.tmp").write_bytes(b"half a segment")
    assert store.count() == 7
    assert not segs[0].exists()


def test_bad_records_and_corrupt_segments_do_not_block_the_log(store, caplog):
    sink = store.open_sink(ingest_interval_s=None)
    bad = make_record("bad")
    bad.text = None
    for r in (make_record("ok1"), bad, make_record("ok2")):
        sink.write(r)
    assert sink.flush() == 2 and sink.rejected == 1
    sink.close()
    (store.spool_dir / "seg-00000000000000000000-1-00000000.arrow").write_bytes(b"garbage")
    assert sorted(ids_in(store)) == ["ok1", "ok2"]
    assert list(store.spool_dir.glob("*.bad"))
    assert "malformed" in caplog.text and "cannot be ingested" in caplog.text


# ---------------------------------------------------------------- labels and reads

def test_human_label_wins_and_latest_wins(store):
    write_all(store, [make_record("h1", layer=Layer.LLM, label="refund",
                                  teacher=TeacherCall("llama3", "refund", True, 10.0)),
                      make_record("h2"), make_record("h3")])
    store.add_human_label("h1", "billing", author="ann")
    store.add_human_label("h2", "shipping")
    store.add_human_label("h2", None, author="bob")  # later: out of scope
    store.add_teacher_label("h3", "refund", "llama3", True, 20.0)
    rows = {r.decision_id: r for r in store.labelled_rows()}
    assert set(rows) == {"h1", "h2", "h3"}
    assert rows["h1"].teacher_label == "refund" and rows["h1"].human_label == "billing"
    assert rows["h1"].target == ("billing", "human") and rows["h1"].human_author == "ann"
    assert rows["h2"].has_human_label and rows["h2"].human_label is None
    assert rows["h2"].target == (None, "human") and rows["h2"].human_author == "bob"
    assert rows["h3"].target == ("refund", "teacher") and rows["h3"].teacher_model == "llama3"
    with pytest.raises(LogStoreError, match="unknown decision id"):
        store.add_human_label("nope", "billing")
    with pytest.raises(LogStoreError, match="unknown decision id"):
        store.add_teacher_label("nope", "billing", "m", True, 1.0)


def test_invalid_teacher_answer_is_never_a_label(store):
    write_all(store, [
        make_record("i1", layer=Layer.EMBEDDING,
                    teacher=TeacherCall("llama3", "refund", False, 3000.0, error="timeout")),
        make_record("i2"),
    ])
    store.add_teacher_label("i2", "refund", "llama3", False, 5.0)
    assert store.labelled_rows() == []
    for r in store.labelled_rows(labelled_only=False):
        assert not r.has_teacher_label and r.teacher_label is None and r.teacher_labels == ()
        assert r.target == (None, None)
    store.add_teacher_label("i2", "shipping", "llama3", True, 5.0)
    (row,) = store.labelled_rows()
    assert row.decision_id == "i2" and row.teacher_labels == ("shipping",)
    assert store.query("SELECT count(*) FROM labels WHERE NOT valid") == [(1,)]


def test_labelled_rows_since(store):
    write_all(store, [make_record("old1", created_at=1000.0),
                      make_record("old2", created_at=1000.0), make_record("new1")])
    store.add_human_label("old1", "billing")
    store.add_human_label("new1", "billing")
    store.add_human_label("old2", "billing")
    cutoff = time.time() + 0.5  # all labels are older than this: nothing newer
    assert store.labelled_rows(since=cutoff) == []
    time.sleep(0.6)
    store.add_human_label("old2", "refund")
    rows = store.labelled_rows(since=cutoff)
    assert [r.decision_id for r in rows] == ["old2"] and rows[0].human_label == "refund"
    assert rows[0].created_at == 1000.0
    assert cutoff <= rows[0].human_at <= time.time()  # the latest human label's own time
    recent = store.labelled_rows(since=time.time() - 60)
    assert {r.decision_id: r.human_at is not None for r in recent} == {"old2": True, "new1": True, "old1": True}
    assert {r.decision_id for r in recent} == {"old2", "new1", "old1"}


def test_pending_and_mark_resolved(store):
    write_all(store, [make_record(f"p{i}", pending=True, created_at=1000.0 + i,
                                  text=f"pending {i}") for i in range(4)] + [make_record("x")])
    pend = store.pending()
    assert [p[0] for p in pend] == ["p0", "p1", "p2", "p3"]
    assert pend[0][1] == "pending 0" and pend[0][2][0] == HistoryEntry("greeting", "hello there")
    assert [p[0] for p in store.pending(limit=2)] == ["p0", "p1"]
    store.add_teacher_label("p0", "billing", "llama3", True, 9.0)
    store.add_teacher_label("p1", "billing", "llama3", False, 9.0)  # failed again: still pending
    assert store.mark_resolved(["p2", "unknown"]) == 1
    assert store.mark_resolved(["p2"]) == 0
    assert [p[0] for p in store.pending()] == ["p1", "p3"]


def test_embeddings_round_trip_with_encoder_id(store):
    rng = np.random.default_rng(0)
    va, vb = rng.standard_normal((2, 384)).astype(np.float32)
    write_all(store, [make_record("e1", embedding=va, encoder_id="minilm:a", text="one"),
                      make_record("e2", embedding=vb.astype(np.float64)[None, :],
                                  encoder_id="bge:b", text="two"),
                      make_record("e3", embedding=None, text="three"),
                      make_record("e4", embedding=va, encoder_id=None, text="four")])
    got = store.embeddings("minilm:a", ["e1", "e2", "e3", "missing"])
    assert list(got) == ["e1"] and got["e1"].dtype == np.float32
    np.testing.assert_array_equal(got["e1"], va)
    np.testing.assert_array_equal(store.embeddings("bge:b", ["e2"])["e2"], vb)
    by_text = store.embeddings("bge:b", texts=["two", "one"])
    assert list(by_text) == ["two"]
    np.testing.assert_array_equal(by_text["two"], vb)
    assert set(store.embeddings("minilm:a")) == {"e1"}
    assert store.embeddings("other", ["e1"]) == {}
    (row,) = [r for r in store.labelled_rows(labelled_only=False) if r.decision_id == "e1"]
    assert row.encoder_id == "minilm:a"


def test_label_for_decision_still_buffered_in_this_process(store):
    sink = store.open_sink(flush_interval_s=60.0, ingest_interval_s=None)
    sink.write(make_record("buffered"))
    store.add_human_label("buffered", "billing")  # flushes this process's sinks, then finds it
    sink.close()
    assert [r.human_label for r in store.labelled_rows()] == ["billing"]


# ---------------------------------------------------------------- real processes

@pytest.mark.slow
def test_busy_database_retries_and_writes_never_wait(tmp_path):
    path = tmp_path / "busy.duckdb"
    store = LogStore(path)
    impatient = LogStore(path, busy_timeout_s=0.2)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import duckdb, sys, time; c = duckdb.connect(sys.argv[1]); "
         "print('locked', flush=True); time.sleep(float(sys.argv[2])); c.close()",
         str(path), "2.0"], stdout=subprocess.PIPE, text=True, env=child_env())
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(LogStoreBusyError, match="busy"):
            impatient.count()
        with pytest.raises(LogStoreError):
            connect(path, busy_timeout_s=0)
        sink = store.open_sink(ingest_interval_s=0.05)
        t0 = time.perf_counter()
        for i in range(100):
            sink.write(make_record(f"w{i}"))
        assert sink.flush() == 100  # durable in the spool without the database lock
        assert time.perf_counter() - t0 < 1.5
        assert store.count() == 100  # waited for the holder, then ingested
        sink.close()
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.slow
def test_kill_9_keeps_every_acknowledged_record(tmp_path):
    path = tmp_path / "crash.duckdb"
    LogStore(path)
    script = tmp_path / "writer.py"
    script.write_text(WRITER_SCRIPT)
    child = subprocess.Popen([sys.executable, str(script), str(path), "k", "60", "0.3"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=child_env())
    acked = 0
    try:
        for line in child.stdout:
            if line.startswith("flushed"):
                acked = int(line.split()[1])
                if acked >= 3000:
                    break
        time.sleep(0.05)  # let it write on after the acknowledgement
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert acked >= 3000, child.stderr.read()
    store = LogStore(path)
    got = ids_in(store)
    assert len(got) == len(set(got)), "a row was ingested twice"
    assert {f"k{i:08d}" for i in range(acked)} <= set(got)


@pytest.mark.slow
def test_writer_and_reader_processes_at_once(tmp_path):
    path = tmp_path / "shared.duckdb"
    reader = LogStore(path)
    script = tmp_path / "writer.py"
    script.write_text(WRITER_SCRIPT)
    child = subprocess.Popen([sys.executable, str(script), str(path), "s", "3.0", "0.1"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=child_env())
    labelled, counts = set(), []
    retries0 = logstore_stats["lock_retries"]
    while child.poll() is None:
        counts.append(reader.count())
        ids = [r[0] for r in reader.query(
            "SELECT decision_id FROM decisions ORDER BY random() LIMIT 3")]
        for did in ids:
            reader.add_human_label(did, "billing", author="cron")
            labelled.add(did)
        time.sleep(0.02)
    out, err = child.communicate()
    assert child.returncode == 0, err
    assert "Traceback" not in err and "busy" not in err
    total = int(out.strip().splitlines()[-1].split()[1])
    assert counts == sorted(counts) and len(counts) > 5 and labelled
    got = ids_in(reader)
    assert len(got) == total == len(set(got))
    assert set(got) == {f"s{i:08d}" for i in range(total)}
    humans = {r.decision_id for r in reader.labelled_rows() if r.has_human_label}
    assert humans == labelled
    print(f"reader: {len(counts)} counts, {len(labelled)} labels, "
          f"{logstore_stats['lock_retries'] - retries0} lock retries; writer: {err.strip()}")


@pytest.mark.slow
def test_interpreter_exit_flushes(tmp_path):
    path = tmp_path / "exit.duckdb"
    code = textwrap.dedent("""
        import sys, time
        from flywheel.classifier.decision import Decision, Layer, Tier
        from flywheel.classifier.protocols import DecisionRecord
        from flywheel.logstore import LogStore
        sink = LogStore(sys.argv[1]).open_sink(flush_interval_s=60.0)
        for i in range(123):
            d = Decision(label=None, confidence=0.1, tier=Tier.NO_MATCH, layer=Layer.EMBEDDING,
                         reason="exit")
            sink.write(DecisionRecord(decision=d, text=str(i), created_at=time.time()))
        # no flush, no close: atexit must do it
    """)
    subprocess.run([sys.executable, "-c", code, str(path)], check=True, env=child_env(),
                   timeout=60)
    assert LogStore(path).count() == 123


def test_segment_helpers_are_public_and_consistent(tmp_path):
    table = records_to_table([make_record("s1", embedding=np.ones(3, np.float32))])
    assert table.num_rows == 1 and table.column("embedding").to_pylist() == [[1.0, 1.0, 1.0]]
    spool = tmp_path / "spool"
    spool.mkdir()
    seg = write_segment(spool, table)
    assert seg.exists() and seg.suffix == ".arrow"
