"""A served model whose layer 2 always asks the teacher, for the command-line tests of the
teacher (``flywheel classify --teacher ...``, ``flywheel label``): a fake embedder
(:class:`tests.support.fakes.HashEmbedder`) stands in for the real model."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from flywheel.classifier.layer2.fitter import fit_model
from flywheel.classifier.settings.intents import parse_intents
from tests.support.docs import ALWAYS_UNSURE, DOC
from tests.support.fakes import HashEmbedder


def always_unsure_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Save a model whose layer 2 always asks the teacher (the default ollama backend, model
    ``tiny-llm``) under ``tmp_path/m`` and serve it as ``FLYWHEEL_MODEL``, with no teacher
    setting or key left in the environment."""
    import flywheel.classifier.encoders

    emb = HashEmbedder()
    monkeypatch.setattr(flywheel.classifier.encoders, "make_embedder", lambda *a, **k: emb)
    for name in ("FLYWHEEL_TEACHER", "FLYWHEEL_TEACHER_HOST", "OPENAI_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    doc = copy.deepcopy(DOC)
    doc["thresholds"] = ALWAYS_UNSURE
    doc["teacher"] = {"model": "tiny-llm", "timeout_s": 2.0}
    path = tmp_path / "m"
    fit_model(parse_intents(doc), embedder=emb, version="v1").save(path)
    monkeypatch.setenv("FLYWHEEL_MODEL", str(path))
    return path
