"""The pluggable parts of the pipeline, as :class:`typing.Protocol` types.

- :class:`Embedder`: text -> L2-normalised float32 vectors (layer 2's encoder).
- :class:`Teacher`: the LLM that labels what layer 2 is unsure of (layer 3).
- :class:`LogSink`: where every decision goes (the DuckDB traffic log in ``logstore``).

``classifier`` only defines these; it never imports duckdb or grpc.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, Sequence, runtime_checkable

import numpy as np

from classifier.decision import Decision, Layer2Answer


@runtime_checkable
class Embedder(Protocol):
    """Encodes texts into L2-normalised float32 row vectors.

    Implementations load their model lazily (first ``encode``/``dim``), never in
    ``__init__``, and at most once per process.
    """

    @property
    def id(self) -> str:
        """Stable encoder id stored in manifests and logs, e.g. ``minilm:all-MiniLM-L6-v2``."""
        ...

    @property
    def dim(self) -> int:
        """Embedding dimension (may load the model)."""
        ...

    def encode(self, texts: Sequence[str], *, batch_size: int | None = None,
               progress: bool = False) -> np.ndarray:
        """Return an ``(len(texts), dim)`` float32 array with unit-norm rows."""
        ...


class DelegatingEmbedder:
    """Base for an embedder that wraps another: ``id`` and ``dim`` are the inner one's,
    and ``encode`` passes through unless a subclass overrides it."""

    def __init__(self, inner: Embedder) -> None:
        self.inner = inner

    @property
    def id(self) -> str:
        return self.inner.id

    @property
    def dim(self) -> int:
        return self.inner.dim

    def encode(self, texts: Sequence[str], *, batch_size: int | None = None,
               progress: bool = False) -> np.ndarray:
        return self.inner.encode(texts, batch_size=batch_size, progress=progress)

    def pop_load_ms(self) -> float:
        """The inner embedder's model-loading time on this thread since the last call
        (0.0 when it does not report one)."""
        pop = getattr(self.inner, "pop_load_ms", None)
        return pop() if pop is not None else 0.0


@dataclass(frozen=True)
class HistoryEntry:
    """One earlier turn in the compact intent history: its label and a short snippet."""

    label: str | None
    snippet: str

    @classmethod
    def of(cls, label: str | None, text: str, max_chars: int = 60) -> "HistoryEntry":
        return cls(label, text if len(text) <= max_chars else text[: max_chars - 1] + "…")


@dataclass(frozen=True)
class LabelOption:
    """A label offered to the teacher, with its description and a few examples."""

    name: str
    description: str
    examples: tuple[str, ...] = ()


@dataclass(frozen=True)
class TeacherRequest:
    text: str
    options: tuple[LabelOption, ...]
    history: tuple[HistoryEntry, ...] = ()
    allow_out_of_scope: bool = True


@dataclass(frozen=True)
class TeacherAnswer:
    """A validated answer: ``label`` is one of the offered names, or ``None`` (out of scope)."""

    label: str | None
    model: str
    latency_ms: float
    raw: str = ""


@runtime_checkable
class Teacher(Protocol):
    """Labels one query. Raises :class:`classifier.errors.TeacherError` on any failure
    (unreachable, timeout, malformed answer, unknown label, circuit open)."""

    @property
    def model(self) -> str: ...

    def label(self, request: TeacherRequest) -> TeacherAnswer: ...


@dataclass
class DecisionRecord:
    """Everything the traffic log stores about one decision."""

    decision: Decision
    text: str
    created_at: float                      # unix seconds
    session_id: str | None = None
    declared_type: str | None = None
    history: tuple[HistoryEntry, ...] = ()
    encoder_id: str | None = None
    embedding: np.ndarray | None = field(default=None, repr=False)  # layer-2 vector, when computed
    audit: bool = False                    # sampled for a background teacher audit
    pending: bool = False                  # needed the teacher while it was unavailable
    layer2: Layer2Answer | None = None     # layer 2's own answer, whenever layer 2 ran


@runtime_checkable
class LogSink(Protocol):
    """Receives every decision. ``write`` must be cheap and must not raise into the
    caller's request path for I/O problems (buffer, and report on ``flush``/``close``)."""

    def write(self, record: DecisionRecord) -> None: ...

    def close(self) -> None: ...
