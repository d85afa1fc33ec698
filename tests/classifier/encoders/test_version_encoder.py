"""A model version that carries its own encoder (issue 22, item 2): the export into
``encoder/`` (checked against torch, int8 where it holds, a content id), the manifest's
hashes of those files, serving them without torch, and hot reload to and from such a
version (refused when its encoder is tampered with or does not verify).

The encoder is a tiny random BERT (tests/support/tiny_encoder.py); every test that exports
it to ONNX is ``slow`` (5-15 s each on 2 cores), the others check what needs no export.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from flywheel.classifier import Classifier
from flywheel.classifier.encoders import VersionEncoderEmbedder, export_encoder, onnx_runner
from flywheel.classifier.encoders.torch_runner import MeanPoolRunner
from flywheel.classifier.encoders.version_encoder import read_export
from flywheel.classifier.errors import EmbedderError, ModelError
from flywheel.classifier.layer2.fitter import fit_model
from flywheel.classifier.settings.intents import parse_intents
from flywheel.classifier.shadow import ShadowScorer
from flywheel.classifier.versions.model import IntentModel, Manifest, file_sha256
from flywheel.classifier.versions.registry import ModelRegistry
from tests.support.docs import ALWAYS_SURE, DOC
from tests.support.fakes import HashEmbedder, ListSink
from tests.support.paths import ROOT
from tests.support.servers import wait_for
from tests.support.tiny_encoder import TEXTS
from tests.support.version_encoders import fit_with_encoder, flip_byte, save_tuned, tiny_export

ENCODER_FILES = {"encoder/manifest.json", "encoder/model.int8.onnx", "encoder/tokenizer.json"}


def _cos(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory):
    """One tiny BERT exported with int8 (shared by the module's slow tests; never modified)."""
    return tiny_export(tmp_path_factory.mktemp("export"), seed=0, quantize=True)


@pytest.fixture(scope="module")
def tuned(exported):
    """DOC fitted on the export's vectors, carrying it."""
    return fit_with_encoder(exported)


def _hash_model(version: str, **thresholds: float) -> IntentModel:
    doc = {**DOC, "thresholds": thresholds} if thresholds else DOC
    return fit_model(parse_intents(doc), embedder=HashEmbedder(), version=version)


# ------------------------------------------------------------------------ without an export

def test_the_manifest_records_encoder_files_only_when_present_and_checks_their_names() -> None:
    m = _hash_model("v1").manifest
    assert "encoder_files" not in m.to_dict()     # an older replica reads exactly what it read before
    sha = "ab" * 32
    doc = {**m.to_dict(), "encoder_files": {"encoder/model.int8.onnx": sha, "encoder/tokenizer.json": sha}}
    files = Manifest.from_dict(doc).files()
    assert {"encoder/model.int8.onnx", "encoder/tokenizer.json"} <= set(files)
    assert files["encoder/tokenizer.json"] == sha
    assert Manifest.from_dict(doc).to_dict()["encoder_files"] == doc["encoder_files"]
    for bad in ({"encoder/../head.npz": sha}, {"encoder/sub/x.onnx": sha}, {"encoder/.hidden": sha},
                {"head.npz": sha}, {"/etc/passwd": sha}, {"encoder/model.onnx": "not-a-sha"}):
        with pytest.raises(ValueError, match="encoder_files"):
            Manifest.from_dict({**doc, "encoder_files": bad})


def test_export_refuses_what_is_not_a_model_and_a_directory_in_use(tmp_path: Path) -> None:
    with pytest.raises(EmbedderError, match="no config.json"):
        export_encoder(tmp_path, tmp_path / "enc", quantize=True)
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "file").write_text("x")
    with pytest.raises(EmbedderError, match="refusing to overwrite"):
        export_encoder(tmp_path / "m", tmp_path / "used", quantize=True)
    with pytest.raises(EmbedderError, match="mean pooling"):
        export_encoder(tmp_path / "m", tmp_path / "new", quantize=True, pooling="cls")
    with pytest.raises(EmbedderError, match="not a version encoder"):
        VersionEncoderEmbedder(tmp_path / "m")


