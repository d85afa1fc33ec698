"""Human labels from Python: :func:`record_feedback` and :func:`add_feedback`, what
``flywheel feedback`` does, over the site's one writer (:meth:`fleet.site.Site.human_labels`,
:class:`fleet.human_labels.HumanLabels`). A human label always wins over the teacher's at the
next retrain.

Locally the decision must be in the log already: a logged decision is once its log has
flushed (every ~0.5 s, and at once when ``flywheel.close()`` or the end of a
``flywheel.open_classifier`` block closes it); until then the id is unknown
(:class:`logstore.UnknownDecisionError`). On a fleet, a decision not shipped yet is taken."""

from __future__ import annotations

from flywheel.classifier.settings.config import Config
from flywheel.logstore import LogStore

__all__ = ["add_feedback", "record_feedback"]


def record_feedback(cfg: Config, decision_id: str, label: str, *, author: str | None = None,
                    store: LogStore | None = None, label_uid: str | None = None) -> str | None:
    """Store a human label for ``decision_id``; returns the stored label (None = out of scope).
    (:func:`add_feedback` also says whether it was new.)"""
    return add_feedback(cfg, decision_id, label, author=author, store=store, label_uid=label_uid)[0]


def add_feedback(cfg: Config, decision_id: str, label: str, *, author: str | None = None,
                 store: LogStore | None = None, label_uid: str | None = None) -> tuple[str | None, bool]:
    """Store a human label for ``decision_id``: ``(label, recorded)``, the label parsed
    (None = out of scope) and whether it was written (``False``: the log already had it).

    The site of ``cfg`` (:func:`fleet.site.open_site`) records it: parsed against the
    served model's labels, into ``store`` (default: the site's log; locally an unknown
    decision id raises :class:`logstore.UnknownDecisionError`) or, on a fleet, into the
    bucket (a decision another replica has not shipped yet is accepted). The same label
    for the same decision from the same author is recorded once: ``label_uid`` names a
    label an import may bring again (:func:`~logstore.label_records.stable_label_uid`).
    """
    from flywheel.fleet.site import open_site

    site = open_site(cfg)
    writer = site.human_labels(store if store is not None else LogStore(cfg.log_path))
    return writer.record_text(decision_id, label, author=author, label_uid=label_uid)
