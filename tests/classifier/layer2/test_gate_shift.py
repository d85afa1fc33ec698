"""The out-of-scope gate under shift (issue 43): a rejection without out-of-scope evidence
(a query in an undertrained declared language, or one in the novelty cut's band) goes to
the teacher as unsure; a rejection the out-of-scope class claims surely stays ``no_match``;
a version fitted before the language counts gates as it did."""

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


def test_a_rejection_in_an_undertrained_language_is_unsure_with_its_top_intent():
    th = replace(TH, undertrained=frozenset({"es"}))
    res = tier_rows(_scores(0.9), LABELS, th, np.array([True]))[0]
    assert (res.tier, res.label, res.sure) == (Tier.WEAK, "A", False)
    assert "undertrained: es" in res.reason and res.reason.startswith("out of scope unsure")
    same = tier_rows(_scores(0.9), LABELS, th, np.array([False]))[0]   # a well-trained language: as before
    assert (same.tier, same.label) == (Tier.NO_MATCH, None)


def test_a_rejection_the_out_of_scope_class_claims_surely_stays_no_match_in_any_language():
    s = _scores(0.95, oos_class=0.85, probs=(0.1, 0.05))
    batch = assign_tiers(s, LABELS, TH, np.array([True]))
    assert list(batch.tier) == [Tier.NO_MATCH] and bool(batch.sure[0])
    unsure_claim = assign_tiers(_scores(0.95, oos_class=0.6, probs=(0.3, 0.1)), LABELS, TH, np.array([True]))
    assert list(unsure_claim.tier) == [Tier.WEAK]    # a claim below oos_confident is no evidence under shift


def test_the_novelty_band_is_unsure_and_beyond_it_stays_no_match():
    th = replace(TH, oos=0.99, oos_confident=1.1, novelty_floor=0.25)
    band, beyond = (tier_rows(_scores(0.995, sim=s), LABELS, th)[0] for s in (0.26, 0.2))
    assert (band.tier, band.label) == (Tier.WEAK, "A") and "no out-of-scope evidence" in band.reason
    assert (beyond.tier, beyond.label) == (Tier.NO_MATCH, None)
    claimed = tier_rows(_scores(0.995, oos_class=0.8, sim=0.26, probs=(0.1, 0.1)), LABELS, th)[0]
    assert claimed.tier is Tier.NO_MATCH   # the out-of-scope class (synthetic negatives) claims it


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
    assert es.tier in (Tier.WEAK, Tier.AMBIGUOUS) and es.label in ("ORDERS", "REFUNDS")
    assert "undertrained: es" in es.reason and es.language == "es"


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
