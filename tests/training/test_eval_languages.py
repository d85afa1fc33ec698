"""Per-language slices of ``flywheel eval``: the loaders keep each row's ``lang``, the
report gains ``by_language`` and the CLI prints it. A fake embedder (hashed bag of
words) stands in for the real model."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from flywheel.classifier.layer2.fitter import fit_model
from flywheel.classifier.pipeline import Classifier
from flywheel.classifier.settings.intents import Intent, IntentSet, Rule, ThresholdSettings
from flywheel.training.evaluate import evaluate, format_report, language_slices
from flywheel.training.loaders import DatasetError, load_labelled
from tests.support.docs import OOS_WORDS, TOPICS, topic_examples
from tests.support.fakes import HashEmbedder
from tests.support.paths import DATA


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def fake() -> HashEmbedder:
    return HashEmbedder()


@pytest.fixture(scope="module")
def intent_set() -> IntentSet:
    intents = tuple(Intent(name, name, tuple(topic_examples(words))) for name, words in TOPICS.items())
    return IntentSet(name="toy", intents=intents, oos_examples=tuple(topic_examples(OOS_WORDS)))


# ------------------------------------------------------------------ loaders
def test_jsonl_keeps_lang(tmp_path):
    p = _write_jsonl(tmp_path / "d.jsonl", [{"text": "hi", "label": "greet", "lang": "en"},
                                            {"text": "hola", "label": "greet", "lang": " es "},
                                            {"text": "ciao", "label": "oos", "lang": None},
                                            {"text": "salut", "label": "greet"}])
    d = load_labelled(p)
    assert d.langs == ["en", "es", None, None]
    assert d.labels == ["greet", "greet", None, "greet"]
    assert load_labelled(p, lang_column=None).langs is None


def test_jsonl_without_lang_has_no_langs(tmp_path):
    p = _write_jsonl(tmp_path / "d.jsonl", [{"text": "hi", "label": "greet"}])
    assert load_labelled(p).langs is None


def test_csv_keeps_lang_and_custom_column(tmp_path):
    p = tmp_path / "d.csv"
    p.write_text("text,label,lang\nhi,greet,en\nhola,oos,es\n", encoding="utf-8")
    d = load_labelled(p)
    assert d.texts == ["hi", "hola"] and d.labels == ["greet", None] and d.langs == ["en", "es"]
    p.write_text("text,label,language\nhi,greet,en\n", encoding="utf-8")
    assert load_labelled(p).langs is None
    assert load_labelled(p, lang_column="language").langs == ["en"]


def test_clinc150_has_no_langs(tmp_path):
    p = tmp_path / "data_full.json"
    p.write_text(json.dumps({"test": [["find flights", "book_flight"]], "oos_test": [["sing", "oos"]]}),
                 encoding="utf-8")
    assert load_labelled(p, split="test").langs is None


def test_bad_lang_names_the_line(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text('{"text": "hi", "label": "a", "lang": "en"}\n{"text": "yo", "label": "a", "lang": 5}\n',
                 encoding="utf-8")
    with pytest.raises(DatasetError, match=r"d\.jsonl: line 2: lang must be a string, got int 5"):
        load_labelled(p)
    p.write_text('{"text": "hi", "label": "a", "lang": "en"}\n\n{"text": "yo", "label": "a", "lang": "  "}\n',
                 encoding="utf-8")
    with pytest.raises(DatasetError, match=r"d\.jsonl: line 3: empty lang"):
        load_labelled(p)
    p.write_text('{"text": "hi", "label": "a", "lang": ["en"]}\n', encoding="utf-8")
    with pytest.raises(DatasetError, match=r"line 1: lang must be a string, got list"):
        load_labelled(p)
    c = tmp_path / "d.csv"
    c.write_text("text,label,lang\nhi,a,en\nyo,a,\n", encoding="utf-8")
    with pytest.raises(DatasetError, match=r"d\.csv: line 3 \(row 2\): empty lang"):
        load_labelled(c)
    c.write_text("text,lang,label\nhi,en,a\nyo,es\n", encoding="utf-8")
    with pytest.raises(DatasetError, match=r"line 3 \(row 2\): has 2 field\(s\), expected 3"):
        load_labelled(c)


def test_the_heldout_sets_carry_their_language():
    en = load_labelled(DATA / "heldout_queries.jsonl")
    es = load_labelled(DATA / "heldout_queries_es.jsonl")
    assert len(en) == 65 and en.langs == ["en"] * 65
    assert len(es) == 75 and es.langs == ["es"] * 75


# ------------------------------------------------------------------ metrics
def test_language_slices_by_hand():
    true = ["a", "a", None, "b", "b", "a", None, "b"]
    pred = ["a", None, None, "b", "a", "a", "b", "b"]
    langs = ["en", "en", "en", "es", "es", "es", "es", None]
    s = language_slices(true, pred, langs)
    assert list(s) == ["en", "es", "unknown"]
    assert s["en"] == {"n": 3, "n_in_scope": 2, "n_out_of_scope": 1, "accuracy": pytest.approx(2 / 3, abs=1e-6),
                       "in_scope_accuracy": 0.5, "oos_recall": 1.0, "oos_precision": 0.5,
                       "macro_f1": pytest.approx(2 / 3, abs=1e-6)}
    assert s["es"]["n"] == 4 and s["es"]["accuracy"] == 0.5
    assert s["es"]["in_scope_accuracy"] == pytest.approx(2 / 3, abs=1e-6) and s["es"]["oos_recall"] == 0.0
    assert s["unknown"] == {"n": 1, "n_in_scope": 1, "n_out_of_scope": 0, "accuracy": 1.0, "in_scope_accuracy": 1.0,
                            "oos_recall": None, "oos_precision": None, "macro_f1": 1.0}
    assert language_slices(true, pred, None) == {} == language_slices(true, pred, [None] * 8)
    with pytest.raises(ValueError, match="languages"):
        language_slices(true, pred, ["en"])


# ------------------------------------------------------------------ evaluate
def test_evaluate_reports_accuracy_per_language(intent_set, fake):
    # Rules decide the queries they match; a cutoff of 0 rejects every other one as out of scope.
    rules = (Rule(id="w", intent="weather", patterns=("rain", "lluvia")),
             Rule(id="m", intent="music", patterns=("guitarra",)))
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


# ------------------------------------------------------------------ CLI
def test_cli_eval_json_shows_both_language_slices(tmp_path, monkeypatch, capsys):
    import flywheel.classifier.encoders
    import flywheel.classifier.layer2.fitter
    from flywheel.cli import main

    fake = HashEmbedder()
    monkeypatch.setattr(flywheel.classifier.layer2.fitter, "make_embedder", lambda *a, **k: fake)
    monkeypatch.setattr(flywheel.classifier.encoders, "make_embedder", lambda *a, **k: fake)
    train = [{"text": t, "label": name} for name, words in TOPICS.items() for t in topic_examples(words)]
    train += [{"text": t, "label": "oos"} for t in topic_examples(OOS_WORDS)]
    _write_jsonl(tmp_path / "train.jsonl", train)
    w, m, b = (topic_examples(words) for words in TOPICS.values())
    test = [{"text": w[0], "label": "weather", "lang": "en"}, {"text": m[0], "label": "music", "lang": "en"},
            {"text": b[0], "label": "banking", "lang": "en"}, {"text": w[1], "label": "weather", "lang": "en"},
            {"text": w[2], "label": "weather", "lang": "es"}, {"text": m[1], "label": "music", "lang": "es"},
            {"text": b[1], "label": "music", "lang": "es"}]  # mislabelled: the model says banking
    _write_jsonl(tmp_path / "test.jsonl", test)
    rc = main(["eval", "--train", str(tmp_path / "train.jsonl"), "--test", str(tmp_path / "test.jsonl"),
               "--json", "--quiet", "--latency-sample", "0"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    report = json.loads(out)
    by = report["by_language"]
    assert list(by) == ["en", "es"]
    assert (by["en"]["n"], by["en"]["accuracy"], by["en"]["in_scope_accuracy"]) == (4, 1.0, 1.0)
    assert (by["es"]["n"], by["es"]["accuracy"]) == (3, pytest.approx(2 / 3, abs=1e-6))
    assert by["en"]["oos_recall"] is None and by["es"]["oos_recall"] is None
    assert report["n"] == 7 and report["accuracy"] == pytest.approx(6 / 7, abs=1e-6)
