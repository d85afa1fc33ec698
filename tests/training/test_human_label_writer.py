"""Issue 33, item 3: one writer of human labels (:class:`fleet.human_labels.HumanLabels`,
given by the site). Each of the six entry points (``flywheel feedback``, the review walk,
the ``flywheel ui`` POST, a Label Studio import, gRPC ``Feedback``, ``record_feedback`` from
Python) records through it, the
labels are parsed against the served model's manifest read once per command (a POST of
1,000 labels reads it once), and the server's writer follows the model it serves now."""

from __future__ import annotations

import copy
import json

import pytest
from typer.testing import CliRunner

from flywheel.classifier.errors import UnknownLabelError
from flywheel.classifier.layer2.fitter import fit_model
from flywheel.classifier.settings.config import load_config
from flywheel.classifier.settings.intents import parse_intents
from flywheel.classifier.versions.model import Manifest
from flywheel.classifier.versions.registry import ModelRegistry
from flywheel.cli import build_app, main
from flywheel.fleet.human_labels import HumanLabels
from flywheel.logstore import LogStore, UnknownDecisionError
from tests.support.docs import ALWAYS_SURE, DOC
from tests.support.fakes import HashEmbedder
from tests.support.records import review_record, teacher_call
from tests.support.worlds import write

IDS = ("a" * 32, "b" * 32, "c" * 32)
TOKEN = "s3cret"


def _doc(*extra: str) -> dict:
    d = copy.deepcopy(DOC)
    d["thresholds"] = ALWAYS_SURE
    d["intents"] += [{"name": n, "description": n.lower(), "examples": [f"{n.lower()} please {i}" for i in range(6)]}
                     for n in extra]
    return d


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A home whose models home serves v1 (RETRIEVAL, PLATFORM, BILLING: not the starter
    set), with three logged decisions; ``Manifest.read`` and the writer's records counted."""
    monkeypatch.setenv("FLYWHEEL_HOME", str(tmp_path))
    monkeypatch.setenv("FLYWHEEL_TEACHER", "off")
    reg = ModelRegistry(tmp_path / "models")
    fit_model(parse_intents(_doc("BILLING")), embedder=HashEmbedder(), version="v1").save(reg.version_dir("v1"))
    reg.promote("v1")
    cfg = load_config()
    write(LogStore(cfg.log_path), [
        review_record(IDS[0], "docs or my plan?", "RETRIEVAL",
                      teacher=teacher_call(None, False, candidates=("RETRIEVAL", "PLATFORM"))),
        review_record(IDS[1], "show my quota", "PLATFORM", teacher=teacher_call("PLATFORM")),
        review_record(IDS[2], "my invoice", "PLATFORM", l2="PLATFORM", teacher=teacher_call("PLATFORM")),
    ])
    seen = {"manifest_reads": 0, "records": []}
    read, record = Manifest.read, HumanLabels.record

    def counted_read(*a, **k):
        seen["manifest_reads"] += 1
        return read(*a, **k)

    def spied(self, decision_id, label, **k):
        seen["records"].append((decision_id, label, k.get("author")))
        return record(self, decision_id, label, **k)

    monkeypatch.setattr(Manifest, "read", staticmethod(counted_read))
    monkeypatch.setattr(HumanLabels, "record", spied)
    return cfg, reg, seen


def _human(cfg) -> dict:
    return {r.decision_id: r.human_label for r in LogStore(cfg.log_path).labelled_rows() if r.has_human_label}


def test_feedback_records_through_the_writer_against_the_served_labels(home, capsys):
    cfg, _, seen = home
    assert main(["feedback", IDS[0], "BILLING", "--author", "ana"]) == 0
    assert seen["records"] == [(IDS[0], "BILLING", "ana")] and seen["manifest_reads"] == 1
    assert main(["feedback", IDS[1], "CODE_GENERATION"]) == 2          # a starter label v1 does not serve
    assert "unknown label 'CODE_GENERATION'" in capsys.readouterr().err
    assert _human(cfg) == {IDS[0]: "BILLING"}


