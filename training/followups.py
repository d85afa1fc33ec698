"""Logged follow-ups as training rows, in the form layer 2 scores them (issue 43, ADR RC-03).

A logged decision carries the compact history it was classified with (``decisions.history``,
:attr:`logstore.LabelledRow.history`: the labels and snippets the pipeline read, redacted like
the text). That is enough to find again the follow-up layer 2 saw: the pipeline's own
:class:`~classifier.followup.FollowupDetector` run on the logged text and history names the
same anchor turn, and :func:`~classifier.followup.resolved_text` builds the same text layer 2
scored (the anchor's snippet and the query). :func:`as_scored` rewrites each logged
follow-up's text to that, so the retrain fits "Wo ist meine Bestellung 12345? und wann kommt
sie an?" -> ORDER_STATUS, not "und wann kommt sie an?" -> ORDER_STATUS: what the teacher
resolved with the history today, layer 2 resolves with the snippet tomorrow.

A query the detector does not fire on keeps its own text (self-contained: its content alone,
RC-03), and so does every row when the intent set's ``followups`` is ``off`` (layer 2 then
scores follow-ups on their own words). A rewritten row's logged vector is of the query alone,
so the retrain never reuses it (:attr:`Scored.rewritten`): the resolved text is encoded.
For the same reason a follow-up is never a self-training row (layer 2's confident answers
train on their logged vectors, and a follow-up's is of the query alone):
:func:`followups_among`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Sequence

from flywheel.classifier.followup import FollowupDetector, resolved_text
from flywheel.classifier.protocols import HistoryEntry
from flywheel.logstore import LabelledRow

__all__ = ["Scored", "as_scored", "followups_among"]


@dataclass(frozen=True)
class Scored:
    """The log's labelled rows as layer 2 scores them: ``rows`` (follow-ups rewritten),
    ``rewritten`` (their decision ids: their logged vectors are of the query alone) and
    ``by_language`` (rewritten rows per detected language)."""

    rows: list[LabelledRow]
    rewritten: frozenset[str] = frozenset()
    by_language: dict[str, int] = field(default_factory=dict)

    def report(self) -> dict[str, Any]:
        """For the training-set report: ``{"rows": n, "by_language": {...}}``."""
        return {"rows": len(self.rewritten), "by_language": dict(sorted(self.by_language.items()))}


def as_scored(rows: Sequence[LabelledRow], mode: str, detector: FollowupDetector | None = None) -> Scored:
    """``rows`` with each logged follow-up's text replaced by what layer 2 scored for it
    (:func:`~classifier.followup.resolved_text` of the follow-up the detector finds in the
    row's text and logged history); other rows, and all rows under ``mode`` ``off``, as they
    are. Rows without text (retention removed it, and the snippets with it) are kept as they
    are: nothing is left to detect on."""
    if mode == "off":
        return Scored(list(rows))
    det = detector if detector is not None else FollowupDetector()
    out: list[LabelledRow] = []
    ids: set[str] = set()
    langs: dict[str, int] = {}
    for r in rows:
        f = det.detect(r.text, r.history) if r.text and r.history else None
        if f is None:
            out.append(r)
            continue
        out.append(replace(r, text=resolved_text(f, r.text)))
        ids.add(r.decision_id)
        langs[f.language] = langs.get(f.language, 0) + 1
    return Scored(out, frozenset(ids), langs)


def followups_among(texts: Sequence[str], histories: Sequence[Sequence[HistoryEntry]], mode: str,
                    detector: FollowupDetector | None = None) -> list[bool]:
    """Which of the logged ``texts`` (with their logged ``histories``) layer 2 scored as a
    follow-up under ``mode`` (all ``False`` under ``off``)."""
    if mode == "off":
        return [False] * len(texts)
    det = detector if detector is not None else FollowupDetector()
    return [bool(t) and bool(h) and det.detect(t, h) is not None for t, h in zip(texts, histories)]
