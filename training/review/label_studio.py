"""Label Studio, both ways (issue 25): the review queue out as tasks with the model's answer
as a pre-annotation, and finished annotations back in as human labels.

Formats (Label Studio's "Basic JSON", https://labelstud.io/guide/task_format and
/guide/predictions): a task is ``{"data": {...}, "predictions": [...]}``; each prediction or
annotation has a ``result`` list whose items name the control (``from_name``), the object
(``to_name``), the ``type`` and a ``value``. flywheel's project uses one ``Choices`` control,
:data:`FROM_NAME`, on the text, :data:`TO_NAME` (:func:`labeling_config` writes it):

- :func:`export_tasks`: one task per queue item; ``data`` carries the text, the decision id,
  why it is in the queue and the teacher's answer (``OUT_OF_SCOPE`` when it said so, blank
  when it gave none); an item that stands for several decisions with the same text adds
  ``decision_ids`` (the import labels every one) and ``count``. The prediction is the served
  answer with its confidence.
- :func:`read_annotations`: Label Studio's JSON export, checked whole before anything is
  written: every task needs ``data.decision_id``; a task's newest annotation that was not
  cancelled gives one choice, which must be one of the intents or ``OUT_OF_SCOPE``.
  Tasks with no (or only cancelled) annotations are skipped and counted. A malformed item
  raises :class:`LabelStudioError` naming the task; nothing is lost, nothing is written.
- :func:`import_annotations`: records them as human labels, each once: a label's id is
  made from the decision, the choice, the author and the annotation's id and time
  (:func:`~logstore.label_records.stable_label_uid`), so importing the same export again
  (on this host or another one of the fleet) records nothing new, and says so
  (:class:`ImportReport`); an annotation changed in Label Studio is a new label.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from flywheel.classifier.errors import FlywheelError, InvalidInputError
from flywheel.classifier.settings.label_names import OUT_OF_SCOPE, label_name, parse_label
from flywheel.logstore.label_records import stable_label_uid
from flywheel.training.review.queue import ReviewItem

if TYPE_CHECKING:
    from flywheel.fleet.human_labels import HumanLabels

__all__ = ["FROM_NAME", "TO_NAME", "Annotation", "ImportReport", "LabelStudioError", "export_tasks",
           "import_annotations", "labeling_config", "read_annotations"]

FROM_NAME = "intent"
TO_NAME = "text"


class LabelStudioError(InvalidInputError):
    """A Label Studio file flywheel cannot read (the message names the task)."""


def labeling_config(labels: Sequence[str]) -> str:
    """The project's labeling configuration (XML) for ``labels`` and out of scope."""
    choices = "\n".join(f'    <Choice value="{html.escape(n, quote=True)}"/>' for n in [*labels, OUT_OF_SCOPE])
    return (f'<View>\n  <Text name="{TO_NAME}" value="$text"/>\n'
            f'  <Choices name="{FROM_NAME}" toName="{TO_NAME}" choice="single" showInLine="true">\n'
            f"{choices}\n  </Choices>\n</View>\n")


def export_tasks(items: Sequence[ReviewItem]) -> list[dict[str, Any]]:
    """The queue as Label Studio tasks, the served answer as a pre-annotation."""
    out = []
    for it in items:
        result = [{"from_name": FROM_NAME, "to_name": TO_NAME, "type": "choices",
                   "value": {"choices": [label_name(it.label)]}}]
        pred: dict[str, Any] = {"model_version": f"flywheel {it.layer}", "result": result}
        if it.confidence is not None:
            pred["score"] = round(float(it.confidence), 6)
        data: dict[str, Any] = {"text": it.text, "decision_id": it.decision_id, "reasons": ", ".join(it.reasons),
                                "teacher": label_name(it.teacher_label) if it.teacher_answered else "",
                                "candidates": ", ".join(label_name(c) for c in it.candidates)}
        if it.count > 1:    # the same text several times: the import labels every one
            data |= {"decision_ids": list(it.decision_ids), "count": it.count}
        out.append({"data": data, "predictions": [pred]})
    return out


def _where(i: int, task: Any) -> str:
    tid = task.get("id") if isinstance(task, dict) else None
    return f"task {i}" + (f" (id {tid})" if tid is not None else "")


class Annotation(NamedTuple):
    """One task's answer: the decision, the label (``None`` = out of scope), who gave it
    (``label-studio:<user>``) and ``ref``, the annotation's id and time in Label Studio."""

    decision_id: str
    label: str | None
    author: str | None
    ref: str

    def label_uid(self, author: str | None) -> str:
        """The id of this answer as a label given by ``author``: the same for the same
        export, another one once the annotation was changed."""
        return stable_label_uid("label-studio", self.decision_id, self.label, author, self.ref)


