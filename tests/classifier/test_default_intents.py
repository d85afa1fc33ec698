"""The default classifier's model resolution with an explicit intents setting (issue 26):
the file is always validated, and a model or promoted version that wins must bundle it."""

from __future__ import annotations

import copy

import pytest
import yaml

from flywheel.classifier.config import load_config
from flywheel.classifier.default import default_model_dir
from flywheel.classifier.errors import ConfigError, IntentFileError
from flywheel.classifier.intents import parse_intents
from flywheel.classifier.registry import ModelRegistry
from flywheel.classifier.trainer import fit_model
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
    assert default_model_dir(load_config(intents=str(same)), progress=False) == reg.home
    assert not (_isolated_home / "cache").exists()           # nothing trained


def test_a_version_of_another_intent_set_refuses_the_setting(tmp_path, _isolated_home):
    reg = _promote(_isolated_home)
    edited = copy.deepcopy(DOC)
    edited["intents"][0]["examples"].append("where is the api reference")
    path = _write(tmp_path / "edited.yaml", edited)
    with pytest.raises(ConfigError, match=r"edited.yaml: not served: the models home .* serves v1, trained on "
                                          r"another intent set \(same intents, other examples, rules or settings\)"):
        default_model_dir(load_config(intents=str(path)), progress=False)
    # an explicit model setting that wins is held to the same rule
    with pytest.raises(ConfigError, match=r"edited.yaml: not served: the model setting .* serves v1"):
        default_model_dir(load_config(intents=str(path), model=str(reg.version_dir("v1"))), progress=False)
    assert not (_isolated_home / "cache").exists()


def test_after_a_rollback_the_refusal_names_the_stored_version_of_the_file(tmp_path, _isolated_home):
    """Issue 32 walkthrough: a version trained on exactly the file is in the models home, so
    promoting it serves the file again without training; the refusal names it, on one line."""
    edited = copy.deepcopy(DOC)
    edited["intents"][0]["examples"].append("where is the api reference")
    path = _write(tmp_path / "edited.yaml", edited)
    cfg = load_config(intents=str(path))
    reg = _promote(_isolated_home)
    with pytest.raises(ConfigError) as before:        # no stored version of the file yet: retrain it
        default_model_dir(cfg, progress=False)
    assert "models promote" not in str(before.value)
    fit_model(parse_intents(edited), embedder=HashEmbedder(), version="v2").save(reg.version_dir("v2"))
    reg.promote("v2")
    assert default_model_dir(cfg, progress=False) == reg.home      # served: the file's own version
    assert reg.rollback() == "v1"
    with pytest.raises(ConfigError) as after:
        default_model_dir(cfg, progress=False)
    msg = str(after.value)
    assert "\n" not in msg and "serves v1, trained on another intent set" in msg
    assert "run flywheel models promote v2 to serve v2, already trained on this intent set, or " \
           f"flywheel retrain --intents {path}" in msg, msg
    reg.promote("v2")                                               # as advised: served again, nothing trained
    assert default_model_dir(cfg, progress=False) == reg.home and reg.current_name() == "v2"
    assert not (_isolated_home / "cache").exists()


def test_the_cached_default_model_is_keyed_by_this_distributions_version(tmp_path, monkeypatch):
    """An upgrade of flywheel-intent retrains the cached default model; another package's
    version (the unrelated PyPI ``flywheel``) never keys it."""
    import importlib.metadata

    from flywheel.classifier.config import load_config
    from flywheel.classifier.default import cached_model_dir

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
