"""``flywheel train --tune-encoder`` (issue 22): the version carries its tuned encoder, every
file hashed; ``flywheel classify --model`` serves it; a tampered encoder file is refused
with one clear line. The base encoder is a tiny random BERT (tests/support/tiny_encoder.py),
so nothing is downloaded; tuning and the ONNX export take seconds, hence ``slow``."""

from __future__ import annotations

import json

import pytest
import yaml

from flywheel.cli import main
from flywheel.training.tuner import finetune
from tests.support.docs import DOC
from tests.support.tiny_encoder import build_tiny_bert
from tests.support.version_encoders import DOC_TEXTS, flip_byte

pytestmark = pytest.mark.slow


@pytest.fixture
def tiny_base(tmp_path, monkeypatch):
    base = build_tiny_bert(tmp_path / "tiny-bert", extra_texts=DOC_TEXTS)
    monkeypatch.setattr(finetune, "tunable_base", lambda settings: base)
    return base


def _doc_file(tmp_path, tune=None):
    doc = json.loads(json.dumps(DOC))
    if tune is not None:
        doc.setdefault("embedder", {})["tune"] = tune
    path = tmp_path / "intents.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _run(capsys, *args):
    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


def test_train_tune_encoder_writes_a_version_with_its_encoder_and_classify_serves_it(
        tiny_base, tmp_path, capsys, monkeypatch):
    intents = _doc_file(tmp_path)
    out = tmp_path / "v-tuned"
    rc, _, err = _run(capsys, "train", "--intents", str(intents), "--out", str(out), "--tune-encoder",
                      "--tune-budget", "30", "--json")
    assert rc == 0, err
    assert "encoder tuned" in err and "exported as tuned:" in err
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["encoder"]["id"].startswith("tuned:")
    files = manifest["encoder_files"]
    assert files and all(name.startswith("encoder/") for name in files)
    assert {p.relative_to(out).as_posix() for p in (out / "encoder").iterdir()} == set(files)
    assert manifest["metrics"]["encoder_tuning"]["steps"] > 0

    monkeypatch.setenv("FLYWHEEL_TEACHER", "off")
    rc, stdout, err = _run(capsys, "classify", "--model", str(out), "--no-log", DOC_TEXTS[0])
    assert rc == 0, err
    decision = json.loads(stdout.strip().splitlines()[-1])
    assert decision["model_version"] == "v-tuned"

    served = next(n for n in files if n.endswith(".onnx"))
    flip_byte(out / served)
    rc, _, err = _run(capsys, "classify", "--model", str(out), "--no-log", DOC_TEXTS[0])
    assert rc == 3
    assert err.startswith("flywheel: error: ") and err.count("\n") == 1, err
    assert "checksum does not match" in err and served.split("/")[-1] in err


def test_the_intent_file_turns_tuning_on_and_the_flag_turns_it_off(tiny_base, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("FLYWHEEL_TUNE_ENCODER")   # tests/conftest.py turns the default off, over the file's tune
    intents = _doc_file(tmp_path, tune={"budget_s": 20, "epochs": 1})
    rc, _, err = _run(capsys, "train", "--intents", str(intents), "--out", str(tmp_path / "a"), "--quiet")
    assert rc == 0, err
    assert (tmp_path / "a" / "encoder").is_dir()
    rc, _, err = _run(capsys, "train", "--intents", str(intents), "--out", str(tmp_path / "b"), "--quiet",
                      "--no-tune-encoder")
    assert rc == 0, err
    assert not (tmp_path / "b" / "encoder").exists()
    assert "encoder_files" not in json.loads((tmp_path / "b" / "manifest.json").read_text())


def test_an_encoder_that_cannot_be_tuned_is_one_line_and_exit_2(tmp_path, capsys):
    doc = json.loads(json.dumps(DOC))
    doc["languages"] = ["en", "es"]          # the multilingual default (USE) runs in numpy
    path = tmp_path / "intents.yaml"
    path.write_text(yaml.safe_dump(doc))
    rc, _, err = _run(capsys, "train", "--intents", str(path), "--out", str(tmp_path / "v"), "--tune-encoder")
    assert rc == 2
    assert err.startswith("flywheel: error: ") and err.count("\n") == 1, err
    assert "cannot be fine-tuned" in err
    assert not (tmp_path / "v").exists()


def test_the_multilingual_default_gets_an_adapter_served_and_checked(tmp_path, capsys, monkeypatch):
    """``objective: adapter`` on the numpy USE default: the version carries ``encoder/adapter.npz``,
    hashed; classify serves it over USE; a tampered adapter is one clear line."""
    doc = json.loads(json.dumps(DOC))
    doc["languages"] = ["en", "es"]
    doc.setdefault("embedder", {})["tune"] = {"objective": "adapter", "epochs": 1, "holdout": 0}
    path = tmp_path / "intents.yaml"
    path.write_text(yaml.safe_dump(doc))
    out = tmp_path / "v-adapted"
    rc, _, err = _run(capsys, "train", "--intents", str(path), "--out", str(out), "--tune-encoder")
    assert rc == 0, err
    assert "encoder tuned (adapter" in err
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["encoder"]["id"].startswith("adapted:")
    assert set(manifest["encoder_files"]) == {"encoder/adapter.npz", "encoder/manifest.json"}
    assert manifest["metrics"]["encoder_tuning"]["base_encoder"] == "use-multilingual:v3"

    monkeypatch.setenv("FLYWHEEL_TEACHER", "off")
    rc, stdout, err = _run(capsys, "classify", "--model", str(out), "--no-log", "¿Cómo cambio mi contraseña?")
    assert rc == 0, err
    assert json.loads(stdout.strip().splitlines()[-1])["model_version"] == "v-adapted"

    flip_byte(out / "encoder" / "adapter.npz", offset=-20)
    rc, _, err = _run(capsys, "classify", "--model", str(out), "--no-log", "hello")
    assert rc == 3
    assert err.startswith("flywheel: error: ") and err.count("\n") == 1, err
    assert "checksum does not match" in err and "adapter.npz" in err
