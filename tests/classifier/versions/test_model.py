import json

import pytest

from flywheel.classifier.errors import ModelError
from flywheel.classifier.layer2.fitter import fit_model
from flywheel.classifier.settings.intents import parse_intents
from flywheel.classifier.versions.model import IntentModel
from tests.support.docs import DOC
from tests.support.fakes import HashEmbedder


@pytest.fixture()
def model():
    return fit_model(parse_intents(DOC), embedder=HashEmbedder())


def test_save_load_roundtrip(tmp_path, model):
    d = model.save(tmp_path / "v1")
    manifest = json.loads((d / "manifest.json").read_text())
    for key in ("format_version", "labels", "encoder", "thresholds", "libraries", "training_size",
                "metrics", "created_at", "head_sha256"):
        assert key in manifest
    assert manifest["encoder"] == {"backend": "minilm", "model": None, "id": "fake:hash-256", "dim": 256}
    loaded = IntentModel.load(d, expected_encoder_id="fake:hash-256")
    assert loaded.version == model.version
    assert loaded.intents.rules[0].id == "quota-rule"
    assert list(loaded.head.classes_) == ["PLATFORM", "RETRIEVAL"]


def test_refuses_overwrite(tmp_path, model):
    model.save(tmp_path / "v1")
    with pytest.raises(ModelError, match="non-empty"):
        model.save(tmp_path / "v1")


def test_corrupt_head_is_refused(tmp_path, model):
    d = model.save(tmp_path / "v1")
    with (d / "head.joblib").open("r+b") as f:
        f.seek(100)
        f.write(b"garbage")
    with pytest.raises(ModelError, match="checksum"):
        IntentModel.load(d)


def test_mismatched_manifest_is_refused(tmp_path, model):
    d = model.save(tmp_path / "v1")
    m = json.loads((d / "manifest.json").read_text())
    m["labels"] = ["PLATFORM", "RETRIEVAL", "EXTRA"]
    (d / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ModelError, match="do not match"):
        IntentModel.load(d)
    m["labels"] = ["PLATFORM", "RETRIEVAL"]
    m["encoder"]["dim"] = 384
    (d / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ModelError, match="256-d"):
        IntentModel.load(d)


def test_wrong_encoder_and_missing_files(tmp_path, model):
    d = model.save(tmp_path / "v1")
    with pytest.raises(ModelError, match="trained with encoder"):
        IntentModel.load(d, expected_encoder_id="minilm:all-MiniLM-L6-v2")
    with pytest.raises(ModelError, match="not a model version"):
        IntentModel.load(tmp_path)
    (d / "manifest.json").write_text("{not json")
    with pytest.raises(ModelError, match="corrupt manifest"):
        IntentModel.load(d)


@pytest.mark.parametrize("edit, expected", [
    (lambda m: m.pop("labels"), "missing key 'labels'"),
    (lambda m: [m.pop("labels"), m.pop("encoder")], "missing keys 'labels', 'encoder'"),
    (lambda m: m.update(labels="A,B"), "'labels' should be a list, found str"),
    (lambda m: m["encoder"].pop("dim"), "'encoder' is missing 'dim'"),
    (lambda m: m.update(training_size=True), "'training_size' should be an integer"),
])
def test_corrupt_manifest_names_what_is_wrong(tmp_path, model, edit, expected):
    d = model.save(tmp_path / "v1")
    doc = json.loads((d / "manifest.json").read_text())
    edit(doc)
    (d / "manifest.json").write_text(json.dumps(doc))
    with pytest.raises(ModelError) as info:
        IntentModel.load(d)
    assert "corrupt manifest" in str(info.value) and expected in str(info.value)
    assert "__init__" not in str(info.value) and "positional" not in str(info.value)


def test_manifest_records_every_file_and_a_corrupt_intent_file_is_refused(tmp_path, model):
    from flywheel.classifier.versions.model import Manifest, file_sha256

    d = model.save(tmp_path / "v1")
    doc = json.loads((d / "manifest.json").read_text())
    files = Manifest.from_dict(doc).files()
    assert set(files) == {"head.joblib", "head.npz", "intents.yaml"}
    assert all(files[f] == file_sha256(d / f) for f in files)
    assert doc["intents_sha256"] == files["intents.yaml"]
    intents = d / "intents.yaml"
    original = intents.read_text()
    intents.write_text(original.replace("what is addvar", "what is addvar, tampered"))
    with pytest.raises(ModelError, match="intents.yaml: checksum does not match") as info:
        IntentModel.load(d)
    assert str(intents) in str(info.value)
    intents.unlink()
    with pytest.raises(ModelError, match="intents.yaml is missing"):
        IntentModel.load(d)
    intents.write_text(original)
    assert IntentModel.load(d).version == model.version


def test_a_manifest_without_the_intents_checksum_still_loads(tmp_path, model):
    from flywheel.classifier.versions.model import Manifest

    d = model.save(tmp_path / "v1")
    doc = json.loads((d / "manifest.json").read_text())
    del doc["intents_sha256"]
    (d / "manifest.json").write_text(json.dumps(doc))
    assert set(Manifest.from_dict(doc).files()) == {"head.joblib", "head.npz"}
    # saved before the checksum existed: the intent file is parsed, not checked
    (d / "intents.yaml").write_text((d / "intents.yaml").read_text() + "\n# a comment\n")
    assert IntentModel.load(d).intents.labels == model.intents.labels
    doc["intents_sha256"] = 42
    (d / "manifest.json").write_text(json.dumps(doc))
    with pytest.raises(ModelError, match="'intents_sha256' should be a string"):
        IntentModel.load(d)


def test_a_head_pickled_before_layer2_moved_into_its_wing_still_loads(tmp_path, model):
    """head.joblib names its classes' modules: a version saved while the head lived at
    ``flywheel.classifier.head`` (before the ``layer2`` wing) loads as the new class."""
    import hashlib
    import sys

    import joblib

    from flywheel.classifier.layer2 import head as head_mod

    d = model.save(tmp_path / "v1")
    cls = type(model.head)
    old = "flywheel.classifier.head"
    assert old not in sys.modules
    sys.modules[old] = head_mod
    cls.__module__ = old   # pickle the way the old layout did
    try:
        joblib.dump(model.head, d / "head.joblib")
    finally:
        cls.__module__ = head_mod.__name__
        del sys.modules[old]
    assert old.encode() in (d / "head.joblib").read_bytes()
    manifest = json.loads((d / "manifest.json").read_text())
    manifest["head_sha256"] = hashlib.sha256((d / "head.joblib").read_bytes()).hexdigest()
    (d / "manifest.json").write_text(json.dumps(manifest))
    loaded = IntentModel.load(d, estimator=True)
    assert type(loaded.head) is cls and list(loaded.head.classes_) == ["PLATFORM", "RETRIEVAL"]
    assert old not in sys.modules   # the alias lived for the one load
