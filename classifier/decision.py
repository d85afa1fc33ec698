"""The result of one classification: a :class:`Decision` with its tier and layer."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, TypeGuard


class Tier(str, Enum):
    """How sure the decision is."""

    CONFIDENT = "confident"
    AMBIGUOUS = "ambiguous"
    WEAK = "weak"
    NO_MATCH = "no_match"


class Layer(str, Enum):
    """Which layer made the decision."""

    DECLARED = "declared"
    RULES = "rules"
    EMBEDDING = "embedding"
    LLM = "llm"


#: Why a decision is degraded: the teacher's failure kinds
#: (:class:`~classifier.errors.TeacherError`; ``budget``: the LLM call budget of
#: :mod:`classifier.teachers.budget` was spent), the sidecar's reasons for not asking or not
#: waiting (``skipped_deadline``, ``pool_full``, ``timeout``), ``no_teacher`` (none
#: configured) and ``error`` (a teacher that raised something unexpected).
DEGRADED_REASONS = ("unavailable", "timeout", "circuit_open", "budget", "skipped_deadline", "pool_full",
                    "malformed", "unknown_label", "error", "no_teacher")


@dataclass(frozen=True)
class Candidate:
    """One label with its confidence (``label`` is ``None`` for out of scope)."""

    label: str | None
    confidence: float

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "confidence": round(float(self.confidence), 6)}


@dataclass(frozen=True)
class Layer2Answer:
    """Layer 2's own answer for a query, whichever layer decided in the end.

    Kept for the traffic log (what layer 2 said when the LLM decided, or when a
    degraded decision fell back to it); ``label`` is ``None`` for out of scope.
    """

    label: str | None
    confidence: float
    tier: Tier


@dataclass(frozen=True)
class TeacherCall:
    """What the LLM teacher was asked and answered, kept for the traffic log.

    ``candidates`` is an unsure answer's set (logged as ``teacher_candidates``): ``None``
    when the teacher was sure or did not answer, ``()`` for "cannot tell", else the 2 or 3
    labels it could not pick between (``None`` among them: out of scope). An unsure call
    is not valid (never a training label) and has no ``error``: it is an answer."""

    model: str
    label: str | None
    valid: bool
    latency_ms: float
    error: str | None = None
    candidates: tuple[str | None, ...] | None = None

    @property
    def unsure(self) -> bool:
        """Whether the teacher answered with a candidate set or "cannot tell"."""
        return self.candidates is not None


def _new_process_keys() -> tuple[str, bytes]:
    return os.urandom(4).hex(), os.urandom(16)


#: 8 random hex chars that start every decision id this process makes (regenerated in a
#: forked child), so a replica can tell an id it issued from one it cannot check. Read it
#: as ``decision.PROCESS_TAG`` (a name imported before a fork keeps the parent's tag).
PROCESS_TAG, _PROCESS_KEY = _new_process_keys()


def _retag_after_fork() -> None:
    global PROCESS_TAG, _PROCESS_KEY
    PROCESS_TAG, _PROCESS_KEY = _new_process_keys()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_retag_after_fork)


def _mac(tag: str, body: str) -> str:
    return hashlib.blake2b((tag + body).encode(), key=_PROCESS_KEY, digest_size=4).hexdigest()


def new_decision_id() -> str:
    """A unique id for feedback: 32 lowercase hex chars, :data:`PROCESS_TAG`, 64 random
    bits and a 32-bit keyed checksum of both (existing logs' ids, 128 random bits, have the
    same shape). The checksum lets this process tell its own ids from made-up ones that
    carry its tag (:func:`made_by_this_process`) without remembering any of them."""
    tag, body = PROCESS_TAG, os.urandom(8).hex()
    return tag + body + _mac(tag, body)


_HEX = frozenset("0123456789abcdef")


def looks_like_decision_id(s: object) -> TypeGuard[str]:
    """Whether ``s`` has the shape of a decision id: 32 lowercase hex chars."""
    return isinstance(s, str) and len(s) == 32 and _HEX.issuperset(s)


def carries_this_process_tag(s: object) -> TypeGuard[str]:
    """Whether ``s`` starts with :data:`PROCESS_TAG`: an id this process made, or a
    corrupted or made-up one (see :func:`made_by_this_process`)."""
    return looks_like_decision_id(s) and s[:8] == PROCESS_TAG


def made_by_this_process(s: object) -> bool:
    """Whether ``s`` is a decision id this process made (its tag and keyed checksum match).

    False says nothing about whether the id exists: another process may have made it."""
    return carries_this_process_tag(s) and _mac(s[:8], s[8:24]) == s[24:]


@dataclass(frozen=True)
class Decision:
    """The answer of :meth:`classifier.Classifier.classify`.

    ``to_dict`` gives exactly the public fields, :data:`PUBLIC_FIELDS`: ``id``, ``label``,
    ``confidence``, ``tier``, ``layer``, ``alternatives``, ``reason``, ``model_version``,
    ``latency_ms`` (milliseconds per layer that ran), ``metadata`` (the intent's
    string map from the intent file, e.g. ``{"rag": "false"}``; empty for out of scope) and
    ``degraded`` (why the answer did not get the layer it needed, one of
    :data:`DEGRADED_REASONS`: layer 2 was unsure and the teacher did not answer; ``None``
    when it did) and ``language`` (the query's language, one of the intent set's declared
    ``languages`` or ``"unknown"``, :mod:`classifier.language`; ``None`` from servers older
    than the field). ``teacher`` records the LLM call, if any, and ``pending`` whether the
    teacher was needed but unavailable; they are for the traffic log and the metrics, not
    part of the public dict.

    Frozen: the pipeline computes every field before it builds one (its ``finish`` step
    adds ``language`` and the total latency with one :func:`dataclasses.replace`), and
    nothing changes it afterwards; a changed decision is a new one
    (``dataclasses.replace(d, ...)``; the ``id`` is kept unless given).
    """

    label: str | None
    confidence: float
    tier: Tier
    layer: Layer
    reason: str
    alternatives: list[Candidate] = field(default_factory=list)
    model_version: str | None = None
    latency_ms: dict[str, float] = field(default_factory=dict)
    id: str = field(default_factory=new_decision_id)
    metadata: dict[str, str] = field(default_factory=dict)
    teacher: TeacherCall | None = None
    pending: bool = False  # the teacher was needed but unavailable: label it later (log only)
    degraded: str | None = None  # why this answer did not get the layer it needed (public)
    language: str | None = None  # the query's language: a declared one or "unknown" (public)

    def to_dict(self) -> dict[str, Any]:
        """The public fields (:data:`PUBLIC_FIELDS`, in that order) as JSON-ready values."""
        return {n: _PUBLIC_VALUE[n](self) if n in _PUBLIC_VALUE else getattr(self, n) for n in PUBLIC_FIELDS}


#: The public fields of a :class:`Decision`, in order, defined once: the keys of
#: :meth:`Decision.to_dict` (the command line's JSON) and the fields of the gRPC
#: ``flywheel.v1.Decision`` message (same names; :func:`service.convert.decision_to_proto`
#: fills each). A field added here must be added to the ``.proto`` too (with a new field
#: number), and to the conversions; ``tests/service/test_decision_shape.py`` fails until it is.
PUBLIC_FIELDS: tuple[str, ...] = ("id", "label", "confidence", "tier", "layer", "alternatives", "reason",
                                  "model_version", "latency_ms", "metadata", "degraded", "language")


#: How :meth:`Decision.to_dict` writes the public fields that are not their attribute as is.
_PUBLIC_VALUE = {
    "confidence": lambda d: round(float(d.confidence), 6),
    "tier": lambda d: d.tier.value,
    "layer": lambda d: d.layer.value,
    "alternatives": lambda d: [c.to_dict() for c in d.alternatives],
    "latency_ms": lambda d: {k: round(v, 4) for k, v in d.latency_ms.items()},
    "metadata": lambda d: dict(d.metadata),
}
