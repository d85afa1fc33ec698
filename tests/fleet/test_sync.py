"""fleet.sync.RegistrySync against a real S3 server: a replica's local models home
follows the fleet's ``models/CURRENT``; what does not verify is refused once and the old
version keeps serving; a store that is down changes nothing."""

from __future__ import annotations

import json
import logging
import time

import pytest

from flywheel.classifier import Classifier
from flywheel.classifier.layer2.fitter import fit_model
from flywheel.classifier.settings.intents import parse_intents
from flywheel.classifier.versions.model import IntentModel
from flywheel.classifier.versions.registry import ModelRegistry
from flywheel.fleet.objects import ObjectStore
from flywheel.fleet.registry import CURRENT_KEY, DOWNLOAD_MARK, BucketRegistry
from flywheel.fleet.sync import SYNC_OUTCOMES, RegistrySync
from tests.support.bucket import publish, save_version, tamper, upload_raw, without_serving_head
from tests.support.docs import DOC
from tests.support.fakes import HashEmbedder

pytestmark = pytest.mark.slow   # every test talks to the real server


@pytest.fixture(scope="module")
def trained() -> IntentModel:
    """One tiny fitted model; versions are copies of it under other names."""
    return fit_model(parse_intents(DOC), embedder=HashEmbedder(), version="base")


@pytest.fixture
def fleet(objects, tmp_path) -> BucketRegistry:
    """The fleet registry as the retrain host sees it."""
    return BucketRegistry(objects, ModelRegistry(tmp_path / "trainer"), by="trainer@test")


@pytest.fixture
def replica(tmp_path) -> ModelRegistry:
    """A replica's local models home, empty (not even created)."""
    return ModelRegistry(tmp_path / "replica")


def wait_for(predicate, timeout_s: float = 20.0, step_s: float = 0.02) -> float:
    """Seconds until ``predicate()`` held; fails after ``timeout_s``."""
    t0 = time.monotonic()
    while not predicate():
        assert time.monotonic() - t0 < timeout_s, "timed out"
        time.sleep(step_s)
    return time.monotonic() - t0


def test_a_fresh_replica_starts_on_the_fleets_current_version(objects, fleet, replica, trained):
    sync = RegistrySync(objects, replica, interval_s=0.1)
    assert sync.poll() == "unchanged"                  # nothing promoted in the fleet yet
    assert replica.current_name() is None
    publish(fleet, trained, "v1", "v2")
    fleet.promote("v2", expected=None)

    assert sync.sync_once(timeout_s=30) == "new"
    assert replica.current_name() == "v2" and sync.serving == "v2" and sync.fleet_version == "v2"
    assert [v.name for v in replica.versions()] == ["v2"]    # only what is served is downloaded
    assert sync.poll() == "not_modified"
    assert sync.polls == {**dict.fromkeys(SYNC_OUTCOMES, 0), "unchanged": 1, "new": 1, "not_modified": 1}
    assert Classifier.from_registry(replica.home, embedder=HashEmbedder(), watch=False).model_version == "v2"


def test_a_replicas_log_lines_say_its_installs_are_local(objects, fleet, replica, trained, caplog):
    """Only the host that moved ``models/CURRENT`` logs a promotion; a replica following it
    says it installed the version locally (issue 26)."""
    publish(fleet, trained, "v1", "v2")
    fleet.promote("v1", expected=None)
    sync = RegistrySync(objects, replica, interval_s=0.1)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="flywheel"):
        assert sync.sync_once(timeout_s=30) == "new"
        fleet.set_shadow("v2")
        sync.poll()
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("flywheel")]
    assert any(ln.startswith("replica: installed v1 locally (was None), following the fleet's CURRENT")
               for ln in lines), lines
    assert any(ln.startswith("replica: installed shadow version v2 locally") for ln in lines), lines
    on_replica = [ln for ln in lines if "s3://" not in ln]   # the fleet's own lines name the bucket
    assert not [ln for ln in on_replica if ln.startswith(("promoted", "published", "installed", "shadow"))
                and "local models home" not in ln], lines


