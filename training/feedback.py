"""Human labels: ``flywheel feedback`` and the Python API."""

from __future__ import annotations

from classifier.config import Config
from classifier.errors import UnknownLabelError
from classifier.pipeline import OUT_OF_SCOPE_NAMES
from training.logstore import LogStore


def known_labels(cfg: Config) -> tuple[str, ...] | None:
    """Labels of the served model (or of the intent file it would be trained from), to
    reject typos; ``None`` when neither can be read. Never trains or loads a model."""
    import json

    from classifier.config import starter_intents_path
    from classifier.default import existing_model_dir
    from classifier.errors import FlywheelError
    from classifier.intents import load_intents

    try:
        path = existing_model_dir(cfg)
        if path is not None:
            return tuple(json.loads((path / "manifest.json").read_text())["labels"])
        return load_intents(cfg.intents or starter_intents_path()).labels
    except (FlywheelError, OSError, ValueError, KeyError):
        return None


def normalise_label(label: str, labels: tuple[str, ...] | None) -> str | None:
    if label.strip().upper() in OUT_OF_SCOPE_NAMES:
        return None
    if labels is not None and label not in labels:
        raise UnknownLabelError(f"unknown label {label!r}; known: {', '.join(labels)}, OUT_OF_SCOPE")
    return label


def record_feedback(cfg: Config, decision_id: str, label: str, *, author: str | None = None,
                    store: LogStore | None = None) -> str | None:
    """Store a human label for ``decision_id``; returns the stored label (None = out of scope)."""
    value = normalise_label(label, known_labels(cfg))
    (store or LogStore(cfg.log_path)).add_human_label(decision_id, value, author=author)
    return value
