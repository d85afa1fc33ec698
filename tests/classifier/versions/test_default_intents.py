"""The default classifier's model resolution with an explicit intents setting (issue 26):
the file is always validated, and a model or promoted version that wins must bundle it."""

from __future__ import annotations

import copy

import pytest
import yaml

from flywheel.classifier.errors import ConfigError, IntentFileError, IntentSetMismatch
from flywheel.classifier.layer2.fitter import fit_model
from flywheel.classifier.settings.config import load_config
from flywheel.classifier.settings.intents import parse_intents
from flywheel.classifier.versions.default import served_model
from flywheel.classifier.versions.registry import ModelRegistry
from tests.support.docs import DOC
from tests.support.fakes import HashEmbedder


def _promote(home, name="v1"):
    reg = ModelRegistry(home / "models")
    fit_model(parse_intents(DOC), embedder=HashEmbedder(), version=name).save(reg.version_dir(name))
    reg.promote(name)
    return reg


def _write(path, doc):
    path.write_text(yaml.safe_dump(doc))
    return path


def test_the_api_raises_the_named_error_for_a_missing_intents_file(monkeypatch, tmp_path, _isolated_home):
    import flywheel.classifier as classifier

    monkeypatch.setenv("FLYWHEEL_INTENTS", str(tmp_path / "missing.yaml"))
    with pytest.raises(IntentFileError, match="missing.yaml: file not found"):
        classifier.classify("show my invoices")
    _promote(_isolated_home)     # a promoted version does not hide it either
    with pytest.raises(IntentFileError, match="missing.yaml: file not found"):
        classifier.classify("show my invoices")


def test_the_promoted_home_serves_an_intents_setting_it_was_trained_on(tmp_path, _isolated_home):
    reg = _promote(_isolated_home)
    same = _write(tmp_path / "same.yaml", DOC)             # another file, the same intent set
    served = served_model(load_config(intents=str(same)), progress=False)
    assert served.home.home == reg.home and served.model.version == "v1" and not served.note
    assert served.served.version == "v1" and served.served.source == "models home"
    assert not (_isolated_home / "cache").exists()           # nothing trained


def test_a_version_of_another_intent_set_refuses_the_setting(tmp_path, _isolated_home):
    reg = _promote(_isolated_home)
    edited = copy.deepcopy(DOC)
    edited["intents"][0]["examples"].append("where is the api reference")
    path = _write(tmp_path / "edited.yaml", edited)
    with pytest.raises(IntentSetMismatch, match=r"edited.yaml: not served: the models home .* serves v1, trained "
                                                r"on another intent set \(same intents, other examples, rules or "
                                                r"settings\), and no stored version was trained on this file"):
        served_model(load_config(intents=str(path)), progress=False)
    # an explicit model setting that wins is held to the same rule
    with pytest.raises(ConfigError, match=r"edited.yaml: not served: the model setting .* serves v1"):
        served_model(load_config(intents=str(path), model=str(reg.version_dir("v1"))), progress=False)
    assert not (_isolated_home / "cache").exists()


def test_a_start_serves_the_stored_version_of_the_file_when_current_is_another_set(tmp_path, _isolated_home):
    """Issue 41: no start exits non-zero while a stored version matches the file: after a
    rollback to another set's version, a start serves the newest stored version of the file
    (not CURRENT), says so, and its watcher refuses CURRENT as long as it is another set."""
    edited = copy.deepcopy(DOC)
    edited["intents"][0]["examples"].append("where is the api reference")
    path = _write(tmp_path / "edited.yaml", edited)
    cfg = load_config(intents=str(path))
    reg = _promote(_isolated_home)
    with pytest.raises(ConfigError) as before:        # no stored version of the file yet: retrain it
        served_model(cfg, progress=False)
    assert "flywheel retrain --intents" in str(before.value) and "--serve-last-good" in str(before.value)
    assert "\n" not in str(before.value)
    fit_model(parse_intents(edited), embedder=HashEmbedder(), version="v2").save(reg.version_dir("v2"))
    reg.promote("v2")
    assert served_model(cfg, progress=False).model.version == "v2"      # served: the file's own version
    assert reg.rollback() == "v1"                                      # a move nobody checked
    served = served_model(cfg, progress=False)
    assert served.model.version == "v2" and reg.current_name() == "v1"
    assert "flywheel models promote v2" in served.note and "serves v1" in served.note
    assert served.served.source == "stored version fitting the intents file"
    from flywheel.classifier.versions.registry import ModelWatcher
    swapped: list = []
    watcher = ModelWatcher(served.home, swapped.append, current="v2")
    assert not watcher.poll(force=True) and not swapped                # CURRENT (v1) refused
    assert "another intent set" in watcher.refused["v1"]
    reg.promote("v2")
    assert served_model(cfg, progress=False).note == ""
    assert not (_isolated_home / "cache").exists()


def test_serve_last_good_serves_current_of_another_set_and_says_so(tmp_path, _isolated_home, caplog):
    _promote(_isolated_home)
    edited = copy.deepcopy(DOC)
    edited["intents"].append({"name": "OPENING_HOURS", "description": "when the shop is open",
                              "examples": ["when do you open", "opening hours on sunday", "are you open now"]})
    path = _write(tmp_path / "edited.yaml", edited)
    served = served_model(load_config(intents=str(path), serve_last_good=True), progress=False)
    assert served.model.version == "v1" and "SERVING ANOTHER INTENT SET" in served.note
    assert "SERVING ANOTHER INTENT SET" in caplog.text


def test_the_cached_default_model_is_keyed_by_this_distributions_version(tmp_path, monkeypatch):
    """An upgrade of flywheel-intent retrains the cached default model; another package's
    version (the unrelated PyPI ``flywheel``) never keys it."""
    import importlib.metadata

    from flywheel.classifier.settings.config import load_config
    from flywheel.classifier.versions.default import cached_model_dir

    path = tmp_path / "intents.yaml"
    path.write_text("intents: []\n")
    cfg = load_config(home=tmp_path / "home")
    asked: list[str] = []

    def fake(name, *, release="1.0"):
        asked.append(name)
        return release

    monkeypatch.setattr(importlib.metadata, "version", lambda name: fake(name))
    before = cached_model_dir(cfg, path)
    monkeypatch.setattr(importlib.metadata, "version", lambda name: fake(name, release="2.0"))
    assert cached_model_dir(cfg, path) != before
    assert set(asked) == {"flywheel-intent"}
