import numpy as np
import pytest

from flywheel.classifier.decision import Candidate, Tier
from flywheel.classifier.errors import ModelError, NotFittedError
from flywheel.classifier.layer2.calibration import expected_calibration_error
from flywheel.classifier.layer2.head import CrossFitView, IntentHead
from flywheel.classifier.layer2.tiers import Thresholds, assign_tier, cut_at_drop, fmt_probs
from tests.support.worlds import blobs


def test_fit_sets_fitted_attributes_and_predicts():
    X, y, centres = blobs()
    head = IntentHead(cv=3)
    assert not hasattr(head, "lr_")  # no work in __init__
    assert head.fit(X, y) is head
    assert list(head.classes_) == ["L0", "L1", "L2", "L3"]
    assert head.has_oos_
    assert set(head.thresholds_) == {"confident", "ambiguous_ratio", "oos", "oos_confident", "defer", "set", "coverage"}
    pred = head.predict(centres)
    assert list(pred) == ["L0", "L1", "L2", "L3"]


def test_calibration_is_measured_and_temperature_helps():
    X, y, _ = blobs(noise=0.9, seed=1)
    head = IntentHead(cv=4).fit(X, y)
    assert head.metrics_["oof_ece"] <= head.metrics_["oof_ece_raw"] + 1e-9
    Xt, yt, _ = blobs(noise=0.9, seed=1, n_per=60)  # same centres, new noise
    s = head.scores(Xt)
    ins = np.array([v is not None for v in yt])
    top = head.classes_[s.probs.argmax(1)]
    correct = top[ins] == np.array(yt, dtype=object)[ins]
    assert expected_calibration_error(s.probs.max(1)[ins], correct) < 0.1


def test_far_query_is_out_of_scope_even_with_peaked_softmax():
    X, y, centres = blobs(with_oos=False)
    head = IntentHead(cv=3).fit(X, y)
    far = centres[0] * 40 + np.random.default_rng(9).standard_normal(centres.shape[1]) * 60
    s = head.scores(far[None, :])
    # a linear model extrapolates: softmax is peaked, but the distance signal says no
    assert s.p_oos[0] >= head.thresholds_["oos"]
    assert head.predict(far[None, :])[0] is None


def test_errors():
    with pytest.raises(NotFittedError):
        IntentHead().predict(np.zeros((1, 4)))
    X, y, _ = blobs()
    head = IntentHead(cv=3).fit(X, y)
    with pytest.raises(ModelError, match="32-d"):
        head.scores(np.zeros((1, 8)))
    with pytest.raises(ValueError, match="fewer than 2"):
        IntentHead().fit(X[:3], ["A", "A", "B"])


def test_zero_threshold_is_a_threshold():
    th = Thresholds(confident=0.0, ambiguous_ratio=1.0, oos=1.0)
    r = assign_tier(np.array([0.2, 0.1, 0.05]), ["A", "B", "C"], 0.0, 0.0, th)
    assert r.tier is Tier.CONFIDENT  # 0.2 >= 0.0; a truthiness test would have failed
    th = Thresholds(confident=0.9, ambiguous_ratio=0.5, oos=0.0)
    assert assign_tier(np.array([0.99, 0.01]), ["A", "B"], 0.0, 0.0, th).tier is Tier.NO_MATCH


def test_reasons_never_round_a_cutoff_to_a_value_it_is_not():
    """0.9999 is not printed as 1.000, and 0.996 < 0.9961 does not read as 0.996 < 0.996 (issue 26), with
    the same number of decimals every time (issue 44)."""
    th = Thresholds(confident=0.9999, ambiguous_ratio=1.0, oos=1.0)
    r = assign_tier(np.array([0.996, 0.004]), ["A", "B"], 0.0, 0.0, th)
    assert r.tier is Tier.WEAK and r.reason == "confidence 0.996 < cutoff >0.999", r.reason
    th = Thresholds(confident=0.9961, ambiguous_ratio=1.0, oos=1.0)
    assert assign_tier(np.array([0.996, 0.004]), ["A", "B"], 0.0, 0.0, th).reason == "confidence 0.996 < cutoff 0.997"
    th = Thresholds(confident=0.7, ambiguous_ratio=1.0, oos=1.0)
    assert assign_tier(np.array([0.8, 0.2]), ["A", "B"], 0.0, 0.0, th).reason == "confidence 0.800 >= cutoff 0.700"
    assert fmt_probs(0.9999) == [">0.999"] and fmt_probs(0.99951, 0.9999) == ["0.999", ">0.999"]
    assert fmt_probs(0.0, 1.0, 0.5) == ["0.000", "1.000", "0.500"] and fmt_probs(0.00004) == ["<0.001"]
    assert fmt_probs(0.83051, 0.83049) == ["0.831", "0.830"] and fmt_probs(0.5, 0.5) == ["0.500", "0.500"]


def test_tiers():
    th = Thresholds(confident=0.7, ambiguous_ratio=0.5, oos=0.6, oos_confident=0.9, per_intent={"B": 0.95})
    labels = ["A", "B", "C", "D"]
    r = assign_tier(np.array([0.8, 0.1, 0.05, 0.05]), labels, 0.0, 0.1, th)
    assert (r.tier, r.label, r.alternatives, r.sure) == (Tier.CONFIDENT, "A", [], True)
    r = assign_tier(np.array([0.1, 0.8, 0.05, 0.05]), labels, 0.0, 0.1, th)
    assert r.tier is Tier.WEAK and r.label == "B"  # per-intent override 0.95
    r = assign_tier(np.array([0.40, 0.35, 0.20, 0.05]), labels, 0.0, 0.1, th)
    assert r.tier is Tier.AMBIGUOUS
    assert [c.label for c in r.alternatives] == ["A", "B", "C"]  # cut where 0.05 < 0.5 * 0.20
    r = assign_tier(np.array([0.5, 0.1, 0.1, 0.1]), labels, 0.2, 0.7, th)
    assert r.tier is Tier.NO_MATCH and r.label is None and not r.sure
    r = assign_tier(np.array([0.05, 0.0, 0.0, 0.0]), labels, 0.95, 0.95, th)
    assert r.tier is Tier.NO_MATCH and r.sure


