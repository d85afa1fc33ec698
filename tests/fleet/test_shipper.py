"""fleet.shipper: a SpoolSink's segments shipped to a real S3 server (``weed mini``), create-only,
deleted locally only after the store acknowledged them."""

from __future__ import annotations

import os
import shutil
import threading
import time
from datetime import datetime, timezone

import numpy as np
import pyarrow as pa
import pytest

from flywheel.fleet.config import StoreConfig
from flywheel.fleet.errors import FleetError, StoreUnavailable
from flywheel.fleet.mirror import mirror
from flywheel.fleet.objects import ObjectStore
from flywheel.fleet.shipper import ObjectShipper, object_key, segment_date
from flywheel.logstore import LogStore, LogStoreError, SpoolDrain, SpoolSink, from_parquet, spool_id
from flywheel.logstore.segments import list_segments
from tests.support.bucket import log_keys, shipping_sink
from tests.support.records import rec
from tests.support.servers import free_port

pytestmark = pytest.mark.slow   # every test here talks to the weed server or builds on it


def wait_until(pred, timeout: float = 20.0, step: float = 0.05) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(step)
    return pred()


def test_shipper_is_a_spool_drain(objects):
    assert isinstance(ObjectShipper(objects), SpoolDrain)


def test_keys_name_the_spool_the_segment_and_the_first_rows_date():
    t = pa.table({"created_at": pa.array([datetime(2026, 3, 4, 23, 59), datetime(2026, 3, 5, 0, 1)],
                                         pa.timestamp("us"))})
    assert segment_date(t, "seg-x") == "2026-03-04"
    empty = t.slice(0, 0)
    ns = int(datetime(2025, 1, 2, 3, tzinfo=timezone.utc).timestamp() * 1e9)
    assert segment_date(empty, f"lab-{ns:020d}-12-00000001.arrow") == "2025-01-02"
    assert object_key("labels", "2026-03-04", "0123456789ab", "lab-1-2-3.arrow") == \
        "log/labels/date=2026-03-04/0123456789ab-lab-1-2-3.parquet"


def test_sink_ships_decisions_and_labels_and_deletes_them_after_the_ack(tmp_path, objects):
    spool = tmp_path / "spool"
    sink, shipper = shipping_sink(spool, objects)
    records = [rec(f"query {i}") for i in range(30)]
    for r in records:
        sink.write(r)
    sink.add_human_label(records[0].decision.id, "shipping", author="ann")
    sink.add_teacher_label(records[1].decision.id, None, "llm-x", True, 12.5)
    assert sink.drain_now(10.0) == 32
    assert list_segments(spool) == [] and sink.drained == 32 and sink.drain_errors == 0

    sid = spool_id(spool)
    today = datetime.now(timezone.utc).strftime("%Y-%m-%d")
    dec, lab = log_keys(objects, "decisions"), log_keys(objects, "labels")
    assert len(dec) == 1 and len(lab) == 1
    assert dec[0].startswith(f"log/decisions/date={today}/{sid}-seg-") and dec[0].endswith(".parquet")
    assert lab[0].startswith(f"log/labels/date={today}/{sid}-lab-")
    table = from_parquet(objects.get(dec[0])[0])
    assert table.column("decision_id").to_pylist() == [r.decision.id for r in records]
    assert table.column("text").to_pylist() == [r.text for r in records]
    assert np.allclose(table.column("embedding")[3].as_py(), records[3].embedding)
    labels = from_parquet(objects.get(lab[0])[0]).to_pylist()
    assert [(x["decision_id"], x["source"], x["label"]) for x in labels] == \
        [(records[0].decision.id, "human", "shipping"), (records[1].decision.id, "teacher", None)]
    c = shipper.counters()
    assert (c["rows"], c["objects"], c["already_there"], c["quarantined"]) == (32, 2, 0, 0)
    assert c["bytes"] == sum(o.size for o in objects.list("log"))
    sink.close()


