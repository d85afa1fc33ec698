"""The teacher-noise guard (issue 41, item 6): a teacher measured as mostly wrong is not
distilled silently. Above ``--max-teacher-noise`` (decided on the estimate's 95% lower
bound) the retrain drops the teacher rows of the labels above it and says so in its notes,
its report, ``flywheel stats`` and the dashboard (training.teacher_noise.guard_teacher_rows,
noise_guard)."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from flywheel.classifier.decision import Candidate, Decision, Layer, Tier
from flywheel.classifier.protocols import DecisionRecord
from flywheel.cli import build_app
from flywheel.training.cli import retrain as cli_retrain
from flywheel.training.options import DEFAULT_MAX_TEACHER_NOISE, RetrainOptionError, RetrainOptions
from flywheel.training.report import teacher_markdown
from flywheel.training.review.dashboard import dashboard_data, render_dashboard
from flywheel.training.rows import LabelledSet, TrainingSet
from flywheel.training.stats.traffic import convergence, empty_stats, format_table
from flywheel.training.teacher_noise import NoiseEstimate, guard_teacher_rows, min_labels_for, noise_guard
from tests.support.fakes import HashEmbedder
from tests.support.worlds import ENC, INTENT_DOC, World, human_labels, record, sample, write


@pytest.fixture()
def world(tmp_path) -> World:
    return World(tmp_path)


def checked_by_humans(world: World, pairs: list[tuple[str, str, int]]) -> None:
    """Decisions the teacher labelled and a human labelled too: ``(teacher, human, n)``,
    each on fresh queries of the human's (true) label."""
    seen = {row[0] for row in world.store.query("SELECT text FROM decisions")}
    pool = [(t, y) for t, y in sample(600, 11) if y is not None and t not in seen]
    recs, labels = [], []
    for teacher, human, n in pairs:
        texts = [t for t, y in pool if y == human and t not in {r.text for r in recs}][:n]
        assert len(texts) == n
        recs += [record(t, teacher=teacher) for t in texts]
        labels += [human] * n
    write(world.store, recs)
    human_labels(world.store, [(r.decision.id, lab) for r, lab in zip(recs, labels)])


def bad_teacher(world: World) -> None:
    """200 teacher-labelled decisions, and 20 with a human label too, 15 of them wrong: the
    teacher said PLATFORM on 12 (10 were RETRIEVAL) and RETRIEVAL on 8 (5 were PLATFORM)."""
    world.seed_traffic(n_teacher=200, n_human=0)
    checked_by_humans(world, [("PLATFORM", "RETRIEVAL", 10), ("PLATFORM", "PLATFORM", 2),
                              ("RETRIEVAL", "PLATFORM", 5), ("RETRIEVAL", "RETRIEVAL", 3)])


def layer2_record(text: str, label: str) -> DecisionRecord:
    """A confident layer-2 decision with its vector: a self-training row."""
    d = Decision(label=label, confidence=0.97, tier=Tier.CONFIDENT, layer=Layer.EMBEDDING, reason="test",
                 alternatives=[Candidate(label, 0.97)], model_version="v1", latency_ms={"embedding": 1.0})
    return DecisionRecord(decision=d, text=text, created_at=time.time() - 60, encoder_id=ENC.id,
                          embedding=ENC.encode([text])[0])


def _guard_notes(res) -> list[str]:
    return [n for n in res.report["notes"] if n.startswith("teacher ")]


# ------------------------------------------------------------------ the decision
def test_the_fewest_labels_that_can_show_the_level():
    assert min_labels_for(0.30) == 4 and min_labels_for(0.5) == 6
    assert min_labels_for(0.0) == 1 and min_labels_for(1.0) is None
    assert 0.025 ** (1 / 3) <= 0.30 < 0.025 ** (1 / 4)       # 3 wrong of 3: the interval still reaches 0.29


def test_the_guard_decides_on_the_lower_bound():
    bad = NoiseEstimate.from_rows([("A", "B", 15), ("A", "A", 5)])
    g = noise_guard(bad.overall(), bad.by_intent())
    assert g["status"] == "above" and g["low"] > DEFAULT_MAX_TEACHER_NOISE and g["labels"] == {"A": 0.75}
    assert g["line"].startswith("teacher above --max-teacher-noise 0.3 (the default): 75.0% wrong")
    # 40% wrong on 20 decisions: above the level, but its lower bound is not
    unlucky = NoiseEstimate.from_rows([("A", "B", 8), ("A", "A", 12)])
    assert unlucky.overall()["estimate"] > 0.3 > unlucky.overall()["low"]
    assert noise_guard(unlucky.overall(), unlucky.by_intent())["status"] == "within"
    few = NoiseEstimate.from_rows([("A", "B", 3)])
    assert noise_guard(few.overall(), {})["status"] == "unknown"
    assert noise_guard(NoiseEstimate().overall(), {})["status"] == "unknown"
    assert noise_guard(bad.overall(), bad.by_intent(), level=1.0)["status"] == "off"
    assert noise_guard(bad.overall(), bad.by_intent(), level=0.6)["status"] == "within"
    # 20 labels cannot show a teacher above 90% (36 can): unknown, whatever they say
    assert noise_guard(bad.overall(), bad.by_intent(), level=0.9)["status"] == "unknown"


