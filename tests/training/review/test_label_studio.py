"""Issue 32, item 11: importing the same Label Studio export again records nothing new, says
so, and the retrain's new-label count (``--min-new-labels``) does not grow; an annotation
changed in Label Studio is a new label. The fleet's side is in tests/fleet/test_cli_fleet.py."""

from __future__ import annotations

import json

import pytest

from flywheel.cli import main
from flywheel.logstore import LogStore
from flywheel.training.retrain import count_new_labels
from tests.support.records import review_record, teacher_call
from tests.support.worlds import write

IDS = ("a" * 32, "b" * 32, "c" * 32)


@pytest.fixture
def logged(tmp_path):
    path = tmp_path / "log.duckdb"
    write(LogStore(path), [
        review_record(IDS[0], "docs or my plan?", "RETRIEVAL",
                      teacher=teacher_call(None, False, candidates=("RETRIEVAL", "PLATFORM"))),
        review_record(IDS[1], "show my quota", "PLATFORM", teacher=teacher_call("PLATFORM")),
        review_record(IDS[2], "<b>bold</b> question", "PLATFORM", teacher=teacher_call("PLATFORM"), age_days=3),
    ])
    return path


def _annotation(choice: str, updated_at: str, ann_id: int = 1, who: object = 7) -> list[dict]:
    return [{"id": ann_id, "completed_by": who, "updated_at": updated_at,
             "result": [{"from_name": "intent", "to_name": "text", "type": "choices", "value": {"choices": [choice]}}]}]


def _import(capsys, logged, export) -> str:
    assert main(["review", "--import-label-studio", str(export), "--log-db", str(logged)]) == 0
    return capsys.readouterr().out


def _human_rows(logged) -> list[tuple]:
    return LogStore(logged).query("SELECT decision_id, label, author FROM labels WHERE source = 'human' "
                                  "ORDER BY label_id")


def test_the_same_export_imported_twice_records_each_label_once(logged, tmp_path, capsys):
    tasks = tmp_path / "tasks.json"
    assert main(["review", "--export-label-studio", str(tasks), "--log-db", str(logged)]) == 0
    done = json.loads(tasks.read_text())
    done[0]["annotations"] = _annotation("PLATFORM", "2026-11-27T10:00")
    done[2]["annotations"] = _annotation("OUT_OF_SCOPE", "2026-11-27T10:05", 3, {"email": "ana@example.com"})
    export = tmp_path / "export.json"
    export.write_text(json.dumps(done))
    capsys.readouterr()
    store = LogStore(logged)
    before = count_new_labels(store, None)

    assert "recorded 2 human label(s)" in _import(capsys, logged, export)
    assert len(_human_rows(logged)) == 2 and count_new_labels(store, None) == before + 2
    out = _import(capsys, logged, export)                                      # the same file again
    assert out.startswith("recorded 0 human label(s) from ") and "2 already recorded" in out, out
    assert len(_human_rows(logged)) == 2 and count_new_labels(store, None) == before + 2

    # the reviewer changes one answer in Label Studio and exports again: one new label, one old
    done[0]["annotations"] = _annotation("RETRIEVAL", "2026-11-28T09:00")
    export.write_text(json.dumps(done))
    out = _import(capsys, logged, export)
    assert "recorded 1 human label(s)" in out and "1 already recorded" in out, out
    assert count_new_labels(store, None) == before + 3
    # ... and back: a change again, so a label again (the latest human label wins)
    done[0]["annotations"] = _annotation("PLATFORM", "2026-11-29T09:00")
    export.write_text(json.dumps(done))
    assert "recorded 1 human label(s)" in _import(capsys, logged, export)
    latest = {r.decision_id: r.human_label for r in store.labelled_rows() if r.has_human_label}
    assert latest == {IDS[0]: "PLATFORM", IDS[2]: None}
    assert "recorded 0 human label(s)" in _import(capsys, logged, export)     # and that export again: nothing
    assert len(_human_rows(logged)) == 4 and count_new_labels(store, None) == before + 4


def test_feedback_given_twice_is_one_label(logged, capsys):
    """The same label for the same decision from the same author, through ``flywheel
    feedback`` (no Label Studio ids): recorded once; another author's is another label."""
    store = LogStore(logged)
    before = count_new_labels(store, None)
    for _ in range(2):
        assert main(["feedback", IDS[1], "RETRIEVAL", "--author", "ana", "--log-db", str(logged)]) == 0
    assert _human_rows(logged) == [(IDS[1], "RETRIEVAL", "ana")] and count_new_labels(store, None) == before + 1
    assert main(["feedback", IDS[1], "RETRIEVAL", "--author", "bo", "--log-db", str(logged)]) == 0
    assert len(_human_rows(logged)) == 2 and count_new_labels(store, None) == before + 2


def test_feedback_given_again_says_nothing_was_written(logged, capsys):
    """The repeat's output says it was already recorded (a second 'recorded' read as a
    second label); a changed label is recorded as a new one."""
    said = []
    for label in ("RETRIEVAL", "RETRIEVAL", "PLATFORM"):
        assert main(["feedback", IDS[1], label, "--log-db", str(logged)]) == 0
        said.append(capsys.readouterr().out.strip())
    assert said == [f"recorded RETRIEVAL for decision {IDS[1]}",
                    f"already recorded RETRIEVAL for decision {IDS[1]} (nothing written)",
                    f"recorded PLATFORM for decision {IDS[1]}"], said
    assert [r[1] for r in _human_rows(logged)] == ["RETRIEVAL", "PLATFORM"]


def test_a_second_import_does_not_reach_the_retrains_min_new_labels(tmp_path):
    """The retrain's ``--min-new-labels`` after the same export was imported twice: it counts
    the labels once, so the run still skips."""
    from flywheel.fleet.human_labels import HumanLabels
    from flywheel.training.review.label_studio import import_annotations, read_annotations
    from tests.support.worlds import World

    world = World(tmp_path)
    recs, items = world.seed_traffic(n_teacher=200, n_human=10)
    first = world.run()
    assert first.outcome == "promoted"
    done = [{"data": {"decision_id": r.decision.id}, "annotations": _annotation(y or "OUT_OF_SCOPE", "2026-11-27", i)}
            for i, (r, (_, y)) in enumerate(zip(recs[:3], items[:3]))]

    writer = HumanLabels(world.store, lambda: world.intents.labels)
    for n in (3, 0):
        report = import_annotations(*read_annotations(done, writer.labels), writer)
        assert (report.recorded, report.already) == (n, 3 - n)
    skipped = world.run(min_new_labels=4)
    assert skipped.outcome == "skipped" and skipped.reason.startswith("3 new labels since "), skipped.reason
    assert world.run(min_new_labels=3, dry_run=True).outcome != "skipped"
