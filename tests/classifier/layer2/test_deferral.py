"""Thresholds that mean something: the deferral model (calibrated P(layer 2 is wrong)),
conformal prediction sets, the one vectorised tier rule, and what each cutoff buys."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from flywheel.classifier.errors import IntentFileError
from flywheel.classifier.layer2.head import IntentHead, conformal_cutoff, fit_risk, set_coverage
from flywheel.classifier.layer2.scoring import HeadScores, ServingHead
from flywheel.classifier.layer2.tiers import Thresholds, assign_tier, assign_tiers, tier_rows
from flywheel.classifier.settings.intents import ThresholdSettings, parse_intents
from flywheel.classifier.versions.model import intents_to_doc
from flywheel.training.cutoffs import retune
from flywheel.training.rows import LabelledSet
from tests.support.docs import DOC
from tests.support.worlds import blobs

NOISY = 2.2    # blobs that overlap: layer 2 is wrong often enough to measure


def _fitted(seed: int = 0, noise: float = 0.9) -> tuple[IntentHead, np.ndarray, list]:
    X, y, _ = blobs(n_per=80, k=5, noise=noise, seed=seed)
    return IntentHead(cv=3).fit(X, y), X, y


def test_the_risk_model_is_calibrated_and_falls_with_confidence():
    head, _, _ = _fitted(noise=NOISY)
    X, y, _ = blobs(n_per=200, k=5, noise=NOISY, seed=0)   # same centres, fresh draws
    s = head.scores(X[len(X) // 2:])
    assert s.risk is not None and ((s.risk >= 0) & (s.risk <= 1)).all()
    th = Thresholds.for_model(_model_of(head))
    t = assign_tiers(s, [str(c) for c in head.classes_], th)
    wrong = np.array([a != b for a, b in zip(t.labels(head.classes_), y[len(X) // 2:])])
    # calibrated on fresh data: mean predicted risk close to the error rate
    assert abs(float(s.risk.mean()) - float(wrong.mean())) < 0.08
    # the riskiest fifth is wrong far more often than the safest fifth
    order = np.argsort(s.risk)
    fifth = len(order) // 5
    assert wrong[order[-fifth:]].mean() > wrong[order[:fifth]].mean() + 0.2
    assert head.metrics_["oof_risk_ece"] < 0.1


def test_the_gate_cuts_at_its_balanced_decision_point():
    head, _, _ = _fitted()
    assert head.thresholds_["oos"] == 0.5
    X, y, _ = blobs(n_per=80, k=5, noise=0.9, seed=0, with_oos=False)
    assert IntentHead(cv=3, novelty_quantile=0.02).fit(X, y).thresholds_["oos"] == pytest.approx(0.98)


def test_fit_risk_with_one_outcome_is_the_constant_rate():
    probs = np.array([[0.9, 0.1], [0.6, 0.4]])
    r = fit_risk(probs, np.zeros(2), np.zeros(2, bool))
    assert np.allclose(r(probs, np.zeros(2)), 0.0, atol=1e-5)
    r = fit_risk(probs, np.zeros(2), np.ones(2, bool))
    assert np.allclose(r(probs, np.zeros(2)), 1.0, atol=1e-5)


def test_conformal_cutoff_uses_the_finite_sample_quantile():
    # true-class probabilities 0.1 .. 1.0: nonconformity 0.9 .. 0.0
    p_true = np.linspace(0.1, 1.0, 10)
    probs = np.column_stack([p_true, 1 - p_true])
    yi = np.zeros(10, int)
    # ceil(11 * 0.8) / 10 = 0.9 -> the 9th smallest nonconformity (0.8) -> cutoff 0.2
    assert conformal_cutoff(probs, yi, 0.8) == {"set": pytest.approx(0.2), "coverage": 0.8}
    cov, size = set_coverage(probs, yi, 0.15)
    assert cov == pytest.approx(0.9) and size == pytest.approx(1.7)
    with pytest.raises(ValueError, match="coverage"):
        conformal_cutoff(probs, yi, 1.0)


@pytest.mark.parametrize("coverage", [0.8, 0.95])
def test_prediction_sets_hold_their_coverage_on_fresh_data(coverage):
    X, y, _ = blobs(n_per=150, k=5, noise=1.1, seed=3, with_oos=False)
    head = IntentHead(cv=5, coverage=coverage).fit(X, y)
    Xt, yt, _ = blobs(n_per=400, k=5, noise=1.1, seed=3, with_oos=False)
    probs = head.scores(Xt).probs
    yi = np.searchsorted(head.classes_, np.array(yt, dtype=object))
    cov, size = set_coverage(probs, yi, head.thresholds_["set"])
    # out-of-fold calibration: valid, slightly conservative (the final head is fitted on all rows)
    assert coverage - 0.02 <= cov <= coverage + 0.05
    assert 0.5 < size < 5.0
    assert head.thresholds_["coverage"] == coverage


def test_the_row_view_is_the_batch_rule():
    head, X, _ = _fitted()
    model = _model_of(head)
    labels = [str(c) for c in head.classes_]
    for deferral in ("tiers", "risk"):
        m = _with_deferral(model, deferral)
        th = Thresholds.for_model(m)
        s = head.scores(X)
        batch = assign_tiers(s, labels, th)
        rows = tier_rows(s, labels, th)
        for j, r in enumerate(rows):
            one = assign_tier(s.probs[j], labels, float(s.oos_class[j]), float(s.p_oos[j]), th, float(s.risk[j]))
            assert (one.label, one.tier, one.sure) == (r.label, r.tier, r.sure)
            assert r.tier is batch.tier[j] and r.sure == batch.sure[j]


def test_the_risk_rule_defers_on_p_wrong_alone():
    th = Thresholds(confident=0.99, ambiguous_ratio=0.9, oos=0.5, defer=0.2, set_cutoff=0.3, coverage=0.9)
    probs = np.array([[0.5, 0.45, 0.05], [0.5, 0.45, 0.05], [0.9, 0.05, 0.05], [0.1, 0.1, 0.1]])
    s = HeadScores(probs, np.zeros(4), np.array([0.1, 0.1, 0.1, 0.9]), np.zeros(4),
                   risk=np.array([0.1, 0.3, 0.25, 0.05]))
    t = assign_tiers(s, ["A", "B", "C"], th)
    assert t.sure.tolist() == [True, False, False, True]   # the confident cutoff plays no part
    assert [x.value for x in t.tier] == ["confident", "ambiguous", "weak", "no_match"]
    r = tier_rows(s, ["A", "B", "C"], th)
    assert [c.label for c in r[1].alternatives] == ["A", "B"]   # the prediction set
    assert "P(wrong) 0.300 > cutoff 0.200" in r[1].reason and "prediction set" in r[1].reason
    # a per-intent cutoff still has the last word on its intent
    t2 = assign_tiers(s, ["A", "B", "C"], replace(th, per_intent={"A": 0.6}))
    assert t2.sure.tolist() == [False, False, False, True]


def test_unsure_answers_are_ambiguous_only_with_two_intents_in_the_set():
    th = Thresholds(confident=0.8, ambiguous_ratio=0.6, oos=0.9, set_cutoff=0.25, coverage=0.95)
    s = HeadScores(np.array([[0.6, 0.3, 0.1], [0.6, 0.2, 0.2]]), np.zeros(2), np.zeros(2), np.zeros(2))
    t = assign_tiers(s, ["A", "B", "C"], th)
    assert [x.value for x in t.tier] == ["ambiguous", "weak"]
    assert not t.sure.any()
    # without a set (an old model, or a fixed ambiguous_ratio): the ratio rule
    t = assign_tiers(s, ["A", "B", "C"], replace(th, set_cutoff=None))
    assert [x.value for x in t.tier] == ["weak", "weak"]


def test_a_fixed_ambiguous_ratio_keeps_the_ratio_rule():
    head, _, _ = _fitted()
    doc = {**DOC, "thresholds": {"ambiguous_ratio": 0.4}}
    model = replace(_model_of(head), intents=parse_intents(doc))
    assert Thresholds.for_model(model).set_cutoff is None
    assert Thresholds.for_model(_model_of(head)).set_cutoff == head.thresholds_["set"]


def test_serving_head_round_trips_the_risk_model(tmp_path):
    head, X, _ = _fitted()
    serving = head.serving_head()
    serving.save(tmp_path / "head.npz")
    back = ServingHead.load(tmp_path / "head.npz")
    assert np.allclose(back.scores(X).risk, head.scores(X).risk)
    # a head saved before the deferral model: no risk, and the tiers rule serves it
    old = ServingHead(classes=serving.classes_, coef=serving._coef, intercept=serving._intercept,
                      temperature=serving.temperature_, ref=serving._ref, has_oos=True,
                      gate_coef=serving._gate_coef, gate_intercept=serving._gate_intercept)
    old.save(tmp_path / "old.npz")
    assert ServingHead.load(tmp_path / "old.npz").scores(X).risk is None


def test_intent_file_coverage_and_deferral():
    s = parse_intents({**DOC, "thresholds": {"coverage": 0.9, "deferral": "risk"}})
    assert (s.thresholds.coverage, s.thresholds.deferral) == (0.9, "risk")
    assert parse_intents(DOC).thresholds == ThresholdSettings()
    with pytest.raises(IntentFileError, match="thresholds.deferral must be one of tiers, risk"):
        parse_intents({**DOC, "thresholds": {"deferral": "margin"}})
    with pytest.raises(IntentFileError, match="thresholds.coverage"):
        parse_intents({**DOC, "thresholds": {"coverage": 1.5}})


def test_saved_intent_files_write_new_settings_only_when_set():
    """A replica of the previous release must read what a newer retrain job saves."""
    doc = intents_to_doc(parse_intents(DOC))
    assert set(doc["thresholds"]) == {"confident", "ambiguous_ratio", "oos", "target_precision", "per_intent"}
    assert "keep_alive" not in doc["teacher"] and "max_calls_per_minute" not in doc["teacher"]
    assert {"backend", "model", "host", "timeout_s"} <= set(doc["teacher"])
    custom = parse_intents({**DOC, "thresholds": {"deferral": "risk"}, "teacher": {"daily_budget": 500}})
    doc = intents_to_doc(custom)
    assert doc["thresholds"]["deferral"] == "risk" and doc["teacher"]["daily_budget"] == 500
    assert parse_intents(doc).thresholds == custom.thresholds


def test_retune_with_a_budget_picks_the_cheapest_cutoff_that_fits():
    head, X, y = _fitted(noise=1.1)
    model = _with_deferral(_model_of(head), "risk")
    recent = LabelledSet(texts=[f"t{i}" for i in range(len(X))], labels=list(y), vectors=X.astype(np.float32),
                         sources=["teacher"] * len(X), decision_ids=[None] * len(X))
    risk = head.scores(X).risk
    for budget in (0.05, 0.3):
        info, learned = retune(model, recent, 0.95, budget)
        assert info["method"] == "risk"
        share = float((risk > learned["defer"]).mean())
        assert share <= budget + 1e-9
        assert learned["defer"] >= info["teacher_error"] - 1e-12
        assert info["llm_share_expected"] == pytest.approx(share, abs=1e-4)
        assert 0.0 <= info["risk_ece_recent"] <= 1.0
    # a budget never buys a cheaper wrong answer: P(wrong) above 0.5 is deferred, over budget
    noisy, Xn, yn = _fitted(noise=NOISY)
    over = LabelledSet(texts=[f"t{i}" for i in range(len(Xn))], labels=list(yn), vectors=Xn.astype(np.float32),
                       sources=["teacher"] * len(Xn), decision_ids=[None] * len(Xn))
    info, learned = retune(_with_deferral(_model_of(noisy), "risk"), over, 0.95, 0.05)
    over_half = float((noisy.scores(Xn).risk > 0.5).mean())
    assert over_half > 0.05
    assert learned["defer"] == 0.5 and info["budget_reachable"] is False
    assert info["llm_share_expected"] == pytest.approx(over_half, abs=1e-4)
    # a generous budget stops at the teacher's own error rate: deferring below it adds errors
    info, learned = retune(model, recent, 0.95, 0.99)
    assert learned["defer"] == pytest.approx(1.0 - model.intents.teacher.confidence)


# ------------------------------------------------------------------ helpers
def _model_of(head: IntentHead):
    from flywheel.classifier.versions.model import IntentModel, Manifest

    labels = [str(c) for c in head.classes_]
    intents = parse_intents({"version": 1, "name": "blobs",
                             "intents": [{"name": n, "examples": ["a", "b"]} for n in labels]})
    manifest = Manifest(version="v1", labels=labels, encoder={"id": "x", "dim": head.n_features_in_},
                        thresholds=dict(head.thresholds_), training_size=0)
    return IntentModel(head=head, manifest=manifest, intents=intents)


def _with_deferral(model, deferral: str):
    th = replace(model.intents.thresholds, deferral=deferral)
    return replace(model, intents=replace(model.intents, thresholds=th))