def _tiny_set(rows: list[tuple[str | None, str]]) -> TrainingSet:
    n = len(rows)
    empty = LabelledSet([], [], np.zeros((0, 4), np.float32), [], [])
    return TrainingSet(texts=[f"text {i}" for i in range(n)], labels=[lab for lab, _ in rows],
                       vectors=np.ones((n, 4), np.float32), sources=[s for _, s in rows], decision_ids=[None] * n,
                       report={"train": {}}, eval=empty, recent=empty, fit_intents=None, log_until=0.0)


def test_only_teacher_rows_of_labels_above_the_level_are_dropped_never_the_last_two():
    ts = _tiny_set([("A", "intent_example")] * 3 + [("A", "teacher")] * 5
                   + [("B", "teacher")] * 3
                   + [("C", "human")] * 2 + [("C", "teacher")] * 4 + [("C", "layer2")] * 2
                   + [(None, "teacher")] * 3)
    # A's own record is clean (kept), C's all wrong, B too few checks: the overall 60%
    est = NoiseEstimate.from_rows([("A", "A", 10), ("C", "A", 10), ("B", "A", 5)])
    out, info = guard_teacher_rows(ts, est)
    assert info["status"] == "above" and info["kept_labels"] == {"A": 0.0} and info["labels"] == {"C": 1.0}
    assert info["checked"] == 15 and info["dropped"] == 6 and info["held_back"] == 4
    assert info["dropped_by_label"] == {"C": 4, "B": 1, "OUT_OF_SCOPE": 1}
    assert out.counts() == {**ts.counts(), "teacher": 15 - 6} and out.report["train"]["n"] == len(ts) - 6
    left = list(zip(out.labels, out.sources))
    assert left.count(("A", "teacher")) == 5 and ("C", "teacher") not in left
    assert left.count(("C", "human")) == 2 and left.count(("C", "layer2")) == 2
    assert left.count(("B", "teacher")) == 2 and left.count((None, "teacher")) == 2   # the head needs 2
    note, = info["notes"]
    assert "6 of 15 teacher rows dropped before training (by their own record: C 100.0%; the other labels at " \
           "the overall 60.0%); kept, their own record within the level: A 0.0%; 4 held back" in note
    assert guard_teacher_rows(ts, est, 1.0)[0] is ts


# ------------------------------------------------------------------ the retrain
def test_a_mostly_wrong_teacher_is_not_distilled_and_the_summary_says_so(world):
    bad_teacher(world)
    ids = write(world.store, [layer2_record(t, y) for t, y in sample(900, 4)[:700] if y is not None][-30:])
    assert ids
    res = world.run(dry_run=True, self_training=0.3)
    g = res.report["teacher_guard"]
    assert res.report["teacher_noise"]["wrong"] == 15 and res.report["teacher_noise"]["n"] == 20
    assert g["status"] == "above" and g["labels"] == {"PLATFORM": round(10 / 12, 6)} and g["kept_labels"] == {}
    assert g["checked"] > 100 and g["dropped"] == g["checked"] and g["held_back"] == 0
    train = res.report["dataset"]["train"]["by_source"]
    assert train["teacher"] == 0
    off = world.run(dry_run=True, self_training=0.3, max_teacher_noise=1.0)     # the same run, guard off
    assert off.report["teacher_guard"]["status"] == "off" and off.report["teacher_guard"]["dropped"] == 0
    off_train = off.report["dataset"]["train"]["by_source"]
    assert off_train["teacher"] == g["checked"]
    # intent examples, human labels and self-training rows are untouched
    assert {k: v for k, v in train.items() if k != "teacher"} == {k: v for k, v in off_train.items() if k != "teacher"}
    assert train["human"] > 0 and train["layer2"] > 0
    note, = _guard_notes(res)
    assert note.startswith("teacher above --max-teacher-noise 0.3 (the default): 75.0% wrong (95% CI 50.9%-91.3%) "
                           "on 20 decisions with a teacher and a human label, so its labels were not distilled: ")
    assert f"{g['dropped']} of {g['checked']} teacher rows dropped before training" in note
    assert not _guard_notes(off)
    assert res.to_dict()["teacher_guard"] == g
    assert f"- {note}" in teacher_markdown(res.report)


def test_two_human_labels_are_too_few_and_the_note_says_so(world):
    world.seed_traffic(n_teacher=200, n_human=0)
    checked_by_humans(world, [("PLATFORM", "RETRIEVAL", 2)])        # both wrong: 100%, on 2
    res = world.run(dry_run=True)
    g = res.report["teacher_guard"]
    assert g["status"] == "unknown" and g["n"] == 2 and g["min_n"] == 4 and g["dropped"] == 0
    assert res.report["dataset"]["train"]["by_source"]["teacher"] == g["checked"] > 100
    note, = _guard_notes(res)
    assert note.startswith("teacher noise unknown: 2 human labels on decisions the teacher labelled; at least 4 "
                           "are needed before the 95% interval can show the teacher above --max-teacher-noise 0.3")
    assert note.endswith(f"so the teacher's {g['checked']} training rows are distilled unchecked (flywheel "
                         f"feedback adds human labels)") and note == g["line"]


