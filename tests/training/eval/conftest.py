"""Fixtures of the ``flywheel eval`` tests: a fake encoder, so nothing loads a model."""

from __future__ import annotations

import pytest

from tests.support.docs import toy_embedder


@pytest.fixture()
def fake_encoder(monkeypatch):
    """Every encoder ``flywheel train``/``eval`` would make is :func:`toy_embedder`."""
    import flywheel.classifier.encoders
    import flywheel.classifier.layer2.fitter

    fake = toy_embedder()
    monkeypatch.setattr(flywheel.classifier.layer2.fitter, "make_embedder", lambda *a, **k: fake)
    monkeypatch.setattr(flywheel.classifier.encoders, "make_embedder", lambda *a, **k: fake)
