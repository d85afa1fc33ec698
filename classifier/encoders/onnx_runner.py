"""ONNX Runtime runners for the encoders (``embedder.runtime: onnx``).

An encoder is exported once with torch's dynamo exporter, checked against the torch
runner it replaces, and cached on disk; later loads serve from the cached ``.onnx`` file
with ``onnxruntime`` and a ``tokenizers`` fast tokenizer, without importing torch or
transformers.

- **Export** (:func:`_export`): ``torch.onnx.export(..., dynamo=True)`` of the bare
  transformer, dynamic batch and sequence axes, inputs ``input_ids``/``attention_mask``
  (+ ``token_type_ids`` when the tokenizer produces them), outputs the hidden state(s)
  to pool. Pooling (masked mean or CLS) and L2 normalisation run in numpy, as the torch
  runners do. The legacy (TorchScript) exporter gave wrong vectors under transformers 5
  (cosine 0.93), so no export is trusted unchecked:
- **Verification**: every fresh export encodes :data:`PROBE` (short, long, truncated,
  Spanish...) one text at a time and as one padded batch; the minimum cosine to the fp32
  torch runner must be >= :data:`MIN_COSINE`, else the export is refused and never cached.
- **Cache**: ``<cache_dir>/<key>/`` with ``model.onnx``, ``tokenizer.json`` (the fast
  tokenizer transformers used, so serving needs no transformers) and ``manifest.json``
  (key, source, versions, verified cosine, a probe vector). The whole directory is
  built under a temporary name and renamed into place, so a reader never sees half an
  export. ``cache_dir`` defaults to :func:`default_cache_dir`, one cache for every home
  on the machine; a file lock per entry keeps two processes from exporting it at once,
  and the one that exports says so on stderr first. See :func:`cache_key`.
- **Cache hits** re-encode the probe text and compare it to the manifest's vector (one
  forward pass), which catches a corrupt or foreign file without torch.
- **int8** (``quantize: true``): ``onnxruntime.quantization.quantize_dynamic`` of the
  verified fp32 file, cached beside it as ``model.int8.onnx``; its cosine to fp32 on the
  probe set is recorded in the manifest, not held to :data:`MIN_COSINE`.
- **Any failure** (export exception, failed check, corrupt cache, missing package) is
  logged as a warning and the embedder is served by the torch runner instead.
- **Model versions** that carry their own (fine-tuned) encoder are exported and checked by
  the same two steps (:func:`export_checked`, :func:`quantize_export`) into the version's
  ``encoder/`` directory instead of a cache entry: :mod:`classifier.encoders.version_encoder`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from flywheel.classifier.encoders.base import Runner

__all__ = ["OnnxRunner", "load_onnx_runner", "cache_key", "default_cache_dir", "export_checked",
           "quantize_export", "PROBE", "MIN_COSINE", "STATS"]

log = logging.getLogger("flywheel.onnx")

#: Bump when the export recipe changes: it is part of every cache key.
FORMAT = 1
#: Minimum cosine, over the probe set, between a fresh fp32 export and torch.
MIN_COSINE = 0.9999
#: the cache entry's record of what was exported (not the model version's manifest)
MANIFEST = "manifest.json"
#: The exporter chain whose versions key the cache (read from package metadata: no import).
_EXPORT_PACKAGES = ("torch", "transformers", "onnx", "onnxscript")
#: Files up to this size are fingerprinted by content, larger ones (weights) by name, size, mtime.
_HASH_CONTENT_MAX = 16 * 2**20
_SKIP_FILES = {".gitattributes", "README.md"}

PROBE: tuple[str, ...] = (
    "hi",
    "ok",
    "how do I reset my password",
    "Cancel my last order, please!!",
    "what's the weather going to be like in Paris tomorrow afternoon?",
    "¿Cuál es el saldo de mi cuenta de ahorros?",
    "Quiero cambiar la dirección de envío de mi pedido número 48213.",
    "book a table for 2 at 7:30pm — ideally somewhere quiet 🍝",
    "ERROR 503: upstream connect error or disconnect/reset before headers",
    "The quick brown fox jumps over the lazy dog. " * 3,
    # longer than any max_length we use: exercises truncation and long sequences
    "Por favor, revisa todos los cargos de mi tarjeta del último mes y dime cuáles no reconoces; "
    "I think several of them are duplicates from the same merchant. " * 20,
    "a",
)
_PROBE_TEXT = "flywheel onnx probe: how do I transfer money to my savings account?"

#: Counters for tests and diagnostics: fresh exports, cache hits, int8 conversions, fallbacks to torch.
STATS = {"exports": 0, "cache_hits": 0, "quantizations": 0, "fallbacks": 0}
_STATS_LOCK = threading.Lock()


def _count(name: str) -> None:
    with _STATS_LOCK:
        STATS[name] += 1


def default_cache_dir() -> Path:
    """``FLYWHEEL_ONNX_CACHE`` when set, else ``onnx/`` in the user cache directory
    (platformdirs: ``~/.cache/flywheel/onnx`` on Linux). One cache for every home on the
    machine: an entry is keyed by the content it was exported from (:func:`cache_key`), so
    a new home never exports the same encoder again."""
    shared = os.environ.get("FLYWHEEL_ONNX_CACHE")
    if shared:
        return Path(shared).expanduser()
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("flywheel", appauthor=False)) / "onnx"


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "missing"


def _fingerprint(source: Path) -> list[list[Any]]:
    """One row per file under ``source``: small files by content hash, big ones by stat.

    Weight files are fingerprinted by (name, size, mtime_ns) rather than by content:
    hashing bge-m3's 2.2 GB on every load would cost seconds, and any rewrite of a weight
    file (save_pretrained, pip reinstall, a copy) changes its mtime, so the only risk is
    a spurious re-export, never serving stale weights short of a same-size copy that
    preserves mtimes. Configs and tokenizer files are small and hashed by content.
    """
    rows: list[list[Any]] = []
    for p in sorted(source.rglob("*")):
        rel = p.relative_to(source).as_posix()
        if not p.is_file() or p.name in _SKIP_FILES or p.name.startswith("."):
            continue
        if rel.startswith("onnx/"):  # ONNX copies some repos ship: not what we export from
            continue
        st = p.stat()
        if st.st_size <= _HASH_CONTENT_MAX:
            rows.append([rel, st.st_size, hashlib.sha256(p.read_bytes()).hexdigest()])
        else:
            rows.append([rel, st.st_size, st.st_mtime_ns])
    return rows


def cache_key(source: str | os.PathLike[str], pooling: str = "mean", layers: Sequence[int] | None = None) -> str:
    """The cache key of one export: the source files' fingerprint (see :func:`_fingerprint`),
    the export recipe (pooling, layers, :data:`FORMAT`) and the exporter chain's versions."""
    source = Path(source)
    doc = {"format": FORMAT, "pooling": pooling, "layers": list(layers) if layers else None,
           "versions": {p: _version(p) for p in _EXPORT_PACKAGES}, "files": _fingerprint(source)}
    digest = hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:20]
    return f"{source.name[:40]}-{digest}"


