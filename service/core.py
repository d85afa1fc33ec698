"""What the sidecar does with a request, apart from gRPC: micro-batched layer 2, the
teacher in its own bounded pool within the request's deadline, feedback, readiness.

:class:`SidecarCore` drives the pipeline's stages (:class:`classifier.pipeline.Pending`):

1. ``begin``: declared types and rules are decided inline, on the request thread;
2. an embedding-cache hit is scored inline too; anything else joins the
   :class:`~service.batcher.MicroBatcher` (one encoder pass for many requests);
3. a query layer 2 is unsure of goes to the teacher pool (never on the encoder's
   thread). When the request's deadline, the pool or the circuit breaker does not
   allow a teacher answer, the answer is layer 2's best guess, tier ``weak``, with the
   reason: never an error;
4. ``finish``: session history and the traffic log, before the reply is sent.

Errors are the named ones of :mod:`service.errors`, :mod:`classifier.errors` and
:mod:`logstore.errors`; :mod:`service.servicer` maps them to status codes.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Sequence

from flywheel.classifier.decision import Decision, Layer
from flywheel.classifier.pipeline import Pending, Query
from flywheel.classifier.versions.model import IntentModel
from flywheel.service.batcher import MicroBatcher
from flywheel.service.errors import DeadlineExceeded, NoTrafficLog, NotServing
from flywheel.service.metrics import ServerMetrics
from flywheel.service.options import BatchOptions
from flywheel.service.runtime import Runtime

log = logging.getLogger("flywheel.sidecar")

__all__ = ["BatchOptions", "SidecarCore"]


class SidecarCore:
    """Serves one :class:`~service.runtime.Runtime` to many request threads."""

    def __init__(self, runtime: Runtime, options: BatchOptions, metrics: ServerMetrics) -> None:
        self.runtime = runtime
        self.classifier = runtime.classifier
        self.options = options
        self.metrics = metrics
        self._in_flight = 0
        self._lock = threading.Lock()
        self.ready = False
        self.stopping = False
        self.batcher = MicroBatcher(self.classifier, max_batch=options.max_batch,
                                    max_wait_s=options.max_wait_ms / 1000.0, max_queue=options.max_queue,
                                    in_flight=lambda: self._in_flight,
                                    on_batch=metrics.observe_batch)
        self._teacher_pool = ThreadPoolExecutor(max_workers=options.teacher_workers,
                                                thread_name_prefix="flywheel-teacher")
        self._teacher_slots = threading.BoundedSemaphore(options.teacher_workers + options.teacher_queue)

    # -- lifecycle
    def warm_up(self) -> None:
        """One scoring pass (loads the encoder; not logged), then ready."""
        p = self.classifier.begin(Query("warm-up"))
        self.classifier.score([p])
        self.ready = True

    def begin_shutdown(self) -> None:
        """New requests get :class:`NotServing`; those in flight finish."""
        self.stopping = True

    def close(self, grace_s: float | None = None) -> None:
        """Stop the batcher and the teacher pool, then flush and close the log (shipping it
        within ``grace_s`` seconds in fleet mode)."""
        self.stopping = True
        self.batcher.close()
        self._teacher_pool.shutdown(wait=True, cancel_futures=True)
        self.runtime.close(grace_s=grace_s)

    @property
    def in_flight(self) -> int:
        return self._in_flight

    # -- requests
    def classify(self, query: Query, deadline: float | None = None) -> Decision:
        """One query; ``deadline`` is a ``time.monotonic()`` time or ``None``."""
        return self.classify_batch([query], deadline)[0]

    def classify_batch(self, queries: Sequence[Query], deadline: float | None = None) -> list[Decision]:
        """Several queries, answered in order. An unusable item raises
        :class:`~classifier.errors.InvalidInputError` naming its index; nothing is
        classified or logged then."""
        self._admit()
        try:
            pending = self.classifier.begin_all(queries, item="requests[{i}]")
            waits = [self._layer2(p, deadline) for p in pending]
            for p, fut in zip(pending, waits):
                if fut is not None:
                    self._wait(fut, deadline)
            answers = [self._teacher(p, deadline) for p in pending]
            return [self._finish(p, a) for p, a in zip(pending, answers)]
        finally:
            with self._lock:
                self._in_flight -= 1

    def feedback(self, decision_id: str, label: str) -> str | None:
        """A human label for a logged decision (the same as ``flywheel feedback``);
        returns the stored label (``None`` = out of scope).

        Recorded by the runtime's one writer (:class:`fleet.human_labels.HumanLabels`), which
        parses the label against the model served now (it hot-swaps). Locally the decision
        must be in the log (else :class:`UnknownDecisionError`). In fleet mode the decision
        may have been made by another replica, so only what this replica can rule out is
        refused: an id that is not a decision id, or one that carries this process's tag but
        was not made here. Any other id is accepted, and the retrain checks it against the
        fleet's log."""
        writer = self.runtime.human_labels
        if writer is None:
            raise NoTrafficLog("this server runs without the traffic log (--no-log): feedback cannot be stored")
        return writer.record_text(decision_id, label, author="grpc", what="feedback label")[0]

    def model(self) -> IntentModel:
        return self.classifier.model

    # -- steps
    def _admit(self) -> None:
        if self.stopping:
            raise NotServing("the server is shutting down")
        if not self.ready:
            raise NotServing("the server is not ready yet (loading the model)")
        with self._lock:
            self._in_flight += 1

    def _layer2(self, p: Pending, deadline: float | None) -> Future | None:
        """Inline when decided or cached; else queued for the batcher."""
        if p.decision is not None:
            return None
        vector = self.classifier.cached_vector(p.clean.text, p)   # p's own bundle's encoder
        if vector is not None:
            self.metrics.cache_hit()
            p.vector = vector
            self.classifier.score([p])
            return None
        self.metrics.cache_miss()
        return self.batcher.submit(p, deadline)

    def _wait(self, fut: Future, deadline: float | None) -> None:
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            fut.result(timeout=timeout)
        except FutureTimeout:
            fut.cancel()
            raise DeadlineExceeded("the request's deadline passed while it waited for the encoder") from None

    def _teacher(self, p: Pending, deadline: float | None) -> Decision:
        if p.decision is not None:
            return p.decision
        left = None if deadline is None else deadline - time.monotonic() - self.options.reply_margin_s
        if left is not None and left < self.options.min_teacher_s:
            return self._skipped(p, "skipped_deadline", f"{max(left, 0.0) * 1000:.0f} ms left of the "
                                                        f"request deadline")
        if not self._teacher_slots.acquire(blocking=False):
            return self._skipped(p, "pool_full", "all teacher workers are busy")
        fut = self._teacher_pool.submit(self._ask, p)
        try:
            d = fut.result(timeout=left)
        except FutureTimeout:
            return self._skipped(p, "timeout", "no answer within the request deadline")
        self._count_teacher(d)
        return d

    def _ask(self, p: Pending) -> Decision:
        try:
            return self.classifier.ask_teacher(p)
        finally:
            self._teacher_slots.release()

    def _skipped(self, p: Pending, outcome: str, why: str) -> Decision:
        self.metrics.teacher_call(outcome)
        return self.classifier.without_teacher(p, why, reason=outcome)

    def _count_teacher(self, d: Decision) -> None:
        if d.layer is Layer.LLM and d.teacher is None:   # a teacher-cache hit: no call (the cache's metric counts it)
            return
        if d.layer is Layer.LLM:
            outcome = "ok"
        elif d.teacher is not None and d.teacher.error:
            outcome = d.teacher.error.split(":", 1)[0]
        else:  # refused without calling (no TeacherCall): the breaker, or the call budget
            outcome = d.degraded if d.degraded is not None else "circuit_open"
        self.metrics.teacher_call(outcome)

    def _finish(self, p: Pending, d: Decision) -> Decision:
        d = self.classifier.finish(p, d)
        self.metrics.observe_decision(d)
        return d
