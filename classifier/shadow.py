"""A shadow model version scored beside the champion, off the request path.

:class:`ShadowScorer` holds one shadow :class:`~classifier.versions.model.IntentModel` (set and
cleared by a :class:`~classifier.versions.registry.ModelWatcher` on the ``SHADOW`` pointer). The
pipeline offers it every query that reached layer 2, with the vector the champion's
encoder already made (:meth:`ShadowScorer.offer`: a sampling draw and a non-blocking
append to a deque, nothing else on the request thread). One worker thread wakes every
``interval_s`` (50 ms) and scores what is queued in batches with the shadow's numpy head
(:mod:`classifier.layer2.scoring`) and the shadow's own cutoffs
(:func:`~classifier.layer2.tiers.assign_tiers`), and hands each :class:`ShadowAnswer` to
``on_answer`` (the traffic log). It enforces nothing: the caller
never sees a shadow answer, and a shadow that raises is counted, never surfaced.

A shadow on the champion's encoder scores the champion's vectors (shared: nothing is
encoded twice); one with another encoder is refused by :meth:`ShadowScorer.set_model`,
which the watcher counts, **unless it carries its own encoder** (a fine-tuned export in its
``encoder/``, issue 22): then the worker encodes its sampled share of the queries itself,
with that export on ``shadow_threads`` onnxruntime threads, off the request path (the
request thread only queues the text). That costs the sidecar CPU: BENCHMARKS.md §14.4
measures it. When the champion later swaps to another encoder, a shadow loaded against the
earlier one is offered no more vectors (:meth:`ShadowScorer.offer`) until a shadow of the
new encoder is set; a shadow with its own encoder does not depend on the champion's.

Outcomes, counted in :attr:`ShadowScorer.counts` (:data:`SHADOW_OUTCOMES`):

- ``scored``: an answer was made and handed on;
- ``busy``: the backlog was full (the server is busier than the worker keeps up with),
  so the query was skipped;
- ``sampled_out``: left out by the configured ``fraction``;
- ``error``: scoring or ``on_answer`` raised (logged once per episode).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import random
import threading
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Protocol, runtime_checkable

import numpy as np

from flywheel.classifier.errors import ModelError
from flywheel.classifier.layer2.tiers import Thresholds, assign_tiers
from flywheel.classifier.protocols import Embedder
from flywheel.classifier.versions.model import IntentModel

__all__ = ["LOAD_OUTCOMES", "SHADOW_OUTCOMES", "ShadowAnswer", "ShadowScorer", "ShadowSink"]

log = logging.getLogger("flywheel.shadow")

SHADOW_OUTCOMES = ("scored", "busy", "sampled_out", "error")
LOAD_OUTCOMES = ("ok", "refused")


@dataclass(frozen=True)
class ShadowAnswer:
    """The shadow version's layer-2 answer for one logged decision (``label`` ``None`` =
    out of scope; ``sure``: it would have decided without the teacher)."""

    decision_id: str
    version: str
    label: str | None
    confidence: float
    tier: str
    sure: bool


@runtime_checkable
class ShadowSink(Protocol):
    """A decision sink that also takes shadow answers (the spool's
    :class:`~logstore.sink.SpoolSink`): a :class:`ShadowScorer`'s ``on_answer``.

    Contract: ``add_shadow_answer(answer)`` queues ``answer`` to be logged as a
    ``source='shadow'`` label of its decision; it is called on the scorer's worker thread,
    must not block for long, and reports I/O problems the way the sink reports its decisions'
    (never into the caller). A sink without it (a caller's own :class:`~classifier.protocols.LogSink`)
    gets no shadow answers: the runtime scores no shadow then."""

    def add_shadow_answer(self, answer: ShadowAnswer) -> None: ...


@dataclass(frozen=True)
class _Bundle:
    model: IntentModel
    thresholds: Thresholds
    labels: tuple[str, ...]
    embedder: Embedder | None = None     # the version's own encoder (None: the champion's vectors)

    @classmethod
    def build(cls, model: IntentModel, embedder: Embedder | None = None) -> "_Bundle":
        return cls(model, Thresholds.for_model(model), tuple(model.manifest.labels), embedder)


class ShadowScorer:
    """Scores a shadow version on the champion's layer-2 vectors, on its own thread.

    Parameters
    ----------
    on_answer : callable
        Receives each :class:`ShadowAnswer` on the worker thread (e.g. the log sink's
        ``add_shadow_answer``); must not block for long.
    fraction : float
        Share of layer-2 queries scored (0 < fraction <= 1).
    max_pending : int
        Queries waiting at most; beyond it an offer is skipped and counted ``busy``.
    batch : int
        At most this many queued queries scored in one pass.
    interval_s : float
        How often the worker wakes to score what was queued (it is never woken per query).
    check_encoder : callable, optional
        Raises :class:`~classifier.errors.ModelError` for a model whose encoder is not the
        champion's (:meth:`classifier.pipeline.Classifier.check_encoder`): the shadow
        scores the champion's vectors, unless it carries its own encoder.
    shadow_threads : int
        onnxruntime threads of a shadow's own encoder (1: it takes at most one core from
        the sidecar).
    """

    def __init__(self, on_answer: Callable[[ShadowAnswer], None], *, fraction: float = 1.0,
                 max_pending: int = 1024, batch: int = 256, interval_s: float = 0.05,
                 check_encoder: Callable[[IntentModel], None] | None = None,
                 rng: random.Random | None = None, shadow_threads: int = 1) -> None:
        if not 0.0 < fraction <= 1.0:
            raise ValueError(f"shadow fraction must be in (0, 1], got {fraction!r}")
        if max_pending < 1 or batch < 1 or not interval_s > 0:
            raise ValueError("max_pending and batch must be >= 1, interval_s > 0")
        self.on_answer = on_answer
        self.check_encoder = check_encoder
        self.shadow_threads = int(shadow_threads)
        self.fraction = float(fraction)
        self.batch = int(batch)
        self.counts: dict[str, int] = dict.fromkeys(SHADOW_OUTCOMES, 0)
        self.loads: dict[str, int] = dict.fromkeys(LOAD_OUTCOMES, 0)
        self._bundle: _Bundle | None = None
        self._rng = rng or random.Random()
        self.max_pending = int(max_pending)
        self.interval_s = float(interval_s)
        self._pending: deque = deque()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._failing = False
        self._closed = False
        self._thread: threading.Thread | None = None   # started with the first shadow version

    # ------------------------------------------------------------ the version
    @property
    def version(self) -> str | None:
        """The shadow version scored now (``None``: none)."""
        b = self._bundle
        return b.model.version if b is not None else None

    def set_model(self, model: IntentModel | None) -> None:
        """Score ``model`` from now on (``None``: stop scoring). Raises
        :class:`~classifier.errors.ModelError` for a model with another encoder; it is
        warmed (one scoring pass) before it replaces the old one."""
        if model is None:
            self._bundle = None
            log.info("shadow cleared")
            return
        embedder = None
        if self.check_encoder is not None:
            try:
                self.check_encoder(model)
            except ModelError:
                if model.encoder_dir is None:
                    raise
                embedder = self._own_encoder(model)
        bundle = _Bundle.build(model, embedder)
        warm = embedder.encode(["warm-up"]) if embedder is not None else \
            np.zeros((1, int(model.manifest.encoder["dim"])), dtype=np.float32)
        bundle.model.head.scores(warm)
        with self._lock:
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(target=self._run, name="flywheel-shadow", daemon=True)
                self._thread.start()
        self._bundle = bundle
        log.info("shadow version %s loaded", model.version)

    def _own_encoder(self, model: IntentModel) -> Embedder:
        """``model``'s own encoder export (checked against its manifest by loading it);
        :class:`ModelError` when it cannot be built."""
        from flywheel.classifier.encoders import open_version_encoder

        assert model.encoder_dir is not None
        try:
            embedder = open_version_encoder(model.encoder_dir, model.encoder_settings, num_threads=self.shadow_threads)
        except Exception as exc:  # noqa: BLE001 - any failure to build is a refusal, named
            raise ModelError(f"shadow version {model.version}: its own encoder cannot be loaded: {exc}") from None
        if embedder.id != model.manifest.encoder.get("id"):
            raise ModelError(f"shadow version {model.version}: its encoder/ is {embedder.id}, its head was "
                             f"trained on {model.manifest.encoder.get('id')}")
        return embedder

    def count_load(self, version: str, error: str | None) -> None:
        """A :class:`~classifier.versions.registry.ModelWatcher` listener: count a load or a refusal."""
        self._count_load("ok" if error is None else "refused")

    def _count_load(self, outcome: str) -> None:
        with self._lock:
            self.loads[outcome] = self.loads.get(outcome, 0) + 1

    # ------------------------------------------------------------ the request path
    def offer(self, decision_id: str, vector: np.ndarray, champion_version: str | None = None,
              encoder_id: str | None = None, text: str | None = None) -> None:
        """Queue one layer-2 query for scoring, or count why not. Never blocks, never raises:
        an append to a deque (no lock, no thread wake-up; the worker drains it on a timer).
        A vector made by another encoder than the shadow's (``encoder_id``, when given: the
        champion moved to another encoder after the shadow was loaded) is not offered. A
        shadow with its own encoder queues ``text`` (the text the champion encoded) and
        encodes it on the worker; without a text it is not offered."""
        b = self._bundle
        if b is None or self._closed or b.model.version == champion_version:
            return
        if b.embedder is not None:
            if text is None:
                return
        elif encoder_id is not None and b.model.manifest.encoder.get("id") != encoder_id:
            return
        if self.fraction < 1.0 and self._rng.random() >= self.fraction:
            self._count("sampled_out")
            return
        if len(self._pending) >= self.max_pending:
            self._count("busy")
            return
        self._pending.append((b, decision_id, text if b.embedder is not None else vector))

    @property
    def pending(self) -> int:
        """Queries waiting to be scored."""
        return len(self._pending)

    # ------------------------------------------------------------ the worker
    def _count(self, outcome: str, n: int = 1) -> None:
        with self._lock:
            self.counts[outcome] = self.counts.get(outcome, 0) + n

    def _take(self) -> list:
        """Up to ``batch`` queued items, oldest first."""
        items: list = []
        pop = self._pending.popleft
        while len(items) < self.batch:
            try:
                items.append(pop())
            except IndexError:
                break
        return items

    def _run(self) -> None:
        while True:
            stopping = self._stop.wait(self.interval_s)
            while True:                     # bounded: offers stop once closed
                items = self._take()
                if not items:
                    break
                self._score(items)
            if stopping:
                return

    def _score(self, items: list) -> None:
        with _one_blas_thread():
            self._score_groups(items)

    def _score_groups(self, items: list) -> None:
        by_bundle: dict[int, list] = {}
        for it in items:
            by_bundle.setdefault(id(it[0]), []).append(it)
        for group in by_bundle.values():
            try:
                answers = _answers(group)
                for a in answers:
                    self.on_answer(a)
            except Exception:  # noqa: BLE001 - a shadow must never affect serving
                self._count("error", len(group))
                if not self._failing:
                    log.exception("shadow version %s failed; counting errors until it recovers",
                                  group[0][0].model.version)
                self._failing = True
                continue
            self._failing = False
            self._count("scored", len(answers))

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop taking offers, score what is queued (within ``timeout_s``), end the worker."""
        if self._closed:
            return
        with self._lock:
            self._closed = True
            thread = self._thread
        if thread is None:
            return
        self._stop.set()
        thread.join(timeout_s)
        if thread.is_alive():
            log.warning("shadow worker still busy after %.1fs; %d queued answers dropped", timeout_s,
                        len(self._pending))


