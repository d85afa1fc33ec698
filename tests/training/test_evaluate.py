"""Tests of the labelled-data loaders and the evaluation report, with a fake embedder
(hashed bag of words), so no real model is loaded."""

from __future__ import annotations

import json

import numpy as np
import pytest

from flywheel.classifier.encoders import CachedEmbedder
from flywheel.classifier.errors import FlywheelError, InvalidInputError
from flywheel.classifier.layer2.fitter import fit_model
from flywheel.classifier.pipeline import Classifier
from flywheel.classifier.protocols import Embedder
from flywheel.classifier.settings.intents import Intent, IntentSet, Rule, TeacherSettings, ThresholdSettings
from flywheel.classifier.settings.label_names import OUT_OF_SCOPE as OOS_NAME
from flywheel.training.evaluate import classification_metrics, evaluate, format_report, write_plots
from flywheel.training.loaders import DatasetError, LabelledData, intent_set_from_data, load_labelled
from tests.support.docs import OOS_WORDS, TOPICS, topic_examples
from tests.support.fakes import HashEmbedder

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def toy_embedder() -> HashEmbedder:
    """The plain bag-of-words HashEmbedder (64 buckets) these toy topics are separated by."""
    return HashEmbedder(64, "test:hash-64", bag_of_words=True)


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


# ------------------------------------------------------------------ metrics
def test_metric_definitions_by_hand():
    true = ["a", "a", "a", "b", "b", None, None, None, None]
    pred = ["a", "a", None, "b", "a", None, None, "b", None]
    m = classification_metrics(true, pred)
    assert m["n"] == 9 and m["n_in_scope"] == 5 and m["n_out_of_scope"] == 4
    assert m["accuracy"] == pytest.approx(6 / 9, abs=1e-6)
    # CLINC150: right intent and not rejected, over in-scope queries; the rejected "a" is wrong.
    assert m["in_scope_accuracy"] == pytest.approx(3 / 5, abs=1e-6)
    assert m["oos_recall"] == pytest.approx(3 / 4, abs=1e-6)
    assert m["oos_precision"] == pytest.approx(3 / 4, abs=1e-6)
    # a: P 2/3 R 2/3; b: P 1/2 R 1/2; OOS: P 3/4 R 3/4 -> F1 equal to P=R
    assert m["per_intent"]["a"] == {"precision": pytest.approx(2 / 3, abs=1e-6),
                                    "recall": pytest.approx(2 / 3, abs=1e-6),
                                    "f1": pytest.approx(2 / 3, abs=1e-6), "support": 3}
    assert m["per_intent"][OOS_NAME]["support"] == 4
    assert m["macro_f1"] == pytest.approx((2 / 3 + 1 / 2 + 3 / 4) / 3, abs=1e-6)
    assert sorted(map(tuple, m["confused_pairs"])) == sorted([("a", OOS_NAME, 1), ("b", "a", 1), (OOS_NAME, "b", 1)])
    assert m["confusion"]["labels"] == ["a", "b", OOS_NAME]
    assert m["confusion"]["matrix"] == [[2, 0, 1], [1, 1, 0], [0, 1, 3]]


def test_metrics_without_out_of_scope_and_top_pairs_order():
    true = ["a"] * 5 + ["b"] * 3
    pred = ["b"] * 3 + ["a"] * 2 + ["a", "b", "b"]
    m = classification_metrics(true, pred)
    assert m["oos_recall"] is None and m["oos_precision"] is None
    assert m["in_scope_accuracy"] == m["accuracy"] == pytest.approx(4 / 8)
    assert m["confused_pairs"][0] == ["a", "b", 3]
    assert OOS_NAME not in m["per_intent"]


def test_confusion_subset_for_many_labels():
    labels = [f"l{i:03d}" for i in range(60)]
    true = labels * 2
    pred = list(labels) + [labels[(i + 1) % 60] if i < 25 else labels[i] for i in range(60)]
    m = classification_metrics(true, pred, confusion_labels=20)
    conf = m["confusion"]
    assert len(conf["labels"]) == 20 and not conf["complete"] and conf["n_labels"] == 60
    assert np.array(conf["matrix"]).shape == (20, 20)
    assert len(m["confused_pairs"]) == 10


# ------------------------------------------------------------------ evaluate
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


