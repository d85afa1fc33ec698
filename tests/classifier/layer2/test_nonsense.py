"""Nonsense is out of scope, whatever the encoder: the hand-written list in
tests/data/nonsense.txt (plus a 2,000,000-character line, random bytes and random code
points: ``nonsense()`` in tests/support/docs.py) never gets a confident in-scope answer
from the starter intents, with the multilingual default or with MiniLM (ONNX). The synthetic negatives
(classifier/layer2/negatives.py) that do it are checked too."""

from __future__ import annotations

import pytest

from flywheel.classifier.assembly import build_classifier
from flywheel.classifier.layer2.fitter import fit_model
from flywheel.classifier.layer2.negatives import FAMILIES, synthetic_negatives
from flywheel.classifier.pipeline import Classifier
from flywheel.classifier.settings.config import load_config
from flywheel.classifier.settings.intents import parse_intents
from tests.support.docs import nonsense
from tests.support.fakes import HashEmbedder
from tests.support.paths import ROOT


def _check(clf: Classifier) -> None:
    texts = nonsense()
    assert len(texts) >= 30
    decisions = clf.classify_many(texts)
    confident = [(t[:40], d.label, round(d.confidence, 2)) for t, d in zip(texts, decisions)
                 if d.tier.value == "confident"]
    assert not confident, confident
    no_match = sum(d.tier.value == "no_match" for d in decisions)
    assert no_match >= 0.9 * len(texts), [(t[:30], d.label, d.tier.value) for t, d in zip(texts, decisions)]


@pytest.mark.slow
def test_the_multilingual_default_calls_nonsense_out_of_scope():
    clf = build_classifier(load_config(teacher="off"), progress=False)
    assert clf.model.manifest.encoder["id"].startswith("use-multilingual")
    _check(clf)


@pytest.mark.slow
def test_minilm_calls_nonsense_out_of_scope(tmp_path):
    text = (ROOT / "data" / "starter_intents.yaml").read_text(encoding="utf-8")
    english = tmp_path / "english.yaml"
    english.write_text(text.replace("languages: [en, es]", "languages: [en]"), encoding="utf-8")
    clf = build_classifier(load_config(teacher="off", intents=str(english)), progress=False)
    assert clf.model.manifest.encoder["id"].startswith("minilm")
    _check(clf)


def test_generator_is_seeded_distinct_and_covers_every_family():
    a, b = synthetic_negatives(60), synthetic_negatives(60)
    assert a == b and len(set(a)) == 60
    assert synthetic_negatives(60, seed=1) != a
    assert synthetic_negatives(0) == ()
    assert len(FAMILIES) == 6
    with pytest.raises(ValueError, match="count must be >= 0"):
        synthetic_negatives(-1)


def test_negatives_train_but_do_not_count_as_training_rows():
    doc = {"version": 1, "intents": [{"name": "A", "examples": ["alpha one", "alpha two", "alpha three"]},
                                     {"name": "B", "examples": ["beta one", "beta two", "beta three"]}],
           "out_of_scope": {"synthetic": 30}}
    model = fit_model(parse_intents(doc), embedder=HashEmbedder())
    assert model.manifest.metrics["n_synthetic_negatives"] == 30
    assert model.manifest.training_size == 6 and model.manifest.metrics["n_out_of_scope"] == 0
    assert model.head.has_oos_  # the out-of-scope class exists, trained on the negatives only
    assert model.head.metrics_["fit_only_rows"] == 30  # never fitting the gate or the cutoffs
    off = fit_model(parse_intents({**doc, "out_of_scope": {"synthetic": 0}}), embedder=HashEmbedder())
    assert off.manifest.metrics["n_synthetic_negatives"] == 0 and not off.head.has_oos_
