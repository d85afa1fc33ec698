"""What every encoder module shares: the encoder ids (from the backends' specs,
:mod:`~classifier.encoders.backends`), which runtime and precision an encoder runs with,
the :class:`Runner` interface and the process-wide registry of loaded models.

A *runner* is one loaded model whose ``encode_batch`` maps a batch of texts to unit-norm
float32 rows (:mod:`~classifier.encoders.torch_runner`,
:mod:`~classifier.encoders.onnx_runner`, :mod:`~classifier.encoders.use_runner`). Runners
are shared process-wide through :func:`shared_runner` (one lock per model key; see
:func:`loaded_models` and :func:`clear_loaded_models`).

Imports nothing heavy, not even inside a function: :func:`resolve_runtime` only looks
``onnxruntime`` up.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import numpy as np

from flywheel.classifier.encoders.backends import (
    BGE_M3,
    E5_MULTILINGUAL,
    EMBEDDER_RUNTIMES,
    MINILM,
    USE_MULTILINGUAL,
    backend_spec,
)
from flywheel.classifier.errors import EmbedderError, InvalidInputError

__all__ = [
    "MINILM_ID",
    "USE_ID",
    "E5_ID",
    "BGE_M3_HUB_ID",
    "require_pinned",
    "resolve_runtime",
    "default_quantize",
    "check_texts",
    "Runner",
    "shared_runner",
    "claim_load_ms",
    "claim_earlier_load_ms",
    "loaded_models",
    "clear_loaded_models",
]

MINILM_ID = MINILM.encoder_id()                 # minilm:all-MiniLM-L6-v2
USE_ID = USE_MULTILINGUAL.encoder_id()          # use-multilingual:v3
E5_ID = E5_MULTILINGUAL.encoder_id()            # e5-multilingual:multilingual-e5-small
BGE_M3_HUB_ID = BGE_M3.default_model            # BAAI/bge-m3


def require_pinned(backend: str, package: str, version: str) -> None:
    """Refuse a backend whose weights come from ``package`` unless exactly the audited
    ``version`` is installed (one :class:`EmbedderError` naming the install command)."""
    from importlib import metadata

    try:
        found = metadata.version(package)
    except metadata.PackageNotFoundError:
        raise EmbedderError(f"the {backend} backend needs the {package!r} package "
                            f"(pip install {package}=={version})") from None
    if found != version:
        raise EmbedderError(f"the {backend} backend was audited with {package} {version}, "
                            f"found {found}; install {package}=={version}")


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
    """What ``embedder.quantize: auto`` means for the backend named ``backend`` on ``runtime``:
    int8 only where CLINC150 measured it within 0.3 points of fp32 in-scope accuracy, which
    its spec says (:attr:`~classifier.encoders.backends.BackendSpec.int8_on_onnx`, with the
    figures): MiniLM (last layer; on an AVX2 CPU without VNNI, BENCHMARKS.md section 12, the
    int8 vectors are CPU-dependent and kept, as out-of-scope recall moves the other way, 84.8%
    against 83.2%) and e5 (its FFN down-projections kept fp32), on ONNX Runtime. Everything
    else stays fp32 until measured (``auto``, unresolved, too).

    Raises
    ------
    UnknownBackendError
        No backend is called ``backend``.
    """
    return backend_spec(backend).int8_default(runtime, layers)


def check_texts(texts: Sequence[str]) -> list[str]:
    """``texts`` as a list, after checking it is a sequence of strings (not one string)."""
    if isinstance(texts, (str, bytes)):
        raise InvalidInputError("encode() takes a sequence of strings, not a single string")
    out = list(texts)
    for t in out:
        if not isinstance(t, str):
            raise InvalidInputError(f"encode() got a {type(t).__name__}, expected str")
    return out


class Runner:
    """A loaded model: ``encode_batch`` maps one batch of texts to unit-norm float32 rows."""

    dim: int
    model: Any  # the underlying torch module (or SentenceTransformer, or onnxruntime session)
    uses_torch: bool = True  # False: _LazyEmbedder leaves torch's thread count alone (onnx runner)

    def encode_batch(self, texts: list[str]) -> np.ndarray:  # pragma: no cover - interface
        raise NotImplementedError


# Process-wide registry of loaded models: key -> runner. One lock per key, so loading
# bge-m3 does not block a MiniLM embedder that is already loaded.
_MODELS: dict[Hashable, Runner] = {}
_KEY_LOCKS: dict[Hashable, threading.Lock] = {}
_REGISTRY_LOCK = threading.Lock()


class _Load:
    """How long loading one shared runner took, who loaded it (an embedder's token) and
    whether a decision has reported it yet (:func:`claim_load_ms`)."""

    __slots__ = ("ms", "by", "reported")

    def __init__(self, ms: float, by: object) -> None:
        self.ms, self.by, self.reported = ms, by, False


_LOADS: dict[Hashable, _Load] = {}


def loaded_models() -> dict[Hashable, Any]:
    """Return a snapshot of the process-wide model registry (key -> loaded runner)."""
    with _REGISTRY_LOCK:
        return dict(_MODELS)


def clear_loaded_models() -> None:
    """Forget every loaded model (tests, benchmarks); embedders already holding one keep it."""
    with _REGISTRY_LOCK:
        _MODELS.clear()
        _LOADS.clear()


def shared_runner(key: Hashable, loader: Callable[[], Runner], owner: object = None) -> Runner:
    """The runner loaded under ``key``, loading it with ``loader`` at most once per process;
    the time that took is kept, with ``owner`` (the loading embedder's token), for
    :func:`claim_load_ms`."""
    runner = _MODELS.get(key)
    if runner is not None:
        return runner
    with _REGISTRY_LOCK:
        lock = _KEY_LOCKS.setdefault(key, threading.Lock())
    with lock:
        runner = _MODELS.get(key)
        if runner is None:
            t0 = time.perf_counter()
            runner = loader()
            with _REGISTRY_LOCK:
                _MODELS[key] = runner
                _LOADS[key] = _Load((time.perf_counter() - t0) * 1e3, owner)
    return runner


def claim_load_ms(key: Hashable, owner: object, paid_ms: float) -> float:
    """``paid_ms``, what the calling thread itself spent loading the runner under ``key``
    through ``owner`` (an embedder's token), as a decision reports it: 0.0 when a decision of
    another embedder reported that load already (:func:`claim_earlier_load_ms`), else
    ``paid_ms``, the load then counting as reported."""
    with _REGISTRY_LOCK:
        rec = _LOADS.get(key)
        if rec is None or paid_ms <= 0.0:
            return paid_ms
        if rec.by is owner and rec.reported:
            return 0.0
        rec.reported = True
        return paid_ms


def claim_earlier_load_ms(key: Hashable, owner: object) -> float:
    """Once per process, the time another embedder than ``owner`` spent loading the runner
    under ``key`` before any decision reported it (0.0 otherwise): the default model's
    training on first use loads the encoder the first query then finds loaded; that load
    belongs on the first decision."""
    with _REGISTRY_LOCK:
        rec = _LOADS.get(key)
        if rec is None or rec.reported or rec.by is owner:
            return 0.0
        rec.reported = True
        return rec.ms