def test_cut_at_drop_has_no_fixed_k():
    c = [Candidate(str(i), 0.1) for i in range(5)] + [Candidate("x", 0.01)]
    assert len(cut_at_drop(c, 0.5)) == 5
    assert len(cut_at_drop([Candidate("a", 0.9), Candidate("b", 0.05)], 0.5)) == 1


def test_precision_target_is_relative_to_noisy_labels():
    from flywheel.classifier.layer2.head import precision_cutoff

    rng = np.random.default_rng(0)
    conf = np.sort(rng.uniform(0.3, 1.0, 1000))[::-1]
    truly_right = conf > 0.5
    noisy = truly_right & (rng.random(1000) < 0.9)  # a teacher that is right 90% of the time
    t = precision_cutoff(conf, noisy, 0.95)
    assert t < 1.0  # an absolute 0.95 is unreachable against 90%-right labels; relative is not
    assert 0.45 < t < 0.75
    assert precision_cutoff(conf, truly_right, 0.95) == pytest.approx(t, abs=0.2)
    assert precision_cutoff(np.array([]), np.array([]), 0.95) == 1.0


def test_cross_validation_can_use_a_sample_but_the_final_fit_uses_everything():
    X, y, centres = blobs(n_per=100)
    head = IntentHead(cv=3, cv_max_samples=120).fit(X, y)
    assert 110 <= head.metrics_["cv_samples"] <= 130
    assert head.lr_.coef_.shape[1] == X.shape[1] and len(head.ref_) == 400  # all in-scope rows (<= 200/class)
    assert list(head.predict(centres)) == ["L0", "L1", "L2", "L3"]


def test_cross_fitted_views_calibrate_while_the_served_model_fits_every_row():
    # issue 22: cross-fitted calibration; each view predicts the rows its encoder never saw
    X, y, _ = blobs(noise=0.5, seed=2)
    half = np.arange(len(X)) % 2 == 0
    clean = IntentHead(cv=3).fit(X, y, cv_views=[CrossFitView(X, half), CrossFitView(X, ~half)])
    plain = IntentHead(cv=3).fit(X, y)
    assert clean.metrics_["cv_folds"] == 2 and clean.metrics_["cv_samples"] == len(X)
    assert clean.metrics_["fit_only_rows"] == 0
    np.testing.assert_allclose(clean.lr_.coef_, plain.lr_.coef_)     # the served model: every row of X
    # views whose unseen rows are far noisier score worse out of fold: the calibration follows them
    rng = np.random.default_rng(5)
    noisy = [CrossFitView(np.where(m[:, None], X + 3.0 * rng.standard_normal(X.shape), X), m) for m in (half, ~half)]
    blurred = IntentHead(cv=3).fit(X, y, cv_views=noisy)
    assert blurred.metrics_["oof_top1_accuracy"] < clean.metrics_["oof_top1_accuracy"] - 0.1
    np.testing.assert_allclose(blurred.lr_.coef_, plain.lr_.coef_)


def test_cross_fitted_views_skip_fit_only_rows_and_rows_past_their_end():
    X, y, _ = blobs(seed=3)
    n = len(X) - 10                       # the last 10 rows are in no view (synthetic negatives, say)
    half = np.arange(n) % 2 == 0
    fo = np.zeros(len(X), bool)
    fo[:6] = True
    head = IntentHead(cv=3).fit(X, y, fit_only=fo, cv_views=[CrossFitView(X[:n], half), CrossFitView(X[:n], ~half)])
    assert head.metrics_["cv_samples"] == n - 6 and head.metrics_["fit_only_rows"] == 16


@pytest.mark.parametrize("views, words", [
    (lambda X, m: [CrossFitView(X, m), CrossFitView(X, m)], "more than once"),
    (lambda X, m: [CrossFitView(X[:, :8], m)], "rows of 32 values"),
    (lambda X, m: [CrossFitView(X, m[:-1])], "one flag per row"),
    (lambda X, m: [CrossFitView(X, np.zeros(len(X), bool))], "predict no row"),
])
def test_bad_cross_fitted_views_are_named(views, words):
    X, y, _ = blobs(seed=4)
    m = np.arange(len(X)) % 2 == 0
    with pytest.raises(ValueError, match=words):
        IntentHead(cv=3).fit(X, y, cv_views=views(X, m))


def test_one_intent_against_out_of_scope_fits_and_predicts():
    """A single intent is a yes/no head: the intent against the out-of-scope rows (issue 32:
    ``_learn_thresholds`` read a runner-up that one intent does not have)."""
    X, y, centres = blobs(k=2)
    y1 = [None if v != "L0" else v for v in y]
    head = IntentHead(cv=3).fit(X, y1)
    assert list(head.classes_) == ["L0"] and head.has_oos_
    assert head.thresholds_["ambiguous_ratio"] == 0.5          # no runner-up to learn it from
    assert list(head.predict(centres)) == ["L0", None]
    s = head.scores(centres)
    assert s.probs.shape == (2, 1) and s.p_oos[1] > s.p_oos[0]
