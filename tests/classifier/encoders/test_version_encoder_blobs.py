"""Tuned versions stay small (issue 34, item 2): the large initializers of a version's
encoder graph go to content-addressed blobs stored once per models home
(classifier/encoders/blobs.py). Two tuned versions whose embeddings did not move name one
blob: the second save stores none, both serve what their unsplit graphs serve, a prune of
one keeps the blob and of both removes it; a missing or altered blob is one clear error.

The encoders are tiny BERTs that differ in every layer but share their embeddings (what
e5's tuning with frozen word embeddings makes), split with a tiny threshold
(tests/support/version_encoders.py); every test exports them, so they are ``slow``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from flywheel.classifier.encoders import VersionEncoderEmbedder, export_encoder
from flywheel.classifier.encoders.blobs import BLOBS_DIR, version_storage
from flywheel.classifier.errors import EmbedderError, ModelError
from flywheel.classifier.versions.model import IntentModel
from flywheel.classifier.versions.registry import ModelRegistry
from tests.support.version_encoders import fit_with_encoder, flip_byte, save_tuned, sharing_exports

pytestmark = pytest.mark.slow

TEXTS = ["show my invoices", "¿dónde está mi pedido?", "cancel my last order"]


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory):
    """Two exports that share their embedding blobs, and the models fitted on them."""
    exports = sharing_exports(tmp_path_factory.mktemp("blobs"))
    return exports, [fit_with_encoder(e, f"v{i}") for i, e in enumerate(exports)]


def _blobs(home: Path) -> set[str]:
    return {p.name for p in (home / BLOBS_DIR).iterdir()} if (home / BLOBS_DIR).is_dir() else set()


def test_two_tuned_versions_store_one_embedding_blob_and_serve_as_before_the_split(shared, tmp_path: Path) -> None:
    exports, models = shared
    assert exports[0].id != exports[1].id                  # other layers, other ids
    names = [{b.name: b.sha256 for b in e.blobs} for e in exports]
    assert "model.embeddings.word_embeddings.weight_quantized" in names[0] and names[0] == names[1]
    reg = ModelRegistry(tmp_path / "home")
    save_tuned(reg, models[0], "v0")
    stored = _blobs(reg.home)
    assert stored == set(names[0].values())
    inodes = {p.name: p.stat().st_ino for p in (reg.home / BLOBS_DIR).iterdir()}
    save_tuned(reg, models[1], "v1")                        # the second save adds no blob, rewrites none
    assert {p.name: p.stat().st_ino for p in (reg.home / BLOBS_DIR).iterdir()} == inodes
    for i in (0, 1):
        version = reg.version_dir(f"v{i}")
        assert not any(p.name in stored for p in version.rglob("*"))   # the version holds no copy
        st = version_storage(version)
        assert st["blob_bytes"] == exports[i].blob_bytes > 0
        # what the same BERT serves unsplit (the default threshold keeps the tiny tables in the graph)
        whole = export_encoder(exports[i].path.parent / f"bert-tuned-{i}", tmp_path / f"whole-{i}", quantize=True)
        assert not whole.blobs and whole.id != exports[i].id
        loaded = IntentModel.load(version)
        got = VersionEncoderEmbedder(loaded.encoder_dir).encode(TEXTS)
        np.testing.assert_allclose(got, VersionEncoderEmbedder(whole.path).encode(TEXTS), atol=1e-6)
    assert version_storage(reg.version_dir("v1"), [reg.version_dir("v0")])["download_bytes"] == \
        version_storage(reg.version_dir("v1"))["own_bytes"]   # a replica serving v0 fetches no blob for v1


def test_pruning_keeps_a_blob_another_version_names_and_removes_it_with_the_last(shared, tmp_path: Path) -> None:
    _, models = shared
    reg = ModelRegistry(tmp_path / "home")
    reg.blob_grace_s = 0.0
    for name, model in (("v1", models[0]), ("v2", models[1]), ("v3", models[1])):
        save_tuned(reg, model, name)
    stored = _blobs(reg.home)
    reg.promote("v3")
    assert reg.prune(keep_promoted=0, keep_recent=0) == ["v1", "v2"]
    assert _blobs(reg.home) == stored                        # v3 still names them
    assert reg.load("v3").encoder_dir is not None
    (reg.home / "CURRENT").unlink()
    (reg.home / "HISTORY").unlink()
    assert reg.prune(keep_promoted=0, keep_recent=0) == ["v3"]
    assert _blobs(reg.home) == set()                         # nothing names them any more


def test_a_fresh_unnamed_blob_survives_a_prune_for_its_grace_period(shared, tmp_path: Path) -> None:
    _, models = shared
    reg = ModelRegistry(tmp_path / "home")
    save_tuned(reg, models[0], "v1")
    stored = _blobs(reg.home)
    shutil.rmtree(reg.version_dir("v1"))                     # as a save in progress would look: blobs, no version
    reg.prune(keep_promoted=0, keep_recent=0)
    assert _blobs(reg.home) == stored


def test_a_missing_or_altered_blob_is_one_clear_error_naming_the_blob_and_the_version(shared, tmp_path: Path) -> None:
    exports, models = shared
    reg = ModelRegistry(tmp_path / "home")
    save_tuned(reg, models[0], "v1")
    word = next(b for b in exports[0].blobs if "word_embeddings" in b.name)
    blob = reg.home / BLOBS_DIR / word.sha256
    flip_byte(blob, 10)
    with pytest.raises(EmbedderError, match=rf"version v1: encoder blob {word.sha256} .*does not match its SHA-256"):
        VersionEncoderEmbedder(reg.version_dir("v1") / "encoder").encode(TEXTS)
    with pytest.raises(ModelError, match=rf"version v1: encoder blob {word.sha256} .*does not match"):
        reg.promote("v1")
    blob.unlink()
    with pytest.raises(EmbedderError, match=rf"version v1: encoder blob {word.sha256} .*is missing"):
        VersionEncoderEmbedder(reg.version_dir("v1") / "encoder").encode(TEXTS)
    with pytest.raises(ModelError, match=r"is missing"):
        IntentModel.load(reg.version_dir("v1"))
    assert reg.current_name() is None


def test_the_id_covers_the_blobs_and_a_record_that_names_another_blob_is_refused(shared, tmp_path: Path) -> None:
    _, models = shared
    reg = ModelRegistry(tmp_path / "home")
    path = save_tuned(reg, models[0], "v1")
    record = path / "encoder" / "manifest.json"
    doc = json.loads(record.read_text(encoding="utf-8"))
    doc["blobs"][0]["sha256"] = "0" * 64                    # points the graph at other weights
    record.write_text(json.dumps(doc), encoding="utf-8")
    with pytest.raises(ModelError):
        IntentModel.load(path)
    with pytest.raises(EmbedderError, match="do not match the recorded id"):
        VersionEncoderEmbedder(path / "encoder").encode(TEXTS)


def test_publishing_into_another_home_brings_the_blobs_and_blobs_is_not_a_version_name(shared, tmp_path: Path) -> None:
    _, models = shared
    src = ModelRegistry(tmp_path / "trainer")
    save_tuned(src, models[0], "v1")
    dst = ModelRegistry(tmp_path / "other")
    assert dst.publish(src.version_dir("v1")) == "v1"
    assert _blobs(dst.home) == _blobs(src.home)
    assert dst.load("v1").encoder_dir == dst.version_dir("v1") / "encoder"
    with pytest.raises(ModelError, match="invalid version name"):
        dst.version_dir(BLOBS_DIR)
    assert [v.name for v in dst.versions()] == ["v1"]
