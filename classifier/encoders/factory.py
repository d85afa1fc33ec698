"""Building an encoder from settings: :func:`make_embedder`; a version's own encoder:
:func:`open_version_encoder`.

Reads :class:`~classifier.settings.intents.EmbedderSettings` (an intent set's ``embedder``
section), checks it against the backend's spec (:mod:`~classifier.encoders.backends`),
resolves ``auto`` (the backend, the runtime: :func:`~classifier.encoders.base.resolve_runtime`,
int8: :meth:`~classifier.encoders.backends.BackendSpec.int8_default`) and returns the
embedder its builder (:data:`BUILDERS`) makes from :mod:`~classifier.encoders.embedders`,
behind a :class:`~classifier.encoders.cache.CachedEmbedder`. Nothing is loaded here.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from flywheel.classifier.encoders.backends import (
    BACKENDS,
    BGE_M3,
    E5_MULTILINGUAL,
    MINILM,
    SENTENCE_TRANSFORMERS,
    USE_MULTILINGUAL,
    BackendSpec,
    resolve_backend,
)
from flywheel.classifier.encoders.base import resolve_runtime
from flywheel.classifier.encoders.cache import CachedEmbedder
from flywheel.classifier.encoders.embedders import (
    BGEM3Embedder,
    E5Embedder,
    MiniLMEmbedder,
    SentenceTransformerEmbedder,
    USEMultilingualEmbedder,
)
from flywheel.classifier.encoders.onnx_runner import default_cache_dir
from flywheel.classifier.errors import EmbedderError
from flywheel.classifier.protocols import Embedder
from flywheel.classifier.settings.config import cache_dir

if TYPE_CHECKING:   # not at import time: the intent-file parser imports this wing's backends module
    from flywheel.classifier.settings.intents import EmbedderSettings

__all__ = ["BUILDERS", "Builder", "make_embedder", "open_version_encoder"]

#: ``(settings, runtime, common, cache_root) -> embedder``: one backend's embedder from checked
#: settings; ``common`` holds the keyword arguments every transformers embedder takes
Builder = Callable[["EmbedderSettings", str, dict[str, Any], "str | os.PathLike[str] | None"], Embedder]


def _minilm(s: EmbedderSettings, runtime: str, common: dict[str, Any], cache_root: Any) -> Embedder:
    return MiniLMEmbedder(**common, layers=s.layers, runtime=runtime)


def _use(s: EmbedderSettings, runtime: str, common: dict[str, Any], cache_root: Any) -> Embedder:
    return USEMultilingualEmbedder(s.batch_size, max_chars=s.max_chars,
                                   cache_dir=cache_dir("use", cache_root) if cache_root is not None else None)


def _e5(s: EmbedderSettings, runtime: str, common: dict[str, Any], cache_root: Any) -> Embedder:
    return E5Embedder(**common, runtime=runtime)


def _sentence_transformers(s: EmbedderSettings, runtime: str, common: dict[str, Any], cache_root: Any) -> Embedder:
    return SentenceTransformerEmbedder(str(s.model), **common, runtime=runtime)


def _bge_m3(s: EmbedderSettings, runtime: str, common: dict[str, Any], cache_root: Any) -> Embedder:
    return BGEM3Embedder(s.model or BGE_M3.default_model, s.batch_size, use_fp16=s.use_fp16, device=s.device,
                         quantize=common["quantize"], max_chars=s.max_chars, num_threads=common["num_threads"],
                         runtime=runtime, onnx_cache_dir=common["onnx_cache_dir"])


#: each backend's builder, by its spec's id (every spec but ``auto``, which resolves to one)
BUILDERS: dict[str, Builder] = {MINILM.id: _minilm, USE_MULTILINGUAL.id: _use, E5_MULTILINGUAL.id: _e5,
                                SENTENCE_TRANSFORMERS.id: _sentence_transformers, BGE_M3.id: _bge_m3}


def _refuse(spec: BackendSpec, settings: EmbedderSettings, runtime: str) -> None:
    """Raise :class:`EmbedderError` for settings the backend cannot honour, as its spec says."""
    if settings.layers and not spec.layers:
        with_layers = ", ".join(s.id for s in BACKENDS.values() if s.layers)
        raise EmbedderError(f"embedder.layers is only supported by the {with_layers} backend, not {spec.id!r}")
    if (settings.model and not spec.takes_model) or runtime not in spec.runtimes:
        raise EmbedderError(f"the {spec.id} backend takes no {' or '.join(spec.refused_settings)} "
                            f"(its {spec.engine} model ships in {spec.package})")
    if spec.model_names and settings.model and settings.model.strip().lower() not in spec.model_names:
        raise EmbedderError(
            f"the {spec.id} backend always uses {spec.model} (from the {spec.package} package); got model "
            f"{settings.model!r} (use backend {SENTENCE_TRANSFORMERS.id!r} for another model directory)")
    if spec.needs_model and not settings.model:
        raise EmbedderError(f"the {spec.id} backend needs embedder.model (a model directory)")


def make_embedder(settings: EmbedderSettings, cache: bool = True, *,
                  cache_root: str | os.PathLike[str] | None = None) -> Embedder:
    """Build the embedder that ``settings`` describes (nothing is loaded yet).

    Parameters
    ----------
    settings : EmbedderSettings
        ``backend`` names a spec of :mod:`~classifier.encoders.backends` (``auto``, which an
        intent set resolves from its languages, is MiniLM here), which says what the other
        settings may be: a fixed model (MiniLM, multilingual-e5-small) takes ``model`` unset
        or naming it, USE takes neither ``model`` nor ``runtime``, a sentence-transformers
        backend needs ``model`` (a local directory), bge-m3 takes a local directory or a
        cached hub id (default ``BAAI/bge-m3``); ``layers`` is MiniLM's.
    cache : bool
        Wrap it in a :class:`~classifier.encoders.cache.CachedEmbedder`.
    cache_root : path, optional
        The resolved home's ``cache`` directory (:attr:`classifier.settings.config.Config.cache_root`),
        where the USE encoder keeps its parsed tokenizer (``use/``). Default: the home the
        environment gives (:func:`classifier.settings.config.cache_dir`), which knows nothing of a
        ``--home`` flag: code that resolved a :class:`~classifier.settings.config.Config` passes its
        ``cache_root``. ONNX exports are not kept per home: they go to the machine's cache
        (:func:`~classifier.encoders.onnx_runner.default_cache_dir`), keyed by content.

    Raises
    ------
    EmbedderError
        Unknown backend (:class:`~classifier.errors.UnknownBackendError`), a missing model
        directory, or settings the backend does not take (a model given to ``minilm``...).
    """
    spec = resolve_backend(settings.backend)   # an IntentSet resolves auto from its languages; bare settings: English
    runtime = settings.runtime or "auto"
    quantize = settings.quantize
    if quantize is None:
        quantize = spec.int8_default(resolve_runtime(runtime, settings.device), settings.layers)
    onnx_cache_dir = default_cache_dir()   # one for every home: entries are keyed by content
    common: dict[str, Any] = {"batch_size": settings.batch_size, "device": settings.device,
                              "max_chars": settings.max_chars, "use_fp16": settings.use_fp16,
                              "quantize": bool(quantize), "num_threads": settings.num_threads,
                              "onnx_cache_dir": onnx_cache_dir}
    _refuse(spec, settings, runtime)
    inner = BUILDERS[spec.id](settings, runtime, common, cache_root)
    return CachedEmbedder(inner) if cache else inner


def open_version_encoder(directory: str | os.PathLike[str], settings: EmbedderSettings, *,
                         num_threads: int | None = None,
                         cache_root: str | os.PathLike[str] | None = None) -> Embedder:
    """The embedder of a version's own ``encoder/`` (not loaded yet, not cached): a tuned
    encoder's export (:class:`~classifier.encoders.version_encoder.VersionEncoderEmbedder`)
    or an adapter on the version's ``settings`` encoder
    (:class:`~classifier.encoders.adapter.AdaptedEmbedder`), as its record says.

    ``num_threads`` overrides ``settings.num_threads`` (a shadow scores on its own threads).

    Raises
    ------
    EmbedderError
        ``directory`` holds no export record, or the adapter's base cannot be built.
    """
    from pathlib import Path

    from flywheel.classifier.encoders.adapter import AdaptedEmbedder
    from flywheel.classifier.encoders.version_encoder import VersionEncoderEmbedder
    from flywheel.classifier.encoders.version_format import is_adapter, read_manifest

    threads = settings.num_threads if num_threads is None else num_threads
    try:
        record = read_manifest(Path(directory))
    except (OSError, ValueError) as exc:
        raise EmbedderError(f"{directory}: not a version encoder: {exc}") from None
    if is_adapter(record):
        from dataclasses import replace

        base = make_embedder(replace(settings, num_threads=threads), cache=False, cache_root=cache_root)
        return AdaptedEmbedder(directory, base)
    return VersionEncoderEmbedder(directory, settings.batch_size, max_chars=settings.max_chars, num_threads=threads)
