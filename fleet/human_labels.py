"""The one writer of human labels: :class:`HumanLabels`, given by the site.

Every entry point that records a person's label (``flywheel feedback``, the review walk,
the ``flywheel ui`` page's POST, a Label Studio import, gRPC ``Feedback``) records it
here, so the rules are written once:

- the label is parsed once (:func:`~classifier.settings.label_names.parse_label`) against the
  labels of the model served now: an offline command asks the site once per command
  (:meth:`fleet.site.Site.served_labels`, the fleet's ``models/CURRENT`` on a fleet host
  even before it synced), a server asks its live model on each label (it hot-swaps), and
  ``flywheel ui`` asks the site again when its answer is older than a second or two
  (:meth:`HumanLabels.following`: a promotion with another intent set shows without a
  restart), each label checked against them again when it is written;
- the decision id is checked once: never blank; on a fleet, where the decision may be on
  another replica's spool still, only what can be ruled out here is refused (an id that
  is not a decision id, one that carries this process's tag but was not made here) and
  the retrain's join checks the rest; locally the log refuses an id it does not hold
  (:class:`~logstore.errors.UnknownDecisionError`);
- it is written to the site's :class:`~logstore.drain.LabelSink` once: ``record`` says
  ``False`` when the log already held it (the same label from the same author, or the
  same ``label_uid``, :func:`~logstore.label_records.stable_label_uid`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from flywheel.classifier.decision import carries_this_process_tag, looks_like_decision_id, made_by_this_process
from flywheel.classifier.errors import InvalidInputError, UnknownLabelError
from flywheel.classifier.settings.label_names import label_name, parse_label
from flywheel.logstore.drain import LabelSink
from flywheel.logstore.errors import UnknownDecisionError

__all__ = ["HumanLabels"]

_UNREAD = object()


class HumanLabels:
    """Records human labels into ``sink`` (see the module docs).

    ``served()`` gives the served model's labels (``None``: unknown, any label is taken).
    It is called once, on first use, unless ``live`` (a server whose model hot-swaps: once
    per label) or ``max_age_s`` (again when its answer is older than that by ``clock``:
    a long-running process that reads them from the site, :meth:`following`). ``fleet``:
    the decision may not be in this host's log (the fleet's id rules apply instead of the
    log's)."""

    def __init__(self, sink: LabelSink, served: Callable[[], Sequence[str] | None], *, fleet: bool = False,
                 live: bool = False, max_age_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.sink = sink
        self.fleet = fleet
        self._served = served
        self._live = live
        self._max_age_s = max_age_s
        self._clock = clock
        self._labels: object = _UNREAD
        self._read_at = 0.0

    def __repr__(self) -> str:
        return f"HumanLabels({self.sink!r}, fleet={self.fleet})"

    def following(self, max_age_s: float, *, clock: Callable[[], float] | None = None) -> "HumanLabels":
        """This writer (the same sink, source of labels and id rules) for a long-running
        process that follows what is served: the labels are asked for again when the last
        answer is older than ``max_age_s`` (0: on every use)."""
        return HumanLabels(self.sink, self._served, fleet=self.fleet, max_age_s=max_age_s,
                           clock=clock or self._clock)

    @property
    def labels(self) -> tuple[str, ...] | None:
        """The labels a human label must be one of (or out of scope); ``None``: any."""
        if self._live or self._labels is _UNREAD or (
                self._max_age_s is not None and self._clock() - self._read_at >= self._max_age_s):
            got = self._served()
            labels = None if got is None else tuple(got)
            if self._live:
                return labels
            self._labels, self._read_at = labels, self._clock()
        return self._labels  # type: ignore[return-value]

    def parse(self, text: object, *, what: str = "label") -> str | None:
        """``text`` as a label of the served model (``None``: out of scope); raises
        :class:`~classifier.errors.InvalidInputError` / ``UnknownLabelError``."""
        return parse_label(text, self.labels, what=what)

    def check_id(self, decision_id: object) -> str:
        """``decision_id`` stripped; raises :class:`~classifier.errors.InvalidInputError` for
        a blank one and, on a fleet, :class:`~logstore.errors.UnknownDecisionError` for one
        that cannot be a decision of the fleet's."""
        if not isinstance(decision_id, str) or not decision_id.strip():
            raise InvalidInputError("decision_id must be a non-empty string")
        did = decision_id.strip()
        if self.fleet:
            if not looks_like_decision_id(did):
                raise UnknownDecisionError(f"{did!r} is not a decision id (32 lowercase hex characters)")
            if carries_this_process_tag(did) and not made_by_this_process(did):
                raise UnknownDecisionError(f"unknown decision id {did!r}: this process did not make it")
        return did

    def record(self, decision_id: str, label: str | None, *, author: str | None = None,
               label_uid: str | None = None) -> bool:
        """Record ``label`` (already parsed: one of :attr:`labels`, or ``None`` for out of
        scope) for ``decision_id``; ``False`` when the log already had it (nothing written)."""
        did = self.check_id(decision_id)
        labels = self.labels
        if label is not None and labels is not None and label not in labels:
            raise UnknownLabelError(f"unknown label {label_name(label)!r}: the served model's labels are "
                                    f"{', '.join(labels)}")
        return self.sink.add_human_label(did, label, author=author, label_uid=label_uid) is not False

    def record_text(self, decision_id: str, text: object, *, author: str | None = None,
                    label_uid: str | None = None, what: str = "label") -> tuple[str | None, bool]:
        """Parse ``text`` (:meth:`parse`) and record it: ``(label, recorded)``. The id is
        checked before the label is parsed."""
        did = self.check_id(decision_id)
        value = self.parse(text, what=what)
        return value, self.record(did, value, author=author, label_uid=label_uid)
