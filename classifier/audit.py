"""Background teacher audits with a bounded backlog.

A share of confident layer-2 decisions is also sent to the teacher, off the request
path, so ``flywheel stats`` can show how often layer 2 and the teacher agree. An audit
asks the question layer 3 would have asked for the same query (the pipeline builds both
requests one way: :func:`~classifier.teachers.base.offered_options`, layer 2's top
candidates with the decided label among them), so agreement measures layer 3's task. The
teacher is slow (seconds) and traffic can be fast, so the backlog is bounded: when
``max_pending`` audits are already waiting or running, a new one is dropped and
counted in :attr:`AuditQueue.dropped`, never queued without limit.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

log = logging.getLogger("flywheel.audit")

__all__ = ["AUDIT_OUTCOMES", "AuditQueue", "DEFAULT_MAX_PENDING"]

DEFAULT_MAX_PENDING = 1000
#: What a teacher audit of a confident layer-2 decision found (``Classifier.audit_outcomes``);
#: ``unsure``: the teacher answered with a candidate set or "cannot tell" (no teacher label).
AUDIT_OUTCOMES = ("agree", "disagree", "failed", "unsure")


class AuditQueue:
    """One worker thread, at most ``max_pending`` audits admitted at a time.

    Call :meth:`reserve` first (cheap, never blocks); only when it returns True call
    :meth:`submit` exactly once. The split lets the caller record whether the audit
    really happens before it hands the decision to the log.
    """

    def __init__(self, max_pending: int = DEFAULT_MAX_PENDING) -> None:
        if max_pending < 1:
            raise ValueError(f"max_pending must be >= 1, got {max_pending}")
        self.max_pending = max_pending
        self._slots = threading.BoundedSemaphore(max_pending)
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self.dropped = 0

    def reserve(self) -> bool:
        """Take a place in the backlog; False (and counted as dropped) when it is full."""
        if self._slots.acquire(blocking=False):
            return True
        with self._lock:
            self.dropped += 1
        return False

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the worker; the place taken by :meth:`reserve` is freed after."""
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="flywheel-audit")
            pool = self._pool
        pool.submit(self._run, fn, args)

    def _run(self, fn: Callable[..., Any], args: tuple) -> None:
        try:
            fn(*args)
        except Exception:  # noqa: BLE001 - one failed audit must not stop the worker
            log.exception("audit failed")
        finally:
            self._slots.release()

    def close(self) -> None:
        """Finish the audits already admitted."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)
