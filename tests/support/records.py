"""Decision records built by hand, for the log's tests (logstore, the spool, the fleet's
shipper, mirror and retention).

- :func:`make_record`: a layer-2 decision on "where is my invoice" (labels ``billing`` and
  ``shipping``, model ``v7``, a two-turn history), every field settable.
- :func:`rec`: the same with a random embedding of ``dim`` floats.
- :func:`review_record` and :func:`teacher_call`: decisions for the review queue's tests.
"""

from __future__ import annotations

import time

import numpy as np

from flywheel.classifier.decision import Candidate, Decision, Layer, Layer2Answer, TeacherCall, Tier
from flywheel.classifier.protocols import DecisionRecord, HistoryEntry


def make_record(did: str | None = None, *, text: str = "where is my invoice",
                layer: Layer = Layer.EMBEDDING, label: str | None = "billing",
                confidence: float = 0.8, teacher: TeacherCall | None = None,
                embedding: np.ndarray | None = None, encoder_id: str | None = "enc-test",
                pending: bool = False, audit: bool = False,
                created_at: float | None = None, degraded: str | None = None,
                language: str | None = None) -> DecisionRecord:
    d = Decision(label=label, confidence=confidence, tier=Tier.CONFIDENT, layer=layer,
                 reason="test", alternatives=[Candidate("shipping", 0.1), Candidate(None, 0.05)],
                 model_version="v7", latency_ms={"rules": 0.01, "embedding": 2.5},
                 teacher=teacher, degraded=degraded, language=language,
                 **({"id": did} if did is not None else {}))
    return DecisionRecord(decision=d, text=text,
                          created_at=time.time() if created_at is None else created_at,
                          session_id="sess-1", declared_type=None,
                          history=(HistoryEntry.of("greeting", "hello there"),
                                   HistoryEntry.of(None, "x" * 100)),
                          encoder_id=encoder_id, embedding=embedding, audit=audit, pending=pending)


def rec(text: str = "where is my invoice", *, created_at: float | None = None, teacher: TeacherCall | None = None,
        dim: int = 8) -> DecisionRecord:
    """A decision record with a random embedding."""
    return make_record(text=text, created_at=created_at, teacher=teacher,
                       embedding=np.random.default_rng().random(dim, dtype=np.float32))


#: the review queue tests' clock
NOW = time.time()


def review_record(did: str, text: str, label: str | None, *, layer: Layer = Layer.LLM, l2: str | None = "RETRIEVAL",
         teacher: TeacherCall | None = None, age_days: float = 0.0, tier: Tier = Tier.CONFIDENT,
         confidence: float = 0.9, audit: bool = False, pending: bool = False, degraded: str | None = None,
         language: str | None = None):
    """A logged decision for the review queue's tests (issue 25): served ``label`` by ``layer``,
    layer 2's own answer ``l2``, ``age_days`` before :data:`NOW`."""
    d = Decision(label=label, confidence=confidence, tier=tier, layer=layer, reason="test",
                 alternatives=[Candidate("PLATFORM", 0.3), Candidate("CODE_GENERATION", 0.1)],
                 model_version="v1", teacher=teacher, id=did, degraded=degraded, language=language)
    return DecisionRecord(decision=d, text=text, created_at=NOW - age_days * 86_400 - 60, audit=audit,
                          pending=pending, layer2=Layer2Answer(l2, 0.5, Tier.WEAK))


def teacher_call(label, valid=True, error=None, candidates=None):
    """An inline teacher call (an unsure one: ``valid`` false with its ``candidates``, ``()``
    for "cannot tell")."""
    return TeacherCall("llm", label, valid, 10.0, error, candidates)
