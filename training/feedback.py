"""Human labels: ``flywheel feedback`` and the Python API."""

from __future__ import annotations

from flywheel.classifier.config import Config
from flywheel.classifier.label_names import parse_label
from flywheel.logstore import LabelSink, LogStore

__all__ = ["add_feedback", "known_labels", "record_feedback"]


def known_labels(cfg: Config) -> tuple[str, ...] | None:
    """Labels of the served model (or of the intent file it would be trained from), to
    reject typos; ``None`` when neither can be read. Never trains or loads a model."""
    from flywheel.classifier.config import starter_intents_path
    from flywheel.classifier.default import existing_model_dir
    from flywheel.classifier.errors import FlywheelError
    from flywheel.classifier.intents import load_intents
    from flywheel.classifier.model import Manifest

    try:
        path = existing_model_dir(cfg)
        if path is not None:   # the manifest only: loading the version would read the head
            return tuple(Manifest.read(path).labels)
        return load_intents(cfg.intents or starter_intents_path()).labels
    except (FlywheelError, OSError, ValueError, KeyError):
        return None


def record_feedback(cfg: Config, decision_id: str, label: str, *, author: str | None = None,
                    store: LogStore | None = None, labels: LabelSink | None = None,
                    label_uid: str | None = None) -> str | None:
    """Store a human label for ``decision_id``; returns the stored label (None = out of scope).
    (:func:`add_feedback` also says whether it was new.)"""
    return add_feedback(cfg, decision_id, label, author=author, store=store, labels=labels,
                        label_uid=label_uid)[0]


def add_feedback(cfg: Config, decision_id: str, label: str, *, author: str | None = None,
                 store: LogStore | None = None, labels: LabelSink | None = None,
                 label_uid: str | None = None) -> tuple[str | None, bool]:
    """Store a human label for ``decision_id``: ``(label, recorded)``, the label parsed
    (None = out of scope) and whether it was written (``False``: the log already had it).

    The label is parsed by :func:`classifier.label_names.parse_label` against the served
    model's labels. It goes to ``labels`` when given (in fleet mode a
    :class:`fleet.bucket_labels.BucketLabels`, which accepts a decision another replica has not
    shipped yet), else to ``store`` (default: the configured log), where an unknown
    decision id raises :class:`logstore.UnknownDecisionError`. The same label for the same
    decision from the same author is recorded once (:class:`~logstore.drain.LabelSink`):
    ``label_uid`` names a label an import may bring again
    (:func:`~logstore.label_records.stable_label_uid`).
    """
    value = parse_label(label, known_labels(cfg), what="label")
    sink = labels if labels is not None else (store or LogStore(cfg.log_path))
    recorded = sink.add_human_label(decision_id, value, author=author, label_uid=label_uid)
    return value, recorded is not False
