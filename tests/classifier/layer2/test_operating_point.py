"""The operating point (issue 35 item 2): the trade curves measured with the served rule, the
cutoff a target picks out of fold, and the intent file's ``thresholds.target`` checked."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from flywheel.classifier.errors import IntentFileError
from flywheel.classifier.layer2.fitter import fit_model
from flywheel.classifier.layer2.operating_point import trade_curves
from flywheel.classifier.layer2.targets import check_target
from flywheel.classifier.layer2.tiers import Thresholds
from flywheel.classifier.pipeline import Classifier
from flywheel.classifier.settings.intents import Intent, IntentSet, ThresholdSettings, parse_intents
from flywheel.training.eval.measure import evaluate
from tests.support.worlds import INTENT_DOC, VectorTextEmbedder, blob_split

RECALL_TOLERANCE = 0.06   # 200 out-of-scope rows choose the cutoff, 1,000 held out measure it: ~2 sigma


def blob_intents(texts, labels, target=None, **th) -> IntentSet:
    by: dict[str, list[str]] = {}
    for t, y in zip(texts, labels):
        if y is not None:
            by.setdefault(y, []).append(t)
    return IntentSet("blobs", tuple(Intent(k, k, tuple(v)) for k, v in by.items()), synthetic_negatives=0,
                     oos_examples=tuple(t for t, y in zip(texts, labels) if y is None),
                     thresholds=ThresholdSettings(target=target, **th))


@pytest.fixture(scope="module")
def world():
    return blob_split(n_train=200, n_test=1000, seed=1)


@pytest.fixture(scope="module")
def emb():
    return VectorTextEmbedder(16)


@pytest.fixture(scope="module")
def model(world, emb):
    return fit_model(blob_intents(*world[:2]), embedder=emb, version="v-blobs")


def _decisions(model, emb, texts, **fixed):
    """What a classifier serving ``model`` with these cutoffs fixed in its intent file answers."""
    th = replace(model.intents.thresholds, **fixed)
    served = replace(model, intents=replace(model.intents, thresholds=th))
    return Classifier(served, embedder=emb, teacher=None).classify_many(texts)


def test_trade_curves_are_monotone_and_their_ends_are_the_models_decisions(model, emb, world):
    _, _, texts, truth = world
    th = Thresholds.for_model(model)
    curves = trade_curves(model.head.scores(emb.encode(texts)), [str(c) for c in model.head.classes_], truth, th)
    oos, answered = curves["oos"], curves["answered"]
    assert [p["cutoff"] for p in oos] == sorted(p["cutoff"] for p in oos) and len(oos) >= 51
    recall = [p["oos_recall"] for p in oos]
    in_scope = [p["in_scope_accuracy"] for p in oos]
    assert all(a >= b for a, b in zip(recall, recall[1:])) and all(a <= b for a, b in zip(in_scope, in_scope[1:]))
    assert recall[0] > recall[-1] and in_scope[0] < in_scope[-1]       # the sweep moves both
    share = [p["answered_share"] for p in answered]
    assert all(a >= b for a, b in zip(share, share[1:])) and share[0] > share[-1]
    assert all(abs(p["llm_share"] + p["answered_share"] - 1) < 1e-6 for p in answered)
    assert [p["cutoff"] for p in oos if p.get("served")] == [round(th.oos, 6)]
    # the ends are what a classifier with that cutoff fixed in its intent file answers
    is_oos = np.array([y is None for y in truth])
    for p in (oos[0], oos[-1]):
        labels = [d.label for d in _decisions(model, emb, texts, oos=p["cutoff"])]
        right = np.array([a == y for a, y in zip(labels, truth)])
        assert p["oos_recall"] == pytest.approx(np.array([a is None for a in labels])[is_oos].mean(), abs=1e-6)
        assert p["in_scope_accuracy"] == pytest.approx(right[~is_oos].mean(), abs=1e-6)
    assert oos[0]["oos_recall"] == 1.0 and oos[0]["in_scope_accuracy"] == 0.0
    for p in (answered[0], answered[-1]):
        ds = _decisions(model, emb, texts, confident=p["cutoff"])
        alone = np.array([d.degraded is None for d in ds])            # the rest needed the teacher
        right = np.array([d.label == y for d, y in zip(ds, truth)])
        assert p["answered_share"] == pytest.approx(alone.mean(), abs=1e-6)
        assert p["answered_accuracy"] == pytest.approx(right[alone].mean(), abs=1e-6)


@pytest.mark.parametrize("recall", [0.85, 0.9])
def test_a_target_oos_recall_holds_on_held_out_rows(world, emb, recall):
    train_texts, train_labels, texts, truth = world
    m = fit_model(blob_intents(train_texts, train_labels, {"oos_recall": recall}), embedder=emb)
    op = m.manifest.metrics["operating_point"]
    assert op["cutoff"] == "oos" and op["on"] == "out-of-fold training rows" and op["oos_recall"] >= recall
    assert m.manifest.thresholds["oos"] == op["value"] != 0.5
    report = evaluate(Classifier(m, embedder=emb, teacher=None), texts, truth, progress=False, latency_sample=0)
    got = report["operating_point"]
    assert got["target"] == {"oos_recall": recall} and got["value"] == op["value"]
    assert got["test"]["n"] == truth.count(None) == 1000
    assert abs(got["test"]["oos_recall"] - recall) <= RECALL_TOLERANCE
    assert report["oos_recall"] == got["test"]["oos_recall"]     # no teacher: layer 2's answers are served
    # the tolerance the model states for its choice holds on the held-out rows
    lo, hi = op["interval"]
    assert lo < op["oos_recall"] < hi
    assert op["tolerance"] == pytest.approx(max(op["oos_recall"] - lo, hi - op["oos_recall"]))
    assert got["chosen"]["interval"] == op["interval"] and got["chosen"]["n"] == train_labels.count(None) == 200
    assert abs(got["test"]["oos_recall"] - recall) <= op["tolerance"] + got["test"]["tolerance"]
    assert got["consistent"] is True


def test_a_figure_s_interval_is_wilson_s_and_few_rows_say_so():
    from flywheel.classifier.layer2.operating_point import few_rows, figure_interval

    lo, hi = figure_interval(85, 100)                    # Wilson: p ± z·sqrt(p(1-p)/n + z²/4n²), recentred
    z, p, n = 1.959964, 0.85, 100
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    assert (lo, hi) == pytest.approx((centre - half, centre + half), abs=1e-6)
    assert figure_interval(0, 10)[0] == 0.0 and figure_interval(10, 10)[1] == pytest.approx(1.0)
    assert few_rows({"oos_recall": 0.85, "tolerance": hi - 0.85}) is True          # ±6.2 points on 100 rows
    assert few_rows({"oos_recall": 0.85, "tolerance": 0.022}) is False            # ~1,000 rows
    assert few_rows({"oos_recall": None, "n": 0}) is True


def test_a_test_set_that_differs_from_the_rows_the_target_was_chosen_on_is_flagged(world, emb):
    from flywheel.training.eval.render import target_line

    train_texts, train_labels, texts, truth = world
    m = fit_model(blob_intents(train_texts, train_labels, {"oos_recall": 0.9}), embedder=emb)
    # out-of-scope queries that look like an intent's: the cut made on the training split's kind misses them
    shifted = [None if i % 2 == 0 and y == "L0" else y for i, y in enumerate(truth)]
    report = evaluate(Classifier(m, embedder=emb, teacher=None), texts, shifted, progress=False, latency_sample=0)
    got = report["operating_point"]
    assert got["consistent"] is False and got["test"]["oos_recall"] < got["chosen"]["interval"][0]
    line = target_line(got)
    assert "outside what the chosen rows allow" in line and line.startswith("Target oos_recall 90.0%")
    assert f"of {shifted.count(None):,} ±" in line


def test_a_target_llm_share_sets_the_share_out_of_fold(world, emb):
    m = fit_model(blob_intents(*world[:2], {"llm_share": 0.3}), embedder=emb)
    op = m.manifest.metrics["operating_point"]
    assert op["cutoff"] == "confident" and op["reached"] and op["llm_share"] <= 0.3
    assert m.manifest.thresholds["confident"] == op["value"] and op["defer"]["llm_share"] <= 0.3


def test_target_precision_is_target_precision():
    doc = {**INTENT_DOC, "thresholds": {"target": {"precision": 0.9}}}
    th = parse_intents(doc).thresholds
    assert (th.target, th.target_precision) == ({"precision": 0.9}, 0.9)
    same = parse_intents({**doc, "thresholds": {"target": {"precision": 0.9}, "target_precision": 0.9}})
    assert same.thresholds.target_precision == 0.9


@pytest.mark.parametrize("target, words", [
    ({"oos_recall": 0.8, "llm_share": 0.1}, "give exactly one of oos_recall, llm_share, precision"),
    ({"oos_recall": 1.5}, "oos_recall must be a number in (0, 1], got 1.5"),
    ({"llm_share": 1.0}, "llm_share must be a number in [0, 1), got 1.0"),
    ({"recall": 0.8}, "unknown key 'recall'"),
    (0.85, "must be a mapping"),
    ({"oos_recall": True}, "oos_recall must be a number"),
])
def test_bad_targets_are_refused_in_one_line_naming_the_field(target, words):
    with pytest.raises(IntentFileError) as err:
        parse_intents({**INTENT_DOC, "thresholds": {"target": target}}, source="x.yaml")
    msg = str(err.value)
    assert "thresholds.target" in msg and words in msg and "\n" not in msg


@pytest.mark.parametrize("th, words", [
    ({"target": {"oos_recall": 0.8}, "oos": 0.4}, "thresholds.oos fixes"),
    ({"target": {"llm_share": 0.1}, "confident": 0.6}, "thresholds.confident fixes"),
    ({"target": {"precision": 0.9}, "target_precision": 0.8}, "target_precision"),
])
def test_a_target_cannot_move_a_cutoff_the_file_fixes(th, words):
    with pytest.raises(IntentFileError, match="thresholds.target") as err:
        parse_intents({**INTENT_DOC, "thresholds": th})
    assert words in str(err.value)


def test_check_target_accepts_each_kind():
    assert [check_target({k: 0.5}) for k in ("oos_recall", "llm_share", "precision")] == [
        {"oos_recall": 0.5}, {"llm_share": 0.5}, {"precision": 0.5}]
    assert check_target(None) is None and check_target({"llm_share": 0}) == {"llm_share": 0.0}