def test_format_report_and_plots(clf, tmp_path):
    texts, labels = _test_queries()
    report = evaluate(clf, texts, labels, progress=False, latency_sample=3)
    text = format_report(report)
    assert "v-test" in text
    assert f"{100 * report['in_scope_accuracy']:.1f}%" in text
    assert f"{100 * report['oos_recall']:.1f}%" in text
    assert f"{report['macro_f1']:.3f}" in text and f"{report['ece']:.4f}" in text
    assert "p50" in text and "p99" in text
    paths = write_plots(report, tmp_path / "plots")
    assert [p.name for p in paths] == ["reliability.png", "confusion.png"]
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
    assert all(p.read_bytes()[:8] == PNG_SIGNATURE for p in paths)
    assert len(report["confusion"]["labels"]) == 20


# ------------------------------------------------------------------ datasets
def test_load_csv(tmp_path):
    p = tmp_path / "d.csv"
    p.write_text('text,label,extra\n"hello, world",greet,1\n\nbye now,oos,2\n"multi\nline",greet,3\n',
                 encoding="utf-8")
    d = load_labelled(p)
    assert d.texts == ["hello, world", "bye now", "multi\nline"]
    assert d.labels == ["greet", None, "greet"]
    assert len(d) == 3 and d.n_out_of_scope == 1 and d.intent_labels == ["greet"]


def test_load_csv_custom_columns_and_bom(tmp_path):
    p = tmp_path / "d.csv"
    p.write_text("\ufeffquery,intent\nhi,greet\nnothing,none\n", encoding="utf-8")
    d = load_labelled(p, text_column="query", label_column="intent", oos_label="none")
    assert d.labels == ["greet", None]


def test_csv_errors(tmp_path):
    p = tmp_path / "d.csv"
    p.write_text("text,intent\nhi,greet\n", encoding="utf-8")
    with pytest.raises(DatasetError, match=r"d\.csv.*missing column 'label'.*'text', 'intent'"):
        load_labelled(p)
    p.write_text("text,label\nhi,greet\n  ,greet\n", encoding="utf-8")
    with pytest.raises(DatasetError, match=r"d\.csv: line 3 \(row 2\): empty text"):
        load_labelled(p)
    p.write_text("text,label\nhi,greet\nyo\n", encoding="utf-8")
    with pytest.raises(DatasetError, match=r"line 3.*1 field"):
        load_labelled(p)
    p.write_text("text,label\nhi,\n", encoding="utf-8")
    with pytest.raises(DatasetError, match=r"line 2.*empty label"):
        load_labelled(p)
    p.write_text("", encoding="utf-8")
    with pytest.raises(DatasetError, match="empty file"):
        load_labelled(p)
    p.write_text("text,label\n", encoding="utf-8")
    with pytest.raises(DatasetError, match="no examples"):
        load_labelled(p)


def test_load_jsonl(tmp_path):
    p = tmp_path / "d.jsonl"
    rows = [{"text": "hi", "label": "greet"}, {"text": "what\u2028now", "label": None},
            {"text": "x", "label": "oos"}]
    p.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\n\n", encoding="utf-8")
    d = load_labelled(p)
    assert d.texts == ["hi", "what\u2028now", "x"] and d.labels == ["greet", None, None]
    (tmp_path / "d.ndjson").write_text('{"q": "a", "y": "b"}\n', encoding="utf-8")
    assert load_labelled(tmp_path / "d.ndjson", text_column="q", label_column="y").labels == ["b"]


