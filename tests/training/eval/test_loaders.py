"""The labelled-data loaders of ``flywheel eval`` (:mod:`training.eval.loaders`): the three
formats, their errors naming the file and line, the out-of-scope spellings, each row's
``lang``, the rows a model does not know, and an intent set made from labelled rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flywheel.classifier.errors import FlywheelError
from flywheel.classifier.layer2.fitter import fit_model
from flywheel.classifier.settings.intents import Intent, IntentSet, Rule, TeacherSettings, ThresholdSettings
from flywheel.training.eval.loaders import (
    DatasetError,
    LabelledData,
    drop_unknown_labels,
    intent_set_from_data,
    load_labelled,
)
from tests.support.fakes import HashEmbedder
from tests.support.paths import DATA


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def fake() -> HashEmbedder:
    return HashEmbedder(64, "test:hash-64", bag_of_words=True)


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


def test_load_reads_every_out_of_scope_spelling(tmp_path):
    p = tmp_path / "d.jsonl"
    rows = [{"text": t, "label": lab} for t, lab in
            [("a", "OUT_OF_SCOPE"), ("b", "OOS"), ("c", "NONE"), ("d", "out_of_scope"), ("e", " none "),
             ("f", "oos"), ("g", "greet"), ("h", "Other")]]
    p.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    assert load_labelled(p).labels == [None] * 6 + ["greet", "Other"]
    assert load_labelled(p, oos_label="other").labels == [None] * 6 + ["greet", None]   # --oos-label, any case


def test_drop_unknown_labels_counts_and_keeps_languages():
    data = LabelledData(["a", "b", "c", "d", "e"], ["x", "dance", None, "dance", "tap"], source="t.jsonl",
                        langs=["en", "es", None, "en", "fr"])
    kept, skipped = drop_unknown_labels(data, ["x"])
    assert skipped == {"dance": 2, "tap": 1} and list(skipped) == ["dance", "tap"]
    assert (kept.texts, kept.labels, kept.langs, kept.source) == (["a", "c"], ["x", None], ["en", None], "t.jsonl")
    assert drop_unknown_labels(kept, ["x"]) == (kept, {})


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


@pytest.mark.parametrize("sep", [";", "\t"])
def test_a_semicolon_or_tab_separated_csv_is_read_as_such(tmp_path, sep):
    """German Excel saves CSV with semicolons: the header shows it, and the file reads the same
    as its comma-separated twin (a comma inside a text stays text) (issue 44)."""
    rows = [("text", "label", "lang"), ("hola, ¿qué tal?", "greet", "es"), ("bye; for now", "bye", "en")]
    p = tmp_path / "d.csv"
    p.write_text("\n".join(sep.join(f'"{c}"' if sep in c else c for c in r) for r in rows) + "\n", encoding="utf-8")
    d = load_labelled(p)
    assert d.texts == ["hola, ¿qué tal?", "bye; for now"] and d.labels == ["greet", "bye"] and d.langs == ["es", "en"]


def test_a_csv_without_the_columns_says_how_it_was_split(tmp_path):
    p = tmp_path / "d.csv"
    p.write_text("texto;etiqueta\nhola;greet\n", encoding="utf-8")
    with pytest.raises(DatasetError, match=r"missing column 'text' \(columns: 'texto', 'etiqueta'; read as "
                                           r"semicolon-separated\)"):
        load_labelled(p)
    p.write_text("text,label,note;x;y\nhi,greet,z\n", encoding="utf-8")  # the header names the columns split on commas
    assert load_labelled(p).labels == ["greet"]
