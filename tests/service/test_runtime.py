"""service.runtime.open_runtime: the parts are built first and joined once, in one
Classifier; the runtime is frozen; a part that fails closes what was opened before it; in
fleet mode the sync swaps a promoted version in at once (against the real S3 server)."""

from __future__ import annotations

import copy
import dataclasses

import pytest

from flywheel.classifier.errors import FlywheelError
from flywheel.classifier.layer2.fitter import fit_model
from flywheel.classifier.settings.config import load_config
from flywheel.classifier.settings.intents import parse_intents
from flywheel.classifier.versions.registry import ModelRegistry
from flywheel.fleet.site import LocalSite, ServingLog
from flywheel.logstore import LogStoreError
from flywheel.service.runtime import Runtime, open_runtime
from tests.support.docs import ALWAYS_SURE, ALWAYS_UNSURE, DOC
from tests.support.fakes import HashEmbedder, ListSink, ScriptedTeacher


def _fitted(name: str, thresholds: dict):
    d = copy.deepcopy(DOC)
    d["thresholds"] = thresholds
    return fit_model(parse_intents(d), embedder=HashEmbedder(), version=name)


def _home(tmp_path) -> ModelRegistry:
    """A models home serving v1, with v2 beside it as the shadow version."""
    reg = ModelRegistry(tmp_path / "models")
    for name, th in (("v1", ALWAYS_UNSURE), ("v2", ALWAYS_SURE)):
        _fitted(name, th).save(reg.version_dir(name))
    reg.promote("v1")
    reg.set_shadow("v2")
    return reg


def test_the_parts_are_joined_in_one_classifier_and_the_runtime_is_frozen(tmp_path):
    reg = _home(tmp_path)
    cfg = load_config(home=tmp_path, model=str(reg.home))
    rt = open_runtime(cfg, progress=False, embedder=HashEmbedder())
    try:
        clf = rt.classifier
        assert rt.teacher is not None and clf.teacher is rt.teacher       # built from v1's intents, owned
        assert clf.shadow is rt.shadow and rt.shadow.version == "v2"      # the shadow loaded against v1
        assert clf.watcher is not None and clf.watcher.serving == "v1"
        assert clf.log_sink is rt.sink and rt.labels is rt.store and not rt.fleet
        with pytest.raises(dataclasses.FrozenInstanceError):
            rt.teacher = None  # type: ignore[misc]
        reg.promote("v2")                      # the watcher, built before the classifier, swaps it in
        assert clf.watcher.poll(force=True) and clf.model_version == "v2"
    finally:
        rt.close()


def test_a_teacher_of_the_callers_is_used_and_not_owned(tmp_path):
    reg = _home(tmp_path)
    cfg = load_config(home=tmp_path, model=str(reg.home))
    teacher = ScriptedTeacher()
    rt = open_runtime(cfg, progress=False, log_decisions=False, embedder=HashEmbedder(), teacher=teacher)
    try:
        assert rt.classifier.teacher is teacher and rt.teacher is None   # the caller closes it
        assert rt.sink is None and rt.labels is None and rt.shadow is None  # no log: no shadow either
    finally:
        rt.close()


def test_a_sink_of_the_callers_is_used_and_an_unknown_keyword_is_refused(tmp_path):
    reg = _home(tmp_path)
    cfg = load_config(home=tmp_path, model=str(reg.home), teacher="off")
    sink = ListSink()
    rt = open_runtime(cfg, progress=False, embedder=HashEmbedder(), log_sink=sink)
    try:
        d = rt.classifier.classify("show my invoices")
        assert rt.classifier.log_sink is sink and rt.sink is None        # used as it is
        assert [r.decision.id for r in sink.records] == [d.id]
        assert rt.shadow is None                                         # it takes no shadow answers
    finally:
        rt.close()
    with pytest.raises(TypeError, match="unexpected keyword argument 'audit_rate'"):
        open_runtime(cfg, audit_rate=1.0)            # a Classifier keyword: no longer passed on


class _Site(LocalSite):
    """A local site that records the sink it opened."""

    served: ServingLog | None = None

    def serving_log(self, *, own_sink: bool = True) -> ServingLog:
        self.served = super().serving_log(own_sink=own_sink)
        return self.served


def test_a_part_that_fails_closes_what_was_opened_before_it(tmp_path):
    cfg = load_config(home=tmp_path, model=str(tmp_path / "no-such-version"))
    site = _Site(cfg)
    with pytest.raises(FlywheelError):            # the model does not load, after the log was opened
        open_runtime(cfg, progress=False, site=site, embedder=HashEmbedder())
    assert site.served is not None and site.served.sink is not None
    with pytest.raises(LogStoreError, match="is closed"):
        site.served.sink.write(None)  # type: ignore[arg-type]


@pytest.mark.slow   # talks to the real server
def test_a_replica_swaps_in_what_the_fleet_promotes_at_once(objects, store_env, tmp_path):
    from flywheel.fleet.registry import BucketRegistry
    from tests.support.bucket import publish

    fleet = BucketRegistry(objects, ModelRegistry(tmp_path / "trainer"))
    publish(fleet, _fitted("base", ALWAYS_SURE), "v1", "v2")
    token = fleet.promote("v1", expected=None)
    cfg = load_config(home=tmp_path / "replica", teacher="off")
    rt = open_runtime(cfg, progress=False, embedder=HashEmbedder())
    try:
        assert isinstance(rt, Runtime) and rt.fleet and rt.store is None and rt.labels is rt.sink
        assert rt.classifier.model_version == "v1"                  # the first sync came before the model
        fleet.promote("v2", expected=token)
        assert rt.sync is not None and rt.sync.poll() == "new"
        assert rt.classifier.model_version == "v2"                  # swapped by the sync, not the watcher's clock
    finally:
        rt.close()


@pytest.mark.slow   # talks to the real server
def test_a_replica_of_a_fleet_that_promoted_nothing_serves_the_default_and_follows(objects, store_env, tmp_path,
                                                                                   monkeypatch):
    """Before the fleet's first promotion a replica serves the default model from its models
    home (installed there once by the runtime, not by the site's ``follow``), so that its
    watcher swaps in what the fleet promotes first."""
    import yaml

    from flywheel.classifier.versions.default import cached_model_dir
    from flywheel.fleet.registry import BucketRegistry
    from tests.support.bucket import publish

    intents = tmp_path / "intents.yaml"
    intents.write_text(yaml.safe_dump(DOC))
    monkeypatch.setenv("FLYWHEEL_INTENTS", str(intents))
    cfg = load_config(home=tmp_path / "replica", teacher="off")
    cached = cached_model_dir(cfg, intents)           # the default model, as the first use trains it
    fit_model(parse_intents(DOC), embedder=HashEmbedder(), version=cached.name).save(cached)
    rt = open_runtime(cfg, progress=False, embedder=HashEmbedder())
    try:
        assert rt.classifier.model_version == cached.name
        assert ModelRegistry(cfg.models_dir).current_name() == cached.name     # served from the home
        fleet = BucketRegistry(objects, ModelRegistry(tmp_path / "trainer"))
        publish(fleet, fit_model(parse_intents(DOC), embedder=HashEmbedder(), version="base"), "v1")   # of the file
        fleet.promote("v1", expected=None)
        assert rt.sync is not None and rt.sync.poll() == "new"
        assert rt.classifier.model_version == "v1"                    # the fleet's first promotion
    finally:
        rt.close()
