"""fleet.registry.BucketRegistry against a real S3 server (``weed mini``, tests/support/s3.py):
create-only, manifest-last publishing, compare-and-swap promotion and rollback, verified
downloads. Versions are tiny models (tests/support/fakes.py HashEmbedder), trained once per module."""

from __future__ import annotations

import json
import shutil
import threading

import pytest

from flywheel.classifier.errors import ModelError
from flywheel.classifier.layer2.fitter import fit_model
from flywheel.classifier.protocols import Registry
from flywheel.classifier.settings.intents import parse_intents
from flywheel.classifier.versions.model import IntentModel
from flywheel.classifier.versions.registry import ModelRegistry, PromotionConflict
from flywheel.fleet.errors import StoreUnavailable
from flywheel.fleet.objects import ObjectStore
from flywheel.fleet.registry import CURRENT_KEY, DOWNLOAD_MARK, BucketRegistry
from tests.support.bucket import publish, save_version, tamper, upload_raw, without_serving_head
from tests.support.docs import DOC
from tests.support.fakes import HashEmbedder

pytestmark = pytest.mark.slow   # every test talks to the real server


# ---------------------------------------------------------------- helpers (the shared ones: tests/support/bucket.py)

@pytest.fixture(scope="module")
def trained() -> IntentModel:
    """One tiny fitted model; versions are copies of it under other names."""
    return fit_model(parse_intents(DOC), embedder=HashEmbedder(), version="base")


class RecordingStore(ObjectStore):
    """The real store, remembering the keys written, in order; ``fail_after`` puts succeed,
    then the store "goes away" (a publisher that crashes half way)."""

    def __init__(self, cfg, fail_after: int | None = None) -> None:
        super().__init__(cfg)
        self.puts: list[str] = []
        self.fail_after = fail_after

    def put_if_match(self, key, data, etag):
        if self.fail_after is not None and len(self.puts) >= self.fail_after:
            raise StoreUnavailable(f"put {key}: store unavailable (simulated crash)")
        etag = super().put_if_match(key, data, etag)
        self.puts.append(key)
        return etag


@pytest.fixture
def bucket(objects, tmp_path) -> BucketRegistry:
    """The fleet registry as the retrain host sees it (its own local home)."""
    return BucketRegistry(objects, ModelRegistry(tmp_path / "trainer"), by="trainer@test")


# ---------------------------------------------------------------- publish

def test_publish_uploads_every_file_with_the_manifest_last_and_is_create_only(objects, tmp_path, trained):
    local = ModelRegistry(tmp_path / "trainer")
    path = save_version(local, trained, "v1")
    (path / "report.json").write_text('{"outcome": "promoted"}\n')
    rec = RecordingStore(objects.cfg)
    reg = BucketRegistry(rec, local)

    assert reg.publish(path) == "v1"
    assert rec.puts[-1] == "models/v1/manifest.json"
    assert set(rec.puts) == {f"models/v1/{f}" for f in
                             ("head.npz", "head.joblib", "intents.yaml", "report.json", "manifest.json")}
    for f in ("head.npz", "head.joblib", "intents.yaml", "manifest.json", "report.json"):
        assert objects.get(f"models/v1/{f}")[0] == (path / f).read_bytes()

    etags = {k: objects.head(k) for k in rec.puts}
    rec.puts.clear()
    assert reg.publish(path) == "v1"                     # the same version again: nothing changes
    assert rec.puts == [] and {k: objects.head(k) for k in etags} == etags

    other = save_version(ModelRegistry(tmp_path / "elsewhere"), trained, "v1", metrics={"other": 1})
    with pytest.raises(ModelError, match="already in the store"):
        reg.publish(other)                                 # same name, other content: never replaced
    assert {k: objects.head(k) for k in etags} == etags
    assert [v.name for v in reg.versions()] == ["v1"]


