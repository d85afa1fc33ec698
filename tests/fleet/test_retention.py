"""fleet.retention: raw text past N days removed from the bucket and the local DuckDB
file, checked by searching the raw bytes (the DuckDB file and its WAL, and the SeaweedFS
data dir after a vacuum), while labels and embeddings survive."""

from __future__ import annotations

import os
import secrets
import time
import urllib.request
import zlib
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from flywheel.classifier.decision import TeacherCall
from flywheel.classifier.protocols import HistoryEntry
from flywheel.fleet.bucket_labels import BucketLabels
from flywheel.fleet.mirror import mirror
from flywheel.fleet.retention import PruneReport, prune_log, redact_table
from flywheel.logstore import LogStore, SpoolSink, from_parquet, to_parquet
from flywheel.logstore.schema import SCHEMA_VERSION
from flywheel.logstore.segments import records_to_table
from tests.support.bucket import log_keys, shipping_sink
from tests.support.records import make_record, rec

DAY = 86400.0


# ---- a byte search that compression cannot fool ----

_GZIP, _ZSTD = b"\x1f\x8b\x08", b"\x28\xb5\x2f\xfd"


def _zstd_frame_len(data: bytes, i: int) -> int | None:
    """The length of the zstd frame starting at ``data[i]`` (its magic), walking the
    block headers (RFC 8878); ``None`` when it is not a whole frame."""
    try:
        fhd = data[i + 4]
        fcs_flag, single, checksum, did_flag = fhd >> 6, (fhd >> 5) & 1, (fhd >> 2) & 1, fhd & 3
        pos = i + 5 + (0 if single else 1) + (0, 1, 2, 4)[did_flag]
        pos += (1 if single else 0, 2, 4, 8)[fcs_flag]
        while True:
            header = int.from_bytes(data[pos:pos + 3], "little")
            if pos + 3 > len(data):
                return None
            last, kind, size = header & 1, (header >> 1) & 3, header >> 3
            if kind == 3:
                return None
            pos += 3 + (1 if kind == 1 else size)
            if last:
                break
        pos += 4 if checksum else 0
        return pos - i if pos <= len(data) else None
    except IndexError:
        return None


def _decoded(data: bytes, depth: int = 2):
    """``data`` and every gzip stream and zstd frame found in it, decompressed (nested
    ``depth`` levels: SeaweedFS may gzip a Parquet object whose pages are zstd)."""
    yield data
    if depth == 0:
        return
    i = data.find(_GZIP)
    while i >= 0:
        try:
            out = zlib.decompressobj(31).decompress(data[i:], 256 * 2**20)
        except zlib.error:
            out = b""
        if out:
            yield from _decoded(out, depth - 1)
        i = data.find(_GZIP, i + 1)
    i = data.find(_ZSTD)
    while i >= 0:
        n = _zstd_frame_len(data, i)
        if n:
            try:
                out = pa.CompressedInputStream(pa.BufferReader(data[i:i + n]), "zstd").read()
            except (pa.ArrowException, OSError):
                out = b""
            if out:
                yield from _decoded(out, depth - 1)
        i = data.find(_ZSTD, i + 1)


def holds(paths, marker: str) -> list[str]:
    """The files among ``paths`` (files or folders, searched whole) holding ``marker``,
    raw or inside a gzip stream or zstd frame."""
    needle, hits = marker.encode(), []
    for root in map(Path, paths):
        files = [root] if root.is_file() else [p for p in root.rglob("*") if p.is_file()]
        for p in files:
            try:
                data = p.read_bytes()
            except (FileNotFoundError, IsADirectoryError):
                continue
            if any(needle in chunk for chunk in _decoded(data)):
                hits.append(str(p))
    return hits


def test_the_byte_search_sees_through_gzip_and_zstd(tmp_path):
    marker = secrets.token_hex(16)
    rows = [secrets.token_hex(16) for _ in range(2000)]
    text = " ".join(rows[:1000] + [marker] + rows[1000:]).encode()
    zstd = pa.Codec("zstd").compress(text, asbytes=True)
    packed = to_parquet(pa.table({"text": rows[:1000] + [f"x {marker} y"] + rows[1000:]}))

    def gzip(data: bytes) -> bytes:
        z = zlib.compressobj(9, zlib.DEFLATED, 31)
        return z.compress(data) + z.flush()

    files = {"zstd": b"junk" + zstd + b"tail", "gzip": b"\x00" * 7 + gzip(text) + b"\x01",
             "parquet": packed, "gzip-of-parquet": b"\x1f\x8b\x08" + gzip(packed),
             "without": gzip(" ".join(rows).encode()) + pa.Codec("zstd").compress(b"a" * 999, asbytes=True)}
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    assert marker.encode() not in files["zstd"] and marker.encode() not in files["gzip"]   # compression hides it
    assert sorted(holds([tmp_path], marker)) == sorted(str(tmp_path / n) for n in files if n != "without")