def test_record_feedback_from_python_records_through_the_writer(home):
    from flywheel.training.review.feedback import add_feedback, record_feedback

    cfg, _, seen = home
    assert record_feedback(cfg, f" {IDS[0]} ", "BILLING", author="ana") == "BILLING"
    assert seen["records"] == [(IDS[0], "BILLING", "ana")] and seen["manifest_reads"] == 1
    assert add_feedback(cfg, IDS[0], "BILLING", author="ana") == ("BILLING", False)   # again: nothing written
    assert add_feedback(cfg, IDS[1], "oos") == (None, True)                            # out of scope
    with pytest.raises(UnknownLabelError, match="unknown label 'CODE_GENERATION'"):
        record_feedback(cfg, IDS[2], "CODE_GENERATION")          # a starter label v1 does not serve
    with pytest.raises(UnknownDecisionError):
        record_feedback(cfg, "d" * 32, "BILLING")                # locally the log must hold it
    assert _human(cfg) == {IDS[0]: "BILLING", IDS[1]: None}
    assert [r[:2] for r in seen["records"]] == [(IDS[0], "BILLING"), (IDS[0], "BILLING"), (IDS[1], None),
                                                ("d" * 32, "BILLING")]   # the log refused the last one


def test_the_review_walk_records_through_the_writer(home):
    cfg, _, seen = home
    res = CliRunner().invoke(build_app(), ["review", "--author", "bo"], input="/bill\nq")
    assert res.exit_code == 0, res.output
    assert len(seen["records"]) == 1 and seen["records"][0][1:] == ("BILLING", "bo")
    assert seen["manifest_reads"] == 1 and "BILLING" in _human(cfg).values()


def test_a_post_of_1000_labels_reads_the_manifest_once(home):
    from flywheel.training.cli.review import ui_app
    from flywheel.training.review.app import LABELS_MAX_AGE_S

    cfg, _, seen = home
    now = [100.0]
    app = ui_app(None, None, TOKEN, clock=lambda: now[0])     # as flywheel ui opens it; the clock stands still
    assert seen["manifest_reads"] == 0                 # asked for when a request needs them
    batch = [{"decision_id": IDS[i % 3], "label": ("BILLING", "PLATFORM")[i % 2], "author": f"p{i}"}
             for i in range(1000)]
    auth = {"authorization": f"Bearer {TOKEN}"}
    res = app.handle("POST", "/api/labels", auth, json.dumps({"labels": batch}).encode())
    assert res.status == 200 and json.loads(res.body)["n"] == 1000
    assert len(seen["records"]) == 1000 and seen["manifest_reads"] == 1
    starter_only = {"decision_id": IDS[0], "label": "CODE_GENERATION"}
    bad = app.handle("POST", "/api/labels", auth, json.dumps(starter_only).encode())
    assert bad.status == 400 and "unknown label 'CODE_GENERATION'" in json.loads(bad.body)["error"]
    assert len(seen["records"]) == 1000 and seen["manifest_reads"] == 1
    now[0] += LABELS_MAX_AGE_S                         # old enough: the next request asks the site again
    assert app.handle("GET", "/api/queue", {}).status == 200 and seen["manifest_reads"] == 2


def test_a_label_studio_import_records_through_the_writer(home, tmp_path, capsys):
    cfg, _, seen = home
    done = [{"data": {"decision_id": did}, "annotations": [{"id": i, "completed_by": 3, "updated_at": "2026-11-28",
                                                            "result": [{"from_name": "intent", "value": {
                                                                "choices": [choice]}}]}]}
            for i, (did, choice) in enumerate(zip(IDS, ["BILLING", "OUT_OF_SCOPE", "PLATFORM"]))]
    (tmp_path / "ls.json").write_text(json.dumps(done))
    assert main(["review", "--import-label-studio", str(tmp_path / "ls.json")]) == 0
    assert "recorded 3 human label(s)" in capsys.readouterr().out
    assert [r[:2] for r in seen["records"]] == [(IDS[0], "BILLING"), (IDS[1], None), (IDS[2], "PLATFORM")]
    assert seen["manifest_reads"] == 1 and _human(cfg) == {IDS[0]: "BILLING", IDS[1]: None, IDS[2]: "PLATFORM"}


