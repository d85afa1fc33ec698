"""Model versions that carry their own encoder (``encoder/``), for tests: a tiny random
BERT (tests/support/tiny_encoder.py) exported to ONNX by
:func:`classifier.encoders.version_encoder.export_encoder`, and the tiny intent document
(:data:`tests.support.docs.DOC`) fitted on its vectors.

- :func:`tiny_export`: export a tiny BERT (an ONNX export: 5-15 s on 2 cores, so the tests
  that call it are ``slow``);
- :func:`fit_with_encoder`: a model whose head was trained on that export's vectors and
  which carries it (``encoder_dir``);
- :func:`save_tuned`: save a copy of such a model as version ``name`` of a models home;
- :func:`flip_byte`: corrupt one byte of a file in place (a tampered or broken file).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from flywheel.classifier.encoders import EncoderExport, VersionEncoderEmbedder, export_encoder
from flywheel.classifier.layer2.fitter import fit_model
from flywheel.classifier.settings.intents import parse_intents
from flywheel.classifier.versions.model import IntentModel
from flywheel.classifier.versions.registry import ModelRegistry
from tests.support.docs import DOC
from tests.support.tiny_encoder import build_tiny_bert

#: every text of DOC, so that the tiny vocabulary covers their characters
DOC_TEXTS = [e for i in DOC["intents"] for e in i["examples"]] + list(DOC["out_of_scope"]["examples"])


def tiny_export(base: Path, *, seed: int = 0, quantize: bool = True, **kw: object) -> EncoderExport:
    """Build a tiny BERT with weights ``seed`` under ``base`` and export it to ``base/encoder-<seed>...``."""
    src = build_tiny_bert(base / f"bert-{seed}", seed=seed, extra_texts=DOC_TEXTS)
    dest = base / f"encoder-{seed}-{'int8' if quantize else 'fp32'}-{len(list(base.glob('encoder-*')))}"
    return export_encoder(src, dest, quantize=quantize, **kw)  # type: ignore[arg-type]


def fit_with_encoder(export: EncoderExport, version: str = "v-tuned") -> IntentModel:
    """DOC fitted on ``export``'s vectors (served as a version serves them), carrying it."""
    model = fit_model(parse_intents(DOC), embedder=VersionEncoderEmbedder(export.path), version=version)
    model.encoder_dir = export.path
    return model


def save_tuned(reg: ModelRegistry, model: IntentModel, name: str) -> Path:
    """Save a copy of ``model`` (with its encoder) as version ``name`` of ``reg``."""
    copy = IntentModel(model.intents, model.head, dataclasses.replace(model.manifest, version=name),
                       encoder_dir=model.encoder_dir)
    return copy.save(reg.version_dir(name))


def flip_byte(path: Path, offset: int = -100) -> None:
    """Change one byte of ``path`` in place."""
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


#: test threshold: a tiny BERT's token table (int8, ~3.4 kB) and position table leave the graph for blobs
TINY_SPLIT_BYTES = 3000


def retuned_copy(src: Path, dest: Path, seed: int) -> Path:
    """A copy of the Hugging Face model ``src`` whose transformer layers moved (a seeded
    nudge) and whose embeddings did not: what two tunings with frozen embeddings make."""
    import shutil

    import torch
    from transformers import BertModel

    shutil.copytree(src, dest)
    model = BertModel.from_pretrained(str(src))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not name.startswith("embeddings."):
                p.add_(0.05 * torch.randn(p.shape, generator=gen))
    model.save_pretrained(str(dest))
    return dest


def sharing_exports(base: Path, n: int = 2) -> list[EncoderExport]:
    """``n`` int8 exports of tiny BERTs that differ in every layer but share their embeddings,
    split with :data:`TINY_SPLIT_BYTES` (so they name the same blobs)."""
    src = build_tiny_bert(base / "bert-base", seed=0, extra_texts=DOC_TEXTS)
    return [export_encoder(retuned_copy(src, base / f"bert-tuned-{i}", seed=i), base / f"encoder-tuned-{i}",
                           quantize=True, split_min_bytes=TINY_SPLIT_BYTES) for i in range(n)]