# ---- unit level: redaction and the local file ----

def test_redact_table_removes_text_and_keeps_everything_else():
    r = make_record(text="my card is 4111", embedding=np.arange(4, dtype=np.float32),
                    teacher=TeacherCall("llm", None, False, 3.0, "malformed: answer is not JSON: 'my card is 4111'"))
    table = records_to_table([r, make_record(text="other")])
    red = redact_table(table)
    assert red.schema.equals(table.schema, check_metadata=True)
    assert red.column("text").to_pylist() == ["", ""]
    assert red.column("history")[0].as_py() == [{"label": "greeting", "snippet": ""}, {"label": None, "snippet": ""}]
    assert red.column("teacher_error").to_pylist() == ["malformed", None]
    keep = [n for n in table.schema.names if n not in ("text", "history", "teacher_error")]
    assert red.select(keep).equals(table.select(keep))


def test_a_redacted_or_forgotten_unsure_answer_keeps_its_set(tmp_path):
    """An unsure answer's set is intent names, no text: retention keeps it as data, so the
    review queue and the tuner's hard pairs still see it (issue 33; before, the set was prose
    in ``teacher_error``, which retention cut to ``unsure``)."""
    unsure = TeacherCall("llm", None, False, 3.0, candidates=("billing", None))
    table = records_to_table([make_record("u1", text="my card is 4111", teacher=unsure)])
    red = redact_table(table)
    assert red.column("text").to_pylist() == [""]
    assert red.column("teacher_candidates").to_pylist() == [["billing", None]]
    store = LogStore(tmp_path / "log.duckdb")
    store.insert_objects([("k/red", "decisions", red)])
    store.insert_objects([("k/new", "decisions", records_to_table([make_record("u2", teacher=unsure)]))])
    store.add_teacher_label("u2", None, "llm", False, 5.0, candidates=("shipping", "billing"))   # an audit's
    assert store.forget_text(time.time() + DAY) == 1      # u2 (u1 came redacted)
    assert store.query("SELECT decision_id, text, teacher_candidates FROM decisions ORDER BY 1") == [
        ("u1", "", ["billing", None]), ("u2", "", ["billing", None])]
    assert sorted(store.unsure_candidate_sets()) == sorted([("billing", None), ("billing", None),
                                                            ("shipping", "billing")])


def _files(store: LogStore) -> list[str]:
    return [p for p in (store.path, store.path + ".wal") if os.path.exists(p)]


def test_forget_text_and_compact_remove_the_bytes_and_keep_the_rest(tmp_path):
    store = LogStore(tmp_path / "log.duckdb")
    old, new = secrets.token_hex(16), secrets.token_hex(16)
    now = time.time()
    sink = store.open_sink(ingest_interval_s=None)
    for i in range(500):
        sink.write(make_record(text=f"filler {i}", created_at=now - 3 * DAY, embedding=np.ones(4, np.float32)))
    target = make_record(text=f"call me on {old}", created_at=now - 3 * DAY, embedding=np.full(4, 7, np.float32))
    target.history = (HistoryEntry.of("greeting", f"hi {old}"),)
    sink.write(target)
    sink.write(make_record(text=f"fresh {new}", created_at=now))
    sink.write(waiting := make_record(text=f"pending {old}", created_at=now - 3 * DAY, pending=True))
    sink.close()
    did = target.decision.id
    assert [p[0] for p in store.pending()] == [waiting.decision.id]
    store.add_human_label(did, "billing")
    before = store.query("SELECT max(label_id) FROM labels")[0][0]
    assert holds(_files(store), old), "positive control: the marker must be visible before"

    report = prune_log(None, store, days=1, now=now)
    assert isinstance(report, PruneReport)
    assert (report.local_rows, report.redacted, report.deleted) == (502, 0, 0)
    assert store.pending() == []   # nothing left to ask the teacher about
    assert report.compacted_bytes == os.path.getsize(store.path)
    assert holds(_files(store), old) == [] and holds(_files(store), new)
    assert store.query("SELECT text, history FROM decisions WHERE decision_id = ?", [did]) == \
        [("", [{"label": "greeting", "snippet": ""}])]
    row = {r.decision_id: r for r in store.labelled_rows()}[did]
    assert row.target == ("billing", "human") and row.text == ""
    assert np.allclose(store.embeddings("enc-test", [did])[did], 7)
    assert store.schema_version == SCHEMA_VERSION
    store.add_human_label(did, "refund")   # labels_seq continues after the rewrite
    assert store.query("SELECT max(label_id) FROM labels")[0][0] == before + 1
    assert {r.decision_id: r for r in store.labelled_rows()}[did].target == ("refund", "human")
    assert store.count() == 503

    again = prune_log(None, store, days=1, now=now)
    assert (again.local_rows, again.compacted_bytes) == (0, None)   # nothing changed: no rewrite