def test_a_version_whose_encoder_cannot_be_built_is_refused_and_the_old_one_serves(tmp_path: Path) -> None:
    clf = Classifier(_hash_model("v1", **ALWAYS_SURE), embedder=HashEmbedder(), teacher=None)
    broken = _hash_model("v2", **ALWAYS_SURE)
    broken.manifest.encoder["id"] = "tuned:0123456789abcdef"
    broken.encoder_dir = tmp_path / "missing"          # no export there
    with pytest.raises(ModelError, match="v2"):
        clf.swap_model(broken)
    assert clf.model_version == "v1" and clf.classify("show my invoices").model_version == "v1"


def test_the_shadow_is_not_offered_vectors_of_another_encoder() -> None:
    scorer = ShadowScorer(lambda a: None)
    scorer.set_model(_hash_model("v-shadow"))
    try:
        vec = np.ones(256, dtype=np.float32) / 16.0
        scorer.offer("d1", vec, "v1", "tuned:0123456789abcdef")   # the champion moved to another encoder
        assert scorer.pending == 0
        scorer.offer("d2", vec, "v1", "fake:hash-256")
        scorer.offer("d3", vec, "v1")
        assert scorer.pending + scorer.counts["scored"] == 2
    finally:
        scorer.close()


@pytest.mark.slow   # an ONNX export
def test_a_shadow_with_its_own_encoder_encodes_its_share_on_the_worker(tuned, exported, tmp_path: Path) -> None:
    # issue 22 item 4: a shadow that carries a tuned encoder is no longer refused; the request
    # thread only queues the text, and the worker encodes it with the shadow's own export
    got: list = []
    champion = HashEmbedder()
    scorer = ShadowScorer(got.append, interval_s=0.01,
                          check_encoder=lambda m: m.check_encoder(champion.id, champion.dim))
    clf = Classifier(_hash_model("v1", **ALWAYS_SURE), embedder=champion, teacher=None, shadow=scorer)
    try:
        scorer.set_model(tuned)
        assert scorer.version == "v-tuned"
        queries = ["show my invoices", "write a function that adds two numbers", "how much quota is left"]
        decisions = [clf.classify(q) for q in queries]
        layer2 = [d for d in decisions if d.layer == "embedding"]
        assert layer2 and wait_for(lambda: len(got) == len(layer2), 10.0)
        own = VersionEncoderEmbedder(exported.path)
        want = {d.id: tuned.head.predict(own.encode([q]))[0] for d, q in zip(decisions, queries)
                if d.layer == "embedding"}
        assert {a.decision_id: a.label for a in got} == want and {a.version for a in got} == {"v-tuned"}
        assert scorer.counts["scored"] == len(layer2) and scorer.counts["error"] == 0
        scorer.offer("no-text", np.ones(256, np.float32) / 16, "v1", champion.id)   # no text: not offered
        assert scorer.pending == 0
        broken = dataclasses.replace(tuned, encoder_dir=tmp_path / "missing")   # an export that is not there
        with pytest.raises(ModelError, match="its own encoder cannot be loaded"):
            scorer.set_model(broken)
        assert scorer.version == "v-tuned"                 # the old shadow keeps scoring
    finally:
        clf.close()
        scorer.close()


# ------------------------------------------------------------------------ the export

