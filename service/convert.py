"""Conversions between flywheel's Python types and the gRPC messages of
``service/protos/flywheel/v1/classifier.proto``. Pure functions: no I/O, no server logic.

Out of scope is ``None`` in Python and ``""`` in the messages (a decision's label, an
alternative's label, a history entry's label). A decision's ``model_version`` and
``degraded`` and ``language`` of ``None`` are ``""`` too. The message carries exactly the public fields,
:data:`classifier.decision.PUBLIC_FIELDS`; ``Decision.teacher`` and ``Decision.pending``
are for the traffic log only and do not travel.
"""

from __future__ import annotations

import numbers
from typing import Any, Iterable

from flywheel.classifier.decision import Candidate, Decision, Layer, Tier
from flywheel.classifier.layer2.tiers import Thresholds
from flywheel.classifier.protocols import HistoryEntry
from flywheel.classifier.versions.model import IntentModel
from flywheel.service.protos.flywheel.v1 import classifier_pb2 as pb

__all__ = [
    "TIER_TO_PROTO", "TIER_FROM_PROTO", "LAYER_TO_PROTO", "LAYER_FROM_PROTO",
    "decision_to_proto", "decision_from_proto", "history_to_proto", "history_from_proto",
    "model_info_to_proto", "model_info_to_dict",
]

TIER_TO_PROTO: dict[Tier, pb.Tier] = {
    Tier.CONFIDENT: pb.TIER_CONFIDENT,
    Tier.AMBIGUOUS: pb.TIER_AMBIGUOUS,
    Tier.WEAK: pb.TIER_WEAK,
    Tier.NO_MATCH: pb.TIER_NO_MATCH,
}
TIER_FROM_PROTO: dict[int, Tier] = {v: k for k, v in TIER_TO_PROTO.items()}
LAYER_TO_PROTO: dict[Layer, pb.Layer] = {
    Layer.DECLARED: pb.LAYER_DECLARED,
    Layer.RULES: pb.LAYER_RULES,
    Layer.EMBEDDING: pb.LAYER_EMBEDDING,
    Layer.LLM: pb.LAYER_LLM,
}
LAYER_FROM_PROTO: dict[int, Layer] = {v: k for k, v in LAYER_TO_PROTO.items()}


def _label_out(label: str | None) -> str:
    return "" if label is None else label


def _label_in(label: str) -> str | None:
    return label or None


def decision_to_proto(d: Decision) -> pb.Decision:
    """A :class:`~classifier.decision.Decision` as a ``flywheel.v1.Decision`` message
    (every field of :data:`~classifier.decision.PUBLIC_FIELDS`)."""
    return pb.Decision(
        id=d.id,
        label=_label_out(d.label),
        confidence=float(d.confidence),
        tier=TIER_TO_PROTO[Tier(d.tier)],
        layer=LAYER_TO_PROTO[Layer(d.layer)],
        alternatives=[pb.Candidate(label=_label_out(c.label), confidence=float(c.confidence))
                      for c in d.alternatives],
        reason=d.reason,
        model_version=d.model_version or "",
        latency_ms={str(k): float(v) for k, v in d.latency_ms.items()},
        metadata={str(k): str(v) for k, v in d.metadata.items()},
        degraded=d.degraded or "",
        language=d.language or "",
    )


def decision_from_proto(m: pb.Decision) -> Decision:
    """The :class:`~classifier.decision.Decision` of a ``flywheel.v1.Decision`` message
    (the inverse of :func:`decision_to_proto`).

    Raises :class:`ValueError` for a tier or layer that is unspecified or unknown (a
    server never sends one).
    """
    try:
        tier = TIER_FROM_PROTO[m.tier]
    except KeyError:
        raise ValueError(f"decision {m.id!r}: tier {_enum_name(pb.Tier, m.tier)} has no flywheel meaning") from None
    try:
        layer = LAYER_FROM_PROTO[m.layer]
    except KeyError:
        raise ValueError(f"decision {m.id!r}: layer {_enum_name(pb.Layer, m.layer)} has no flywheel meaning") from None
    return Decision(
        label=_label_in(m.label),
        confidence=m.confidence,
        tier=tier,
        layer=layer,
        reason=m.reason,
        alternatives=[Candidate(_label_in(c.label), c.confidence) for c in m.alternatives],
        model_version=m.model_version or None,
        latency_ms=dict(m.latency_ms),
        id=m.id,
        metadata=dict(m.metadata),
        degraded=m.degraded or None,
        language=m.language or None,
    )