def test_jsonl_errors(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text('{"text": "hi", "label": "a"}\n\n{"text": "oops", "label": \n', encoding="utf-8")
    with pytest.raises(DatasetError, match=r"d\.jsonl: invalid JSON on line 3"):
        load_labelled(p)
    p.write_text('{"text": "hi", "label": "a"}\n{"label": "a"}\n', encoding="utf-8")
    with pytest.raises(DatasetError, match=r"line 2: missing key 'text'"):
        load_labelled(p)
    p.write_text('{"text": "hi", "label": "a"}\n[1, 2]\n', encoding="utf-8")
    with pytest.raises(DatasetError, match=r"line 2: expected a JSON object"):
        load_labelled(p)
    p.write_text('{"text": "", "label": "a"}\n', encoding="utf-8")
    with pytest.raises(DatasetError, match=r"line 1: empty text"):
        load_labelled(p)
    p.write_text('{"text": 5, "label": "a"}\n', encoding="utf-8")
    with pytest.raises(DatasetError, match=r"line 1: text must be a string"):
        load_labelled(p)


def _clinc(tmp_path):
    doc = {"train": [["book a flight", "book_flight"], ["cancel my card", "cancel"]],
           "oos_train": [["how tall is a giraffe", "oos"]],
           "val": [["fly me", "book_flight"]], "oos_val": [],
           "test": [["find flights", "book_flight"]], "oos_test": [["sing", "oos"], ["dance", "oos"]]}
    p = tmp_path / "data_full.json"
    p.write_text(json.dumps(doc), encoding="utf-8")
    return p


def test_load_clinc150(tmp_path):
    p = _clinc(tmp_path)
    train = load_labelled(p)
    assert train.texts == ["book a flight", "cancel my card", "how tall is a giraffe"]
    assert train.labels == ["book_flight", "cancel", None]
    test = load_labelled(p, split="test")
    assert test.labels == ["book_flight", None, None]
    assert load_labelled(p, fmt="clinc150", split="val").texts == ["fly me"]


def test_clinc150_errors(tmp_path):
    p = _clinc(tmp_path)
    with pytest.raises(DatasetError, match="unknown split 'dev'"):
        load_labelled(p, split="dev")
    bad = tmp_path / "bad.json"
    bad.write_text('{"train": [\n["a", "b"],\n["c" "d"]\n]}', encoding="utf-8")
    with pytest.raises(DatasetError, match=r"bad\.json: invalid JSON on line 3"):
        load_labelled(bad)
    bad.write_text(json.dumps({"train": [["a", "b"], ["c"]]}), encoding="utf-8")
    with pytest.raises(DatasetError, match=r"'train' item #2: expected a \[text, label\] pair"):
        load_labelled(bad)
    bad.write_text(json.dumps({"other": []}), encoding="utf-8")
    with pytest.raises(DatasetError, match="no 'train' or 'oos_train' list"):
        load_labelled(bad)
    bad.write_text(json.dumps([["a", "b"]]), encoding="utf-8")
    with pytest.raises(DatasetError, match="JSON object of splits"):
        load_labelled(bad)


def test_general_dataset_errors(tmp_path):
    with pytest.raises(DatasetError, match=r"nope\.csv: file not found") as info:
        load_labelled(tmp_path / "nope.csv")
    assert isinstance(info.value, FlywheelError) and info.value.exit_code == 2
    (tmp_path / "d.txt").write_text("x", encoding="utf-8")
    with pytest.raises(DatasetError, match=r"d\.txt: cannot tell the format.*'\.txt'"):
        load_labelled(tmp_path / "d.txt")
    with pytest.raises(DatasetError, match="unknown format 'xml'"):
        load_labelled(tmp_path / "d.txt", fmt="xml")
    (tmp_path / "latin.csv").write_bytes(b"text,label\ncaf\xe9,a\n")
    with pytest.raises(DatasetError, match="not valid UTF-8"):
        load_labelled(tmp_path / "latin.csv")


# --------------------------------------------------------------- intent sets
def test_intent_set_from_data(fake):
    data = LabelledData(["rain today", "sunny forecast", "play a song", "guitar album", "zebra", "galaxy"],
                        ["weather", "weather", "music", "music", None, None], source="x.csv")
    s = intent_set_from_data(data, name="from-data")
    assert s.name == "from-data" and s.labels == ("weather", "music")
    assert s.intent("music").examples == ("play a song", "guitar album")
    assert s.intent("music").description == "music"
    assert s.oos_examples == ("zebra", "galaxy") and s.rules == ()
    texts, labels = s.training_pairs()
    assert sorted(zip(texts, map(str, labels))) == sorted(zip(data.texts, map(str, data.labels)))
    model = fit_model(s, embedder=fake)
    assert sorted(model.head.classes_) == ["music", "weather"]


def test_intent_set_from_data_with_base():
    base = IntentSet(
        name="base",
        intents=(Intent("music", "Music.", ("song",), confident=0.7), Intent("gone", "Gone.", ("x",))),
        rules=(Rule(id="r1", intent="music", patterns=("guitar",)), Rule(id="r2", intent="gone", patterns=("x",))),
        teacher=TeacherSettings(model="other:1b"),
        thresholds=ThresholdSettings(oos=0.4, per_intent={"music": 0.7, "gone": 0.5}))
    data = LabelledData(["play a song", "guitar album"], ["music", "music"])
    s = intent_set_from_data(data, name="n", base=base)
    assert [r.id for r in s.rules] == ["r1"]
    assert s.teacher.model == "other:1b" and s.thresholds.oos == 0.4
    assert s.thresholds.per_intent == {"music": 0.7}
    assert s.intent("music").confident == 0.7
    with pytest.raises(DatasetError, match="no in-scope examples"):
        intent_set_from_data(LabelledData(["a"], [None]), name="n")


def test_prediction_sets_calibrated_on_held_out_data(model, fake):
    from flywheel.classifier.layer2.tiers import Thresholds
    from flywheel.training.calibration import calibrate_sets
    from flywheel.training.loaders import DatasetError, LabelledData

    texts, labels = _test_queries()
    data = LabelledData(texts=texts * 5, labels=labels * 5, source="cal.jsonl")
    cal = calibrate_sets(model, data, embedder=fake)
    assert cal is not model and model.manifest.thresholds.get("set") == model.head.thresholds_["set"]
    th = Thresholds.for_model(cal)
    assert th.coverage == 0.95 and th.set_cutoff == cal.manifest.thresholds["set"]
    rep = evaluate(Classifier(cal, embedder=fake, teacher=None), texts, labels, progress=False, latency_sample=0)
    assert rep["set_coverage"] >= 0.95      # calibrated on these very queries: covered by construction
    with pytest.raises(DatasetError, match="cal.jsonl: no in-scope rows"):
        calibrate_sets(model, LabelledData(texts=["zebra"], labels=[None], source="cal.jsonl"), embedder=fake)


# ------------------------------------------------------------------ out-of-scope spellings, unknown labels
def test_load_reads_every_out_of_scope_spelling(tmp_path):
    p = tmp_path / "d.jsonl"
    rows = [{"text": t, "label": lab} for t, lab in
            [("a", "OUT_OF_SCOPE"), ("b", "OOS"), ("c", "NONE"), ("d", "out_of_scope"), ("e", " none "),
             ("f", "oos"), ("g", "greet"), ("h", "Other")]]
    p.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    assert load_labelled(p).labels == [None] * 6 + ["greet", "Other"]
    assert load_labelled(p, oos_label="other").labels == [None] * 6 + ["greet", None]   # --oos-label, any case


def test_drop_unknown_labels_counts_and_keeps_languages():
    from flywheel.training.loaders import drop_unknown_labels

    data = LabelledData(["a", "b", "c", "d", "e"], ["x", "dance", None, "dance", "tap"], source="t.jsonl",
                        langs=["en", "es", None, "en", "fr"])
    kept, skipped = drop_unknown_labels(data, ["x"])
    assert skipped == {"dance": 2, "tap": 1} and list(skipped) == ["dance", "tap"]
    assert (kept.texts, kept.labels, kept.langs, kept.source) == (["a", "c"], ["x", None], ["en", None], "t.jsonl")
    assert drop_unknown_labels(kept, ["x"]) == (kept, {})


def test_cli_eval_scores_oos_spellings_as_out_of_scope_and_leaves_unknown_labels_out(tmp_path, monkeypatch,
                                                                                     capsys):
    import flywheel.classifier.encoders
    import flywheel.classifier.layer2.fitter
    from flywheel.cli import main

    fake = toy_embedder()
    monkeypatch.setattr(flywheel.classifier.layer2.fitter, "make_embedder", lambda *a, **k: fake)
    monkeypatch.setattr(flywheel.classifier.encoders, "make_embedder", lambda *a, **k: fake)
    train = [{"text": t, "label": name} for name, words in TOPICS.items() for t in topic_examples(words)]
    train += [{"text": t, "label": "oos"} for t in topic_examples(OOS_WORDS)]
    oos = topic_examples(OOS_WORDS, 20)[12:]
    test = [{"text": topic_examples(TOPICS["weather"])[0], "label": "weather"},
            {"text": oos[0], "label": "OUT_OF_SCOPE"}, {"text": oos[1], "label": "OOS"},
            {"text": oos[2], "label": "NONE"}, {"text": oos[3], "label": "none"},
            {"text": "dance the tango", "label": "dance"}, {"text": "dance a waltz", "label": "dance"},
            {"text": "tap dance", "label": "tap"}]
    for name, rows in (("train", train), ("test", test)):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    args = ["eval", "--train", str(tmp_path / "train.jsonl"), "--test", str(tmp_path / "test.jsonl"),
            "--json", "--quiet", "--latency-sample", "0"]
    rc = main(args)
    out, err = capsys.readouterr()
    assert rc == 0, err
    report = json.loads(out)
    assert (report["n"], report["n_out_of_scope"], report["n_in_scope"]) == (5, 4, 1)
    assert report["oos_recall"] is not None and report["unknown_labels"] == []
    assert report["skipped_unknown_labels"] == {"dance": 2, "tap": 1}
    assert "warning" in err and "3 row(s) with labels the model does not know: dance (2), tap (1)" in err

    rc = main([*args, "--strict"])
    out, err = capsys.readouterr()
    assert rc == 2 and out == "" and "Traceback" not in err
    assert "test.jsonl: 3 row(s) with labels the model does not know: dance (2), tap (1)" in err
