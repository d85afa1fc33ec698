"""``flywheel eval``'s measurement (:mod:`training.eval.measure`), its text and plots
(:mod:`training.eval.render`) and the held-out calibration (:mod:`training.eval.held_out`),
with a fake embedder (hashed bag of words), so no real model is loaded."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from flywheel.classifier.encoders import CachedEmbedder
from flywheel.classifier.errors import InvalidInputError
from flywheel.classifier.layer2.fitter import fit_model
from flywheel.classifier.pipeline import Classifier
from flywheel.classifier.protocols import Embedder
from flywheel.classifier.settings.intents import Intent, IntentSet, Rule, ThresholdSettings
from flywheel.training.eval.held_out import calibrate
from flywheel.training.eval.loaders import DatasetError, LabelledData
from flywheel.training.eval.measure import evaluate
from flywheel.training.eval.render import eval_text, format_report, format_tradeoff, tuning_lines, write_plots
from flywheel.training.metrics import classification_metrics
from tests.support.docs import OOS_WORDS, TOPICS, topic_examples, toy_embedder
from tests.support.fakes import HashEmbedder

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def intent_set() -> IntentSet:
    intents = tuple(Intent(name, name, tuple(topic_examples(words))) for name, words in TOPICS.items())
    return IntentSet(name="toy", intents=intents, oos_examples=tuple(topic_examples(OOS_WORDS)))


@pytest.fixture(scope="module")
def fake() -> HashEmbedder:
    return toy_embedder()


@pytest.fixture(scope="module")
def model(intent_set, fake):
    return fit_model(intent_set, embedder=fake, version="v-test")


@pytest.fixture()
def clf(model, fake) -> Classifier:
    return Classifier(model, embedder=fake, teacher=None)


def test_fake_embedder_is_an_embedder(fake):
    assert isinstance(fake, Embedder)
    X = fake.encode(["rain forecast", "play a song"])
    assert X.shape == (2, 64) and np.allclose(np.linalg.norm(X, axis=1), 1.0)


def _test_queries() -> tuple[list[str], list[str | None]]:
    texts = ["rain forecast today", "is it sunny", "play my playlist", "guitar album song",
             "transfer money to account", "bank balance", "zebra galaxy", "volcano pyramid chess"]
    labels = ["weather", "weather", "music", "music", "banking", "banking", None, None]
    return texts, labels


def test_evaluate_report_is_consistent_with_decisions(clf):
    texts, labels = _test_queries()
    decisions = clf.classify_many(texts)
    preds = [d.label for d in decisions]
    report = evaluate(clf, texts, labels, progress=False, latency_sample=5)
    expected = classification_metrics(labels, preds)
    for key in ("n", "accuracy", "in_scope_accuracy", "oos_recall", "macro_f1", "per_intent", "confused_pairs"):
        assert report[key] == expected[key], key
    assert report["n"] == 8 and report["model_version"] == "v-test"
    assert report["accuracy"] >= 0.75  # the toy topics are easy
    assert 0.0 <= report["ece"] <= 1.0 and report["top3_accuracy"] == 1.0  # only 3 intents
    assert sum(b["count"] for b in report["reliability"]) == 6
    assert sum(report["tier_share"].values()) == pytest.approx(1.0)
    assert report["layer_share"]["embedding"] == pytest.approx(1.0)
    lat = report["latency_ms"]
    assert lat["n"] == 5 and 0 < lat["p50"] <= lat["p99"] and lat["mean"] > 0
    assert report["throughput_qps"] > 0
    json.dumps(report)  # serialisable


def test_evaluate_layer2_metrics_by_hand(clf, model, fake):
    texts, labels = _test_queries()
    X = fake.encode(texts)
    probs = model.head.scores(X).probs
    classes = list(model.head.classes_)
    ins = [i for i, v in enumerate(labels) if v is not None]
    top = probs[ins].argmax(axis=1)
    correct = np.array([classes[top[k]] == labels[i] for k, i in enumerate(ins)])
    from flywheel.classifier.layer2.calibration import expected_calibration_error

    report = evaluate(clf, texts, labels, progress=False, latency_sample=0)
    assert report["ece"] == expected_calibration_error(probs[ins].max(axis=1), correct)
    assert report["top1_accuracy_layer2"] == pytest.approx(correct.mean(), abs=1e-6)
    assert report["latency_ms"] is None


def test_evaluate_chunks_and_rules(model, fake, intent_set):
    # A rule decides one query (no layer-2 vector from the pipeline): its layer-2 metrics still count.
    rule_set = IntentSet(name="toy", intents=intent_set.intents, oos_examples=intent_set.oos_examples,
                         rules=(Rule(id="r1", intent="music", kind="contains", patterns=("guitar",)),))
    from dataclasses import replace

    clf = Classifier(replace(model, intents=rule_set), embedder=fake)
    texts, labels = _test_queries()
    report = evaluate(clf, texts * 3, labels * 3, progress=True, latency_sample=3, chunk_size=5)
    assert report["n"] == 24
    assert report["layer_share"]["rules"] == pytest.approx(3 / 24, abs=1e-6)
    assert sum(b["count"] for b in report["reliability"]) == 18


def test_evaluate_bypasses_the_embedding_cache(model):
    inner = toy_embedder()
    cached = CachedEmbedder(inner)
    clf = Classifier(model, embedder=cached)
    texts, labels = _test_queries()
    evaluate(clf, texts, labels, progress=False, latency_sample=4)
    assert len(cached) == 0 and cached.cache_info()["misses"] == 0  # untouched
    assert inner.texts_seen >= len(texts) + 4 + 1


def test_evaluate_counts_a_rejected_in_scope_query_as_wrong(model, fake, intent_set):
    # An out-of-scope cutoff of 0 rejects everything: in-scope accuracy 0, oos recall 1.
    from dataclasses import replace

    strict = replace(model, intents=replace(intent_set, thresholds=ThresholdSettings(oos=0.0)))
    clf = Classifier(strict, embedder=fake)
    texts, labels = _test_queries()
    report = evaluate(clf, texts, labels, progress=False, latency_sample=0)
    assert report["in_scope_accuracy"] == 0.0 and report["oos_recall"] == 1.0
    assert report["accuracy"] == pytest.approx(2 / 8)
    assert report["tier_share"]["no_match"] == 1.0


def test_evaluate_rejects_bad_input(clf):
    with pytest.raises(ValueError):
        evaluate(clf, ["a"], ["x", "y"], progress=False)
    with pytest.raises(InvalidInputError, match="query #2"):
        evaluate(clf, ["rain", "   "], ["weather", "weather"], progress=False)


def test_evaluate_reports_unknown_labels(clf):
    report = evaluate(clf, ["rain forecast", "play a song"], ["weather", "dance"], progress=False,
                      latency_sample=0)
    assert report["unknown_labels"] == ["dance"]
    assert "dance" in format_report(report)


def test_evaluate_reports_accuracy_per_language(intent_set):
    # Rules decide the queries they match; a cutoff of 0 rejects every other one as out of scope.
    rules = (Rule(id="w", intent="weather", patterns=("rain", "lluvia")),
             Rule(id="m", intent="music", patterns=("guitarra",)))
    fake = HashEmbedder()
    model = fit_model(intent_set, embedder=fake, version="v-lang")
    strict = replace(intent_set, rules=rules, thresholds=ThresholdSettings(oos=0.0))
    clf = Classifier(replace(model, intents=strict), embedder=fake, teacher=None)
    rows = [("rain forecast today", "weather", "en"),      # rule: right
            ("play my playlist", "music", "en"),           # rejected: wrong
            ("zebra galaxy", None, "en"),                  # rejected: right
            ("pronóstico de lluvia", "weather", "es"),     # rule: right
            ("toca la guitarra", "music", "es"),           # rule: right
            ("el saldo de mi cuenta", "banking", "es"),    # rejected: wrong
            ("hola volcán", None, "es"),                   # rejected: right
            ("bank balance", "banking", None)]             # rejected: wrong
    texts, labels, langs = (list(x) for x in zip(*rows))
    report = evaluate(clf, texts, labels, langs=langs, progress=False, latency_sample=0)
    by = report["by_language"]
    assert list(by) == ["en", "es", "unknown"]
    assert (by["en"]["n"], by["en"]["accuracy"], by["en"]["in_scope_accuracy"], by["en"]["oos_recall"]) == \
        (3, pytest.approx(2 / 3, abs=1e-6), 0.5, 1.0)
    assert (by["es"]["n"], by["es"]["accuracy"], by["es"]["in_scope_accuracy"], by["es"]["oos_recall"]) == \
        (4, 0.75, pytest.approx(2 / 3, abs=1e-6), 1.0)
    assert (by["unknown"]["n"], by["unknown"]["accuracy"], by["unknown"]["in_scope_accuracy"],
            by["unknown"]["oos_recall"]) == (1, 0.0, 0.0, None)
    assert report["accuracy"] == pytest.approx(5 / 8)
    json.dumps(report)
    text = format_report(report)
    assert "By language:" in text
    assert any(line.split() == ["en", "3", "66.7%", "50.0%", "100.0%"] for line in text.splitlines())
    assert any(line.split() == ["es", "4", "75.0%", "66.7%", "100.0%"] for line in text.splitlines())
    assert any(line.split() == ["unknown", "1", "0.0%", "0.0%", "n/a"] for line in text.splitlines())

    plain = evaluate(clf, texts, labels, progress=False, latency_sample=0)
    assert "by_language" not in plain and "By language" not in format_report(plain)
    assert "by_language" not in evaluate(clf, texts, labels, langs=[None] * 8, progress=False, latency_sample=0)
    with pytest.raises(ValueError, match="languages"):
        evaluate(clf, texts, labels, langs=["en"], progress=False)


def test_format_report_and_plots(clf, tmp_path):
    texts, labels = _test_queries()
    report = evaluate(clf, texts, labels, progress=False, latency_sample=3)
    text = format_report(report)
    assert "v-test" in text
    assert f"{100 * report['in_scope_accuracy']:.1f}%" in text
    assert f"{100 * report['oos_recall']:.1f}%" in text
    assert f"{report['macro_f1']:.3f}" in text and f"{report['ece']:.4f}" in text
    assert "p50" in text and "p99" in text
    paths = write_plots(report, tmp_path / "plots")   # both sets: the report has trade curves
    assert [p.name for p in paths] == ["reliability.png", "confusion.png", "tradeoff_oos.png", "tradeoff_teacher.png"]
    for p in paths:
        assert p.read_bytes()[:8] == PNG_SIGNATURE and p.stat().st_size > 1000


def test_plots_for_many_labels(tmp_path):
    labels = [f"intent_{i:03d}" for i in range(150)] + [None]
    true = labels * 2
    pred = labels + [labels[(i * 7) % 151] for i in range(151)]
    report = {"model_version": "v", "ece": 0.1, "reliability": [
        {"confidence": 0.3, "accuracy": 0.2, "count": 10}, {"confidence": 0.95, "accuracy": 0.9, "count": 50}],
        **classification_metrics(true, pred)}
    paths = write_plots(report, tmp_path)
    assert [p.name for p in paths] == ["reliability.png", "confusion.png"]   # no trade curves: no trade plots
    assert all(p.read_bytes()[:8] == PNG_SIGNATURE for p in paths)
    assert len(report["confusion"]["labels"]) == 20


def test_prediction_sets_calibrated_on_held_out_data(model, fake):
    from flywheel.classifier.layer2.tiers import Thresholds

    texts, labels = _test_queries()
    data = LabelledData(texts=texts * 5, labels=labels * 5, source="cal.jsonl")
    cal, note = calibrate(model, data, embedder=fake)
    assert note is None   # no target: only the prediction sets move
    assert cal is not model and model.manifest.thresholds.get("set") == model.head.thresholds_["set"]
    th = Thresholds.for_model(cal)
    assert th.coverage == 0.95 and th.set_cutoff == cal.manifest.thresholds["set"]
    rep = evaluate(Classifier(cal, embedder=fake, teacher=None), texts, labels, progress=False, latency_sample=0)
    assert rep["set_coverage"] >= 0.95      # calibrated on these very queries: covered by construction
    with pytest.raises(DatasetError, match="cal.jsonl: no in-scope rows"):
        calibrate(model, LabelledData(texts=["zebra"], labels=[None], source="cal.jsonl"), embedder=fake)


def test_eval_text_is_the_report_the_trade_tables_and_the_tuning(clf):
    texts, labels = _test_queries()
    report = evaluate(clf, texts, labels, progress=False, latency_sample=0)
    assert eval_text(report) == "\n".join([format_report(report), *format_tradeoff(report)])
    assert "Out-of-scope trade" in eval_text(report) and "encoder tuned" not in eval_text(report)
    tuning = {"objective": "contrastive", "device": "cpu", "steps": 12, "epochs_done": 1, "seconds": 3.2,
              "stopped_early": True, "loss_first": 1.5, "loss_last": 0.5, "encoder_id": "tuned:abc", "quantized": True,
              "unlabelled_stage": {"steps": 4, "rows": 1200, "seconds": 1.0, "loss_first": 2.0, "loss_last": 1.0}}
    lines = tuning_lines(tuning)
    assert lines == ["encoder tuned (contrastive, cpu): 12 steps, 1 epoch(s) in 3 s (stopped by its budget), loss 1.5 "
                     "-> 0.5; served as tuned:abc (int8)",
                     "unlabelled stage first (SimCSE): 4 steps on 1,200 texts in 1 s, loss 2.0 -> 1.0"]
    assert eval_text({**report, "tuning": tuning}).endswith("\n".join(lines))
