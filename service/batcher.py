"""Micro-batching across concurrent requests: one encoder pass serves many queries.

Request threads :meth:`MicroBatcher.submit` a :class:`~classifier.pipeline.Pending`
query and wait on the returned future; one worker thread takes up to ``max_batch`` of
them and runs :meth:`Classifier.score` once for all. It waits up to ``max_wait_s`` for
more only while the server is *busy* (more requests are in flight than it already
has), so a lone request is never delayed. Admission is bounded: with ``max_queue``
queries waiting, :meth:`submit` raises :class:`~service.errors.Overloaded` at once. A
query whose deadline has passed when its batch is formed is dropped, not computed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Callable

from flywheel.classifier.pipeline import Classifier, Pending
from flywheel.service.errors import DeadlineExceeded, NotServing, Overloaded
from flywheel.service.options import BatchOptions

log = logging.getLogger("flywheel.batcher")

__all__ = ["MicroBatcher"]


@dataclass(eq=False)
class _Item:
    pending: Pending
    deadline: float | None          # time.monotonic() seconds, or None
    future: Future


class MicroBatcher:
    """Batches :meth:`Classifier.score` calls from many request threads (see module docs).

    ``in_flight`` is a callable giving how many requests the server is handling now;
    ``on_batch(n)`` reports each batch size to metrics.
    """

    def __init__(self, classifier: Classifier, *, max_batch: int = BatchOptions.max_batch,
                 max_wait_s: float = BatchOptions.max_wait_ms / 1000.0,
                 max_queue: int = BatchOptions.max_queue, in_flight: Callable[[], int] | None = None,
                 on_batch: Callable[[int], Any] | None = None) -> None:
        if max_batch < 1 or max_queue < 1 or max_wait_s < 0:
            raise ValueError("need max_batch >= 1, max_queue >= 1 and max_wait_s >= 0")
        self.classifier = classifier
        self.max_batch, self.max_wait_s, self.max_queue = max_batch, max_wait_s, max_queue
        self._in_flight = in_flight or (lambda: 0)
        self._on_batch = on_batch
        self._queue: deque[_Item] = deque()
        self._cond = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="flywheel-batcher", daemon=True)
        self._thread.start()

    @property
    def depth(self) -> int:
        """Queries waiting for a batch."""
        return len(self._queue)

    def submit(self, pending: Pending, deadline: float | None = None) -> Future:
        """Queue ``pending`` for layer 2; the future resolves to it once scored. Raises
        :class:`Overloaded` when ``max_queue`` queries already wait."""
        item = _Item(pending, deadline, Future())
        with self._cond:
            if self._stopping:
                raise NotServing("the server is shutting down")
            if len(self._queue) >= self.max_queue:
                raise Overloaded(f"overloaded: {len(self._queue)} queries already wait for the encoder "
                                 f"(max_queue {self.max_queue}); retry with backoff")
            self._queue.append(item)
            self._cond.notify()
        return item.future

    def close(self, timeout: float = 10.0) -> None:
        """Score what is queued, then stop the worker."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join(timeout)

    # -- the worker
    def _run(self) -> None:
        while True:
            batch = self._next_batch()
            if batch is None:
                return
            live = self._drop_expired(batch)
            if live:
                self._score(live)

    def _next_batch(self) -> list[_Item] | None:
        with self._cond:
            while not self._queue:
                if self._stopping:
                    return None
                self._cond.wait()
            batch = self._take()
            if len(batch) < self.max_batch and self._busy(len(batch)):
                end = time.monotonic() + self.max_wait_s
                while len(batch) < self.max_batch and not self._stopping:
                    left = end - time.monotonic()
                    if left <= 0:
                        break
                    if not self._queue:
                        self._cond.wait(left)
                    batch += self._take(self.max_batch - len(batch))
            return batch

    def _take(self, n: int | None = None) -> list[_Item]:
        out: list[_Item] = []
        n = self.max_batch if n is None else n
        while self._queue and len(out) < n:
            out.append(self._queue.popleft())
        return out

    def _busy(self, have: int) -> bool:
        """More requests are being handled than this batch holds: more are coming."""
        return self._in_flight() > have

    def _drop_expired(self, batch: list[_Item]) -> list[_Item]:
        now = time.monotonic()
        live = []
        for it in batch:
            # RUNNING from here on: a request thread giving up (fut.cancel()) can no longer
            # cancel it, so set_result/set_exception below never raise InvalidStateError
            # (which would kill this worker thread and stall layer 2 for good)
            if not it.future.set_running_or_notify_cancel():
                continue
            if it.deadline is not None and now >= it.deadline:
                it.future.set_exception(DeadlineExceeded("the request's deadline passed while it waited "
                                                         "for the encoder; not computed"))
            else:
                live.append(it)
        return live

    def _score(self, batch: list[_Item]) -> None:
        try:
            self.classifier.score([it.pending for it in batch])
        except Exception as exc:  # noqa: BLE001 - fail these requests, keep the worker alive
            log.exception("layer 2 failed on a batch of %d", len(batch))
            for it in batch:
                it.future.set_exception(exc)
            return
        if self._on_batch is not None:
            self._on_batch(len(batch))
        for it in batch:
            it.future.set_result(it.pending)
