"""The pluggable parts of the pipeline, as :class:`typing.Protocol` types.

- :class:`Embedder`: text -> L2-normalised float32 vectors (layer 2's encoder); what some
  embedders can do besides, each a Protocol of its own that callers check with ``isinstance``
  (never a ``getattr``): :class:`CachingEmbedder` (a vector without encoding) and
  :class:`LoadTimed` (the time spent loading the model).
- Layer 2's fitted head, as a model version serves and saves it, is the
  :class:`~classifier.layer2.scoring.Head` Protocol, kept in layer 2's wing beside the two
  heads that satisfy it.
- :class:`Teacher`: the LLM that labels what layer 2 is unsure of (layer 3);
  :class:`ManagedTeacher`, one with a server behind it that the process checks, watches
  and closes (the backends in :mod:`classifier.teachers`).
- :class:`LogSink`: where every decision goes (the DuckDB traffic log in ``logstore``).
- :class:`Registry`: the model versions and which one is served (a local models home,
  :class:`classifier.versions.registry.ModelRegistry`, or a shared one).

``classifier`` only defines these; it never imports duckdb, grpc or a storage client.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ContextManager, Protocol, Sequence, runtime_checkable

import numpy as np

from flywheel.classifier.decision import Decision, Layer2Answer
from flywheel.classifier.settings.label_names import label_name

if TYPE_CHECKING:
    from flywheel.classifier.versions.model import IntentModel


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
        (0.0 when it is not :class:`LoadTimed`): a wrapper is :class:`LoadTimed` itself."""
        return self.inner.pop_load_ms() if isinstance(self.inner, LoadTimed) else 0.0

    def pop_earlier_load_ms(self) -> float:
        """The inner embedder's load paid before its first decision (see :class:`LoadTimed`)."""
        return self.inner.pop_earlier_load_ms() if isinstance(self.inner, LoadTimed) else 0.0


@runtime_checkable
class CachingEmbedder(Protocol):
    """An :class:`Embedder` that keeps the vectors it made and hands one out without
    encoding (:class:`~classifier.encoders.cache.CachedEmbedder`).

    Contract: ``lookup(text)`` is the vector ``encode([text])[0]`` returned for exactly that
    text earlier, if it is still kept, else ``None``; it never encodes, never loads a model and
    never raises for a text it does not know (so a server can try it on the request thread
    before queueing the text for the encoder). Thread-safe.

    Only the capability is named here (no ``id``/``dim``): ``isinstance`` checks of a
    runtime Protocol with properties read them, and an embedder's ``dim`` may load its model.
    """

    def lookup(self, text: str) -> np.ndarray | None: ...


@runtime_checkable
class LoadTimed(Protocol):
    """An :class:`Embedder` that reports how long loading its model took, so a caller can
    report loading apart from encoding (the query latency the pipeline logs leaves it out).

    Contract: ``pop_load_ms()`` is the milliseconds the *calling thread* spent loading the
    model since its previous call (0.0 when nothing was loaded), and resets that count: each
    load is reported once, to the thread that paid for it. It never loads or encodes. Every
    lazy embedder of :mod:`classifier.encoders` is one, and so is every
    :class:`DelegatingEmbedder` (passing on the inner embedder's). Only the capability is
    named here, as for :class:`CachingEmbedder`.

    ``pop_earlier_load_ms()`` is, once per process, the time spent loading this embedder's
    model before any decision reported it, by another embedder that shares the loaded model
    (the default model's training on first use loads the encoder the first query then finds
    loaded), else 0.0: the first decision reports it as its ``load`` without taking it off
    its encoding time (it was not part of it).
    """

    def pop_load_ms(self) -> float: ...

    def pop_earlier_load_ms(self) -> float: ...


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
    # which order the prompt lists the options in (teachers.base.option_order): 0 is the
    # usual one; another value another order (a second ask, teacher.ask_twice)
    order_seed: int = 0


@dataclass(frozen=True)
class TeacherAnswer:
    """A validated answer: ``label`` is one of the offered names, or ``None`` (out of scope).

    The teacher may be unsure: ``candidates`` (2 or 3 offered labels, ``None`` = out of
    scope) when it cannot pick between them, ``cannot_tell`` when it cannot tell at all.
    Then ``label`` is only its lean, never a training label (:attr:`unsure`). ``asks`` is
    how many teacher calls the answer took (2 when ``teacher.ask_twice`` asked again).
    """

    label: str | None
    model: str
    latency_ms: float
    raw: str = ""
    candidates: tuple[str | None, ...] = ()
    cannot_tell: bool = False
    asks: int = 1

    @property
    def unsure(self) -> bool:
        """Whether the teacher did not give one confident label."""
        return self.cannot_tell or bool(self.candidates)

    @property
    def candidate_set(self) -> tuple[str | None, ...] | None:
        """The unsure answer as data (:attr:`TeacherCall.candidates
        <classifier.decision.TeacherCall>`, the log's ``teacher_candidates``): ``None`` when
        sure, ``()`` for "cannot tell", else the candidates."""
        if self.cannot_tell:
            return ()
        return tuple(self.candidates) if self.candidates else None

    def unsure_reason(self) -> str:
        """The unsure answer in words for a decision's reason, e.g. ``teacher unsure
        between A, B`` (``""`` when sure). Prose only: the set itself travels as
        :attr:`candidate_set`."""
        if self.cannot_tell:
            return "teacher cannot tell"
        if self.candidates:
            return "teacher unsure between " + ", ".join(label_name(c) for c in self.candidates)
        return ""