@pytest.mark.slow   # an ONNX export (shared by the module)
def test_export_is_checked_against_torch_and_every_file_is_hashed(exported, tmp_path: Path) -> None:
    e = exported
    assert e.id.startswith("tuned:") and len(e.id) == len("tuned:") + 16
    assert e.served == "model.int8.onnx" and e.quantized and e.note == ""
    assert set(e.files) == {"manifest.json", "model.int8.onnx", "tokenizer.json"}   # only the served graph
    assert all(file_sha256(e.path / n) == sha for n, sha in e.files.items())
    assert e.cosine >= onnx_runner.MIN_COSINE and 0.95 <= e.int8_cosine <= 1.0 and e.dim == 32
    assert not [p for p in e.path.parent.iterdir() if p.name.startswith(".")]      # no temporary left
    record = json.loads((e.path / "manifest.json").read_text())
    assert record["encoder_id"] == e.id and record["served"] == "model.int8.onnx"
    assert record["int8"]["min_cosine_to_fp32"] == e.int8_cosine
    assert read_export(e.path) == e
    emb = VersionEncoderEmbedder(e.path, num_threads=1)
    assert emb.id == e.id and emb.dim == 32 and not emb.is_loaded
    got = emb.encode(TEXTS)
    assert emb.probe_cosine >= onnx_runner.MIN_COSINE
    ref = MeanPoolRunner(e.path.parent / record["source"], "cpu", False, False, 128, False)   # fp32 torch
    assert _cos(got, ref.encode_batch(TEXTS)).min() >= 0.99     # int8: close to fp32 torch, not equal
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)


@pytest.mark.slow   # two ONNX exports
def test_fp32_serves_when_int8_does_not_hold_and_the_id_follows_the_weights(exported, tmp_path: Path) -> None:
    strict = tiny_export(tmp_path, seed=0, quantize=True, int8_min_cosine=1.01)
    assert strict.served == "model.onnx" and not strict.quantized and "int8 min cosine" in strict.note
    assert set(strict.files) == {"manifest.json", "model.onnx", "tokenizer.json"}
    assert strict.id != exported.id                   # another graph file serves: another id
    ref = MeanPoolRunner(tmp_path / "bert-0", "cpu", False, False, 128, False)
    assert _cos(VersionEncoderEmbedder(strict.path).encode(TEXTS), ref.encode_batch(TEXTS)).min() >= 0.9999
    other = tiny_export(tmp_path, seed=1, quantize=False)   # the same recipe, other weights
    assert other.served == "model.onnx" and other.id not in (strict.id, exported.id)


@pytest.mark.slow   # an ONNX export, tampered with
def test_an_export_whose_files_or_probe_changed_is_refused(exported, tmp_path: Path) -> None:
    copy = Path(shutil.copytree(exported.path, tmp_path / "enc"))
    record = json.loads((copy / "manifest.json").read_text())
    record["int8"]["probe"] = [-x for x in record["int8"]["probe"]]      # as if the graph had changed
    record["probe_fp32"] = [-x for x in record["probe_fp32"]]
    (copy / "manifest.json").write_text(json.dumps(record))
    assert read_export(copy).id == exported.id         # the id is the files' content; the probe is checked on load
    with pytest.raises(EmbedderError, match="probe vector changed"):
        VersionEncoderEmbedder(copy).load()
    shutil.copy(exported.path / "manifest.json", copy / "manifest.json")
    flip_byte(copy / "model.int8.onnx")
    with pytest.raises(EmbedderError, match="do not match the recorded id"):
        read_export(copy)
    with pytest.raises(EmbedderError, match="do not match the recorded id"):
        VersionEncoderEmbedder(copy).load()


# ------------------------------------------------------------------------ the version

