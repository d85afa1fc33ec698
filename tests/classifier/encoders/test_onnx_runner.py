"""The ONNX Runtime runner (``embedder.runtime: onnx``): export, verification, cache, fallback.

The tests build a tiny random BERT (2 layers, hidden 32) with a WordPiece tokenizer
in a temporary directory and point the MiniLM embedder at it (``minilm_model_dir`` is
patched) or save it as a sentence-transformers directory; one test exports the real
packaged MiniLM. Every test that runs an ONNX export (4-14 s each on 2 cores) is slow.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from flywheel.classifier.encoders import (  # noqa: E402
    MiniLMEmbedder,
    SentenceTransformerEmbedder,
    clear_loaded_models,
    embedders,
    make_embedder,
    onnx_runner,
    resolve_runtime,
)
from flywheel.classifier.encoders.onnx_runner import OnnxRunner, cache_key  # noqa: E402
from flywheel.classifier.encoders.torch_runner import MeanPoolRunner, SentenceTransformerRunner  # noqa: E402
from flywheel.classifier.errors import EmbedderError, IntentFileError  # noqa: E402
from flywheel.classifier.settings.intents import EmbedderSettings, parse_intents  # noqa: E402
from tests.support.tiny_encoder import TEXTS, build_tiny_bert  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]   # the repository (= tests.support.paths.ROOT)

def _cos(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_bert(tmp_path_factory.mktemp("models") / "tiny-bert")


@pytest.fixture(autouse=True)
def _fresh_registry():
    """Tiny models share registry keys with the real MiniLM: start and end with an empty registry."""
    clear_loaded_models()
    yield
    clear_loaded_models()


@pytest.fixture
def tiny_minilm(tiny_bert: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(embedders, "minilm_model_dir", lambda: tiny_bert)
    return tiny_bert


def _onnx(cache: Path, **kw) -> MiniLMEmbedder:
    return MiniLMEmbedder(device="cpu", runtime="onnx", onnx_cache_dir=cache, num_threads=1, **kw)


def _entries(cache: Path) -> list[Path]:
    return sorted(p for p in cache.iterdir() if not p.name.startswith(".")) if cache.is_dir() else []


# --------------------------------------------------------------------------- export, verify, cache


@pytest.mark.slow   # an ONNX export
def test_export_verifies_caches_and_second_load_hits_the_cache(tiny_minilm: Path, tmp_path: Path) -> None:
    cache = tmp_path / "onnx"
    before = dict(onnx_runner.STATS)
    emb = _onnx(cache).load()
    runner = emb._loaded
    assert isinstance(runner, OnnxRunner) and runner.uses_torch is False
    assert onnx_runner.STATS["exports"] == before["exports"] + 1
    [entry] = _entries(cache)
    assert {p.name for p in entry.iterdir()} == {"model.onnx", "tokenizer.json", "manifest.json"}
    manifest = json.loads((entry / "manifest.json").read_text())
    assert manifest["key"] == entry.name == cache_key(tiny_minilm)
    assert manifest["verified_min_cosine"] >= onnx_runner.MIN_COSINE
    assert manifest["inputs"] == ["input_ids", "attention_mask", "token_type_ids"]
    assert set(manifest["versions"]) >= {"torch", "transformers", "onnx", "onnxscript"}
    assert not [p for p in cache.iterdir() if p.name.startswith(".")]  # no temporary left behind

    clear_loaded_models()
    again = _onnx(cache).load()
    assert isinstance(again._loaded, OnnxRunner) and again._loaded is not runner
    assert onnx_runner.STATS["exports"] == before["exports"] + 1  # no re-export
    assert onnx_runner.STATS["cache_hits"] == before["cache_hits"] + 1


@pytest.mark.slow   # an ONNX export
@pytest.mark.parametrize("layers", [None, (1, 2)])
def test_served_vectors_match_torch(tiny_minilm: Path, tmp_path: Path, layers) -> None:
    torch_emb = MiniLMEmbedder(device="cpu", layers=layers, runtime="torch")
    onnx_emb = _onnx(tmp_path / "onnx", layers=layers)
    assert isinstance(onnx_emb._runner(), OnnxRunner)
    assert isinstance(torch_emb._runner(), MeanPoolRunner)
    for texts in (TEXTS, TEXTS[:1], ["x"]):
        a, b = onnx_emb.encode(texts), torch_emb.encode(texts)
        assert a.shape == b.shape == (len(texts), 32 * (len(layers) if layers else 1))
        assert a.dtype == np.float32 and a.flags["C_CONTIGUOUS"]
        np.testing.assert_allclose(np.linalg.norm(a, axis=1), 1.0, atol=1e-5)
        assert _cos(a, b).min() >= 0.9999
    batched, single = onnx_emb.encode(TEXTS), np.concatenate([onnx_emb.encode([t]) for t in TEXTS])
    assert _cos(batched, single).min() >= 0.9999  # padding does not leak into the mean


@pytest.mark.slow   # an ONNX export
def test_concurrent_encode_is_safe(tiny_minilm: Path, tmp_path: Path) -> None:
    emb = _onnx(tmp_path / "onnx").load()
    want = {t: emb.encode([t])[0] for t in TEXTS}
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(10):
                for t in TEXTS:
                    np.testing.assert_allclose(emb.encode([t])[0], want[t], atol=1e-5)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


@pytest.mark.slow   # an ONNX export
def test_int8_is_cached_separately_and_reports_its_cosine(tiny_minilm: Path, tmp_path: Path) -> None:
    cache = tmp_path / "onnx"
    emb = _onnx(cache, quantize=True).load()
    runner = emb._loaded
    assert isinstance(runner, OnnxRunner) and runner.path.name == "model.int8.onnx"
    [entry] = _entries(cache)
    assert (entry / "model.onnx").is_file() and (entry / "model.int8.onnx").is_file()
    cosine = json.loads((entry / "manifest.json").read_text())["int8"]["min_cosine_to_fp32"]
    assert 0.5 < cosine <= 1.0
    vecs = emb.encode(TEXTS)
    np.testing.assert_allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-5)
    clear_loaded_models()
    n = onnx_runner.STATS["quantizations"]
    assert isinstance(_onnx(cache, quantize=True)._runner(), OnnxRunner)
    assert onnx_runner.STATS["quantizations"] == n  # served from the cache


# --------------------------------------------------------------------------- failures fall back to torch


@pytest.mark.slow   # an ONNX export
def test_corrupt_cached_file_falls_back_to_torch_then_reexports(tiny_minilm: Path, tmp_path: Path,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    cache = tmp_path / "onnx"
    _onnx(cache).load()
    [entry] = _entries(cache)
    (entry / "model.onnx").write_bytes(b"not an onnx file")
    clear_loaded_models()
    with caplog.at_level(logging.WARNING, logger="flywheel.onnx"):
        emb = _onnx(cache)
        vecs = emb.encode(TEXTS)
    assert isinstance(emb._loaded, MeanPoolRunner)
    assert vecs.shape == (len(TEXTS), 32)
    assert any("unusable" in r.getMessage() and "torch" in r.getMessage() for r in caplog.records)
    assert not entry.exists()  # removed, so that the next load exports afresh
    clear_loaded_models()
    n = onnx_runner.STATS["exports"]
    assert isinstance(_onnx(cache)._runner(), OnnxRunner)
    assert onnx_runner.STATS["exports"] == n + 1


@pytest.mark.slow   # an ONNX export
def test_cached_file_with_wrong_vectors_is_refused(tiny_minilm: Path, tmp_path: Path,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    cache = tmp_path / "onnx"
    _onnx(cache).load()
    [entry] = _entries(cache)
    manifest = json.loads((entry / "manifest.json").read_text())
    manifest["probe_fp32"] = [-x for x in manifest["probe_fp32"]]  # as if the graph's weights had changed
    (entry / "manifest.json").write_text(json.dumps(manifest))
    clear_loaded_models()
    with caplog.at_level(logging.WARNING, logger="flywheel.onnx"):
        assert isinstance(_onnx(cache)._runner(), MeanPoolRunner)
    assert any("probe vector changed" in r.getMessage() for r in caplog.records)


def test_failing_export_falls_back_to_torch_and_caches_nothing(tiny_minilm: Path, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    def boom(*args, **kwargs):
        raise RuntimeError("exporter exploded")

    monkeypatch.setattr(onnx_runner, "_export", boom)
    cache = tmp_path / "onnx"
    with caplog.at_level(logging.WARNING, logger="flywheel.onnx"):
        emb = _onnx(cache)
        vecs = emb.encode(TEXTS)
    assert isinstance(emb._loaded, MeanPoolRunner) and vecs.shape == (len(TEXTS), 32)
    assert any("exporter exploded" in r.getMessage() and "torch" in r.getMessage() for r in caplog.records)
    assert not list(cache.iterdir())  # no entry, no temporary


@pytest.mark.slow   # an ONNX export
def test_export_that_disagrees_with_torch_is_refused(tiny_minilm: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(onnx_runner, "MIN_COSINE", 1.5)  # no export can pass
    cache = tmp_path / "onnx"
    with caplog.at_level(logging.WARNING, logger="flywheel.onnx"):
        assert isinstance(_onnx(cache)._runner(), MeanPoolRunner)
    assert any("disagrees with torch" in r.getMessage() for r in caplog.records)
    assert not list(cache.iterdir())


# --------------------------------------------------------------------------- cache key, torch-free serving


def test_cache_key_changes_when_the_weights_change(tmp_path: Path) -> None:
    a = build_tiny_bert(tmp_path / "m", seed=0)
    key = cache_key(a)
    assert cache_key(a) == key
    assert cache_key(a, layers=(1, 2)) != key and cache_key(a, pooling="cls") != key
    build_tiny_bert(tmp_path / "m", seed=1)  # same files, new weights
    assert cache_key(a) != key


@pytest.mark.slow   # an ONNX export and a process
def test_cached_export_serves_without_importing_torch(tiny_minilm: Path, tmp_path: Path) -> None:
    cache = tmp_path / "onnx"
    want = _onnx(cache).encode(["hola"])
    code = (
        "import sys, json, numpy as np\n"
        "from flywheel.classifier.encoders.onnx_runner import load_onnx_runner, OnnxRunner\n"
        "def no(): raise AssertionError('torch needed')\n"
        f"r = load_onnx_runner({str(tiny_minilm)!r}, reference=no, fallback=no, max_length=128, "
        f"cache_dir={str(cache)!r}, num_threads=1)\n"
        "assert isinstance(r, OnnxRunner)\n"
        "print(json.dumps({'vec': r.encode_batch(['hola'])[0].tolist(), "
        "'heavy': [m for m in ('torch', 'transformers', 'sentence_transformers') if m in sys.modules]}))\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout.strip().splitlines()[-1])
    assert doc["heavy"] == []
    assert _cos(np.asarray([doc["vec"]]), want)[0] >= 0.9999


# --------------------------------------------------------------------------- sentence-transformers directories


@pytest.mark.slow   # an ONNX export
@pytest.mark.parametrize("mode", ["mean", "cls"])
def test_sentence_transformers_dir_runs_on_onnx(tiny_bert: Path, tmp_path: Path, mode: str) -> None:
    from sentence_transformers import SentenceTransformer

    try:  # sentence-transformers >= 6
        from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer
    except ImportError:  # pragma: no cover - older releases
        from sentence_transformers.models import Normalize, Pooling, Transformer

    transformer = Transformer(str(tiny_bert), max_seq_length=128)
    st = SentenceTransformer(modules=[transformer, Pooling(32, pooling_mode=mode), Normalize()], device="cpu")
    st.save(str(tmp_path / f"st-{mode}"))
    onnx_emb = SentenceTransformerEmbedder(tmp_path / f"st-{mode}", device="cpu", runtime="onnx",
                                           onnx_cache_dir=tmp_path / "onnx")
    torch_emb = SentenceTransformerEmbedder(tmp_path / f"st-{mode}", device="cpu", runtime="torch")
    assert isinstance(onnx_emb._runner(), OnnxRunner)
    assert isinstance(torch_emb._runner(), SentenceTransformerRunner)
    assert onnx_emb._loaded.pooling == mode
    assert _cos(onnx_emb.encode(TEXTS), torch_emb.encode(TEXTS)).min() >= 0.9999


# --------------------------------------------------------------------------- settings


def test_runtime_setting_validates_in_intent_files_and_make_embedder(tmp_path: Path) -> None:
    base = {"intents": [{"name": "A", "examples": ["alpha one", "alpha two"]},
                        {"name": "B", "examples": ["beta one", "beta two"]}]}
    s = parse_intents({**base, "embedder": {"runtime": "onnx", "num_threads": 1}})
    assert s.embedder.runtime == "onnx"
    assert parse_intents(base).embedder.runtime == "auto"
    with pytest.raises(IntentFileError, match="embedder.runtime") as ei:
        parse_intents({**base, "embedder": {"runtime": "tpu"}})
    assert "tpu" in str(ei.value)
    inner = make_embedder(s.embedder, cache=False)
    assert isinstance(inner, MiniLMEmbedder) and inner.runtime == "onnx" and not inner.is_loaded
    with pytest.raises(EmbedderError, match="runtime"):
        MiniLMEmbedder(runtime="tpu")
    with pytest.raises(EmbedderError, match="CPU only"):
        MiniLMEmbedder(runtime="onnx", device="cuda")


@pytest.mark.parametrize("runtime, device, expected", [
    ("auto", None, "onnx"), ("auto", "cpu", "onnx"), ("auto", "auto", "onnx"), ("auto", "cuda", "torch"),
    ("auto", "cuda:1", "torch"), ("torch", None, "torch"), ("onnx", "cpu", "onnx"), (None, None, "onnx"),
])
def test_auto_runtime_is_onnx_on_cpu_and_torch_on_a_gpu(runtime, device, expected) -> None:
    assert resolve_runtime(runtime, device) == expected
    assert MiniLMEmbedder(runtime=runtime or "auto", device=device).runtime == expected


def test_auto_runtime_is_torch_without_onnxruntime(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "onnxruntime" else real(name, *a))
    assert resolve_runtime("auto", None) == "torch"
    assert make_embedder(EmbedderSettings(), cache=False).runtime == "torch"


def test_the_default_settings_serve_minilm_on_onnx() -> None:
    assert make_embedder(EmbedderSettings(), cache=False).runtime == "onnx"
    assert parse_intents({"intents": [{"name": "A", "examples": ["alpha one", "alpha two"]},
                                      {"name": "B", "examples": ["beta one", "beta two"]}]}).embedder.runtime == "auto"


def test_onnx_cache_is_the_machines_not_the_homes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLYWHEEL_ONNX_CACHE", str(tmp_path / "shared"))
    assert onnx_runner.default_cache_dir() == tmp_path / "shared"
    monkeypatch.delenv("FLYWHEEL_ONNX_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))   # platformdirs' user cache dir on Linux
    for home in ("one", "two"):
        monkeypatch.setenv("FLYWHEEL_HOME", str(tmp_path / home))
        assert onnx_runner.default_cache_dir() == tmp_path / "xdg" / "flywheel" / "onnx"


@pytest.mark.slow   # an ONNX export
def test_a_new_home_reuses_the_export_and_only_the_export_says_so(
        tiny_minilm: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    """The first use exports once, saying so on stderr; two loads at once (other thread
    counts: two registry entries) export once, and a second home exports nothing."""
    monkeypatch.delenv("FLYWHEEL_ONNX_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("FLYWHEEL_HOME", str(tmp_path / "home-one"))
    before = dict(onnx_runner.STATS)
    runners: list[object] = []
    threads = [threading.Thread(target=lambda n=n: runners.append(
        MiniLMEmbedder(device="cpu", runtime="onnx", num_threads=n).load()._loaded)) for n in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    cache = tmp_path / "xdg" / "flywheel" / "onnx"
    assert all(isinstance(r, OnnxRunner) for r in runners) and len(_entries(cache)) == 1
    assert onnx_runner.STATS["exports"] - before["exports"] == 1
    entry = _entries(cache)[0]
    mtime = (entry / "model.onnx").stat().st_mtime_ns
    err = capfd.readouterr().err
    assert err.count(f"flywheel: exporting {tiny_minilm} to ONNX once (about a minute); "
                     f"cached in {cache}") == 1, err

    clear_loaded_models()
    monkeypatch.setenv("FLYWHEEL_HOME", str(tmp_path / "home-two"))
    emb = make_embedder(EmbedderSettings(runtime="onnx", quantize=False, num_threads=1), cache=False).load()
    assert isinstance(emb._loaded, OnnxRunner) and emb._loaded.entry == entry
    assert onnx_runner.STATS["exports"] - before["exports"] == 1
    assert (entry / "model.onnx").stat().st_mtime_ns == mtime
    assert "exporting" not in capfd.readouterr().err


# --------------------------------------------------------------------------- the real MiniLM


@pytest.mark.slow
def test_real_minilm_export_matches_torch(tmp_path: Path) -> None:
    sentences = [
        "how do I reset my password", "I forgot my password, how can I change it?", "cancel my last order",
        "what's the weather going to be like in Paris tomorrow", "book me a table for two at an italian place",
        "¿Cuál es el saldo de mi cuenta?", "quiero devolver estos zapatos", "hi", "thanks!", "ok",
        "transfer $250 from checking to savings", "my card was declined at the gas station",
        "play some jazz", "set an alarm for 6:45 am", "what is the capital of Australia",
        "tell me a joke about penguins", "the package arrived damaged and the box was wet",
        "can you translate 'good morning' into Japanese", "how many calories are in an avocado",
        "Lorem ipsum dolor sit amet, consectetur adipiscing elit. " * 40,
    ]
    assert len(sentences) == 20
    emb = MiniLMEmbedder(device="cpu", runtime="onnx", onnx_cache_dir=tmp_path / "onnx", num_threads=1).load()
    assert isinstance(emb._loaded, OnnxRunner)
    assert emb._loaded.manifest["verified_min_cosine"] >= onnx_runner.MIN_COSINE
    ref = MiniLMEmbedder(device="cpu", pack_weights=False, runtime="torch")
    assert _cos(emb.encode(sentences), ref.encode(sentences)).min() >= 0.9999
    single = np.concatenate([emb.encode([s]) for s in sentences])
    assert _cos(single, ref.encode(sentences)).min() >= 0.9999