def test_a_tampered_version_is_refused_once_and_the_old_one_keeps_serving(objects, fleet, replica, trained,
                                                                         caplog):
    publish(fleet, trained, "v1", "v2", "v3")
    e1 = fleet.promote("v1", expected=None)
    sync = RegistrySync(objects, replica)
    assert sync.poll() == "new"

    e2 = fleet.promote("v2", expected=e1)                # checked against the bucket's bytes: fine
    tamper(objects, "models/v2/head.npz")                # the bucket copy is damaged after promoting
    with caplog.at_level(logging.ERROR, logger="flywheel.fleet.registry"):
        assert sync.poll() == "refused"
    assert replica.current_name() == "v1" and sync.serving == "v1"
    assert "checksum does not match" in sync.refused["v2"] and sync.last_error == sync.refused["v2"]
    assert any("refusing model version v2" in r.getMessage() for r in caplog.records)
    assert not (replica.home / "v2").exists()
    assert not any(DOWNLOAD_MARK in p.name for p in replica.home.iterdir())

    assert sync.poll() == "not_modified"                 # not tried again
    e2b = fleet.promote("v2", expected=e2, verify=False)   # promoted again, unchecked: a new etag
    assert sync.poll() == "unchanged"
    assert sync.polls["refused"] == 1 and replica.current_name() == "v1"

    fleet.promote("v3", expected=e2b)
    assert sync.poll() == "new" and replica.current_name() == "v3"
    assert replica.history() == ["v1", "v3"]


def test_a_version_without_a_serving_head_is_refused_by_replicas(objects, tmp_path, fleet, replica, trained):
    publish(fleet, trained, "v1")
    e1 = fleet.promote("v1", expected=None)
    sync = RegistrySync(objects, replica)
    assert sync.poll() == "new"
    old = without_serving_head(save_version(ModelRegistry(tmp_path / "x"), trained, "x"), tmp_path / "old")
    upload_raw(objects, old)
    doc = {"version": "old", "history": ["v1", "old"], "updated_at": "2026-01-01T00:00:00Z", "by": "hand"}
    objects.put_if_match(CURRENT_KEY, json.dumps(doc).encode(), e1)   # promoted by hand, past every check
    assert sync.poll() == "refused"
    assert "head.npz" in sync.refused["old"]
    assert replica.current_name() == "v1" and not (replica.home / "old").exists()


def test_a_corrupt_pointer_is_an_error_and_changes_nothing(objects, fleet, replica, trained):
    publish(fleet, trained, "v1")
    e1 = fleet.promote("v1", expected=None)
    sync = RegistrySync(objects, replica)
    assert sync.poll() == "new"
    objects.put_if_match(CURRENT_KEY, b"{not json", e1)
    assert sync.poll() == "error" and "corrupt model pointer" in sync.last_error
    assert sync.poll() == "error"                        # read again each time until it is fixed
    assert replica.current_name() == "v1" and sync.polls["error"] == 2


def test_store_down_poll_is_an_error_and_nothing_changes(s3_server, objects, fleet, replica, trained):
    fast = ObjectStore(objects.cfg, timeout_s=2.0, max_retries=0)
    publish(fleet, trained, "v1", "v2")
    e1 = fleet.promote("v1", expected=None)
    sync = RegistrySync(fast, replica)
    assert sync.poll() == "new"
    fleet.promote("v2", expected=e1)
    s3_server.stop()
    try:
        t0 = time.monotonic()
        assert sync.poll() == "error"
        assert sync.sync_once(timeout_s=10) == "error"   # a replica starting now: logged, never raised
        assert time.monotonic() - t0 < 10
        assert replica.current_name() == "v1" and sync.serving == "v1"
        assert "unavailable" in sync.last_error
        assert s3_server.secret_key not in sync.last_error and s3_server.access_key not in sync.last_error
    finally:
        s3_server.start()
    assert sync.poll() == "new" and replica.current_name() == "v2"
    assert sync.polls["error"] == 2