@functools.cache
def _blas_controller() -> Any:
    """threadpoolctl's view of the loaded BLAS libraries, taken once (``None`` without it)."""
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:   # without it the shadow still works, only slower
        return None
    return ThreadpoolController()


def _one_blas_thread() -> Any:
    """A context in which BLAS runs on one thread (``threadpoolctl``), for the shadow's
    matrix products. With a threaded BLAS (numpy's OpenBLAS), a second caller's products
    wake the BLAS thread pool beside the encoder's and the two oversubscribe the cores:
    measured, that cost the sidecar 15% of its throughput (BENCHMARKS.md section 11.2)."""
    ctl = _blas_controller()
    return ctl.limit(limits=1, user_api="blas") if ctl is not None else contextlib.nullcontext()


def _answers(group: list) -> list[ShadowAnswer]:
    """Score one batch of ``(bundle, decision_id, vector or text)`` that share a bundle (a
    text when the bundle has its own encoder: encoded here, on the worker)."""
    b: _Bundle = group[0][0]
    if b.embedder is not None:
        X = np.asarray(b.embedder.encode([t for _, _, t in group]), dtype=np.float32)
    else:
        X = np.stack([np.asarray(v, dtype=np.float32).reshape(-1) for _, _, v in group])
    s = b.model.head.scores(X)
    t = assign_tiers(s, b.labels, b.thresholds)
    return [ShadowAnswer(decision_id, b.model.version, label, float(t.confidence[j]), t.tier[j].value, bool(t.sure[j]))
            for j, ((_, decision_id, _), label) in enumerate(zip(group, t.labels(b.labels)))]
