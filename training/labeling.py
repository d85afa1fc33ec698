"""``flywheel label``: ask the teacher, in batches, for decisions that needed it while
it was down (the log's *pending* decisions)."""

from __future__ import annotations

import sys
from typing import Any

from flywheel.classifier.errors import FlywheelError, TeacherError
from flywheel.classifier.pipeline import RETRYABLE_TEACHER_ERRORS, Classifier
from flywheel.logstore import LabelSink, LogStore

__all__ = ["backfill_pending"]


def backfill_pending(store: LogStore, clf: Classifier, *, batch_size: int = 32, limit: int | None = None,
                     progress: bool = True, labels: LabelSink | None = None) -> dict[str, Any]:
    """Ask the teacher for decisions that needed it while it was down, in batches.

    Valid answers become teacher labels and the decision leaves the pending list;
    invalid answers are stored as invalid (never training data) and resolved too, an
    unsure one with its candidate set (for the review queue and the tuner's hard pairs);
    when the teacher is unreachable the run stops and the rest stays pending. Answers go
    to ``labels`` (in fleet mode the bucket, so every host sees them), else to ``store``.
    """
    sink: LabelSink = labels if labels is not None else store
    if clf.teacher is None:
        raise FlywheelError("no teacher configured (teacher = off)")
    todo = store.pending(limit)
    counts: dict[str, Any] = {"pending": len(todo), "labelled": 0, "invalid": 0, "remaining": len(todo)}
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(todo), desc="labelling pending", unit="query", file=sys.stderr)
    try:
        for start in range(0, len(todo), batch_size):
            batch = todo[start:start + batch_size]
            requests = clf.teacher_requests([t for _, t, _ in batch], [h for _, _, h in batch])
            resolved: list[str] = []
            for (did, _, _), req in zip(batch, requests):
                try:
                    ans = clf.teacher.label(req)
                    if ans.unsure:   # a candidate set or "cannot tell": never a training label
                        sink.add_teacher_label(did, None, ans.model, False, ans.latency_ms,
                                               candidates=ans.candidate_set)
                        counts["unsure"] = counts.get("unsure", 0) + 1
                    else:
                        sink.add_teacher_label(did, ans.label, ans.model, True, ans.latency_ms)
                        counts["labelled"] += 1
                except TeacherError as exc:
                    if exc.kind in RETRYABLE_TEACHER_ERRORS:
                        counts["stopped_because"] = str(exc)
                        store.mark_resolved(resolved)
                        return counts
                    sink.add_teacher_label(did, None, clf.teacher.model, False)
                    counts["invalid"] += 1
                resolved.append(did)
                counts["remaining"] -= 1
                if bar is not None:
                    bar.update(1)
            store.mark_resolved(resolved)
    finally:
        if bar is not None:
            bar.close()
    return counts