def test_the_sync_thread_follows_promotions_and_stops(objects, fleet, replica, trained):
    publish(fleet, trained, "v1", "v2")
    e1 = fleet.promote("v1", expected=None)
    sync = RegistrySync(objects, replica, interval_s=0.05).start()
    try:
        wait_for(lambda: replica.current_name() == "v1")
        fleet.promote("v2", expected=e1)
        wait_for(lambda: replica.current_name() == "v2")
        assert sync.running
    finally:
        sync.stop()
    assert not sync.running
    assert sync.polls["new"] == 2 and sync.polls["error"] == 0 and sync.polls["refused"] == 0


def test_a_served_classifier_picks_up_a_fleet_promotion(objects, fleet, replica, trained, record_property):
    publish(fleet, trained, "v1", "v2")
    e1 = fleet.promote("v1", expected=None)
    sync = RegistrySync(objects, replica, interval_s=0.1)
    assert sync.sync_once(timeout_s=30) == "new"
    clf = Classifier.from_registry(replica.home, embedder=HashEmbedder(), interval_s=0.1, background=True)
    sync.start()
    try:
        assert clf.classify("show my invoices").model_version == "v1"
        t0 = time.monotonic()
        fleet.promote("v2", expected=e1)
        latency = wait_for(lambda: clf.classify("show my invoices").model_version == "v2", timeout_s=20)
        record_property("promotion_to_serving_s", round(time.monotonic() - t0, 3))
        assert latency < 5.0   # one sync interval + one watcher interval + download and warm-up
    finally:
        sync.stop()
        clf.close()


def test_a_served_classifier_swaps_as_soon_as_the_sync_installs(objects, fleet, replica, trained):
    publish(fleet, trained, "v1", "v2")
    fleet.promote("v1", expected=None)
    sync = RegistrySync(objects, replica)
    assert sync.poll() == "new"
    clf = Classifier.from_registry(replica.home, embedder=HashEmbedder(), interval_s=3600.0)  # a lazy watcher
    calls = []
    sync.on_new = lambda: calls.append(clf.watcher.poll(force=True))
    _, etag = fleet.current()
    fleet.promote("v2", expected=etag)
    assert sync.poll() == "new" and calls == [True]
    assert clf.model_version == "v2"          # without waiting for the watcher's own check
    assert sync.poll() == "not_modified" and calls == [True]
    clf.close()


# ------------------------------------------------------------------ shadow and last retrain
def test_replicas_follow_the_fleets_shadow_and_last_retrain(objects, fleet, replica, trained):
    publish(fleet, trained, "v1", "v2", "v3")
    fleet.promote("v1", expected=None)
    sync = RegistrySync(objects, replica, interval_s=0.1)
    sync.poll()
    assert replica.current_name() == "v1" and replica.shadow_name() is None
    fleet.set_shadow("v2")
    assert fleet.shadow() == "v2"
    assert sync.poll() in ("not_modified", "unchanged")
    assert replica.shadow_name() == "v2" and (replica.home / "v2" / "manifest.json").is_file()
    assert replica.current_name() == "v1"                      # the shadow serves nothing
    fleet.record_retrain({"finished_at": 1_800_000_000.0, "outcome": "shadowed", "version": "v2"})
    sync.poll()
    assert replica.last_retrain() == fleet.last_retrain() == {"finished_at": 1_800_000_000.0,
                                                              "outcome": "shadowed", "version": "v2"}
    with pytest.raises(Exception, match="shadow"):
        fleet.set_shadow(None, expected="v3")                  # compare-and-swap: the shadow is v2
    fleet.set_shadow(None, expected="v2")
    sync.poll()
    assert replica.shadow_name() is None


def test_a_shadow_that_does_not_verify_is_refused(objects, fleet, replica, trained):
    publish(fleet, trained, "v1", "v2")
    fleet.promote("v1", expected=None)
    fleet.set_shadow("v2")
    tamper(objects, "models/v2/head.npz")
    sync = RegistrySync(objects, replica, interval_s=0.1)
    assert sync.poll() == "new" and "v2" in sync.refused       # v1 installed, the shadow refused
    assert replica.shadow_name() is None and replica.current_name() == "v1"
    assert sync.poll() in ("not_modified", "unchanged")      # refused once, not retried
    assert sync.polls["refused"] == 1