def _write_json_atomic(path: Path, doc: dict[str, Any]) -> None:
    fd, tmp = tempfile.mkstemp(prefix=".manifest-", dir=path.parent)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(doc, fh, indent=1)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def _unit_rows(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)  # torch.nn.functional.normalize


def _min_cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float((_unit_rows(a) * _unit_rows(b)).sum(axis=1).min())


class OnnxRunner(Runner):
    """One cached ONNX export served by ``onnxruntime`` (CPU) with a ``tokenizers`` tokenizer.

    Imports neither torch nor transformers. ``encode_batch`` is thread-safe: ORT sessions
    allow concurrent ``run`` calls and the tokenizer is configured once, then only read.
    """

    uses_torch = False  # _LazyEmbedder must not call torch.set_num_threads for this one
    runtime = "onnx"

    def __init__(self, entry: Path, model_file: str, max_length: int | None, num_threads: int | None, *,
                 initializers: dict[str, np.ndarray] | None = None) -> None:
        """``initializers``: arrays for the graph's external initializers (a version's shared
        blobs, :mod:`~classifier.encoders.blobs`), kept alive with the session."""
        import onnxruntime as ort
        from tokenizers import Tokenizer

        self.entry = entry
        self.manifest = json.loads((entry / MANIFEST).read_text(encoding="utf-8"))
        m = self.manifest
        self.path = entry / model_file
        self.max_length = int(max_length or m["max_length"])
        tok = Tokenizer.from_file(str(entry / "tokenizer.json"))
        tok.no_padding()
        tok.no_truncation()
        tok.enable_truncation(self.max_length)
        tok.enable_padding(pad_id=int(m["pad_id"]), pad_token=m["pad_token"], pad_type_id=int(m["pad_type_id"]),
                           direction=m.get("padding_side", "right"))
        self.tokenizer = tok
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = int(num_threads or 0)  # 0: onnxruntime's default (physical cores)
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.log_severity_level = 3
        self._external = [ort.OrtValue.ortvalue_from_numpy(a) for a in (initializers or {}).values()]
        if self._external:
            opts.add_external_initializers(list(initializers or {}), self._external)
        self._arrays = initializers
        self.session = ort.InferenceSession(str(self.path), sess_options=opts, providers=["CPUExecutionProvider"])
        self.model = self.session
        self.inputs = [i.name for i in self.session.get_inputs()]
        self.outputs = [o.name for o in self.session.get_outputs()]
        if self.inputs != m["inputs"] or self.outputs != m["outputs"]:
            raise ValueError(f"{self.path.name} has inputs {self.inputs} / outputs {self.outputs}, "
                             f"the manifest says {m['inputs']} / {m['outputs']}")
        self.pooling = m["pooling"]
        self.dim = int(m["dim"])

    def encode_batch(self, texts: list[str]) -> np.ndarray:
        encs = self.tokenizer.encode_batch(texts)
        ids = np.array([e.ids for e in encs], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encs], dtype=np.int64)
        feeds = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in self.inputs:
            feeds["token_type_ids"] = np.array([e.type_ids for e in encs], dtype=np.int64)
        states = self.session.run(self.outputs, feeds)
        if self.pooling == "cls":
            parts = [_unit_rows(h[:, 0].astype(np.float32)) for h in states]
        else:
            w = mask[:, :, None].astype(np.float32)
            denom = np.maximum(w.sum(axis=1), 1e-9)
            parts = [_unit_rows((h * w).sum(axis=1) / denom) for h in states]
        out = parts[0] if len(parts) == 1 else _unit_rows(np.concatenate(parts, axis=-1))
        return np.ascontiguousarray(out, dtype=np.float32)

    def probe_cosine(self, expected: Sequence[float]) -> float:
        """Cosine of the probe text's vector now to ``expected`` (recorded at export)."""
        return _min_cosine(self.encode_batch([_PROBE_TEXT]), np.asarray(expected, dtype=np.float32)[None, :])


