"""The served bundle: a model version with what serving it needs (its encoder, rules,
cutoffs and the teacher's options), built in one piece so that
:meth:`~classifier.pipeline.Classifier.swap_model` replaces it in a single assignment.

:func:`new_embedder` makes the encoder a version needs (its own, else its settings'),
lazily; :func:`warmed_bundle` picks the encoder a version's head needs, checks it against
that head, loads it and scores once, before the bundle is served.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from flywheel.classifier.errors import ModelError
from flywheel.classifier.language import LanguageDetector
from flywheel.classifier.layer2.tiers import Thresholds
from flywheel.classifier.protocols import Embedder, LabelOption
from flywheel.classifier.rules import RuleEngine
from flywheel.classifier.teachers.cache import intent_set_revision
from flywheel.classifier.versions.model import IntentModel

__all__ = ["ModelBundle", "new_embedder", "warmed_bundle"]


@dataclass(frozen=True)
class ModelBundle:
    """One served model version and what scoring and asking about its queries need."""

    model: IntentModel
    rules: RuleEngine
    thresholds: Thresholds
    labels: tuple[str, ...]
    options: dict[str, LabelOption]         # label -> what the teacher is shown, in ``labels`` order
    metadata: dict[str, dict[str, str]]     # label -> the intent's metadata
    embedder: Embedder                      # makes the vectors this model's head scores
    revision: str = ""                      # the intent set's content hash (the teacher cache's key)
    language: LanguageDetector = field(default_factory=lambda: LanguageDetector(("en",)))  # the set's languages

    @classmethod
    def build(cls, model: IntentModel, embedder: Embedder) -> "ModelBundle":
        intents = model.intents
        thresholds = Thresholds.for_model(model)
        n_ex = intents.teacher.examples_per_intent
        by_name = {i.name: LabelOption(i.name, i.description, tuple(i.examples[:n_ex])) for i in intents.intents}
        labels = tuple(model.manifest.labels)
        options = {n: by_name[n] for n in labels if n in by_name}
        metadata = {i.name: dict(i.metadata) for i in intents.intents}
        return cls(model, RuleEngine(intents.rules), thresholds, labels, options, metadata, embedder,
                   intent_set_revision(intents), LanguageDetector(intents.languages))


def new_embedder(model: IntentModel, cache_root: str | Path | None) -> Embedder:
    """A fresh (lazy) embedder for ``model``: its own encoder, else its encoder settings'."""
    from flywheel.classifier.encoders import CachedEmbedder, make_embedder, open_version_encoder

    s = model.encoder_settings
    if model.encoder_dir is not None:
        return CachedEmbedder(open_version_encoder(model.encoder_dir, s, cache_root=cache_root))
    return make_embedder(s, cache_root=cache_root)


def warmed_bundle(model: IntentModel, known: Iterable[Embedder | None],
                  cache_root: str | Path | None) -> ModelBundle:
    """``model`` with the encoder its head needs, checked, loaded and warmed (one scoring
    pass). The encoder is the first of ``known`` (the one serving now, the caller's) with
    the id the head was trained with (a version's own encoder has a content id, so the
    same id is the same, already checked, encoder), else a new one (:func:`new_embedder`).
    Raises :class:`~classifier.errors.ModelError` for an encoder that cannot be built,
    loaded or verified, or that is not the one the head was trained with."""
    enc = model.manifest.encoder
    try:
        embedder = next((e for e in known if e is not None and e.id == enc.get("id")), None)
        if embedder is None:
            embedder = new_embedder(model, cache_root)
        if embedder.id != enc.get("id"):   # before reading dim, which may load a model
            raise ModelError(f"model {model.version} was trained with encoder {enc.get('id')!r} "
                             f"({enc.get('dim')}-d), its settings make {embedder.id!r}")
        model.check_encoder(embedder.id, embedder.dim)
        rt = ModelBundle.build(model, embedder)
        rt.model.head.scores(embedder.encode(["warm-up"]))
        rt.language.warm()   # builds both passes' language models before the swap
    except ModelError:
        raise
    except Exception as exc:  # noqa: BLE001 - a broken encoder or head is refused, never served
        raise ModelError(f"model {model.version}: cannot serve it with encoder "
                         f"{enc.get('id')!r}: {type(exc).__name__}: {exc}") from exc
    return rt
