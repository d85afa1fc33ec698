"""Issue 33: a Classifier is built with the models home it follows (``follow``), so no
watcher is set after construction; the served model is resolved once
(:func:`classifier.versions.default.served_model`) for ``classifier.assembly.build_classifier`` and the serving runtime,
and a fleet replica's default-model install is that function's, not the site's."""

from __future__ import annotations

import threading

import yaml

from flywheel.classifier.assembly import build_classifier
from flywheel.classifier.layer2.fitter import fit_model
from flywheel.classifier.pipeline import Classifier
from flywheel.classifier.settings.config import load_config
from flywheel.classifier.settings.intents import parse_intents
from flywheel.classifier.versions.default import cached_model_dir, served_model
from flywheel.classifier.versions.registry import CURRENT, ModelRegistry
from tests.support.docs import DOC
from tests.support.fakes import HashEmbedder


def _save(reg: ModelRegistry, name: str, *, corrupt: bool = False) -> None:
    fit_model(parse_intents(DOC), embedder=HashEmbedder(), version=name).save(reg.version_dir(name))
    if corrupt:
        (reg.version_dir(name) / "head.joblib").write_bytes(b"corrupt")


def _home(tmp_path) -> ModelRegistry:
    reg = ModelRegistry(tmp_path / "models")
    _save(reg, "v1")
    reg.promote("v1")
    return reg


def test_a_classifier_is_built_with_the_home_it_follows(tmp_path):
    reg = _home(tmp_path)
    clf = Classifier(reg.load_current(), embedder=HashEmbedder(), teacher=None, follow=reg, follow_interval_s=0.0)
    assert not hasattr(Classifier, "watch")                     # nothing sets a watcher afterwards
    assert clf.watcher is not None and clf.watcher.registry is reg and clf.watcher.serving == "v1"
    _save(reg, "v2")
    reg.promote("v2")
    assert clf.classify("show my invoices").model_version == "v2"    # hot reload swaps the model
    _save(reg, "v3", corrupt=True)
    (reg.home / CURRENT).write_text("v3\n")                          # promoted behind the registry's back
    assert clf.classify("show my invoices").model_version == "v2"    # a failed load keeps the old one
    assert "v3" in clf.watcher.refused
    clf.close()
    assert Classifier(reg.load("v2"), embedder=HashEmbedder(), teacher=None).watcher is None


def test_build_classifier_follows_the_models_home_on_its_own_thread(tmp_path):
    reg = _home(tmp_path)
    cfg = load_config(home=tmp_path, model=str(reg.home), teacher="off")
    clf = build_classifier(cfg, progress=False, background_reload=True, embedder=HashEmbedder())
    try:
        assert clf.watcher is not None and clf.watcher.running and clf.watcher.registry.home == reg.home
        _save(reg, "v2")
        reg.promote("v2")
        for _ in range(1000):   # bounded wait: the watcher's thread swaps it, no request polls
            if clf.model_version == "v2":
                break
            threading.Event().wait(0.01)
        assert clf.model_version == "v2"
    finally:
        clf.close()
    version_dir = build_classifier(load_config(home=tmp_path, model=str(reg.version_dir("v1")), teacher="off"),
                                   progress=False, embedder=HashEmbedder())
    assert version_dir.watcher is None and version_dir.model_version == "v1"   # nothing to follow


def test_served_model_installs_the_default_into_the_home_only_when_asked(tmp_path, monkeypatch):
    """A fleet replica whose fleet promoted nothing yet serves the default model from its
    models home (published and promoted there once), so its watcher follows the fleet's
    first promotion; a single machine serves the cached default as it is, following the
    models home for its first promotion (issue 41)."""
    intents = tmp_path / "intents.yaml"
    intents.write_text(yaml.safe_dump(DOC))
    monkeypatch.setenv("FLYWHEEL_INTENTS", str(intents))
    cfg = load_config(home=tmp_path / "home")
    cached = cached_model_dir(cfg, intents)
    fit_model(parse_intents(DOC), embedder=HashEmbedder(), version=cached.name).save(cached)

    model, home = served_model(cfg, progress=False)[:2]   # followed, so the first promotion is swapped in
    assert home is not None and home.home == cfg.models_dir and home.current_name() is None
    assert model.version == cached.name and not (cfg.models_dir / CURRENT).exists()
    model, home = served_model(cfg, progress=False, into_home=True)[:2]
    assert home is not None and home.home == cfg.models_dir and home.current_name() == model.version
    assert home.history() == [model.version]
    again, home = served_model(cfg, progress=False, into_home=True)[:2]   # installed once
    assert home is not None and again.version == model.version and home.history() == [model.version]
    other = fit_model(parse_intents(DOC), embedder=HashEmbedder(), version="given")
    other.save(tmp_path / "given")
    given = load_config(home=tmp_path / "other-home", model=str(tmp_path / "given"))
    model, home = served_model(given, progress=False, into_home=True)[:2]    # a configured model: as it is
    assert home is None and model.version == "given" and not (given.models_dir / CURRENT).exists()