@dataclass(frozen=True)
class ImportReport:
    """What :func:`import_annotations` did: labels ``recorded``, labels the log ``already``
    had (the same export imported before), tasks ``skipped`` (no finished annotation)."""

    recorded: int
    already: int
    skipped: int

    def summary(self, where: object) -> str:
        return (f"recorded {self.recorded} human label(s) from {where}"
                + (f"; {self.already} already recorded (imported before), not counted again" if self.already
                   else "")
                + (f"; {self.skipped} task(s) without a finished annotation skipped" if self.skipped else ""))


def _choice(i: int, task: dict[str, Any], labels: Sequence[str] | None
            ) -> tuple[str | None, str | None, str] | None:
    """``(label, author, ref)`` of the task's newest annotation that was not cancelled;
    ``None`` when it has none."""
    anns = task.get("annotations") or []
    if not isinstance(anns, list):
        raise LabelStudioError(f"{_where(i, task)}: 'annotations' is not a list")
    done = [a for a in anns if isinstance(a, dict) and not a.get("was_cancelled")]
    if not done:
        return None
    ann = max(done, key=lambda a: (str(a.get("updated_at") or a.get("created_at") or ""), str(a.get("id") or "")))
    picked = [r for r in ann.get("result") or [] if isinstance(r, dict) and r.get("from_name") == FROM_NAME]
    if len(picked) != 1:
        raise LabelStudioError(f"{_where(i, task)}: expected one '{FROM_NAME}' result in its annotation, "
                               f"found {len(picked)}")
    choices = (picked[0].get("value") or {}).get("choices")
    if not isinstance(choices, list) or len(choices) != 1:
        raise LabelStudioError(f"{_where(i, task)}: expected exactly one choice, got {choices!r}")
    try:
        label = parse_label(choices[0], labels, what="choice")
    except FlywheelError as exc:
        raise LabelStudioError(f"{_where(i, task)}: {exc}") from None
    author = ann.get("completed_by")
    if isinstance(author, dict):
        author = author.get("email") or author.get("id")
    ref = f"{ann.get('id', '')}@{ann.get('updated_at') or ann.get('created_at') or ''}"
    return label, None if author is None else f"label-studio:{author}", ref


def read_annotations(doc: Any, labels: Sequence[str] | None) -> tuple[list[Annotation], int]:
    """``([Annotation, ...], skipped)`` from Label Studio's JSON export ``doc``; raises
    :class:`LabelStudioError` before returning anything when one task is malformed."""
    if not isinstance(doc, list):
        raise LabelStudioError("a Label Studio export is a JSON list of tasks")
    out, skipped = [], 0
    for i, task in enumerate(doc):
        if not isinstance(task, dict) or not isinstance(task.get("data"), dict):
            raise LabelStudioError(f"{_where(i, task)}: not a task (an object with 'data')")
        did = task["data"].get("decision_id")
        if not isinstance(did, str) or not did.strip():
            raise LabelStudioError(f"{_where(i, task)}: data.decision_id is missing (export tasks with "
                                   f"flywheel review --export-label-studio)")
        got = _choice(i, task, labels)
        if got is None:
            skipped += 1
            continue
        out.append(Annotation(did.strip(), *got))
    return out, skipped


def import_annotations(rows: Sequence[Annotation], skipped: int, writer: HumanLabels, *,
                       author: str | None = None, known: Callable[[str], bool] | None = None,
                       where: object = "the export") -> ImportReport:
    """Record the annotations ``rows`` (:func:`read_annotations`, against ``writer.labels``;
    ``skipped``: the tasks it skipped) as human labels, each once, through the site's one
    writer (:class:`fleet.human_labels.HumanLabels`); ``author`` overrides each annotation's.
    Every decision id is checked first (:meth:`~fleet.human_labels.HumanLabels.check_id`;
    with ``known``, every decision must be in the log): else :class:`LabelStudioError` and
    nothing is written."""
    for a in rows:
        try:
            writer.check_id(a.decision_id)
        except FlywheelError as exc:
            raise LabelStudioError(f"{where}: {exc}; nothing was recorded") from None
    missing = [a.decision_id for a in rows if known is not None and not known(a.decision_id)]
    if missing:
        raise LabelStudioError(f"{where}: {len(missing)} task(s) name decisions not in the log (first: "
                               f"{missing[0]}); nothing was recorded")
    recorded = 0
    for a in rows:
        who = author or a.author
        recorded += writer.record(a.decision_id, a.label, author=who, label_uid=a.label_uid(who))
    return ImportReport(recorded, len(rows) - recorded, skipped)
