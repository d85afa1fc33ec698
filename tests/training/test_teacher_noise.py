"""Tests of the teacher-noise estimate and the teacher filter (training.teacher_noise), and
of where they show: the retrain's report and ``--json``, ``flywheel stats`` and the metric."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml
from scipy.stats import binomtest
from typer.testing import CliRunner

from flywheel.classifier.layer2.fitter import fit_model
from flywheel.classifier.text import normalise_key
from flywheel.classifier.versions.registry import ModelRegistry
from flywheel.cli import build_app
from flywheel.logstore import LogStore
from flywheel.service.metrics import ServerMetrics
from flywheel.training.cli import retrain as cli_retrain
from flywheel.training.options import RetrainOptionError, RetrainOptions
from flywheel.training.report import teacher_markdown
from flywheel.training.stats.traffic import convergence, empty_stats, format_table
from flywheel.training.teacher_noise import (
    FilterRules,
    NoiseEstimate,
    check_training_set,
    clopper_pearson,
    estimate_from_log,
    filter_teacher_rows,
    format_noise,
    noise_interval,
)
from flywheel.training.trainset import build_training_set, split_role
from tests.support.fakes import HashEmbedder
from tests.support.worlds import INTENT_DOC, World, human_labels, record, sample, write


@pytest.fixture()
def world(tmp_path) -> World:
    return World(tmp_path)


# ------------------------------------------------------------------ the estimate
@pytest.mark.parametrize("k, n", [(0, 10), (3, 10), (5, 10), (10, 10), (7, 17), (1, 250)])
def test_clopper_pearson_is_the_exact_interval(k, n):
    low, high = clopper_pearson(k, n)
    ci = binomtest(k, n).proportion_ci(0.95, method="exact")
    assert low == pytest.approx(ci.low, abs=1e-9) and high == pytest.approx(ci.high, abs=1e-9)


def test_known_agreements_give_a_known_interval():
    assert clopper_pearson(0, 10) == (0.0, pytest.approx(0.308497, abs=1e-6))
    assert clopper_pearson(5, 10) == (pytest.approx(0.187086, abs=1e-6), pytest.approx(0.812914, abs=1e-6))
    assert clopper_pearson(10, 10)[1] == 1.0
    assert noise_interval(0, 0) == {"estimate": None, "low": None, "high": None, "n": 0, "wrong": 0}
    assert noise_interval(3, 12) == {"estimate": 0.25, "low": 0.054861, "high": 0.571858, "n": 12, "wrong": 3}
    with pytest.raises(ValueError):
        clopper_pearson(3, 2)


def test_the_estimate_is_split_per_teacher_label_with_enough_rows():
    # the teacher said A 12 times (3 corrected to B), OUT_OF_SCOPE 10 times (6 corrected to A), B 4 times
    est = NoiseEstimate.from_rows([("A", "A", 9), ("A", "B", 3), (None, "A", 6), (None, None, 4), ("B", "B", 4)])
    assert est.n == 26 and est.wrong == 9
    assert est.overall()["estimate"] == round(9 / 26, 6)
    by = est.by_intent()
    assert list(by) == ["OUT_OF_SCOPE", "A"]                    # noisiest first; B has only 4 rows
    assert by["OUT_OF_SCOPE"] == noise_interval(6, 10) and by["A"] == noise_interval(3, 12)
    assert list(est.by_intent(min_rows=1)) == ["OUT_OF_SCOPE", "A", "B"]
    assert est.corrections()[0] == {"teacher": None, "human": "A", "n": 6, "of": 10, "share": 0.6}
    assert NoiseEstimate().report() == {"teacher_noise": noise_interval(0, 0), "teacher_noise_by_intent": {}}
    line = format_noise(est.overall(), by)
    assert line.startswith("teacher noise: 34.6% (95% CI ") and "on 26 decisions" in line
    assert "noisiest: OUT_OF_SCOPE 60.0% (n=10), A 25.0% (n=12)" in line
    assert "no decision has both" in format_noise(noise_interval(0, 0))


def noisy_log(world):
    """12 decisions the teacher called PLATFORM that humans checked (3 were RETRIEVAL), 2 it
    called out of scope (humans: RETRIEVAL), one with a back-filled teacher answer, one
    with only an invalid teacher answer and teacher-only decisions. Returns the texts."""
    items = sample(70, 7)
    platform = [t for t, y in items[:60] if y == "PLATFORM"][:9]
    retrieval = [t for t, y in items[:60] if y == "RETRIEVAL"][:6]
    recs = ([record(t, teacher="PLATFORM") for t in platform] + [record(t, teacher="PLATFORM") for t in retrieval[:3]]
            + [record(t, teacher=None) for t in retrieval[3:5]]
            + [record(retrieval[5], teacher=None, valid=False)]
            + [record(t, true=y) for t, y in items[60:]])
    write(world.store, recs)
    human_labels(world.store, [(r.decision.id, "PLATFORM") for r in recs[:9]]
                 + [(r.decision.id, "RETRIEVAL") for r in recs[9:15]])
    world.store.add_teacher_label(recs[9].decision.id, "RETRIEVAL", "fake-llm", valid=True)   # back-filled, agrees now
    return recs


def test_the_estimate_reads_decisions_with_both_labels(world):
    noisy_log(world)
    est = estimate_from_log(world.store)
    # 14 decisions with a valid teacher label and a human label; the invalid answer is no label
    assert est.n == 14 and est.wrong == 2 + 2
    assert est.pairs[("PLATFORM", "RETRIEVAL")] == 2 and est.pairs[(None, "RETRIEVAL")] == 2
    assert est.by_intent() == {"PLATFORM": noise_interval(2, 11)}

    # the grouped read counts what the labelled rows say: the latest valid teacher label
    # against the latest human label
    rows = [r for r in world.store.labelled_rows() if r.has_teacher_label and r.has_human_label]
    assert NoiseEstimate.from_rows((r.teacher_label, r.human_label) for r in rows).pairs == est.pairs
    assert estimate_from_log(None).n == 0


def test_an_empty_log_has_no_estimate(tmp_path):
    store = LogStore(tmp_path / "empty.duckdb")
    assert estimate_from_log(store) == NoiseEstimate() and store.teacher_human_pairs() == []


# ------------------------------------------------------------------ the filter's rules
def cluster(centre, n, rng, noise=0.05):
    return centre + noise * rng.standard_normal((n, len(centre)))


def vector_world(n_teacher_oos_far=30):
    """Two intents A and B (8 examples each) on orthogonal axes, out-of-scope examples on a
    third; teacher rows: out of scope deep inside A, halfway between A and B, far from both
    (``n_teacher_oos_far`` of them), and a human out-of-scope label inside B."""
    rng = np.random.default_rng(0)
    e = np.eye(8)
    a, b, o = e[0], e[1], e[2]
    X = np.vstack([cluster(a, 8, rng), cluster(b, 8, rng), cluster(o, 4, rng),
                   cluster(a, 1, rng, 0.01), (a + b)[None, :] / np.sqrt(2), cluster(e[3], n_teacher_oos_far, rng),
                   cluster(b, 1, rng, 0.01)])
    labels = ["A"] * 8 + ["B"] * 8 + [None] * 4 + [None, None] + [None] * n_teacher_oos_far + [None]
    sources = ["intent_example"] * 20 + ["teacher"] * (2 + n_teacher_oos_far) + ["human"]
    return X.astype(np.float32), labels, sources


def test_out_of_scope_deep_inside_an_intent_is_dropped_the_edge_and_humans_are_not():
    X, labels, sources = vector_world()
    drop, info = filter_teacher_rows(X, labels, sources, NoiseEstimate())
    assert drop == [20]                                       # inside A; not the one between A and B
    assert info["dropped"] == {"oos_inside_intent": 1, "human_corrected_pair": 0}
    assert info["checked"] == 32 and info["examples"][0]["evidence"] == "A"
    assert 20 + 2 + 30 not in drop                            # a human label inside B stays


def test_out_of_scope_drops_are_capped_for_the_gate():
    rng = np.random.default_rng(1)
    X, labels, sources = vector_world(n_teacher_oos_far=0)
    inside = cluster(np.eye(8)[0], 10, rng, 0.01).astype(np.float32)
    X = np.vstack([X, inside])
    labels, sources = labels + [None] * 10, sources + ["teacher"] * 10
    # 12 teacher out-of-scope rows, 11 inside A; 17 out-of-scope rows in all
    drop, info = filter_teacher_rows(X, labels, sources, NoiseEstimate(), rules=FilterRules(oos_floor=0))
    assert len(drop) == 6 and info["held_back"]["oos_cap"] == 5          # at most half the teacher's
    drop, info = filter_teacher_rows(X, labels, sources, NoiseEstimate(), rules=FilterRules(oos_floor=14))
    assert len(drop) == 3 and info["held_back"]["oos_cap"] == 8          # never fewer than 14 left
    assert info["dropped"]["oos_inside_intent"] == 3


def test_an_intent_pair_humans_keep_correcting_drops_labels_with_that_runner_up():
    rng = np.random.default_rng(2)
    X = rng.standard_normal((10, 4)).astype(np.float32)
    labels = ["A", "A", "B", "B", "C", "C", "A", "A", "A", "B"]
    sources = ["intent_example"] * 6 + ["teacher"] * 4
    runner = {6: "B", 7: "C", 8: "B", 9: "A"}

    def ranker(V, exclude):                                   # layer 2's runner-up, as stubbed
        rows = [int(np.flatnonzero((X == v).all(axis=1))[0]) for v in V]
        return [runner[i] for i in rows]

    humans = NoiseEstimate.from_rows([("A", "B", 3), ("A", "A", 2), ("B", "A", 2), ("B", "B", 8)])
    drop, info = filter_teacher_rows(X, labels, sources, humans, ranker=ranker)
    assert drop == [6, 8]                     # A labels whose runner-up is B; B -> A is too rare a correction
    assert info["dropped"] == {"oos_inside_intent": 0, "human_corrected_pair": 2}
    assert info["pairs"] == [{"teacher": "A", "human": "B", "n": 3, "of": 5, "share": 0.6}]
    few = NoiseEstimate.from_rows([("A", "B", 2)])            # fewer than pair_min corrections
    assert filter_teacher_rows(X, labels, sources, few, ranker=ranker)[0] == []
    # never the last two rows of a label (the head needs 2 per label)
    drop, info = filter_teacher_rows(X[[0, 2, 3, 4, 5, 6]], ["A", "B", "B", "C", "C", "A"],
                                     ["intent_example"] * 5 + ["teacher"], humans,
                                     ranker=lambda V, ex: ["B"] * len(V))
    assert drop == [] and info["held_back"]["last_rows_of_label"] == 1


# ------------------------------------------------------------------ on a training set (HashEmbedder world)
def wrong_oos_world(world, n_wrong=15):
    """Correct teacher traffic plus ``n_wrong`` in-scope queries the teacher called out of
    scope (training rows, not held out). Returns their texts."""
    world.seed_traffic(n_teacher=200, n_human=10)
    seen = {t for t, _ in sample(210, 0)}
    wrong = [t for t, y in sample(400, 3, exclude=seen) if y is not None
             and split_role(t, "teacher") == "train"][:n_wrong]
    write(world.store, [record(t, teacher=None) for t in wrong])
    return wrong


def test_the_filter_drops_wrong_out_of_scope_labels_only(world):
    wrong = wrong_oos_world(world)
    ts = build_training_set(world.store, world.intents, embedder=world.embedder)
    oos_before = [t for t, y, s in zip(ts.texts, ts.labels, ts.sources) if y is None and s == "teacher"]
    out, info = check_training_set(ts, estimate_from_log(world.store), encoder_id=world.embedder.id)
    dropped = {normalise_key(t) for t in ts.texts} - {normalise_key(t) for t in out.texts}
    assert info["enabled"] and info["dropped"]["oos_inside_intent"] == len(dropped) >= len(wrong) // 2
    assert dropped <= {normalise_key(t) for t in wrong}       # only the wrong labels
    assert len(out) == len(ts) - len(dropped) and out.report["train"]["n"] == len(out)
    assert out.report["train"]["by_source"]["teacher"] == ts.report["train"]["by_source"]["teacher"] - len(dropped)
    assert len(oos_before) > len(dropped) and out.n_out_of_scope >= FilterRules().oos_floor
    assert info["runner_up_from"].startswith("intent examples")
    off, info_off = check_training_set(ts, estimate_from_log(world.store), enabled=False)
    assert off is ts and info_off["dropped"] == {"noisy_teacher": 0, "oos_inside_intent": 0, "human_corrected_pair": 0}
    assert info_off["would_drop"] == {k: v for k, v in info["dropped"].items() if k != "noisy_teacher"}


def test_a_corrected_pair_drops_only_rows_whose_runner_up_is_the_correction(world):
    champion = fit_model(world.intents, embedder=HashEmbedder())
    items = [(t, y) for t, y in sample(300, 5) if y is not None and split_role(t, "teacher") == "train"]
    X = HashEmbedder().encode([t for t, _ in items])
    pred = champion.head.scores(X).probs
    classes = list(champion.manifest.labels)
    p_platform = pred[:, classes.index("PLATFORM")]
    wrong = [t for (t, y), p in zip(items, p_platform) if y == "RETRIEVAL" and p < 0.3][:6]    # layer 2: RETRIEVAL
    right = [t for (t, y), p in zip(items, p_platform) if y == "PLATFORM" and p > 0.8][:6]     # layer 2: sure
    assert len(wrong) == len(right) == 6
    write(world.store, [record(t, teacher="PLATFORM") for t in wrong + right])
    humans = NoiseEstimate.from_rows([("PLATFORM", "RETRIEVAL", 3), ("PLATFORM", "PLATFORM", 2)])
    ts = build_training_set(world.store, world.intents, embedder=world.embedder)
    out, info = check_training_set(ts, humans, champion=champion, encoder_id=world.embedder.id)
    kept = {normalise_key(t) for t in out.texts}
    # one step: the guard (a sure champion and the nearest examples say RETRIEVAL) takes some, the pair rule the rest
    d = info["dropped"]
    assert d["oos_inside_intent"] == 0 and d["noisy_teacher"] + d["human_corrected_pair"] == 6
    assert not kept & {normalise_key(t) for t in wrong} and {normalise_key(t) for t in right} <= kept
    assert info["runner_up_from"] == f"champion {champion.version}"
    # without a champion the intent examples rank the rows: the same drops here
    _, by_examples = check_training_set(ts, humans, encoder_id=world.embedder.id)
    assert by_examples["dropped"]["human_corrected_pair"] == 6


def test_retrain_reports_noise_and_what_the_filter_dropped(world):
    wrong_oos_world(world)
    noisy_log(world)
    off = world.run(dry_run=True)                                         # the filter is off by default
    assert off.report["teacher_filtered"] == {} and not off.report["teacher_filter"]["enabled"]
    would = {k: v for k, v in off.report["teacher_filter"]["would_drop"].items() if v}
    assert would.get("oos_inside_intent", 0) >= 5
    assert any("teacher filter off (--teacher-filter turns it on)" in ln for ln in teacher_markdown(off.report))
    res = world.run(teacher_filter=True)
    assert res.outcome == "promoted", res.reason
    r = res.report
    assert r["teacher_noise"] == noise_interval(4, 24)       # 10 seed decisions with both labels agree
    by = r["teacher_noise_by_intent"]     # the seed's human-checked decisions add agreeing PLATFORM rows
    assert by == estimate_from_log(world.store).by_intent() and by["PLATFORM"]["wrong"] == 2
    assert r["teacher_filtered"] == would and r["teacher_filter"]["enabled"]
    assert r["dataset"]["train"]["by_source"]["teacher"] == r["teacher_filter"]["checked"] - sum(would.values())
    md = (world.registry.home / res.version / "report.md").read_text()
    assert "## Teacher labels" in md and "teacher filter on:" in md
    # one step, one section: the noisy-teacher guard is in teacher_filter (was dataset.noisy_teacher)
    assert "noisy_teacher" not in r["dataset"] and "active" in r["teacher_filter"]["guard"]
    assert r["teacher_filter"]["dropped"]["noisy_teacher"] == r["teacher_filter"]["guard"]["dropped"]
    teacher_section = md.split("## Teacher labels")[1].split("\n## ")[0]
    assert "- noisy teacher labels dropped: " in teacher_section
    assert "noisy teacher" not in md.split("## Teacher labels")[0]
    assert f"| PLATFORM | {by['PLATFORM']['n']} | {100 * by['PLATFORM']['estimate']:.1f}% |" in md
    assert world.registry.last_retrain()["teacher_noise"] == r["teacher_noise"]
    skipped = world.run(min_new_labels=10_000)
    assert skipped.outcome == "skipped" and skipped.report["teacher_noise"] == r["teacher_noise"]
    assert "teacher_filtered" not in skipped.to_dict() and skipped.to_dict()["teacher_noise"]["n"] == 24
    assert world.registry.last_retrain()["teacher_noise"] == r["teacher_noise"]


def test_the_option_is_checked():
    assert RetrainOptions().teacher_filter is False
    with pytest.raises(RetrainOptionError):
        RetrainOptions(teacher_filter="yes")


def test_cli_json_has_teacher_noise_and_teacher_filtered(world, tmp_path, monkeypatch):
    monkeypatch.setattr(cli_retrain, "make_embedder", lambda settings, cache_root=None: HashEmbedder())
    wrong_oos_world(world)
    noisy_log(world)
    intents_file = tmp_path / "intents.yaml"
    intents_file.write_text(yaml.safe_dump(INTENT_DOC))
    common = ["retrain", "--home", str(tmp_path / "home"), "--log-db", world.store.path, "--quiet", "--json",
              "--intents", str(intents_file)]
    r = CliRunner().invoke(build_app(), [*common, "--no-teacher-filter", "--dry-run"])
    assert r.exit_code == 0, r.output
    obj = json.loads(r.stdout)
    assert obj["teacher_filtered"] == {} and obj["teacher_filter"]["would_drop"]["oos_inside_intent"] >= 5
    r = CliRunner().invoke(build_app(), [*common, "--teacher-filter"])
    assert r.exit_code == 0, r.output
    obj = json.loads(r.stdout)
    assert set(obj["teacher_noise"]) == {"estimate", "low", "high", "n", "wrong"} and obj["teacher_noise"]["n"] == 24
    assert obj["teacher_noise"]["low"] < obj["teacher_noise"]["estimate"] < obj["teacher_noise"]["high"]
    assert obj["teacher_filtered"]["oos_inside_intent"] >= 5
    assert obj["teacher_noise_by_intent"]["PLATFORM"]["wrong"] == 2


# ------------------------------------------------------------------ stats and the metric
def test_stats_show_the_noise(world, tmp_path):
    noisy_log(world)
    s = convergence(world.store)
    assert {k: s["teacher_noise"][k] for k in ("estimate", "n", "wrong")} == {"estimate": round(4 / 14, 6),
                                                                           "n": 14, "wrong": 4}
    assert s["teacher_noise"]["by_intent"] == {"PLATFORM": noise_interval(2, 11)}
    assert list(s)[-4:] == ["teacher_noise", "anchoring", "shadow", "windows"]
    assert "  teacher noise: 28.6% (95% CI " in format_table(s)
    empty = empty_stats()
    assert empty["teacher_noise"] == {**noise_interval(0, 0), "by_intent": {}}
    assert convergence(LogStore(tmp_path / "empty.duckdb"))["teacher_noise"] == empty["teacher_noise"]


def test_the_metric_follows_the_last_retrain(tmp_path):
    reg = ModelRegistry(tmp_path / "models")
    m = ServerMetrics()

    class Clf:
        audit_outcomes: dict = {}
        teacher = teacher_cache = None

    m.bind_serving(classifier=Clf(), registry=reg)
    get = m.registry.get_sample_value
    assert get("flywheel_teacher_noise_ratio") is None                   # no retrain yet
    reg.record_retrain({"finished_at": 1.0, "outcome": "kept", "teacher_noise": noise_interval(0, 0)})
    assert get("flywheel_teacher_noise_ratio") is None                   # no decision with both labels
    reg.record_retrain({"finished_at": 2.0, "outcome": "kept", "teacher_noise": noise_interval(3, 12)})
    assert get("flywheel_teacher_noise_ratio") == 0.25


def test_one_decision_is_not_1_decisions(world):
    rec = record("show my quota", teacher="RETRIEVAL")
    write(world.store, [rec])
    human_labels(world.store, [(rec.decision.id, "PLATFORM")])
    text = format_table(convergence(world.store))
    assert text.startswith("flywheel stats: 1 decision\n") or text.startswith("flywheel stats: 1 decision ("), text
    assert "wrong on 1 decision with a teacher and a human label" in text, text
    assert "1 decisions" not in text
    md = "\n".join(teacher_markdown({"teacher_noise": noise_interval(1, 1)}))
    assert "wrong on 1 decision with" in md and "wrong on 2 decisions with" in format_noise(noise_interval(1, 2))