def test_grpc_feedback_records_through_the_writer_against_the_model_served_now(home):
    from flywheel.service.core import SidecarCore
    from flywheel.service.metrics import ServerMetrics
    from flywheel.service.options import BatchOptions
    from flywheel.service.runtime import open_runtime

    cfg, reg, seen = home
    rt = open_runtime(load_config(model=str(reg.home)), progress=False, embedder=HashEmbedder())
    core = SidecarCore(rt, BatchOptions(), ServerMetrics())
    try:
        assert core.feedback(IDS[0], "BILLING") == "BILLING"
        assert seen["records"] == [(IDS[0], "BILLING", "grpc")]
        with pytest.raises(UnknownLabelError, match="feedback label 'REFUND'"):
            core.feedback(IDS[1], "REFUND")
        with pytest.raises(UnknownDecisionError):
            core.feedback("f" * 32, "PLATFORM")                  # locally: the log's own check
        fit_model(parse_intents(_doc("BILLING", "REFUND")), embedder=HashEmbedder(),
                  version="v2").save(reg.version_dir("v2"))
        reg.promote("v2")
        assert rt.classifier.watcher.poll(force=True) and rt.classifier.model_version == "v2"
        assert core.feedback(IDS[1], "REFUND") == "REFUND"        # the model served now: hot-swapped
    finally:
        core.close()
    assert _human(cfg) == {IDS[0]: "BILLING", IDS[1]: "REFUND"}


def test_the_writer_reads_the_served_labels_once_unless_live_and_applies_the_fleets_id_rules(tmp_path):
    from flywheel.classifier.decision import new_decision_id

    calls = []

    def served():
        calls.append(1)
        return ("A", "B")

    class Sink:
        def __init__(self):
            self.got = []

        def add_human_label(self, did, label, *, author=None, label_uid=None):
            self.got.append((did, label))
            return True

    sink = Sink()
    offline = HumanLabels(sink, served)
    for _ in range(1000):
        offline.record_text("d1", "A")
    assert len(calls) == 1 and len(sink.got) == 1000
    now = ["A"]
    live = HumanLabels(sink, lambda: now, live=True)   # a server's: the model served at each label
    with pytest.raises(UnknownLabelError):
        live.record_text("d1", "B")
    now.append("B")
    assert live.record_text("d1", "B") == ("B", True) and offline.labels == ("A", "B") and len(calls) == 1
    with pytest.raises(UnknownLabelError):
        offline.record("d1", "C")                      # an already parsed label is still one of the served
    fleet = HumanLabels(sink, served, fleet=True)
    with pytest.raises(UnknownDecisionError, match="not a decision id"):
        fleet.record_text("d1", "A")
    from flywheel.classifier.decision import PROCESS_TAG

    forged = PROCESS_TAG + "0" * 24                    # this process's tag, not made here
    with pytest.raises(UnknownDecisionError, match="did not make it"):
        fleet.record_text(forged, "A")
    assert fleet.record_text(new_decision_id(), " B ")[0] == "B"
    with pytest.raises(Exception, match="decision_id must be a non-empty string"):
        offline.record_text("  ", "A")


def test_a_following_writer_asks_for_the_served_labels_again_once_they_are_old():
    """Issue 41, item 5: ``flywheel ui``'s writer (:meth:`HumanLabels.following`) keeps the
    served labels at most ``max_age_s``; the same sink, id rules and source of labels."""
    served, now = [("A",)], [0.0]
    calls = []

    def labels():
        calls.append(1)
        return served[0]

    class Sink:
        def add_human_label(self, did, label, *, author=None, label_uid=None):
            return True

    offline = HumanLabels(Sink(), labels, fleet=True)
    writer = offline.following(2.0, clock=lambda: now[0])
    assert writer.sink is offline.sink and writer.fleet and writer.labels == ("A",) and len(calls) == 1
    served[0] = ("A", "B")                       # promoted
    now[0] = 1.9
    assert writer.labels == ("A",) and len(calls) == 1
    now[0] = 2.0
    assert writer.labels == ("A", "B") and len(calls) == 2
    served[0] = ("B",)
    now[0] = 4.0
    with pytest.raises(UnknownLabelError, match="unknown label 'A'"):
        writer.record("f" * 32, "A")             # checked against the served labels when it is written
