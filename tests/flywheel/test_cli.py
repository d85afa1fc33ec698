"""The CLI end to end in a temporary home (real MiniLM; the starter model is trained once)."""

import json

import pytest

from flywheel.classifier.decision import PUBLIC_FIELDS
from flywheel.cli import main
from tests.support.paths import DATA, ROOT

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    return tmp_path_factory.mktemp("cli-home")


def run(capsys, *args):
    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


def test_classify_prints_one_json_decision_per_line_and_logs(capsys, home, monkeypatch):
    monkeypatch.setenv("FLYWHEEL_HOME", str(home))
    rc, out, err = run(capsys, "classify", "What is addVar in AVAP?", "usage percentage of 20%",
                       "What's the weather in Madrid tomorrow?")
    assert rc == 0, err
    lines = [json.loads(x) for x in out.splitlines()]
    assert [tuple(d) for d in lines] == [PUBLIC_FIELDS] * 3 and lines[0]["degraded"] is None
    assert lines[0]["label"] == "RETRIEVAL" and lines[0]["layer"] == "embedding"
    assert lines[0]["metadata"] == {"rag": "true", "model_slot": "retrieval"}      # the starter routes
    assert lines[1]["metadata"]["rag"] == "false" and lines[2]["metadata"] == {}
    assert lines[1]["layer"] == "rules" and lines[1]["reason"] == "rule usage-figures"
    assert lines[2]["label"] is None and lines[2]["tier"] == "no_match"
    rc, out, err = run(capsys, "feedback", lines[0]["id"], "CODE_GENERATION")
    assert rc == 0 and "recorded CODE_GENERATION" in out
    rc, out, err = run(capsys, "stats", "--json")
    assert rc == 0 and json.loads(out)["total"] == 3


def test_declared_type_and_bad_input_exit_codes(capsys, home, monkeypatch):
    monkeypatch.setenv("FLYWHEEL_HOME", str(home))
    rc, out, _ = run(capsys, "classify", "--no-log", "--declared-type", "PLATFORM", "anything")
    assert rc == 0 and json.loads(out)["layer"] == "declared"
    rc, _, err = run(capsys, "classify", "--no-log", "--declared-type", "BILLING", "anything")
    assert rc == 2 and "unknown declared type 'BILLING'" in err
    rc, _, err = run(capsys, "classify", "--no-log", "   ")
    assert rc == 2 and err.startswith("flywheel: error: text is empty")
    rc, _, err = run(capsys, "classify", "--no-log", "--history", "{bad", "x")
    assert rc == 2 and "--history is not valid JSON" in err
    rc, _, err = run(capsys, "feedback", "no-such-id", "RETRIEVAL")
    assert rc == 2 and "unknown decision id" in err
    rc, _, err = run(capsys, "eval")
    assert rc == 2 and "Missing option '--test'" in err
    rc, _, err = run(capsys, "models", "promote", "nope")
    assert rc == 3 and "no version 'nope'" in err
    assert "Traceback" not in err


def test_ollama_down_degrades_and_says_so(capsys, home, monkeypatch, tmp_path):
    import yaml

    from flywheel.classifier.settings.config import starter_intents_path

    doc = yaml.safe_load(starter_intents_path().read_text())
    doc["thresholds"].update({"confident": 1.0, "ambiguous_ratio": 0.0})  # layer 2 is never sure
    intents = tmp_path / "unsure.yaml"
    intents.write_text(yaml.safe_dump(doc))
    monkeypatch.setenv("FLYWHEEL_HOME", str(home))
    rc, out, err = run(capsys, "classify", "--no-log", "--intents", str(intents), "What is addVar in AVAP?")
    assert rc == 0, err
    d = json.loads(out)
    assert d["layer"] == "embedding" and d["tier"] == "weak" and d["label"] == "RETRIEVAL"
    assert "llm unavailable: connection refused" in d["reason"] and "unavailable: unavailable" not in d["reason"]


def test_train_promote_is_served_by_classify(capsys, tmp_path, monkeypatch):
    from flywheel.classifier.versions.registry import ModelRegistry

    home = tmp_path / "fresh-home"                        # nothing promoted, no cached starter model
    monkeypatch.setenv("FLYWHEEL_HOME", str(home))
    monkeypatch.setenv("FLYWHEEL_TEACHER", "off")
    rc, out, err = run(capsys, "train", "--intents", str(ROOT / "data" / "starter_intents.yaml"), "--promote",
                       "--quiet")
    assert rc == 0, err
    reg = ModelRegistry(home / "models")
    name = reg.current_name()
    assert name is not None and [v.name for v in reg.versions()] == [name]   # a version inside the home
    assert f"saved {name} to {home / 'models' / name}" in out and f"promoted {name} in {home / 'models'}" in out
    rc, out, err = run(capsys, "classify", "--no-log", "What is addVar in AVAP?")
    assert rc == 0, err
    assert json.loads(out.splitlines()[0])["model_version"] == name


def test_train_and_eval_say_what_the_cutoffs_buy(capsys, home, monkeypatch, tmp_path):
    monkeypatch.setenv("FLYWHEEL_HOME", str(home))
    rc, out, err = run(capsys, "train", "--intents", str(ROOT / "data" / "starter_intents.yaml"),
                       "--out", str(tmp_path / "m"))
    assert rc == 0, err
    assert "prediction sets:" in out and "(nominal 95%)" in out and "deferral model ECE" in out
    assert "held-out answers at or above it; by intent" in out
    rc, out, err = run(capsys, "eval", "--model", str(tmp_path / "m"), "--test", str(DATA / "heldout_queries.jsonl"),
                       "--json", "--quiet", "--latency-sample", "0")
    assert rc == 0, err
    rep = json.loads(out)
    assert 0.0 <= rep["set_coverage"] <= 1.0 and rep["mean_set_size"] > 0 and rep["nominal_coverage"] == 0.95
    assert rep["deferral"] == "tiers" and set(rep["cutoff_precision"]) <= {"RETRIEVAL", "CODE_GENERATION",
                                                                         "CONVERSATIONAL", "PLATFORM", "OUT_OF_SCOPE"}
    assert all(0.0 <= v["precision"] <= 1.0 and v["n"] > 0 for v in rep["cutoff_precision"].values())