def test_a_refusing_store_keeps_every_segment_and_never_leaks_a_credential(tmp_path, s3_server, store_env,
                                                                              monkeypatch, caplog):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret-7d0c55")
    wrong = ObjectStore(StoreConfig.parse(store_env), timeout_s=2.0)
    spool = tmp_path / "spool"
    sink, shipper = shipping_sink(spool, wrong)
    for i in range(5):
        sink.write(rec(f"q{i}"))
    sink.flush()
    before = list_segments(spool)
    with pytest.raises(FleetError) as err:
        sink.drain_now(5.0)
    assert list_segments(spool) == before and len(before) == 1
    assert sink.drain_errors == 1 and sink.last_drain_error and shipper.errors == 1
    sink.close(grace_s=0.5)
    assert list_segments(spool) == before
    text = str(err.value) + caplog.text + str(sink.last_drain_error)
    assert "access denied" in str(err.value)
    assert "wrong-secret-7d0c55" not in text and s3_server.access_key not in text


def test_a_segment_shipped_twice_is_one_object_and_one_row(tmp_path, objects):
    spool = tmp_path / "spool"
    sink, shipper = shipping_sink(spool, objects)
    records = [rec(f"twice {i}") for i in range(7)]
    for r in records:
        sink.write(r)
    sink.flush()
    (name,) = list_segments(spool)
    saved = (spool / name).read_bytes()
    assert sink.drain_now(10.0) == 7
    (spool / name).write_bytes(saved)    # a crash between the upload and the unlink
    assert sink.drain_now(10.0) == 7     # acknowledged by "already exists"
    assert list_segments(spool) == []
    assert len(log_keys(objects, "decisions")) == 1
    assert (shipper.shipped_objects, shipper.already_there) == (2, 1)
    sink.close()

    store = LogStore(tmp_path / "mirror.duckdb")
    report = mirror(objects, store)
    assert (report.objects, report.rows) == (1, 7)
    assert store.count() == 7


def test_an_unreadable_segment_is_quarantined_and_the_rest_ships(tmp_path, objects, caplog):
    spool = tmp_path / "spool"
    with SpoolSink(spool, None) as writer:
        writer.write(rec())
    (good,) = list_segments(spool)
    odd = f"seg-{2:020d}-1-\x01.arrow"   # readable, but no object key can hold its name
    shutil.copy(spool / good, spool / odd)
    (spool / f"seg-{1:020d}-1-00000000.arrow").write_bytes(b"not an arrow file")
    (spool / "junk.arrow").write_bytes(b"")
    shipper = ObjectShipper(objects)
    assert shipper.drain(spool, 10.0) == 1
    assert sorted(p.name for p in spool.iterdir() if p.name.endswith(".bad")) == \
        ["junk.arrow.bad", f"seg-{1:020d}-1-00000000.arrow.bad", odd + ".bad"]
    assert shipper.quarantined == 3 and len(log_keys(objects, "decisions")) == 1
    assert list_segments(spool) == [] and "cannot be shipped" in caplog.text


def test_no_new_segment_starts_after_the_timeout(tmp_path, objects):
    spool = tmp_path / "spool"
    sink, shipper = shipping_sink(spool, objects, batch_size=1)
    for i in range(3):
        sink.write(rec(f"q{i}"))
        sink.flush()
    assert len(list_segments(spool)) == 3
    assert shipper.drain(spool, 0.0) == 0 and len(list_segments(spool)) == 3
    assert shipper.drain(spool, 10.0) == 3 and list_segments(spool) == []
    sink.close()


