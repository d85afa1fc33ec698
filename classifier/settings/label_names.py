"""Label names: a label as a string, and one meaning for "out of scope".

Inside flywheel, out of scope is ``None`` (a decision's ``label``, a training row's
label, a logged label). Where a label is a string given by someone else (a declared
type, a feedback label, a teacher's answer) or shown to someone (reports, stats),
out of scope is :data:`OUT_OF_SCOPE`; :func:`parse_label` is the one parser, and it
also accepts the aliases in :data:`OUT_OF_SCOPE_NAMES` (any case).
"""

from __future__ import annotations

import difflib
from typing import Sequence

from flywheel.classifier.errors import InvalidInputError, UnknownLabelError

__all__ = ["OUT_OF_SCOPE", "OUT_OF_SCOPE_NAMES", "parse_label", "label_name", "suggest_label"]

#: How out of scope is written wherever a label is a string.
OUT_OF_SCOPE = "OUT_OF_SCOPE"
#: The names accepted for it (compared upper-cased).
OUT_OF_SCOPE_NAMES = frozenset({OUT_OF_SCOPE, "OOS", "NONE"})


def parse_label(value: object, labels: Sequence[str] | None, *, what: str = "label") -> str | None:
    """A label string as flywheel means it: one of ``labels``, or ``None`` for out of scope.

    ``labels=None`` accepts any non-empty label (the label set is unknown). Raises
    :class:`~classifier.errors.InvalidInputError` for a non-string or blank value and
    :class:`~classifier.errors.UnknownLabelError` for a label outside ``labels``; both
    messages start with ``what`` ("declared type", "feedback label", ...).

    >>> parse_label("oos", ["A"]) is None
    True
    >>> parse_label(" A ", ["A"])
    'A'
    """
    if not isinstance(value, str) or not value.strip():
        raise InvalidInputError(f"{what} must be a non-empty string, got {value!r}")
    name = value.strip()
    if labels is not None and name in labels:
        return name
    if name.upper() in OUT_OF_SCOPE_NAMES:
        return None
    if labels is None:
        return name
    known = ", ".join(list(labels)[:20]) + (f", … ({len(labels)} in all)" if len(labels) > 20 else "")
    hint = suggest_label(name, labels)
    raise UnknownLabelError(f"unknown {what} {value!r}{f'; did you mean {hint}?' if hint else ''}; "
                            f"known: {known}, {OUT_OF_SCOPE}")


def suggest_label(name: str, labels: Sequence[str]) -> str | None:
    """The label ``name`` was probably meant to be: the one that differs from it only in case,
    else the closest by :func:`difflib.get_close_matches` (compared case-folded), else ``None``.
    A suggestion, never an answer: no label is accepted in another case than its own.

    >>> suggest_label("hours", ["BOOK", "HOURS"])
    'HOURS'
    >>> suggest_label("CANSEL", ["BOOK", "CANCEL"])
    'CANCEL'
    """
    folded = {str(label).casefold(): str(label) for label in labels}
    key = name.strip().casefold()
    if key in folded:
        return folded[key]
    close = difflib.get_close_matches(key, list(folded), n=1, cutoff=0.75)
    return folded[close[0]] if close else None


def label_name(label: str | None) -> str:
    """The string form of a label: :data:`OUT_OF_SCOPE` for ``None``."""
    return OUT_OF_SCOPE if label is None else str(label)