def test_an_interrupted_local_prune_rewrites_next_time_and_stale_spool_leftovers_go(tmp_path):
    store = LogStore(tmp_path / "log.duckdb")
    Path(store.path + ".prune-pending").touch()      # a run died between forget_text and compact
    bad, fresh_bad = store.spool_dir / "seg-1-1-1.arrow.bad", store.spool_dir / "seg-2-1-1.arrow.bad"
    bad.write_bytes(b"raw text")
    fresh_bad.write_bytes(b"raw text")
    os.utime(bad, (time.time() - 3 * DAY,) * 2)
    other = tmp_path / "sidecar-spool"
    other.mkdir()
    (other / "seg-3-1-1.arrow.tmp").write_bytes(b"x")
    os.utime(other / "seg-3-1-1.arrow.tmp", (time.time() - 3 * DAY,) * 2)
    report = prune_log(None, store, days=1, spools=[other])
    assert report.compacted_bytes is not None and report.spool_files == 2
    assert not bad.exists() and fresh_bad.exists() and not os.listdir(other)
    assert not Path(store.path + ".prune-pending").exists()
    with pytest.raises(ValueError):
        prune_log(None, None, days=-1)


# ---- end to end against the real server ----

def _vacuum(s3_server) -> None:
    with urllib.request.urlopen(f"{s3_server.master_url}/vol/vacuum?garbageThreshold=0.0001", timeout=30) as r:
        r.read()