def test_store_down_never_blocks_a_write_and_everything_arrives_after_restart(tmp_path, s3_server, objects):
    short = ObjectStore(objects.cfg, timeout_s=1.0, max_retries=0)
    # which threads call the store: a write must never (it spools; the drain thread ships)
    callers: set[int] = set()
    for name in ("put_if_absent", "put", "put_if_match", "get", "head", "list", "delete"):
        real = getattr(short, name)

        def spy(*a, _real=real, **k):
            callers.add(threading.get_ident())
            return _real(*a, **k)
        setattr(short, name, spy)
    spool = tmp_path / "spool"
    sink, shipper = shipping_sink(spool, short, drain_interval_s=0.2, busy_timeout_s=2.0)
    n = 3000
    s3_server.stop()
    try:
        for i in range(n):
            sink.write(rec(f"during the outage {i}"))
            if i == 1000:
                sink.add_human_label(f"dec-{i}", "billing")
        sink.flush(10.0)
        assert wait_until(lambda: sink.drain_errors >= 1, 15.0), "the drain never noticed the outage"
        assert isinstance(sink.last_drain_error, str) and "StoreUnavailable" in sink.last_drain_error
        assert sink.spool_segments >= 1 and sink.drained == 0
        # never waited for the store: the writing thread never called it, the drain did
        assert callers and threading.get_ident() not in callers, callers
    finally:
        s3_server.start()
    # the drain removes each segment as it ships it and counts the rows when its call
    # returns: wait for the count, not for the empty spool (which it reaches first)
    assert wait_until(lambda: sink.drained == n + 1, 30.0), \
        f"shipping did not resume by itself (drained {sink.drained} of {n + 1})"
    assert sink.spool_segments == 0 and sink.last_drain_error is None
    sink.close()
    store = LogStore(tmp_path / "mirror.duckdb")
    mirror(objects, store)
    assert store.count() == n
    assert store.query("SELECT count(*) FROM labels")[0][0] == 1


def test_close_ships_within_the_grace_period_and_the_next_start_ships_the_rest(tmp_path, s3_server, objects):
    spool = tmp_path / "spool"
    sink, _ = shipping_sink(spool, objects)
    for i in range(10):
        sink.write(rec(f"at close {i}"))
    sink.close(grace_s=10.0)
    assert list_segments(spool) == [] and len(log_keys(objects, "decisions")) == 1

    dead = ObjectStore(StoreConfig.parse(objects.cfg.url, {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}", "AWS_ACCESS_KEY_ID": "k",
        "AWS_SECRET_ACCESS_KEY": "s"}), timeout_s=0.5, max_retries=0)
    sink, _ = shipping_sink(spool, dead)
    sink.write(rec("left behind"))
    sink.close(grace_s=0.5)
    assert len(list_segments(spool)) == 1   # stays for the next start
    with pytest.raises(StoreUnavailable):
        ObjectShipper(dead).drain(spool, 1.0)
    sink, _ = shipping_sink(spool, objects, drain_interval_s=0.1)   # the next start ships it by itself
    assert wait_until(lambda: not list_segments(spool), 10.0)
    sink.close()
    assert len(log_keys(objects, "decisions")) == 2


def test_a_spool_copied_whole_to_another_host_ships_under_the_same_keys(tmp_path, objects):
    """The spool id (made by the first drain) travels with the spool: a replica restarted
    elsewhere with its emptyDir copied ships the same keys, never a second copy."""
    spool = tmp_path / "a"
    sink, _ = shipping_sink(spool, objects)
    sink.write(rec("first"))
    sink.drain_now(10.0)
    sink.write(rec("second"))
    sink.flush()
    copy = tmp_path / "b"
    shutil.copytree(spool, copy)
    sink.drain_now(10.0)
    sink.close()
    assert spool_id(copy) == spool_id(spool)
    assert ObjectShipper(objects).drain(copy, 10.0) == 1
    assert len(log_keys(objects, "decisions")) == 2
    assert not [p for p in os.listdir(copy) if p.endswith(".arrow")]


def test_a_closed_sink_refuses_drains(tmp_path, objects):
    sink, _ = shipping_sink(tmp_path / "s", objects)
    sink.close()
    with pytest.raises(LogStoreError):
        sink.drain_now(1.0)
