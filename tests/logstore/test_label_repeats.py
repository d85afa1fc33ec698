"""Issue 32, item 11: the same label for the same decision from the same author is one label.
:meth:`LogStore.add_human_label` writes it once (and says so); what a sink that cannot look
wrote twice (the spool, two replicas) is kept, and counted once by ``count_new_labels``,
which the retrain's ``--min-new-labels`` reads."""

from __future__ import annotations

from flywheel.logstore import LogStore
from flywheel.logstore.label_records import LabelRecord, stable_label_uid
from tests.support.records import make_record
from tests.support.worlds import write


def _store(tmp_path, n=2) -> tuple[LogStore, list[str]]:
    store = LogStore(tmp_path / "log.duckdb")
    ids = write(store, [make_record(text=f"query {i}") for i in range(n)])
    return store, ids


def _human(store: LogStore) -> int:
    return store.query("SELECT count(*) FROM labels WHERE source = 'human'")[0][0]


def test_add_human_label_writes_a_repeat_once_and_keeps_every_change(tmp_path):
    store, (a, b) = _store(tmp_path)
    assert store.add_human_label(a, "billing", author="ana") is True
    assert store.add_human_label(a, "billing", author="ana") is False          # a repeat: nothing written
    assert store.add_human_label(a, "billing", author="bo") is True            # another author's label
    assert store.add_human_label(a, "shipping", author="bo") is True
    assert store.add_human_label(a, "billing", author="bo") is True            # a change back is a label
    assert store.add_human_label(b, None) is True and store.add_human_label(b, None) is False
    assert _human(store) == 5 and store.count_new_labels(None) == 5
    assert {r.decision_id: r.human_label for r in store.labelled_rows()} == {a: "billing", b: None}

    uid = stable_label_uid("label-studio", a, "shipping", "ana", "1@t")
    assert store.add_human_label(a, "shipping", author="ana", label_uid=uid) is True
    store.add_human_label(a, "billing", author="bo")
    assert store.add_human_label(a, "shipping", author="ana", label_uid=uid) is False   # the same import: once
    assert store.is_recorded(LabelRecord.human(a, "shipping", author="ana", label_uid=uid))
    assert _human(store) == 7 and store.count_new_labels(None) == 7


def test_repeats_written_where_nobody_could_look_count_once(tmp_path):
    """Two replicas' spools (or one sidecar given the same Feedback twice) hold the same label:
    both rows stay, the new-label count counts one."""
    store, (a, b) = _store(tmp_path)
    before = store.count_new_labels(None)
    sink = store.open_sink(ingest_interval_s=None, fsync=False)
    for _ in range(3):
        sink.add_human_label(a, "billing", author="grpc")
    sink.add_human_label(b, "billing", author="grpc")
    sink.add_human_label(b, "shipping", author="grpc")
    sink.flush()
    sink.close()
    assert _human(store) == 5
    assert store.count_new_labels(None) == before + 3          # a once, then b's two different labels
