"""A version that carries its own encoder (``encoder/``) in the fleet's bucket, against the
real S3 server (tests/support/s3.py): published file by file with the manifest last,
listed, downloaded and verified by a replica, served from there, and refused when an
encoder file in the bucket was tampered with. The encoder is a tiny random BERT exported
once per module (tests/support/version_encoders.py)."""

from __future__ import annotations

import pytest

from flywheel.classifier import Classifier
from flywheel.classifier.errors import ModelError
from flywheel.classifier.versions.model import IntentModel
from flywheel.classifier.versions.registry import ModelRegistry
from flywheel.fleet.registry import DOWNLOAD_MARK, BucketRegistry
from flywheel.fleet.sync import RegistrySync
from tests.support.bucket import tamper
from tests.support.version_encoders import fit_with_encoder, save_tuned, tiny_export

pytestmark = pytest.mark.slow   # an ONNX export, and every test talks to the real server

ENCODER_FILES = ("encoder/manifest.json", "encoder/model.int8.onnx", "encoder/tokenizer.json")


@pytest.fixture(scope="module")
def tuned(tmp_path_factory: pytest.TempPathFactory):
    return fit_with_encoder(tiny_export(tmp_path_factory.mktemp("export"), seed=0, quantize=True))


def test_a_version_with_its_encoder_is_published_downloaded_verified_and_served(objects, tmp_path, tuned):
    trainer = BucketRegistry(objects, ModelRegistry(tmp_path / "trainer"), by="trainer@test")
    path = save_tuned(trainer.local, tuned, "v1")
    assert trainer.publish(path) == "v1"
    for f in ENCODER_FILES:
        assert objects.get(f"models/v1/{f}")[0] == (path / f).read_bytes()
    [listed] = trainer.versions()
    assert listed.valid and set(ENCODER_FILES) <= set(listed.files)
    trainer.promote("v1", expected=None)

    replica = ModelRegistry(tmp_path / "replica")
    sync = RegistrySync(objects, replica)
    assert sync.poll() == "new" and replica.current_name() == "v1"
    installed = replica.version_dir("v1")
    for f in ENCODER_FILES:
        assert (installed / f).read_bytes() == (path / f).read_bytes()
    assert IntentModel.load(installed).encoder_dir == installed / "encoder"
    assert not list(replica.home.glob(f".*{DOWNLOAD_MARK}*"))
    clf = Classifier.from_registry(replica.home, watch=False, teacher=None)
    assert clf.embedder.id == tuned.manifest.encoder["id"]
    assert clf.classify("show my invoices").model_version == "v1"


def test_a_tampered_encoder_file_in_the_bucket_is_refused_and_the_replica_keeps_serving(objects, tmp_path, tuned):
    trainer = BucketRegistry(objects, ModelRegistry(tmp_path / "trainer"), by="trainer@test")
    for name in ("v1", "v2"):
        trainer.publish(save_tuned(trainer.local, tuned, name))
    etag = trainer.promote("v1", expected=None)
    replica = ModelRegistry(tmp_path / "replica")
    sync = RegistrySync(objects, replica)
    assert sync.poll() == "new"

    tamper(objects, "models/v2/encoder/model.int8.onnx")
    fresh = BucketRegistry(objects, ModelRegistry(tmp_path / "fresh"))
    with pytest.raises(ModelError, match=r"encoder/model\.int8\.onnx: checksum does not match"):
        fresh.download("v2")
    assert not fresh.local.version_dir("v2").exists() and not list(fresh.local.home.glob(f".*{DOWNLOAD_MARK}*"))
    with pytest.raises(ModelError, match=r"encoder/model\.int8\.onnx: checksum does not match"):
        trainer.promote("v2", expected=etag)          # its own copy is intact, the bucket's bytes are checked

    trainer.promote("v2", expected=etag, verify=False)   # forced past that check (as a hand edit of CURRENT)
    assert sync.poll() == "refused" and "model.int8.onnx" in sync.refused["v2"]
    assert replica.current_name() == "v1" and not replica.version_dir("v2").exists()