@pytest.mark.slow   # an ONNX export and a process
def test_a_version_with_its_encoder_is_hashed_whole_and_serves_without_torch(tuned, exported, tmp_path: Path) -> None:
    path = save_tuned(ModelRegistry(tmp_path), tuned, "v1")
    assert sorted(p.name for p in (path / "encoder").iterdir()) == ["manifest.json", "model.int8.onnx",
                                                                    "tokenizer.json"]
    doc = json.loads((path / "manifest.json").read_text())
    assert set(doc["encoder_files"]) == ENCODER_FILES and doc["encoder"]["id"] == exported.id
    assert all(file_sha256(path / n) == sha for n, sha in doc["encoder_files"].items())
    loaded = IntentModel.load(path)
    assert loaded.encoder_dir == path / "encoder" and ENCODER_FILES <= set(loaded.manifest.files())
    assert _hash_model("v0").encoder_dir is None

    clf = Classifier.load(path, teacher=None)
    assert clf.embedder.id == exported.id
    want = clf.classify("show my invoices")
    code = (
        "import sys, json\n"
        "from flywheel.classifier import Classifier\n"
        f"clf = Classifier.load({str(path)!r}, teacher=None)\n"
        "d = clf.classify('show my invoices')\n"
        "print(json.dumps({'label': d.label, 'confidence': d.confidence, 'encoder': clf.embedder.id,\n"
        "                  'heavy': [m for m in ('torch', 'transformers', 'sentence_transformers', 'sklearn')\n"
        "                            if m in sys.modules]}))\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["heavy"] == [] and got["encoder"] == exported.id
    assert got["label"] == want.label and got["confidence"] == pytest.approx(want.confidence, abs=1e-4)


@pytest.mark.slow   # an ONNX export
def test_save_refuses_an_encoder_the_head_was_not_trained_with(tuned, tmp_path: Path) -> None:
    other = IntentModel(tuned.intents, tuned.head, dataclasses.replace(tuned.manifest, version="v9",
                        encoder={**tuned.manifest.encoder, "id": "tuned:0000000000000000"}),
                        encoder_dir=tuned.encoder_dir)
    with pytest.raises(ModelError, match="not the one the head was trained with"):
        other.save(tmp_path / "v9")
    assert list(tmp_path.iterdir()) == []      # nothing half-written


@pytest.mark.slow   # an ONNX export
def test_a_tampered_encoder_is_refused_by_load_promote_and_hot_reload(tuned, exported, tmp_path: Path,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    reg = ModelRegistry(tmp_path)
    save_tuned(reg, tuned, "v1")
    reg.promote("v1")
    clf = Classifier.from_registry(tmp_path, interval_s=0.0, teacher=None)
    assert clf.classify("show my invoices").model_version == "v1" and clf.embedder.id == exported.id

    v2 = save_tuned(reg, tuned, "v2")
    flip_byte(v2 / "encoder" / "model.int8.onnx")
    with pytest.raises(ModelError, match=r"encoder/model\.int8\.onnx: checksum does not match"):
        IntentModel.load(v2)
    with pytest.raises(ModelError, match=r"encoder/model\.int8\.onnx"):
        reg.promote("v2")
    assert reg.current_name() == "v1"
    (tmp_path / "CURRENT").write_text("v2\n")          # promoted behind the registry's back
    with caplog.at_level("ERROR"):
        assert clf.classify("show my invoices").model_version == "v1"
    assert "v2" in clf.watcher.refused and "model.int8.onnx" in clf.watcher.refused["v2"]

    clf.close()

    # every hash matches, but the encoder does not verify when it is loaded (its probe vector
    # moved), seen from a classifier serving another encoder (one serving this id reuses it)
    other = ModelRegistry(tmp_path / "other")
    _hash_model("v0").save(other.version_dir("v0"))
    other.promote("v0")
    clf = Classifier.from_registry(other.home, embedder=HashEmbedder(), interval_s=0.0, teacher=None)
    bad = Path(shutil.copytree(exported.path, tmp_path / "bad-export"))
    record = json.loads((bad / "manifest.json").read_text())
    record["int8"]["probe"] = [-x for x in record["int8"]["probe"]]
    record["probe_fp32"] = [-x for x in record["probe_fp32"]]
    (bad / "manifest.json").write_text(json.dumps(record))
    save_tuned(other, dataclasses.replace(tuned, encoder_dir=bad), "v3")
    IntentModel.load(other.version_dir("v3"))           # loads: the swap is what checks the encoder
    (other.home / "CURRENT").write_text("v3\n")
    assert clf.classify("show my invoices").model_version == "v0"
    assert "probe vector changed" in clf.watcher.refused["v3"]
    assert clf.embedder.id == "fake:hash-256"
    clf.close()


@pytest.mark.slow   # an ONNX export
def test_hot_reload_from_a_base_encoder_version_to_a_tuned_one_fails_no_request(tuned, exported,
                                                                                tmp_path: Path) -> None:
    reg = ModelRegistry(tmp_path)
    _hash_model("v1").save(reg.version_dir("v1"))       # the base encoder (here: the fake one)
    reg.promote("v1")
    base = HashEmbedder()
    sink = ListSink()
    clf = Classifier.from_registry(tmp_path, embedder=base, interval_s=0.02, background=True, teacher=None,
                                   log_sink=sink)
    errors: list[BaseException] = []
    seen: set[str] = set()
    done = threading.Event()

    def worker(n: int) -> None:
        try:
            for i in range(5000):   # bounded; the main thread stops it after the swap
                if done.is_set():
                    return
                seen.add(clf.classify(f"show my invoices {n} {i % 7}").model_version)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(3)]
    try:
        for t in threads:
            t.start()
        save_tuned(reg, tuned, "v2")
        reg.promote("v2")
        wait_for(lambda: "v2" in seen, 10.0, step_s=0.01)   # bounded: a request served by the tuned version
        done.set()
        for t in threads:
            t.join(timeout=60)
        assert errors == [] and seen == {"v1", "v2"}
        assert clf.embedder.id == exported.id
        by_version = {}
        for r in sink.records:
            by_version.setdefault(r.decision.model_version, set()).add((r.encoder_id, r.embedding.shape[0]))
        assert by_version == {"v1": {("fake:hash-256", 256)}, "v2": {(exported.id, 32)}}

        _hash_model("v3").save(reg.version_dir("v3"))   # back to the base encoder: the caller's is reused
        reg.promote("v3")
        for _ in range(1000):
            if clf.model_version == "v3":
                break
            threading.Event().wait(0.01)
        assert clf.model_version == "v3" and clf.embedder is base
        assert clf.classify("show my invoices").model_version == "v3"
    finally:
        done.set()
        clf.close()


@pytest.mark.slow   # an ONNX export
def test_the_local_registry_publishes_installs_and_prunes_a_version_with_its_encoder(tuned, tmp_path: Path) -> None:
    elsewhere = save_tuned(ModelRegistry(tmp_path / "staging"), tuned, "v1")
    home = ModelRegistry(tmp_path / "home")
    assert home.publish(elsewhere) == "v1"
    assert IntentModel.load(home.version_dir("v1")).encoder_dir == home.version_dir("v1") / "encoder"
    download = tmp_path / "home" / ".v2.download-x"
    shutil.copytree(elsewhere, download)
    doc = json.loads((download / "manifest.json").read_text())
    (download / "manifest.json").write_text(json.dumps({**doc, "version": "v2"}))
    assert home.install("v2", download) == home.version_dir("v2") and not download.exists()
    assert (home.version_dir("v2") / "encoder" / "model.int8.onnx").is_file()
    home.promote("v2")
    assert home.prune(keep_promoted=0, keep_recent=0) == ["v1"]
    assert sorted(p.name for p in home.home.iterdir() if not p.name.startswith(".")) == ["CURRENT", "HISTORY", "v2"]
    bad = tmp_path / "home" / ".v3.download-y"
    shutil.copytree(elsewhere, bad)
    flip_byte(bad / "encoder" / "tokenizer.json", 10)
    with pytest.raises(ModelError, match=r"encoder/tokenizer\.json"):
        home.install("v1", bad)
    assert not bad.exists() and not home.version_dir("v1").exists()


@pytest.mark.slow   # an ONNX export
def test_models_shadow_accepts_a_version_that_carries_its_own_encoder(tuned, tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture) -> None:
    # issue 22 item 4: a shadow on another encoder is refused unless it carries that encoder
    from flywheel.cli import main

    home = ModelRegistry(tmp_path / "models")
    _hash_model("v1").save(home.version_dir("v1"))
    home.promote("v1")
    save_tuned(home, tuned, "v2")
    plain = _hash_model("v3")
    plain.manifest.encoder["id"] = "fake:other-encoder"     # another encoder, not carried
    plain.save(home.version_dir("v3"))
    assert main(["models", "shadow", "v3", "--models", str(home.home)]) == 2
    assert "must use the same encoder" in capsys.readouterr().err and home.shadow_name() is None
    assert main(["models", "shadow", "v2", "--models", str(home.home)]) == 0, capsys.readouterr().err
    assert home.shadow_name() == "v2"