def _hidden_module(model: Any, inputs: list[str], layers: tuple[int, ...] | None) -> Any:
    import torch

    class HiddenStates(torch.nn.Module):
        """The transformer, returning the hidden state(s) to pool as plain tensors."""

        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    token_type_ids: torch.Tensor | None = None) -> Any:
            feeds = {"input_ids": input_ids, "attention_mask": attention_mask}
            if token_type_ids is not None:
                feeds["token_type_ids"] = token_type_ids
            out = self.model(**feeds, output_hidden_states=layers is not None)
            if layers is None:
                return out.last_hidden_state
            return tuple(out.hidden_states[i] for i in layers)

    return HiddenStates().eval()


def _export(tmp: Path, source: Path, reference: Runner, hf_model: Any, hf_tokenizer: Any,
            pooling: str, layers: tuple[int, ...] | None, max_length: int | None) -> dict[str, Any]:
    """Export ``hf_model`` into ``tmp/model.onnx`` (+ tokenizer.json); return the manifest fields."""
    import torch

    max_length = max_length or getattr(reference, "max_length", None)
    if not max_length:
        raise ValueError("no max_length: neither given nor known to the torch runner")
    backend = getattr(hf_tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise ValueError("runtime onnx needs a fast (tokenizers) tokenizer; this model only has a slow one")
    backend.save(str(tmp / "tokenizer.json"))
    names = list(getattr(hf_tokenizer, "model_input_names", ["input_ids", "attention_mask"]))
    inputs = [n for n in ("input_ids", "attention_mask", "token_type_ids") if n in names]
    if inputs[:2] != ["input_ids", "attention_mask"]:
        raise ValueError(f"unexpected tokenizer inputs {names}")
    outputs = ["last_hidden_state"] if layers is None else [f"hidden_state_{i}" for i in layers]
    batch = hf_tokenizer(["an example input", "a somewhat longer example input for the exporter"],
                         padding=True, return_tensors="pt")
    kwargs = {n: batch[n] for n in inputs}
    dim_b, dim_s = torch.export.Dim("batch"), torch.export.Dim("sequence")
    module = _hidden_module(hf_model, inputs, layers)
    t0 = time.perf_counter()
    # "torchvision is not installed. Skipping ..." and the optimizer's per-pass INFO lines
    quiet = [logging.getLogger(n) for n in ("torch.onnx", "onnx_ir", "onnxscript")]
    levels = [q.level for q in quiet]
    for q in quiet:
        q.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            program = torch.onnx.export(module, (), kwargs=kwargs, dynamo=True, input_names=inputs,
                                        output_names=outputs, dynamic_shapes={n: {0: dim_b, 1: dim_s} for n in inputs},
                                        verbose=False)
            if program is None:  # only the legacy exporter (dynamo=False) returns None
                raise RuntimeError("torch.onnx.export returned no program")
            program.save(str(tmp / "model.onnx"))
    finally:
        for q, level in zip(quiet, levels, strict=True):
            q.setLevel(level)
    export_s = time.perf_counter() - t0
    return {
        "inputs": inputs, "outputs": outputs, "pooling": pooling, "layers": list(layers) if layers else None,
        "dim": int(reference.dim), "max_length": int(max_length),
        "pad_id": int(hf_tokenizer.pad_token_id), "pad_token": str(hf_tokenizer.pad_token),
        "pad_type_id": int(getattr(hf_tokenizer, "pad_token_type_id", 0) or 0),
        "padding_side": str(getattr(hf_tokenizer, "padding_side", "right")),
        "export_seconds": round(export_s, 3),
    }


def _verify(runner: Runner, reference: Runner) -> float:
    """Minimum cosine between ``runner`` and ``reference`` on :data:`PROBE`, one by one and batched."""
    texts = list(PROBE)
    single = np.concatenate([runner.encode_batch([t]) for t in texts])
    ref_single = np.concatenate([reference.encode_batch([t]) for t in texts])
    return min(_min_cosine(single, ref_single), _min_cosine(runner.encode_batch(texts), reference.encode_batch(texts)))


def export_checked(directory: Path, source: Path, reference_factory: Callable[[], tuple[Runner, Any, Any]], *,
                   pooling: str, layers: tuple[int, ...] | None, max_length: int | None,
                   num_threads: int | None, record: dict[str, Any] | None = None) -> tuple[dict[str, Any], float]:
    """Export ``source`` into the existing, empty ``directory`` (``model.onnx``,
    ``tokenizer.json``, ``manifest.json`` with ``record``'s fields added) and verify it
    against the fp32 torch runner on :data:`PROBE`; return ``(manifest, min cosine)``.

    Raises ValueError when the export disagrees with torch (min cosine < :data:`MIN_COSINE`),
    and whatever the exporter raises. Installing ``directory`` is the caller's: the ONNX
    cache renames it into place (:func:`load_onnx_runner`), a model version's encoder is
    exported this way too (:func:`classifier.encoders.version_encoder.export_encoder`)."""
    reference, hf_model, hf_tokenizer = reference_factory()
    manifest = _export(directory, source, reference, hf_model, hf_tokenizer, pooling, layers, max_length)
    _count("exports")
    manifest.update({
        **(record or {}), "format": FORMAT,
        "versions": {p: _version(p) for p in (*_EXPORT_PACKAGES, "onnxruntime")},
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    })
    _write_json_atomic(directory / MANIFEST, manifest)
    runner = OnnxRunner(directory, "model.onnx", manifest["max_length"], num_threads)
    cosine = _verify(runner, reference)
    if not cosine >= MIN_COSINE:
        raise ValueError(f"the export disagrees with torch: min cosine {cosine:.6f} < {MIN_COSINE} "
                         f"on the probe set")
    manifest["verified_min_cosine"] = round(cosine, 7)
    manifest["probe_text"] = _PROBE_TEXT
    manifest["probe_fp32"] = runner.encode_batch([_PROBE_TEXT])[0].tolist()
    _write_json_atomic(directory / MANIFEST, manifest)
    return manifest, cosine


def _build(entry: Path, source: Path, key: str, reference_factory: Callable[[], tuple[Runner, Any, Any]],
           pooling: str, layers: tuple[int, ...] | None, max_length: int | None, num_threads: int | None) -> float:
    """Export, verify and atomically install ``entry``; return the verified cosine."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=entry.parent))
    try:
        manifest, cosine = export_checked(tmp, source, reference_factory, pooling=pooling, layers=layers,
                                          max_length=max_length, num_threads=num_threads,
                                          record={"key": key, "source": str(source)})
        for f in tmp.iterdir():  # mkdtemp/mkstemp make owner-only files; the cache may be shared
            f.chmod(0o644)
        tmp.chmod(0o755)
        try:
            os.rename(tmp, entry)
        except OSError:  # another process installed the same key first: keep theirs
            if not (entry / MANIFEST).is_file():
                raise
        log.info("exported %s to ONNX in %.1fs (min cosine to torch %.6f): %s",
                 source, manifest["export_seconds"], cosine, entry)
        return cosine
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def quantize_export(entry: Path, keep_fp32: Callable[[Path], list[str]] | None = None) -> float:
    """Write ``model.int8.onnx`` beside the verified fp32 ``model.onnx`` of ``entry`` (a cache
    entry or an :func:`export_checked` directory) and record its min cosine to fp32 on
    :data:`PROBE` and its probe vector in the manifest (``int8``); return that cosine.
    ``keep_fp32`` names the nodes of ``model.onnx`` to leave unquantized (e5's FFN down-projections)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    excluded = keep_fp32(entry / "model.onnx") if keep_fp32 is not None else []
    fd, tmp_name = tempfile.mkstemp(prefix=".model.int8-", suffix=".onnx", dir=entry)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        root = logging.getLogger()
        advice = _DropAdvice()  # onnxruntime logs "consider pre-processing" on the root logger: noise here
        root.addFilter(advice)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                quantize_dynamic(str(entry / "model.onnx"), str(tmp), weight_type=QuantType.QInt8,
                                 per_channel=True, nodes_to_exclude=excluded)
        finally:
            root.removeFilter(advice)
        _count("quantizations")
        fp32 = OnnxRunner(entry, "model.onnx", None, None)
        int8 = OnnxRunner(entry, tmp.name, None, None)
        texts = list(PROBE)
        cosine = min(_min_cosine(int8.encode_batch([t]), fp32.encode_batch([t])) for t in texts)
        manifest = json.loads((entry / MANIFEST).read_text(encoding="utf-8"))
        manifest["int8"] = {"min_cosine_to_fp32": round(cosine, 6), "kept_fp32": len(excluded),
                            "probe": int8.encode_batch([_PROBE_TEXT])[0].tolist()}
        tmp.chmod(0o644)
        os.replace(tmp, entry / "model.int8.onnx")
        _write_json_atomic(entry / MANIFEST, manifest)
        log.info("quantized %s to int8 (min cosine to fp32 %.4f)", entry, cosine)
        return cosine
    finally:
        tmp.unlink(missing_ok=True)


class _DropAdvice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "pre-processing before quantization" not in record.getMessage()


class _Int8Error(Exception):
    """Quantizing a verified fp32 export failed (the fp32 export itself is fine)."""


def _open(entry: Path, quantize: bool, max_length: int | None, num_threads: int | None,
          keep_fp32: Callable[[Path], list[str]] | None = None) -> OnnxRunner:
    """Open a cached entry and re-check its probe vector (raises on any problem)."""
    if quantize and ("int8" not in json.loads((entry / MANIFEST).read_text(encoding="utf-8"))
                     or not (entry / "model.int8.onnx").is_file()):
        try:
            quantize_export(entry, keep_fp32)
        except Exception as exc:
            raise _Int8Error(f"int8 quantization failed: {type(exc).__name__}: {exc}") from exc
    runner = OnnxRunner(entry, "model.int8.onnx" if quantize else "model.onnx", max_length, num_threads)
    probe = runner.manifest.get("int8", {}).get("probe") if quantize else runner.manifest.get("probe_fp32")
    if probe is None:
        raise ValueError("the manifest records no probe vector for this file")
    cos = runner.probe_cosine(probe)
    if not cos >= MIN_COSINE:
        raise ValueError(f"the probe vector changed (cosine {cos:.6f} to the one recorded at export)")
    return runner


def load_onnx_runner(source: str | os.PathLike[str], *, reference: Callable[[], tuple[Runner, Any, Any]],
                     fallback: Callable[[], Runner], pooling: str = "mean", layers: Sequence[int] | None = None,
                     max_length: int | None, num_threads: int | None = None, quantize: bool = False,
                     cache_dir: str | os.PathLike[str] | None = None,
                     int8_keep_fp32: Callable[[Path], list[str]] | None = None) -> Runner:
    """An :class:`OnnxRunner` for the model in ``source``, exporting it on a cache miss.

    Parameters
    ----------
    source : path
        The model directory (its files key the cache).
    reference : callable
        Builds ``(torch_runner, hf_model, hf_tokenizer)``: the fp32 torch runner the export
        must match (CPU, no packing, no quantization), the transformer to export and its
        tokenizer. Called on a cache miss only.
    fallback : callable
        Builds the torch runner to serve with when ONNX is not usable.
    pooling : ``"mean"`` or ``"cls"``
    layers : sequence of int, optional
        Hidden states to mean-pool and concatenate (MiniLM ``layers``); default the last.
    max_length : int, optional
        Token limit per text (default: the torch runner's ``max_length``, kept in the manifest).
    num_threads : int, optional
        onnxruntime intra-op threads (default: onnxruntime's choice).
    quantize : bool
        Serve the int8 (dynamically quantized) copy of the verified export.
    cache_dir : path, optional
        Default :func:`default_cache_dir`.
    int8_keep_fp32 : callable, optional
        Given the fp32 ``model.onnx``, the node names to keep fp32 in the int8 copy.
    """
    source = Path(source)
    layer_t = tuple(int(i) for i in layers) if layers else None
    try:
        root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
        key = cache_key(source, pooling, layer_t)
    except Exception as exc:  # noqa: BLE001 - unreadable model dir, bad home...
        return _fall_back(fallback, f"cannot key the ONNX cache for {source} ({_brief(exc)})")
    entry = root / key
    if not (entry / MANIFEST).is_file():
        try:
            built = _build_once(entry, source, reference, pooling, layer_t, max_length, num_threads)
        except Exception as exc:  # noqa: BLE001 - exporter errors are many and varied
            return _fall_back(fallback, f"exporting {source} to ONNX failed or did not match torch, "
                                        f"nothing was cached ({_brief(exc)})")
        if built:
            try:
                return _open(entry, quantize, max_length, num_threads, int8_keep_fp32)
            except Exception as exc:  # noqa: BLE001 - int8 conversion failed...
                return _fall_back(fallback, f"{entry}: {_brief(exc)}")
    # in the cache: from an earlier run, or exported by another process while this one waited
    try:
        runner = _open(entry, quantize, max_length, num_threads, int8_keep_fp32)
    except _Int8Error as exc:
        return _fall_back(fallback, f"{entry}: {exc}")
    except Exception as exc:  # noqa: BLE001 - corrupt file, wrong graph...
        shutil.rmtree(entry, ignore_errors=True)  # the next load exports afresh
        return _fall_back(fallback, f"the cached ONNX export {entry} is unusable and was removed "
                                    f"({_brief(exc)})")
    _count("cache_hits")
    return runner


def _build_once(entry: Path, source: Path, reference: Callable[[], tuple[Runner, Any, Any]], pooling: str,
                layers: tuple[int, ...] | None, max_length: int | None, num_threads: int | None) -> bool:
    """Export ``source`` into the cache entry ``entry`` unless another process did while this
    one waited for the entry's lock (a file lock beside it: two processes, two homes, never
    export the same entry at once); return whether this call exported it. Says so on stderr
    first: an export takes about a minute, once per encoder and machine."""
    from filelock import FileLock

    entry.parent.mkdir(parents=True, exist_ok=True)
    lock = entry.parent / f".{entry.name}.lock"
    with FileLock(str(lock)):
        try:
            if (entry / MANIFEST).is_file():
                return False
            print(f"flywheel: exporting {source} to ONNX once (about a minute); cached in {entry.parent}",
                  file=sys.stderr, flush=True)
            _build(entry, source, entry.name, reference, pooling, layers, max_length, num_threads)
            return True
        finally:
            # removed while held: a process waiting on it finds the entry installed; one that
            # comes later checks the entry before it locks (after a failed export, two
            # processes may then both try again: _build keeps the first one installed)
            lock.unlink(missing_ok=True)


def _brief(exc: BaseException) -> str:
    """``Type: message`` on one line; torch.export's multi-page messages cut to their summary."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    summary = [ln for ln in lines if ln.startswith("<class ")]
    text = " | ".join(lines[:1] + summary[:1])
    return f"{type(exc).__name__}: {text[:400]}"


def _fall_back(fallback: Callable[[], Runner], why: str) -> Runner:
    log.debug("ONNX fallback details", exc_info=True)
    log.warning("%s; serving this encoder with torch instead", why)
    _count("fallbacks")
    return fallback()
