"""The out-of-scope gate under shift (issue 43): a rejection of a query in an undertrained
declared language is never sure, even one the out-of-scope class claims: the teacher
decides, and without one it is served as the rejection it is; a rejection in a well-trained
language stays sure; a version fitted before the language counts gates as it did."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from flywheel.classifier import Classifier
from flywheel.classifier.decision import Layer, Tier
from flywheel.classifier.layer2.fitter import fit_model
from flywheel.classifier.layer2.scoring import HeadScores
from flywheel.classifier.layer2.shift import language_rows, undertrained_languages
from flywheel.classifier.layer2.tiers import Thresholds, assign_tiers, tier_rows
from flywheel.classifier.settings.intents import parse_intents
from tests.support.fakes import HashEmbedder, ScriptedTeacher

TH = Thresholds(confident=0.6, ambiguous_ratio=0.5, oos=0.5, oos_confident=0.8)
LABELS = ["A", "B"]


def _scores(p_oos: float, oos_class: float = 0.0, sim: float = 0.3, probs=(0.7, 0.1)) -> HeadScores:
    return HeadScores(np.array([probs], float), np.array([oos_class]), np.array([p_oos]), np.array([sim]))


def test_language_rows_count_in_scope_rows_by_declared_language():
    rows = language_rows(["where is my order", "my package never arrived", "hello there", "qué tal"],
                         ["ORDER", "ORDER", None, None], ["en", "es"])
    assert rows == {"en": 2, "es": 0}


@pytest.mark.parametrize("rows, declared, expected", [
    ({"en": 120, "es": 0}, ("en", "es"), {"es"}),
    ({"en": 120, "es": 11}, ("en", "es"), {"es"}),       # barely: under a tenth of English's
    ({"en": 120, "es": 12}, ("en", "es"), set()),
    ({"en": 120}, ("en", "es", "de"), {"es", "de"}),     # a declared language with no count has none
    ({"en": 120, "es": 0}, ("en",), set()),              # one declared language: nothing to shift to
    (None, ("en", "es"), set()),                         # a version fitted before the counts
])
def test_undertrained_languages(rows, declared, expected):
    assert undertrained_languages(rows, declared) == frozenset(expected)


def test_a_rejection_in_an_undertrained_language_is_an_unsure_no_match():
    th = replace(TH, undertrained=frozenset({"es"}))
    res = tier_rows(_scores(0.9), LABELS, th, np.array([True]))[0]
    assert (res.tier, res.label, res.sure) == (Tier.NO_MATCH, None, False)
    assert res.reason == ("out of scope unsure, the query's language is undertrained (es): "
                          "out of scope: probability 0.900 >= cutoff 0.500")
    same = tier_rows(_scores(0.9), LABELS, th, np.array([False]))[0]   # a well-trained language: as before
    assert (same.tier, same.label, same.sure) == (Tier.NO_MATCH, None, True)


def test_under_shift_even_a_sure_out_of_scope_class_claim_is_no_evidence():
    claimed = _scores(0.95, oos_class=0.85, probs=(0.1, 0.05))   # the class claims it, above oos_confident
    shifted = assign_tiers(claimed, LABELS, TH, np.array([True]))
    assert list(shifted.tier) == [Tier.NO_MATCH] and not bool(shifted.sure[0]) and bool(shifted.doubt[0])
    kept = assign_tiers(claimed, LABELS, TH, np.array([False]))   # in a well-trained language it is evidence
    assert list(kept.tier) == [Tier.NO_MATCH] and bool(kept.sure[0]) and not bool(kept.doubt[0])


def test_a_query_the_gate_accepts_is_tiered_as_before_in_any_language():
    accepted = _scores(0.1, probs=(0.9, 0.05))
    for shifted in (np.array([True]), np.array([False]), None):
        batch = assign_tiers(accepted, LABELS, TH, shifted)
        assert list(batch.tier) == [Tier.CONFIDENT] and not bool(batch.doubt[0])


DOC = {"version": 1, "languages": ["en", "es"], "embedder": {"backend": "minilm"},
       "intents": [{"name": "ORDERS", "examples": ["where is my order", "track my order please",
                                                   "my order has not arrived", "order status for my parcel"]},
                   {"name": "REFUNDS", "examples": ["i want my money back", "refund my purchase",
                                                    "how do i get a refund", "return this for a refund"]}],
       "out_of_scope": {"examples": [], "synthetic": 0},
       "thresholds": {"oos": 0.0}}     # every query rejected by the gate: what happens next is the test


@pytest.fixture(scope="module")
def fitted():
    emb = HashEmbedder()
    return fit_model(parse_intents(DOC), embedder=emb), emb


def test_the_fit_counts_rows_per_language_and_serving_sends_the_undertrained_one_to_the_teacher(fitted):
    model, emb = fitted
    assert model.manifest.metrics["language_rows"] == {"en": 8, "es": 0}
    assert Thresholds.for_model(model).undertrained == frozenset({"es"})
    clf = Classifier(model, embedder=emb, teacher=None)
    en, es = clf.classify_many(["where is my order", "¿dónde está mi pedido? quiero saberlo ya"])
    assert (en.tier, en.label) == (Tier.NO_MATCH, None)
    assert (es.tier, es.label, es.degraded) == (Tier.NO_MATCH, None, "no_teacher")  # served as rejected
    assert "undertrained (es)" in es.reason and es.language == "es"
    assert "undertrained" not in en.reason


def test_the_teacher_decides_the_undertrained_query(fitted):
    model, emb = fitted
    teacher = ScriptedTeacher(lambda req: "REFUNDS")
    d = Classifier(model, embedder=emb, teacher=teacher).classify("quiero que me devuelvan el dinero")
    assert (d.layer, d.label) == (Layer.LLM, "REFUNDS") and len(teacher.requests) == 1


def test_a_version_without_the_language_counts_gates_as_before(fitted):
    model, emb = fitted
    metrics = {k: v for k, v in model.manifest.metrics.items() if k != "language_rows"}
    old = replace(model, manifest=replace(model.manifest, metrics=metrics))
    assert Thresholds.for_model(old).undertrained == frozenset()
    es = Classifier(old, embedder=emb, teacher=None).classify("¿dónde está mi pedido? quiero saberlo ya")
    assert (es.tier, es.label) == (Tier.NO_MATCH, None)


def test_a_retrain_counts_languages_from_its_rows_texts(fitted):
    from flywheel.training.tuner.fit import HeadRows, fit_head

    model, emb = fitted
    texts, labels = model.intents.training_pairs()
    rows = HeadRows(emb.encode(texts), labels)
    counted = fit_head(model.intents, replace(rows, texts=texts), encoder_id=emb.id)
    assert counted.manifest.metrics["language_rows"] == {"en": 8, "es": 0}
    assert "language_rows" not in fit_head(model.intents, rows, encoder_id=emb.id).manifest.metrics


def test_an_unsure_rejection_says_why_it_is_unsure_and_a_sure_one_does_not():
    """A rejection below ``oos_confident`` goes to the teacher; its reason says so (a newcomer
    saw a sure and an unsure rejection with the same reason and confidence)."""
    unsure = tier_rows(_scores(0.9, oos_class=0.0), LABELS, replace(TH, oos_confident=0.95))[0]
    assert (unsure.tier, unsure.sure) == (Tier.NO_MATCH, False)
    assert unsure.reason.endswith("; unsure: out-of-scope confidence 0.900 < cutoff 0.950")
    sure = tier_rows(_scores(0.9, oos_class=0.0), LABELS, TH)[0]
    assert sure.sure and "unsure" not in sure.reason


def test_a_query_scored_under_shift_has_its_language_detected_once(fitted, monkeypatch):
    model, emb = fitted
    clf = Classifier(model, embedder=emb, teacher=None)
    asked: list[str] = []
    detector = clf._rt.language
    real = detector.detect
    monkeypatch.setattr(detector, "detect", lambda text: asked.append(text) or real(text))
    d = clf.classify("¿dónde está mi pedido? quiero saberlo ya")
    assert d.language == "es" and asked == ["¿dónde está mi pedido? quiero saberlo ya"]
