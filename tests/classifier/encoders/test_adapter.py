"""A version's adapter on a fixed encoder (issue 22 item 5): written, hashed, served in
numpy over the version's own encoder settings, and refused when tampered with or when the
base encoder is not the one it was trained on."""

from __future__ import annotations

import json

import numpy as np
import pytest

import flywheel.classifier.encoders.factory as factory
from flywheel.classifier.encoders import VersionEncoderEmbedder, open_version_encoder
from flywheel.classifier.encoders.adapter import AdaptedEmbedder, apply_adapter, write_adapter
from flywheel.classifier.encoders.version_format import ADAPTER_FILE, MANIFEST, read_export
from flywheel.classifier.errors import EmbedderError, ModelError
from flywheel.classifier.layer2.fitter import fit_model
from flywheel.classifier.settings.intents import EmbedderSettings, parse_intents
from flywheel.classifier.versions.model import IntentModel
from tests.support.docs import DOC
from tests.support.fakes import HashEmbedder
from tests.support.version_encoders import flip_byte

TEXTS = ["where is my invoice", "write a python function", "hola, ¿qué tal?"]


def _arrays(dim: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (np.eye(dim, dtype=np.float32) + 0.05 * rng.standard_normal((dim, dim)).astype(np.float32),
            0.01 * rng.standard_normal(dim).astype(np.float32))


@pytest.fixture
def base():
    return HashEmbedder(64, id="fake:hash-64")


@pytest.fixture
def export(tmp_path, base):
    w, b = _arrays(base.dim)
    return write_adapter(tmp_path / "encoder", w, b, base, trained={"steps": 3})


def test_the_export_is_hashed_and_its_id_comes_from_the_arrays_and_the_base(tmp_path, base, export):
    assert export.id.startswith("adapted:") and export.dim == base.dim
    assert set(export.files) == {ADAPTER_FILE, MANIFEST}
    record = json.loads((export.path / MANIFEST).read_text())
    assert record["base_id"] == base.id and record["trained"] == {"steps": 3}
    w, b = _arrays(base.dim, seed=1)
    other = write_adapter(tmp_path / "other", w, b, base)
    assert other.id != export.id
    on_other_base = write_adapter(tmp_path / "third", *_arrays(base.dim), HashEmbedder(64, id="fake:other"))
    assert on_other_base.id != export.id


def test_served_vectors_are_the_adapted_base_vectors(base, export):
    served = AdaptedEmbedder(export.path, base)
    w, b = _arrays(base.dim)
    got = served.encode(TEXTS)
    np.testing.assert_allclose(got, apply_adapter(base.encode(TEXTS), w, b), atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    assert served.id == export.id and served.probe_cosine is not None and served.probe_cosine > 0.9999


def test_a_tampered_adapter_is_refused_on_load(base, export):
    flip_byte(export.path / ADAPTER_FILE, offset=-20)
    served = AdaptedEmbedder(export.path, base)          # the record still reads
    with pytest.raises(EmbedderError, match="corrupt or replaced"):
        served.encode(TEXTS)
    with pytest.raises(EmbedderError, match="do not match|corrupt"):
        read_export(export.path)


def test_another_base_encoder_is_refused_by_name(export):
    served = AdaptedEmbedder(export.path, HashEmbedder(64, id="fake:not-the-base"))
    with pytest.raises(EmbedderError, match="trained on encoder fake:hash-64.*fake:not-the-base"):
        served.encode(TEXTS)


def test_a_bad_shape_is_refused_when_written(tmp_path, base):
    with pytest.raises(EmbedderError, match="needs weight"):
        write_adapter(tmp_path / "e", np.eye(32, dtype=np.float32), np.zeros(32, np.float32), base)


def test_open_version_encoder_builds_the_adapter_on_the_settings_encoder(monkeypatch, base, export, tmp_path):
    seen = []

    def fake_make(settings, cache=True, **kw):
        seen.append(settings)
        return base

    monkeypatch.setattr(factory, "make_embedder", fake_make)
    served = open_version_encoder(export.path, EmbedderSettings(backend="use-multilingual"), num_threads=3)
    assert isinstance(served, AdaptedEmbedder) and served.id == export.id
    assert seen[0].backend == "use-multilingual" and seen[0].num_threads == 3
    with pytest.raises(EmbedderError, match="not a version encoder"):
        open_version_encoder(tmp_path, EmbedderSettings())


@pytest.mark.slow
def test_open_version_encoder_still_opens_a_tuned_export(tmp_path):
    from tests.support.version_encoders import tiny_export

    tuned = tiny_export(tmp_path, quantize=False)
    assert isinstance(open_version_encoder(tuned.path, EmbedderSettings()), VersionEncoderEmbedder)


def test_a_version_carries_its_adapter_hashed_and_refuses_a_tampered_one(tmp_path, base, export):
    served = AdaptedEmbedder(export.path, base)
    model = fit_model(parse_intents(DOC), embedder=served, version="v-adapted")
    model.encoder_dir = export.path
    out = model.save(tmp_path / "v-adapted")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["encoder"]["id"] == export.id
    assert set(manifest["encoder_files"]) == {f"encoder/{ADAPTER_FILE}", f"encoder/{MANIFEST}"}
    loaded = IntentModel.load(out)
    assert loaded.encoder_dir == out / "encoder"
    flip_byte(out / "encoder" / ADAPTER_FILE, offset=-20)
    with pytest.raises(ModelError, match="checksum does not match"):
        IntentModel.load(out)
