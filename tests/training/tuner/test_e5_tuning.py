"""Tuning the e5-multilingual encoder (issue 34 items 1-2): ``flywheel train --tune-encoder``
on a two-language intent file with ``embedder.backend: e5-multilingual`` tunes the converted
BertModel with e5's ``query: `` prefix and its word embeddings frozen, and writes a version
whose encoder records the prefix, serves with it, and carries the model's licence notice.

One conversion (about 25 s, shared with tests/classifier/encoders/test_e5.py's cache), a tuning of a
few seconds and an fp32 ONNX export of the 450 MB model: ``slow``."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

from flywheel.classifier.encoders import VersionEncoderEmbedder, e5_convert
from flywheel.cli import main
from flywheel.training.tuner import finetune

pytestmark = pytest.mark.slow

DOC = {
    "name": "bilingual",
    "languages": ["en", "es"],
    "embedder": {"backend": "e5-multilingual", "quantize": False,
                 "tune": {"budget_s": 10, "epochs": 1, "batch_size": 8, "calibration": "holdout"}},
    "intents": [
        {"name": "ORDER_STATUS", "examples": [
            "where is my order", "track my package", "has my parcel shipped", "when will my order arrive",
            "¿dónde está mi pedido?", "quiero rastrear mi paquete", "¿cuándo llega mi pedido?",
            "¿ya enviaron mi paquete?"]},
        {"name": "REFUND", "examples": [
            "i want my money back", "refund my purchase", "how do i get a refund", "return this item for cash",
            "quiero que me devuelvan el dinero", "¿cómo pido un reembolso?", "devuélveme mi dinero",
            "reembolso de mi compra"]},
    ],
    "out_of_scope": {"examples": ["what's the weather", "tell me a joke", "¿qué hora es?", "cuéntame un chiste"]},
}
TEXTS = ["where's my parcel right now", "¿me pueden reembolsar la compra?"]


def _word_embeddings(onnx_path):
    """The served graph's word-embedding table: from its shared blob (classifier.encoders.blobs),
    else from the graph itself."""
    import onnx
    from onnx import numpy_helper

    from flywheel.classifier.encoders.blobs import blob_refs, load_blobs

    manifest = json.loads((onnx_path.parent / "manifest.json").read_text())
    shared = load_blobs(onnx_path.parent, blob_refs(manifest))
    table = next((a for name, a in shared.items() if name.endswith("word_embeddings.weight")), None)
    if table is not None:
        return table
    model = onnx.load(str(onnx_path), load_external_data=False)
    return next(numpy_helper.to_array(t) for t in model.graph.initializer if t.name.endswith("word_embeddings.weight"))


def test_train_tune_encoder_tunes_e5_with_its_prefix_frozen_embeddings_and_licence(tmp_path, capsys, monkeypatch,
                                                                                  onnx_cache):
    intents = tmp_path / "intents.yaml"
    intents.write_text(yaml.safe_dump(DOC, allow_unicode=True), encoding="utf-8")
    out = tmp_path / "v-e5"
    rc = main(["train", "--intents", str(intents), "--out", str(out), "--tune-encoder", "--json"])
    _, err = capsys.readouterr()
    assert rc == 0, err

    manifest = json.loads((out / "manifest.json").read_text())
    tuning = manifest["metrics"]["encoder_tuning"]
    assert tuning["steps"] > 0 and tuning["query_prefix"] == "query: " and tuning["word_embeddings_frozen"]
    record = json.loads((out / "encoder" / "manifest.json").read_text())
    assert record["query_prefix"] == e5_convert.QUERY_PREFIX == "query: "
    assert "encoder/LICENSE-NOTICE.txt" in manifest["encoder_files"]
    assert "MIT" in (out / "encoder" / "LICENSE-NOTICE.txt").read_text()

    base = finetune.tunable_base(finetune_settings())
    served = VersionEncoderEmbedder(out / "encoder", num_threads=1)
    vectors = served.encode(TEXTS)
    runner = served._runner()
    raw = runner.inner.encode_batch(["query: " + t for t in TEXTS])   # serving adds exactly the prefix
    np.testing.assert_allclose(vectors, raw, atol=1e-6)

    from transformers import AutoModel, AutoTokenizer

    model = AutoModel.from_pretrained(str(base), local_files_only=True).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(base), local_files_only=True)
    frozen = finetune._encode(model, tokenizer, ["query: " + t for t in TEXTS], 64, "cpu")
    assert float(np.min(np.sum(frozen * vectors, axis=1))) < 0.9995        # the encoder was tuned
    assert np.array_equal(_word_embeddings(out / "encoder" / record["served"]),
                          model.get_input_embeddings().weight.detach().numpy())   # but not its word embeddings

    monkeypatch.setenv("FLYWHEEL_TEACHER", "off")
    rc = main(["classify", "--model", str(out), "--no-log", "¿dónde está mi paquete?"])
    stdout, err = capsys.readouterr()
    assert rc == 0, err
    assert json.loads(stdout.strip().splitlines()[-1])["model_version"] == "v-e5"


def finetune_settings():
    from flywheel.classifier.settings.intents import parse_intents

    return parse_intents(DOC).embedder
