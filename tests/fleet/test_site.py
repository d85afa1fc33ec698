"""fleet.site: where the log and the registry live. Without a store everything is local and
nothing touches the network; with one, every part is the bucket's (against the real S3
server)."""

from __future__ import annotations

import pytest

from flywheel.classifier.decision import Decision, Layer, Tier
from flywheel.classifier.layer2.fitter import fit_model
from flywheel.classifier.protocols import DecisionRecord
from flywheel.classifier.settings.config import load_config
from flywheel.classifier.settings.intents import parse_intents
from flywheel.classifier.versions.registry import ModelRegistry
from flywheel.fleet.bucket_labels import BucketLabels
from flywheel.fleet.registry import BucketRegistry
from flywheel.fleet.shipper import ObjectShipper
from flywheel.fleet.site import FleetSite, LocalSite, mirror_progress, open_site
from flywheel.logstore import LocalIngest, LogStore, SpoolSink
from tests.support.bucket import publish
from tests.support.docs import DOC
from tests.support.fakes import HashEmbedder


# ------------------------------------------------------------------ local
def test_without_a_store_everything_is_local(tmp_path):
    cfg = load_config(home=tmp_path)
    site = open_site(cfg)
    assert isinstance(site, LocalSite) and not site.fleet
    reg = site.registry()
    assert isinstance(reg, ModelRegistry) and reg.home == cfg.models_dir
    assert site.registry(tmp_path / "other").home == tmp_path / "other"
    store = site.open_log()
    assert isinstance(store, LogStore) and str(store.path) == str(cfg.log_path)
    assert site.labels(store) is store
    assert isinstance(site.drain(), LocalIngest)
    assert site.follow(lambda: None) is None                      # nothing to follow
    assert cfg.log_retention_days is None and site.apply_retention(store) is None


def test_a_local_serving_log_is_the_duckdb_file_and_its_sink(tmp_path):
    site = open_site(load_config(home=tmp_path))
    served = site.serving_log()
    assert isinstance(served.store, LogStore) and served.labels is served.store
    assert isinstance(served.sink, SpoolSink) and served.sink.spool == served.store.spool_dir
    served.sink.close()
    theirs = site.serving_log(own_sink=False)                     # the caller brings its own sink
    assert theirs.sink is None and theirs.labels is theirs.store


def test_local_prune_reports_what_it_removed(tmp_path, capsys):
    site = open_site(load_config(home=tmp_path))
    rep = site.prune_log(site.open_log(), 30, progress=True)
    assert rep.local_rows == 0 and rep.redacted == 0
    assert "retention 30 days: text before" in capsys.readouterr().err


def test_mirror_progress_prints_at_most_every_interval_and_at_the_end(capsys):
    report = mirror_progress(every_s=3600.0)
    report(1, 3, 10)
    report(2, 3, 20)
    report(3, 3, 30)
    err = capsys.readouterr().err.splitlines()
    assert err == ["flywheel:   mirrored 3 of 3 new objects (30 rows)"]


def test_stats_refuses_bad_options_before_touching_the_store(monkeypatch, capsys):
    from flywheel.cli import main

    monkeypatch.setenv("FLYWHEEL_STORE", "s3://nowhere/prefix")   # no endpoint nor credentials: never reached
    assert main(["stats", "--top", "x"]) == 2
    err = capsys.readouterr().err
    assert "--top must be an integer" in err and "mirroring" not in err


# ------------------------------------------------------------------ fleet
@pytest.mark.slow   # talks to the real server
def test_with_a_store_every_part_is_the_fleets(objects, store_env, tmp_path, capsys):
    cfg = load_config(home=tmp_path)
    site = open_site(cfg)
    assert isinstance(site, FleetSite) and site.fleet
    reg = site.registry()
    assert isinstance(reg, BucketRegistry) and reg.local.home == cfg.models_dir
    assert isinstance(site.drain(), ObjectShipper)

    served = site.serving_log()          # a replica: a spool shipped to the bucket, no local DuckDB
    assert served.store is None and served.labels is served.sink and isinstance(served.sink, SpoolSink)
    d = Decision(label="RETRIEVAL", confidence=0.9, tier=Tier.CONFIDENT, layer=Layer.EMBEDDING, reason="t")
    served.sink.write(DecisionRecord(decision=d, text="what is addVar", created_at=1.0e9))
    assert served.sink.drain_now(timeout_s=30) == 1
    served.sink.close()

    store = site.open_log(progress=True)                         # mirrored from the bucket first
    assert "mirrored 1 new objects" in capsys.readouterr().err
    assert [r[0] for r in store.query("SELECT decision_id FROM decisions")] == [d.id]
    assert isinstance(site.labels(store), BucketLabels)
    rep = site.prune_log(store, 30)                              # the bucket's copy and the local one
    assert rep.redacted == 1 and rep.local_rows == 1


@pytest.mark.slow   # talks to the real server
def test_a_fresh_replica_follows_the_fleet_and_starts_on_its_version(objects, store_env, tmp_path):
    trainer = BucketRegistry(objects, ModelRegistry(tmp_path / "trainer"))   # another host publishes
    publish(trainer, fit_model(parse_intents(DOC), embedder=HashEmbedder(), version="base"), "v1")
    trainer.promote("v1", expected=None)
    site = open_site(load_config(home=tmp_path / "replica"))
    news: list[str] = []
    sync = site.follow(lambda: news.append("new"))
    local = ModelRegistry(tmp_path / "replica" / "models")
    assert sync is not None and not sync.running                  # not started
    assert sum(sync.polls.values()) == 0 and local.current_name() is None and news == []   # nor synced
    assert sync.sync_once() == "new"                              # the first sync is the caller's
    assert local.current_name() == "v1" and news == ["new"]


@pytest.mark.slow   # talks to the real server
def test_the_replica_setting_signs_this_hosts_moves_of_the_fleets_pointers(objects, store_env, tmp_path):
    """``replica`` (``FLYWHEEL_REPLICA``) names the host in the fleet's ``CURRENT`` and
    ``SHADOW`` (``by``: shown when a promotion loses a race); unset, ``user@host``."""
    site = open_site(load_config(home=tmp_path / "retrain", replica="retrain"))
    reg = site.registry()
    publish(reg, fit_model(parse_intents(DOC), embedder=HashEmbedder(), version="base"), "v1", "v2")
    token = reg.promote("v1", expected=None)
    assert reg.pointer().by == "retrain"
    other = open_site(load_config(home=tmp_path / "admin")).registry()
    other.promote("v2", expected=token)
    assert "@" in other.pointer().by and other.pointer().by != "retrain"