@dataclass(frozen=True)
class TeacherStatus:
    """What a teacher's ``check()`` found: ``ok`` when its server answered and has the
    model (or cannot say, see the backend), ``detail`` a one-line explanation for logs."""

    ok: bool
    detail: str


@runtime_checkable
class Teacher(Protocol):
    """Labels one query. Raises :class:`classifier.errors.TeacherError` on any failure
    (unreachable, timeout, malformed answer, unknown label, circuit open).

    All the pipeline needs; a teacher with a server behind it is a :class:`ManagedTeacher`."""

    @property
    def model(self) -> str: ...

    def label(self, request: TeacherRequest) -> TeacherAnswer: ...


class Breaker(Protocol):
    """A teacher's circuit breaker, as the process watches it: ``state`` is ``"closed"``
    (calls go through), ``"open"`` (calls fail at once with ``circuit_open``, no server
    call) or ``"half_open"`` (the cool-down is over: one probe call may go through).
    Reading it never raises and changes nothing."""

    @property
    def state(self) -> str: ...


@runtime_checkable
class ManagedTeacher(Teacher, Protocol):
    """A :class:`Teacher` with a server behind it, which the serving process checks,
    watches and closes (the backends of :mod:`classifier.teachers`, and a
    :class:`~classifier.teachers.budget.BudgetedTeacher` around one of them).

    Contract:

    - ``check()`` says whether the server answers and serves ``model``, as a
      :class:`TeacherStatus`. It never raises (a failure is ``ok=False`` with the reason in
      ``detail``), is bounded by the teacher's own timeout, is not a labelling call (no
      budget is spent) and does not touch the breaker.
    - ``close()`` releases what the teacher holds open (its HTTP client). It may be called
      more than once; a later ``label()`` or ``check()`` opens what it needs again.
    - ``breaker`` is the :class:`Breaker` that ``label()`` calls go through, ``None`` when
      there is none; the same object for the teacher's lifetime (the server reads it
      once, when it starts).

    A teacher that is only a :class:`Teacher` is labelled with and nothing else: nothing
    checks it at startup, watches a breaker or closes it.
    """

    @property
    def breaker(self) -> Breaker | None: ...

    def check(self) -> TeacherStatus: ...

    def close(self) -> None: ...


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


@runtime_checkable
class Registry(Protocol):
    """The model versions and the pointer to the served one.

    Contract:

    - ``current()`` is ``(name, token)`` of the served version, ``(None, None)`` when
      nothing is promoted. The token is opaque (the name itself in a local home, an etag
      in a bucket): hand it back as ``expected`` to move the pointer only if nobody else
      moved it since.
    - ``load(name)`` is the version, verified against every checksum of its manifest;
      :class:`~classifier.errors.ModelError` when it is missing, corrupt or unusable.
    - ``staging_dir(name)`` is the local directory in which to save a new version
      ``name`` before :meth:`publish` (a local registry's own version directory, where
      publishing it is a no-op).
    - ``publish(directory)`` makes a saved version directory available to every reader,
      create-only: an existing version is never replaced (``ModelError``). It returns
      the version's name and serves nothing.
    - ``promote(name, expected=token)`` serves ``name`` if the pointer still holds
      ``expected`` (``None``: nothing is promoted yet): compare-and-swap. When it moved,
      it raises :class:`classifier.versions.registry.PromotionConflict` (naming the expected and
      the found version) and changes nothing; ``ModelError`` when ``name`` is missing or
      does not verify. Returns the new token.
    - ``rollback(expected=token)`` serves the previously promoted version again, with the
      same compare-and-swap (``expected=None``: whatever is served); returns the new token.
    - ``shadow()`` is the shadow version (``None``: none): replicas score it beside the
      served one and enforce nothing. ``set_shadow(name, expected=...)`` sets it (``name``
      must be servable, else ``ModelError``) or clears it (``None``); with ``expected`` (a
      version name, ``None`` = no shadow) only if it still is that, else
      :class:`~classifier.versions.registry.PromotionConflict`.
    - ``record_retrain(status)`` records a finished retrain run (a JSON-ready dict with
      ``finished_at`` in unix seconds); ``last_retrain()`` reads it back (``None``: never).
    - ``lock()`` is the retrain lock, taken without waiting: a context manager yielding
      ``True`` while held, ``False`` when another run holds it. Jobs that write versions
      (retrain, prune) hold it; promotions do not need it (they compare and swap).
      ``create=False`` (a run that writes nothing) does not create a missing home just
      to lock it: it yields ``True`` holding nothing.
    """

    def current(self) -> tuple[str | None, str | None]: ...

    def load(self, name: str) -> IntentModel: ...

    def staging_dir(self, name: str) -> Path: ...

    def publish(self, directory: Path) -> str: ...

    def promote(self, name: str, *, expected: str | None) -> str: ...

    def rollback(self, *, expected: str | None = None) -> str: ...

    def shadow(self) -> str | None: ...

    def set_shadow(self, name: str | None, *, expected: Any = ...) -> None: ...

    def record_retrain(self, status: dict[str, Any]) -> None: ...

    def last_retrain(self) -> dict[str, Any] | None: ...

    def lock(self, *, create: bool = True) -> ContextManager[bool]: ...