@pytest.mark.slow
def test_retention_removes_the_text_everywhere_and_keeps_labels_and_vectors(tmp_path, s3_server, objects):
    old, new = secrets.token_hex(16), secrets.token_hex(16)
    now = time.time()
    past = make_record(text=f"my iban is {old}", created_at=now - 3 * DAY,
                       embedding=np.full(8, 0.5, np.float32), teacher=TeacherCall("llm", "billing", True, 4.0))
    past.history = (HistoryEntry.of("greeting", f"hello {old}"),)
    sink, _ = shipping_sink(tmp_path / "replica", objects)
    sink.write(past)
    sink.flush()
    sink.write(fresh := rec(f"recent {new}"))
    sink.write(rec("also recent"))
    sink.drain_now(10.0)
    sink.close()
    store = LogStore(tmp_path / "retrain.duckdb")
    mirror(objects, store)
    BucketLabels(objects, store).add_human_label(past.decision.id, "refund", author="ann")
    old_day = datetime.fromtimestamp(now - 3 * DAY, timezone.utc).strftime("%Y-%m-%d")
    original = [k for k in log_keys(objects, "decisions") if f"date={old_day}/" in k]
    assert len(original) == 1
    assert holds(_files(store), old) and holds([s3_server.data_dir], old), "positive controls"

    report = prune_log(objects, store, days=1, now=now)
    assert (report.redacted, report.deleted, report.waiting) == (1, 1, 0)
    assert report.local_rows == 1 and report.compacted_bytes is not None

    # the bucket: a redacted copy instead of the original; label objects untouched
    redacted = original[0].replace("log/decisions/", "log/redacted/")
    assert log_keys(objects, "redacted") == [redacted] and original[0] not in log_keys(objects, "decisions")
    copy = from_parquet(objects.get(redacted)[0])
    assert copy.column("text").to_pylist() == [""]
    assert np.allclose(copy.column("embedding")[0].as_py(), 0.5)
    assert copy.column("teacher_label").to_pylist() == ["billing"]
    assert len(log_keys(objects, "labels")) == 1

    # the local file: the bytes are gone, the label and the vector stay, the newer text too
    assert holds(_files(store), old) == [] and holds(_files(store), new)
    row = {r.decision_id: r for r in store.labelled_rows()}[past.decision.id]
    assert row.text == "" and row.target == ("refund", "human") and row.teacher_labels == ("billing",)
    assert np.allclose(store.embeddings("enc-test", [past.decision.id])[past.decision.id], 0.5)
    assert mirror(objects, store).rows == 0          # prune recorded the redacted key: nothing new

    # the object store's disk, once its volumes are vacuumed (deletes reach them asynchronously)
    deadline = time.monotonic() + 25.0
    while True:
        _vacuum(s3_server)
        left = holds([s3_server.data_dir], old)
        if not left or time.monotonic() > deadline:
            break
        time.sleep(1.0)
    assert left == [], f"the marker is still on the store's disk: {left}"
    assert holds([s3_server.data_dir], new), "the newer text must still be there"

    # a fresh host mirrors the label and the vector, never the text
    fresh_store = LogStore(tmp_path / "fresh.duckdb")
    fresh_report = mirror(objects, fresh_store)
    assert fresh_report.bad == 0 and fresh_store.count() == 3
    frow = {r.decision_id: r for r in fresh_store.labelled_rows()}[past.decision.id]
    assert (frow.text, frow.target, frow.teacher_labels) == ("", ("refund", "human"), ("billing",))
    assert frow.history[0].label == "greeting" and frow.history[0].snippet == ""
    assert np.allclose(fresh_store.embeddings("enc-test", [past.decision.id])[past.decision.id], 0.5)
    assert {r.decision_id: r for r in fresh_store.labelled_rows(labelled_only=False)}[fresh.decision.id].text == \
        f"recent {new}"
    assert holds(_files(fresh_store), old) == []

    again = prune_log(objects, store, days=1, now=now)
    assert (again.redacted, again.deleted, again.local_rows, again.compacted_bytes) == (0, 0, 0, None)


@pytest.mark.slow
def test_objects_of_the_cutoff_day_wait_for_their_newest_row_and_interrupted_runs_finish(tmp_path, objects):
    now = datetime(2026, 5, 10, 12, 0, tzinfo=timezone.utc).timestamp()
    spool = tmp_path / "spool"
    sink = SpoolSink(spool, None, flush_interval_s=0.05)
    straddling = [make_record(text="before", created_at=now - 3600), make_record(text="after", created_at=now + 60)]
    for r in straddling:
        sink.write(r)
    sink.flush()
    sink.write(make_record(text="two days ago", created_at=now - 2 * DAY))
    sink.close()
    from flywheel.fleet.shipper import ObjectShipper
    assert ObjectShipper(objects).drain(spool, 10.0) == 3
    # an earlier run made the redacted copy of the old object, then died before deleting it
    (old_key,) = [k for k in log_keys(objects, "decisions") if "date=2026-05-08/" in k]
    objects.put_if_absent(old_key.replace("log/decisions/", "log/redacted/"),
                          to_parquet(redact_table(from_parquet(objects.get(old_key)[0]))))

    report = prune_log(objects, None, days=0, now=now)   # the cutoff is mid-day 2026-05-10
    assert (report.redacted, report.deleted, report.waiting) == (0, 1, 1)
    assert [k.split("/")[2] for k in log_keys(objects, "decisions")] == ["date=2026-05-10"]
    later = prune_log(objects, None, days=0, now=now + 3600)
    assert (later.redacted, later.deleted, later.waiting) == (1, 1, 0)
    assert log_keys(objects, "decisions") == []
    store = LogStore(tmp_path / "log.duckdb")
    mirror(objects, store)
    assert sorted(t for (t,) in store.query("SELECT text FROM decisions")) == ["", "", ""]


def test_prune_log_takes_datetimes(tmp_path):
    store = LogStore(tmp_path / "log.duckdb")
    when = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone(timedelta(hours=2)))
    assert prune_log(None, store, days=0.5, now=when).cutoff == datetime(2026, 1, 1, 13, 4, 5)