def test_an_interrupted_publish_is_invisible_and_publishing_again_finishes_it(objects, tmp_path, trained):
    local = ModelRegistry(tmp_path / "trainer")
    path = save_version(local, trained, "v1")
    crashing = BucketRegistry(RecordingStore(objects.cfg, fail_after=2), local)
    with pytest.raises(StoreUnavailable):
        crashing.publish(path)
    keys = [o.key for o in objects.list("models")]
    assert len(keys) == 2 and "models/v1/manifest.json" not in keys   # files without their manifest

    reader = BucketRegistry(objects, ModelRegistry(tmp_path / "reader"))
    assert reader.versions() == []
    with pytest.raises(ModelError, match="not complete"):
        reader.promote("v1", expected=None)
    with pytest.raises(ModelError, match="not complete"):
        reader.download("v1")
    assert reader.current() == (None, None)
    assert not (tmp_path / "reader" / "v1").exists()

    assert BucketRegistry(objects, local).publish(path) == "v1"      # resumes: same bytes are accepted
    assert [v.name for v in reader.versions()] == ["v1"]
    assert reader.load("v1").version == "v1"


def test_a_version_without_a_serving_head_or_a_checksum_is_refused(objects, tmp_path, trained, bucket):
    good = save_version(bucket.local, trained, "v1")
    old = without_serving_head(good, tmp_path / "old")
    IntentModel.load(old)                                  # fine locally (it unpickles head.joblib)
    with pytest.raises(ModelError, match="serving head"):
        bucket.publish(old)
    assert objects.list("models") == []

    upload_raw(objects, old)                               # someone uploads it by hand anyway
    with pytest.raises(ModelError, match="head.npz"):
        bucket.promote("old", expected=None)
    with pytest.raises(ModelError, match="head.npz"):
        bucket.download("old")
    assert bucket.current() == (None, None)
    [listed] = bucket.versions()
    assert listed.name == "old" and not listed.valid and "head.npz" in listed.problem

    shutil.copytree(good, tmp_path / "nointents")         # a serving head, but intents.yaml unhashed
    doc = json.loads((tmp_path / "nointents" / "manifest.json").read_text())
    doc.update(intents_sha256="", version="nointents")
    (tmp_path / "nointents" / "manifest.json").write_text(json.dumps(doc))
    upload_raw(objects, tmp_path / "nointents")
    for op in (lambda: bucket.promote("nointents", expected=None), lambda: bucket.download("nointents")):
        with pytest.raises(ModelError, match="no checksum for intents.yaml"):
            op()
    assert not (bucket.local.home / "nointents").exists()


# ---------------------------------------------------------------- promote / rollback

def test_promote_is_a_compare_and_swap_on_current(objects, bucket, trained):
    assert isinstance(bucket, Registry)
    publish(bucket, trained, "v1", "v2", "v3")
    assert bucket.current() == (None, None)
    e1 = bucket.promote("v1", expected=None)
    assert bucket.current() == ("v1", e1)
    with pytest.raises(PromotionConflict, match="now serving v1"):
        bucket.promote("v2", expected=None)                # None: only while there is no CURRENT
    e2 = bucket.promote("v2", expected=e1)
    with pytest.raises(PromotionConflict) as err:
        bucket.promote("v3", expected=e1)                  # stale: v2 was promoted meanwhile
    assert err.value.expected == e1 and err.value.found == e2
    assert "now serving v2, promoted by trainer@test" in str(err.value)
    assert bucket.current() == ("v2", e2)
    doc = json.loads(objects.get(CURRENT_KEY)[0])
    assert doc["version"] == "v2" and doc["history"] == ["v1", "v2"] and doc["by"] == "trainer@test"
    assert doc["updated_at"].endswith("Z")
    with pytest.raises(ModelError, match="no version 'v9'"):
        bucket.promote("v9", expected=e2)
    with pytest.raises(ModelError, match="invalid version name"):
        bucket.promote("../v1", expected=e2)
    assert bucket.current() == ("v2", e2)


def test_promote_refuses_a_version_with_a_missing_file(objects, bucket, trained):
    publish(bucket, trained, "v1")
    objects.delete("models/v1/head.joblib")
    with pytest.raises(ModelError, match="missing"):
        bucket.promote("v1", expected=None, verify=False)
    assert bucket.current() == (None, None)


