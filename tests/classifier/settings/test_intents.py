import subprocess
import sys
import textwrap

import pytest

from flywheel.classifier.errors import IntentFileError
from flywheel.classifier.settings.config import starter_intents_path
from flywheel.classifier.settings.intents import load_intents, parse_intents

BASE = {
    "intents": [
        {"name": "A", "description": "a things", "examples": ["alpha one", "alpha two"]},
        {"name": "B", "examples": ["beta one", "beta two"]},
    ],
}


def doc(**over):
    d = {k: v for k, v in BASE.items()}
    d.update(over)
    return d


def test_starter_intents_are_valid_and_large_enough():
    s = load_intents(starter_intents_path())
    assert set(s.labels) == {"RETRIEVAL", "CODE_GENERATION", "CONVERSATIONAL", "PLATFORM"}
    assert all(len(i.examples) >= 30 for i in s.intents)
    assert len(s.oos_examples) >= 30
    assert {r.id for r in s.rules} >= {"platform-injected-prefix", "usage-figures"}


def test_toml_file_is_read(tmp_path):
    p = tmp_path / "set.toml"
    p.write_text(textwrap.dedent("""
        [[intents]]
        name = "A"
        examples = ["x one", "x two"]
        [[intents]]
        name = "B"
        examples = ["y one", "y two"]
        [thresholds]
        confident = 0.0
    """))
    s = load_intents(p)
    assert s.labels == ("A", "B")
    assert s.thresholds.confident == 0.0  # 0.0 is a threshold, not "unset"


@pytest.mark.parametrize("bad, intent, words", [
    (doc(intents=[{"name": "A", "examples": ["x"]}, {"name": "A", "examples": ["y"]}]), "A", "duplicate intent"),
    (doc(intents=[{"name": "A", "examples": []}, {"name": "B", "examples": ["y"]}]), "A", "no examples"),
    (doc(intents=[{"name": "A", "examples": ["x"], "colour": "red"}]), "A", "unknown key 'colour'"),
    (doc(rules=[{"id": "r", "intent": "ZZZ", "contains": "x"}]), "ZZZ", "unknown intent"),
    (doc(rules=[{"id": "r", "intent": "A", "regex": "(unclosed"}]), "A", "invalid regex"),
    (doc(rules=[{"id": "r", "intent": "A", "contains": "x", "regex": "y"}]), "A", "exactly one of"),
    (doc(thresholds={"confident": 1.5}), None, "between 0.0 and 1.0"),
    (doc(thresholds={"per_intent": {"NOPE": 0.5}}), None, "unknown intent 'NOPE'"),
    (doc(embedder={"backend": "word2vec"}), None, "embedder.backend"),
    (doc(surprise=1), None, "unknown key 'surprise'"),
    # issue 32: out of scope is not an intent, and intents differing only in case are one too many
    *[(doc(intents=[*BASE["intents"], {"name": n, "examples": ["x"]}]), n, "means out of scope")
      for n in ("OUT_OF_SCOPE", "out_of_scope", "Oos", "none")],
    (doc(intents=[{"name": "book", "examples": ["x"]}, {"name": "Book", "examples": ["y"]}]), "Book",
     "intents 'book' and 'Book' differ only in case"),
    (doc(intents=[{"name": "A", "examples": ["x", "y"]}], out_of_scope={"synthetic": 0}), "A",
     "a single intent is trained against out of scope, and this file gives none"),
    (doc(rules=[{"id": "r", "intent": "a", "contains": "x"}]), "a", "unknown intent (did you mean A?)"),
    (doc(thresholds={"per_intent": {"b": 0.5}}), None, "unknown intent 'b' (did you mean B?)"),
])
def test_bad_files_name_file_intent_and_problem(bad, intent, words):
    with pytest.raises(IntentFileError) as ei:
        parse_intents(bad, source="set.yaml")
    msg = str(ei.value)
    assert msg.startswith("set.yaml")
    assert words in msg
    assert ei.value.intent == intent


def test_unparsable_yaml_names_the_file(tmp_path):
    p = tmp_path / "broken.yaml"
    p.write_text("intents: [\n  - name: A\n")
    with pytest.raises(IntentFileError, match="broken.yaml"):
        load_intents(p)


def test_a_yaml_syntax_error_is_one_line_naming_file_line_and_column(tmp_path):
    p = tmp_path / "broken.yaml"
    p.write_text("intents:\n  - name: A\n    examples: [a, b\n  - name: B\n")
    with pytest.raises(IntentFileError) as ei:
        load_intents(p)
    msg = str(ei.value)
    assert "\n" not in msg and msg.startswith(f"{p}: not valid"), msg   # PyYAML's own text takes 6 lines
    assert "line 4, column 9" in msg and "expected ',' or ']'" in msg, msg


@pytest.mark.slow   # a flywheel process
def test_cli_exit_code_2_on_bad_file(tmp_path):
    p = tmp_path / "dup.yaml"
    p.write_text("intents:\n  - {name: A, examples: [x]}\n  - {name: A, examples: [y]}\n")
    r = subprocess.run([sys.executable, "-m", "flywheel", "train", "--intents", str(p), "--out",
                        str(tmp_path / "m")], capture_output=True, text=True)
    assert r.returncode == 2, r.stderr
    assert "dup.yaml: intent 'A': duplicate intent" in r.stderr
    assert "Traceback" not in r.stderr