def _enum_name(enum: Any, value: int) -> str:
    try:
        return str(enum.Name(value))
    except ValueError:
        return str(value)


def history_to_proto(entries: Iterable[HistoryEntry]) -> list[pb.HistoryEntry]:
    """``HistoryEntry`` objects as messages (label ``None`` -> ``""``); snippets are sent whole."""
    return [pb.HistoryEntry(label=_label_out(e.label), snippet=e.snippet) for e in entries]


def history_from_proto(entries: Iterable[pb.HistoryEntry]) -> tuple[HistoryEntry, ...]:
    """History messages as ``HistoryEntry`` objects (label ``""`` -> ``None``), unchanged
    otherwise: cutting snippets and keeping the last few turns is the classifier's job
    (:func:`classifier.history.coerce_history`). An empty request history gives ``()``;
    a server that wants the session's history then should pass ``history=None``."""
    return tuple(HistoryEntry(_label_in(e.label), e.snippet) for e in entries)


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def model_info_to_proto(model: IntentModel) -> pb.ModelInfo:
    """What ``GetModelInfo`` answers for ``model``: its manifest, its intents (in
    intent-file order, with descriptions and metadata) and the thresholds it is served
    with (:meth:`classifier.layer2.tiers.Thresholds.for_model`). Only numeric metrics are kept."""
    man = model.manifest
    enc = man.encoder or {}
    th = Thresholds.for_model(model)
    return pb.ModelInfo(
        version=man.version,
        encoder=pb.Encoder(id=str(enc.get("id") or ""), backend=str(enc.get("backend") or ""),
                           model=str(enc.get("model") or ""), dim=int(enc.get("dim") or 0)),
        labels=[pb.LabelInfo(name=i.name, description=i.description, metadata=dict(i.metadata))
                for i in model.intents.intents],
        thresholds=pb.Thresholds(confident=th.confident, ambiguous_ratio=th.ambiguous_ratio, oos=th.oos,
                                 oos_confident=th.oos_confident,
                                 per_intent={k: float(v) for k, v in th.per_intent.items()},
                                 defer=th.defer, set_cutoff=th.set_cutoff, coverage=th.coverage),
        created_at=man.created_at or "",
        training_size=int(man.training_size),
        metrics={str(k): float(v) for k, v in (man.metrics or {}).items() if _is_number(v)},
    )


def model_info_to_dict(m: pb.ModelInfo) -> dict[str, Any]:
    """A ``ModelInfo`` message as plain Python (dicts, lists, str, int, float), field
    names as in the ``.proto``; ``encoder.model`` ``""`` is ``None``."""
    return {
        "version": m.version,
        "encoder": {"id": m.encoder.id, "backend": m.encoder.backend, "model": m.encoder.model or None,
                    "dim": m.encoder.dim},
        "labels": [{"name": lab.name, "description": lab.description, "metadata": dict(lab.metadata)}
                   for lab in m.labels],
        "thresholds": {"confident": m.thresholds.confident, "ambiguous_ratio": m.thresholds.ambiguous_ratio,
                       "oos": m.thresholds.oos, "oos_confident": m.thresholds.oos_confident,
                       "per_intent": dict(m.thresholds.per_intent),
                       "defer": m.thresholds.defer if m.thresholds.HasField("defer") else None,
                       "set_cutoff": m.thresholds.set_cutoff if m.thresholds.HasField("set_cutoff") else None,
                       "coverage": m.thresholds.coverage},
        "created_at": m.created_at,
        "training_size": m.training_size,
        "metrics": dict(m.metrics),
    }
