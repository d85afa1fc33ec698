"""Tuned versions stay small in the fleet's bucket (issue 34, item 2), against the real S3
server (tests/support/s3.py): the shared encoder blobs are ``models/blobs/<sha256>``, a
push uploads only those the bucket lacks, a replica following a promotion downloads the
version's small files and only the blobs it does not hold, and a tampered blob is refused.
The encoders are tiny BERTs sharing their embeddings (tests/support/version_encoders.py)."""

from __future__ import annotations

import pytest

from flywheel.classifier import Classifier
from flywheel.classifier.errors import ModelError
from flywheel.classifier.versions.registry import ModelRegistry
from flywheel.fleet.blobs import BLOBS_PREFIX
from flywheel.fleet.registry import BucketRegistry
from flywheel.fleet.sync import RegistrySync
from tests.support.bucket import tamper
from tests.support.version_encoders import fit_with_encoder, save_tuned, sharing_exports

pytestmark = pytest.mark.slow   # ONNX exports, and every test talks to the real server


@pytest.fixture(scope="module")
def tuned(tmp_path_factory: pytest.TempPathFactory):
    return [fit_with_encoder(e, f"v{i}") for i, e in enumerate(sharing_exports(tmp_path_factory.mktemp("blobs")))]


def _blob_keys(objects) -> set[str]:
    return {i.key for i in objects.list(BLOBS_PREFIX + "/")}


def test_a_second_push_uploads_no_blob_and_a_replica_downloads_only_the_small_files(objects, tmp_path, tuned):
    trainer = BucketRegistry(objects, ModelRegistry(tmp_path / "trainer"), by="trainer@test")
    trainer.publish(save_tuned(trainer.local, tuned[0], "v1"))
    keys = _blob_keys(objects)
    assert trainer.last_blobs.moved == len(keys) >= 1
    trainer.publish(save_tuned(trainer.local, tuned[1], "v2"))
    assert (trainer.last_blobs.moved, trainer.last_blobs.kept) == (0, len(keys)) and _blob_keys(objects) == keys
    assert not any(k.startswith("blobs/") for v in trainer.versions() for k in v.files)
    listed = {v.name: v for v in trainer.versions()}
    assert listed["v2"].blob_bytes > 0 and listed["v2"].bytes > 0
    etag = trainer.promote("v1", expected=None)

    replica = ModelRegistry(tmp_path / "replica")
    sync = RegistrySync(objects, replica)
    assert sync.poll() == "new" and sync.bucket.last_blobs.moved == len(keys)
    trainer.promote("v2", expected=etag)
    for key in keys:   # proof that the replica does not fetch them again: they are gone from the bucket
        objects.delete(key)
    assert sync.poll() == "new" and replica.current_name() == "v2"
    assert (sync.bucket.last_blobs.moved, sync.bucket.last_blobs.kept) == (0, len(keys))
    clf = Classifier.from_registry(replica.home, watch=False, teacher=None)
    assert clf.embedder.id == tuned[1].manifest.encoder["id"]
    assert clf.classify("show my invoices").model_version == "v2"


def test_a_tampered_or_missing_blob_in_the_bucket_is_refused(objects, tmp_path, tuned):
    trainer = BucketRegistry(objects, ModelRegistry(tmp_path / "trainer"), by="trainer@test")
    trainer.publish(save_tuned(trainer.local, tuned[0], "v1"))
    [key, *_] = sorted(_blob_keys(objects))
    tamper(objects, key)
    fresh = BucketRegistry(objects, ModelRegistry(tmp_path / "fresh"))
    with pytest.raises(ModelError, match=r"encoder blob .* of version 'v1' does not match its SHA-256"):
        fresh.download("v1")
    assert not fresh.local.version_dir("v1").exists()
    objects.delete(key)
    with pytest.raises(ModelError, match=r"missing \(an encoder blob of 'v1'\); cannot promote"):
        trainer.promote("v1", expected=None)


def test_a_bucket_prune_keeps_blobs_a_kept_version_names(objects, tmp_path, tuned):
    trainer = BucketRegistry(objects, ModelRegistry(tmp_path / "trainer"), by="trainer@test")
    trainer.blob_grace_s = 0.0
    trainer.publish(save_tuned(trainer.local, tuned[0], "v1"))
    trainer.publish(save_tuned(trainer.local, tuned[1], "v2"))
    keys = _blob_keys(objects)
    trainer.promote("v2", expected=None)
    assert trainer.prune(keep_promoted=0, keep_recent=1) == ["v1"]
    assert _blob_keys(objects) == keys
    objects.put(f"{BLOBS_PREFIX}/{'0' * 64}", b"named by nobody")
    trainer.prune(keep_promoted=0, keep_recent=1)
    assert _blob_keys(objects) == keys