def test_racing_promoters_exactly_one_wins(objects, bucket, trained):
    names = [f"c{i}" for i in range(6)]
    publish(bucket, trained, "v0", *names)
    e0 = bucket.promote("v0", expected=None)
    barrier = threading.Barrier(len(names), timeout=30)
    results: dict[str, object] = {}

    def promoter(name: str) -> None:
        reg = BucketRegistry(ObjectStore(objects.cfg), bucket.local, by=name)
        barrier.wait()
        try:
            results[name] = reg.promote(name, expected=e0, verify=False)
        except Exception as exc:  # noqa: BLE001 - recorded and checked below
            results[name] = exc

    threads = [threading.Thread(target=promoter, args=(n,)) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    winners = [n for n, r in results.items() if isinstance(r, str)]
    losers = [r for r in results.values() if not isinstance(r, str)]
    assert len(winners) == 1, results
    assert len(losers) == len(names) - 1 and all(isinstance(r, PromotionConflict) for r in losers), results
    assert bucket.current() == (winners[0], results[winners[0]])
    assert all(f"now serving {winners[0]}" in str(r) for r in losers)
    assert bucket.history() == ["v0", winners[0]]


def test_rollback_follows_the_history_by_compare_and_swap(objects, bucket, trained):
    publish(bucket, trained, "v1", "v2", "v3")
    with pytest.raises(ModelError, match="nothing to roll back"):
        bucket.rollback()
    e1 = bucket.promote("v1", expected=None)
    e2 = bucket.promote("v2", expected=e1)
    e3 = bucket.promote("v3", expected=e2)
    with pytest.raises(PromotionConflict):
        bucket.rollback(expected=e2)
    assert bucket.current() == ("v3", e3)
    e = bucket.rollback(expected=e3)
    assert bucket.current() == ("v2", e) and bucket.history() == ["v1", "v2"]
    bucket.rollback()
    assert bucket.current()[0] == "v1" and bucket.history() == ["v1"]
    with pytest.raises(ModelError, match="nothing to roll back"):
        bucket.rollback()
    bucket.promote("v3", expected=bucket.current()[1])
    assert bucket.history() == ["v1", "v3"]


def test_rollback_verifies_its_target_as_promote_does(objects, tmp_path, bucket, trained):
    publish(bucket, trained, "v1", "v2")
    e1 = bucket.promote("v1", expected=None)
    e2 = bucket.promote("v2", expected=e1)
    tamper(objects, "models/v1/head.npz")                         # the previous version is now corrupt
    other = BucketRegistry(objects, ModelRegistry(tmp_path / "other-host"))   # no local copy to trust
    with pytest.raises(ModelError, match="head.npz: checksum does not match the manifest"):
        other.promote("v1", expected=e2)
    with pytest.raises(ModelError, match=r"cannot roll back to 'v1': .*head.npz: checksum does not match"):
        other.rollback(expected=e2)
    with pytest.raises(ModelError, match="cannot roll back to 'v1'"):
        other.rollback()
    assert other.current() == ("v2", e2) and other.history() == ["v1", "v2"]   # CURRENT unchanged
    assert not (tmp_path / "other-host" / "v1").exists()


@pytest.mark.parametrize("fname", ["head.npz", "intents.yaml"])
def test_the_publishing_host_checks_the_buckets_bytes_not_its_local_copy(objects, tmp_path, bucket, trained,
                                                                        fname):
    """Issue 32: the host that published a version holds a good local copy of it; if the
    bucket's bytes were tampered after the upload, it refuses them as a replica does, and
    the fleet keeps serving the old version."""
    from flywheel.fleet.sync import RegistrySync

    publish(bucket, trained, "v1", "v2", "v3")
    e1 = bucket.promote("v1", expected=None)
    replica = ModelRegistry(tmp_path / "replica")
    sync = RegistrySync(objects, replica, interval_s=60)
    assert sync.poll() == "new" and replica.current_name() == "v1"
    tamper(objects, f"models/v2/{fname}")
    IntentModel.load(bucket.local.home / "v2")                    # the publisher's own copy still verifies
    with pytest.raises(ModelError, match=f"models/v2/{fname}: checksum does not match the manifest"):
        bucket.promote("v2", expected=e1)
    assert bucket.current() == ("v1", e1) and bucket.history() == ["v1"]
    assert sync.poll() == "not_modified" and replica.current_name() == "v1"   # the old version keeps serving
    e2 = bucket.promote("v3", expected=e1)                        # an untampered version still promotes
    tamper(objects, "models/v1/head.joblib")                      # and a tampered rollback target is refused
    with pytest.raises(ModelError, match=r"cannot roll back to 'v1': .*head.joblib: checksum does not match"):
        bucket.rollback(expected=e2)


def test_set_shadow_checks_what_promote_checks(objects, tmp_path, bucket, trained):
    """Issue 32: the fleet's set_shadow refuses every version promote refuses, with the same
    error (one check, BucketRegistry._verified), and leaves models/SHADOW as it was."""
    publish(bucket, trained, "v1", "v2", "v3")
    bucket.set_shadow("v3")
    tamper(objects, "models/v2/head.npz")                         # tampered after the upload
    upload_raw(objects, without_serving_head(bucket.local.home / "v1", tmp_path / "old"))
    for name in ("v2", "old", "v9", "../v1"):
        with pytest.raises(ModelError) as promoted:
            bucket.promote(name, expected=None)
        with pytest.raises(ModelError) as shadowed:
            bucket.set_shadow(name)
        assert str(shadowed.value) == str(promoted.value), name
    assert bucket.shadow() == "v3" and bucket.current() == (None, None)
    bucket.set_shadow(None)
    assert bucket.shadow() is None


def test_the_history_is_bounded(objects, bucket, trained, monkeypatch):
    import flywheel.fleet.registry

    monkeypatch.setattr(flywheel.fleet.registry, "HISTORY_LIMIT", 3)
    publish(bucket, trained, "v1", "v2", "v3", "v4")
    token = None
    for name in ("v1", "v2", "v3", "v4"):
        token = bucket.promote(name, expected=token, verify=False)
    assert bucket.history() == ["v2", "v3", "v4"]


# ---------------------------------------------------------------- prune (issue 22: versions weigh megabytes)

def test_prune_removes_old_versions_from_the_bucket_and_keeps_what_serving_needs(objects, tmp_path, bucket,
                                                                                   trained):
    publish(bucket, trained, *(f"v{i}" for i in range(1, 9)))
    token = None
    for name in ("v1", "v2", "v3", "v4"):
        token = bucket.promote(name, expected=token, verify=False)
    bucket.set_shadow("v5")
    upload_raw(objects, save_version(ModelRegistry(tmp_path / "partial"), trained, "v0"))
    objects.delete("models/v0/manifest.json")                      # an upload in progress: never touched
    keys_before = {i.key for i in objects.list("models/v0")}
    assert bucket.prune(keep_promoted=2, keep_recent=2, dry_run=True) == ["v1", "v2", "v6"]
    assert [v.name for v in bucket.versions()] == [f"v{i}" for i in range(1, 9)]   # a dry run deletes nothing
    # kept: CURRENT v4, SHADOW v5, the last 2 promoted (v3, v4), the 2 newest (v7, v8)
    assert bucket.prune(keep_promoted=2, keep_recent=2) == ["v1", "v2", "v6"]
    assert [v.name for v in bucket.versions()] == ["v3", "v4", "v5", "v7", "v8"]
    assert not [i.key for i in objects.list("models/v1/")] and not [i.key for i in objects.list("models/v6/")]
    assert {i.key for i in objects.list("models/v0")} == keys_before
    assert bucket.current()[0] == "v4" and bucket.history() == ["v3", "v4"] and bucket.shadow() == "v5"
    bucket.rollback()                                               # the history still rolls back
    assert bucket.current()[0] == "v3"
    # v4, rolled back from, is out of the history now: the next prune takes it
    assert bucket.prune(keep_promoted=2, keep_recent=2) == ["v4"]
    assert bucket.prune(keep_promoted=2, keep_recent=2) == []


def test_an_interrupted_prune_leaves_a_version_that_is_refused_and_pruned_next_time(objects, tmp_path, bucket,
                                                                                   trained):
    publish(bucket, trained, "v1", "v2")
    bucket.promote("v2", expected=None, verify=False)

    class Crash(Exception):
        pass

    real_delete, deleted = objects.delete, []

    def delete_once(key):
        if deleted:
            raise Crash(key)
        deleted.append(key)
        real_delete(key)

    objects.delete = delete_once
    with pytest.raises(Crash):
        bucket.prune(keep_promoted=1, keep_recent=0)
    objects.delete = real_delete
    assert deleted and not deleted[0].endswith("manifest.json")   # the manifest goes last
    other = BucketRegistry(objects, ModelRegistry(tmp_path / "fresh"))
    with pytest.raises(ModelError):                                # half deleted: never installed
        other.download("v1")
    assert bucket.prune(keep_promoted=1, keep_recent=0) == ["v1"]
    assert [v.name for v in bucket.versions()] == ["v2"]


def test_the_bucket_prunes_and_rolls_back_as_the_local_home_does(objects, tmp_path, bucket, trained):
    """One policy (classifier.versions.registry_policy): the scenario of
    tests/classifier/versions/test_registry_policy.py, on both registries, gives the same answers."""
    from flywheel.classifier.versions.registry_policy import prune_plan

    names = [f"v{i}" for i in range(1, 9)]
    local = ModelRegistry(tmp_path / "local-home")
    publish(bucket, trained, *names)
    token = None
    for name in names:
        save_version(local, trained, name)
    for name in ("v1", "v2", "v3", "v4"):
        local.promote(name, verify=False)
        token = bucket.promote(name, expected=token, verify=False)
    answers = []
    for reg in (local, bucket):
        reg.rollback()
        reg.set_shadow("v5")
        plan = prune_plan(names, reg.history(), served=reg.current()[0], shadow="v5", keep_promoted=2, keep_recent=2)
        removed = reg.prune(keep_promoted=2, keep_recent=2)
        assert removed == plan
        answers.append((removed, reg.history(), reg.current()[0], [v.name for v in reg.versions()]))
        reg.rollback()
        answers[-1] += (reg.current()[0],)
    assert answers[0] == answers[1] == (["v1", "v4", "v6"], ["v2", "v3"], "v3", ["v2", "v3", "v5", "v7", "v8"], "v2")


def test_prune_checks_its_counts(bucket):
    from flywheel.classifier.errors import InvalidInputError

    for bad in (-1, True, 1.5):
        with pytest.raises(InvalidInputError, match="keep_recent must be an integer >= 0|keep_recent must be >= 0"):
            bucket.prune(keep_recent=bad)


# ---------------------------------------------------------------- download / load / list

def test_a_fresh_host_downloads_and_verifies_a_version(objects, tmp_path, bucket, trained):
    publish(bucket, trained, "v1", "v2")
    bucket.promote("v2", expected=None)
    fresh = BucketRegistry(objects, ModelRegistry(tmp_path / "fresh"))
    model = fresh.load("v1")
    assert model.version == "v1" and model.path == tmp_path / "fresh" / "v1"
    for f in ("head.npz", "head.joblib", "intents.yaml", "manifest.json"):
        assert (tmp_path / "fresh" / "v1" / f).read_bytes() == (bucket.local.home / "v1" / f).read_bytes()
    assert fresh.download("v1") == tmp_path / "fresh" / "v1"     # installed already: used as it is
    assert fresh.local.current_name() is None                     # downloading serves nothing
    assert [(v.name, v.current, v.valid) for v in fresh.versions()] == [("v1", False, True), ("v2", True, True)]
    with fresh.lock() as taken:
        assert taken is True


@pytest.mark.parametrize("fname", ["head.npz", "head.joblib", "intents.yaml"])
def test_a_tampered_file_is_refused_at_download_and_nothing_is_left(objects, tmp_path, bucket, trained, fname):
    publish(bucket, trained, "v1")
    tamper(objects, f"models/v1/{fname}")
    home = tmp_path / "replica"
    with pytest.raises(ModelError, match=f"{fname}: checksum does not match the manifest"):
        BucketRegistry(objects, ModelRegistry(home)).download("v1")
    assert sorted(p.name for p in home.iterdir()) == []           # no version, no temp dir
    assert not any(DOWNLOAD_MARK in p.name for p in home.iterdir())


def test_a_corrupt_local_copy_is_replaced_by_a_verified_download(objects, tmp_path, bucket, trained):
    publish(bucket, trained, "v1")
    replica = BucketRegistry(objects, ModelRegistry(tmp_path / "replica"))
    path = replica.download("v1")
    (path / "head.npz").write_bytes(b"broken on disk")
    assert replica.load("v1").version == "v1"
    assert (path / "head.npz").read_bytes() == (bucket.local.home / "v1" / "head.npz").read_bytes()