def test_a_good_teacher_changes_nothing(world):
    world.seed_traffic(n_teacher=200, n_human=20)                   # 20 human labels, all agreeing
    res = world.run(dry_run=True)
    off = world.run(dry_run=True, max_teacher_noise=1.0)
    g = res.report["teacher_guard"]
    assert g["status"] == "within" and g["dropped"] == 0 and g["notes"] == []
    assert not _guard_notes(res) and res.report["notes"] == off.report["notes"]
    assert res.report["dataset"]["train"] == off.report["dataset"]["train"]
    assert res.challenger["accuracy"] == off.challenger["accuracy"]


def test_the_level_is_honoured(world):
    bad_teacher(world)
    loose = world.run(dry_run=True, max_teacher_noise=0.6)            # 50.9% lower bound: within 60%
    assert loose.report["teacher_guard"]["status"] == "within" and loose.report["teacher_guard"]["dropped"] == 0
    assert loose.report["dataset"]["train"]["by_source"]["teacher"] == loose.report["teacher_guard"]["checked"]
    strict = world.run(dry_run=True, max_teacher_noise=0.5)           # 50.9% > 50%
    assert strict.report["teacher_guard"]["status"] == "above"
    assert strict.report["dataset"]["train"]["by_source"]["teacher"] == 0


@pytest.mark.parametrize("bad", [-0.1, 1.5, float("nan"), True, "0.3"])
def test_a_bad_level_is_refused(bad):
    with pytest.raises(RetrainOptionError, match="max_teacher_noise"):
        RetrainOptions(max_teacher_noise=bad)
    assert RetrainOptions().max_teacher_noise == DEFAULT_MAX_TEACHER_NOISE == 0.30
    assert RetrainOptions(max_teacher_noise=0).max_teacher_noise == 0


def _cli(world, tmp_path, monkeypatch, *args):
    monkeypatch.setattr(cli_retrain, "make_embedder", lambda settings, cache_root=None: HashEmbedder())
    intents_file = tmp_path / "intents.yaml"
    intents_file.write_text(yaml.safe_dump(INTENT_DOC))
    return CliRunner().invoke(build_app(), ["retrain", "--home", str(tmp_path / "home"), "--log-db",
                                            world.store.path, "--quiet", "--intents", str(intents_file),
                                            "--no-tune-encoder", *args])


def test_the_cli_prints_the_note_honours_the_flag_and_refuses_a_bad_one(world, tmp_path, monkeypatch):
    bad_teacher(world)
    r = _cli(world, tmp_path, monkeypatch, "--dry-run")
    assert r.exit_code == 0, r.output
    assert "  note: teacher above --max-teacher-noise 0.3 (the default): 75.0% wrong" in r.stdout
    r = _cli(world, tmp_path, monkeypatch, "--dry-run", "--json", "--max-teacher-noise", "1")
    assert r.exit_code == 0, r.output
    obj = json.loads(r.stdout)
    assert obj["teacher_guard"]["status"] == "off" and obj["teacher_guard"]["dropped"] == 0
    assert not any(n.startswith("teacher above") for n in obj["notes"])
    for bad in ("-0.1", "1.5"):
        r = _cli(world, tmp_path, monkeypatch, "--dry-run", "--max-teacher-noise", bad)
        assert r.exit_code == 2, r.output
        assert "flywheel: error: max_teacher_noise (--max-teacher-noise) must be a share between 0 and 1" in r.output


# ------------------------------------------------------------------ stats and the dashboard
def test_stats_and_the_dashboard_say_the_next_retrain_drops_the_labels(world):
    bad_teacher(world)
    s = convergence(world.store)
    g = s["teacher_guard"]
    assert g["status"] == "above" and g["level"] == DEFAULT_MAX_TEACHER_NOISE
    assert list(s)[-5:] == ["teacher_guard", "teacher_noise", "anchoring", "shadow", "windows"]
    text = format_table(s)
    assert "  teacher above --max-teacher-noise 0.3 (the default): 75.0% wrong, 95% lower bound 50.9%, on 20 " \
           "decisions with a human label: the next retrain drops its labels from the training rows" in text
    page = render_dashboard(dashboard_data(world.store, [], window=100))
    assert "the next retrain drops its labels from the training rows" in page
    assert empty_stats()["teacher_guard"]["status"] == "unknown"


def test_stats_and_the_dashboard_say_nothing_more_of_a_good_teacher(world):
    world.seed_traffic(n_teacher=60, n_human=20)
    s = convergence(world.store)
    assert s["teacher_guard"]["status"] == "within"
    assert "teacher above" not in format_table(s)
    assert "next retrain" not in render_dashboard(dashboard_data(world.store, [], window=100))