def test_a_single_intent_is_a_valid_file():
    one = parse_intents({"intents": [{"name": "HOURS", "examples": ["when are you open", "opening hours"]}]})
    assert one.labels == ("HOURS",) and one.synthetic_negatives > 0
    assert parse_intents({"intents": [{"name": "HOURS", "examples": ["when are you open", "opening hours"]}],
                          "out_of_scope": {"examples": ["book a table"], "synthetic": 0}}).oos_examples


@pytest.mark.slow   # a flywheel process per file
@pytest.mark.parametrize("names, words", [
    (["book", "Book"], "intent 'Book': intents 'book' and 'Book' differ only in case"),
    (["BOOK", "OUT_OF_SCOPE"], "intent 'OUT_OF_SCOPE': the name 'OUT_OF_SCOPE' means out of scope"),
])
def test_cli_refuses_case_twins_and_out_of_scope_as_an_intent_in_one_line(tmp_path, names, words):
    p = tmp_path / "set.yaml"
    p.write_text("intents:\n" + "".join(f"  - {{name: {n}, examples: [{n} one, {n} two]}}\n" for n in names))
    r = subprocess.run([sys.executable, "-m", "flywheel", "train", "--intents", str(p), "--out",
                        str(tmp_path / "m")], capture_output=True, text=True)
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith(f"flywheel: error: {p}: {words}") and r.stderr.count("\n") == 1, r.stderr


def test_embedder_layers_and_threads_are_validated():
    s = parse_intents(doc(embedder={"layers": [3, 4, 5, 6], "num_threads": 1}))
    assert s.embedder.layers == (3, 4, 5, 6) and s.embedder.num_threads == 1
    with pytest.raises(IntentFileError, match="embedder.layers"):
        parse_intents(doc(embedder={"layers": "all"}))
    with pytest.raises(IntentFileError, match="embedder.num_threads"):
        parse_intents(doc(embedder={"num_threads": 0}))


def _with_thresholds(**th):
    return {"version": 1, "intents": [{"name": n, "description": n, "examples": [f"{n} a", f"{n} b"]}
                                      for n in ("ALPHA", "BETA")], "thresholds": th}


def test_ambiguous_ratio_and_its_old_name(caplog):
    assert parse_intents(_with_thresholds(ambiguous_ratio=0.4)).thresholds.ambiguous_ratio == 0.4
    with caplog.at_level("WARNING", logger="flywheel.intents"):
        old = parse_intents(_with_thresholds(ambiguous_margin=0.3), source="old.yaml")
    assert old.thresholds.ambiguous_ratio == 0.3
    assert "old.yaml: thresholds.ambiguous_margin is deprecated; call it ambiguous_ratio" in caplog.text
    with pytest.raises(IntentFileError, match="give ambiguous_ratio only"):
        parse_intents(_with_thresholds(ambiguous_ratio=0.4, ambiguous_margin=0.3))
    with pytest.raises(IntentFileError, match="ambiguous_ratio"):
        parse_intents(_with_thresholds(ambiguous_ratio=2))


# ------------------------------------------------------- embedder.tune: TuneSettings checks itself
@pytest.mark.parametrize("field, bad", [
    ("budget_s", 0), ("budget_s", 8 * 86400), ("budget_s", float("nan")), ("epochs", 0), ("batch_size", 1),
    ("learning_rate", 2.0), ("max_length", 4), ("seed", -1), ("holdout", 0.7), ("objective", "setfit"),
    ("calibration", "both"), ("epochs", True),
])
def test_tune_settings_check_themselves_with_the_intent_files_bounds(field, bad):
    """One check, one message: TuneSettings built in code (the retrain's options, a --tune-*
    flag) refuses what the intent file refuses, and the intent file says it in the same words."""
    from flywheel.classifier.errors import TuneSettingsError
    from flywheel.classifier.settings.intents import TuneSettings

    with pytest.raises(TuneSettingsError) as direct:
        TuneSettings(**{field: bad})
    assert direct.value.field == field and direct.value.exit_code == 2
    with pytest.raises(IntentFileError) as in_file:
        parse_intents(doc(embedder={"tune": {field: bad}}))
    assert str(in_file.value).endswith(f"embedder.{direct.value}")


def test_tune_settings_in_range_are_kept_and_numbers_are_floats():
    from flywheel.classifier.settings.intents import TuneSettings

    t = parse_intents(doc(embedder={"tune": {"budget_s": 60, "holdout": 0, "learning_rate": 1}})).embedder.tune
    assert t == TuneSettings(budget_s=60.0, holdout=0.0, learning_rate=1.0)
    assert isinstance(TuneSettings(budget_s=60).budget_s, float) and TuneSettings(budget_s=0.01).budget_s == 0.01


def test_parse_intents_reads_section_by_section_in_short_steps():
    """parse_intents was 126 lines, the longest function in the project: each section is a step."""
    import ast
    import inspect

    from flywheel.classifier.settings import intents

    tree = ast.parse(inspect.getsource(intents))
    lengths = {f.name: f.end_lineno - f.lineno + 1 for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)}
    assert lengths["parse_intents"] <= 25, lengths["parse_intents"]
    assert max(lengths.values()) <= 45, max(lengths.items(), key=lambda kv: kv[1])
