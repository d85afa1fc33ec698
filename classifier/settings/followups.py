"""The intent file's ``followups`` setting: what layer 2 does with a query that leans on the
previous turn (:mod:`classifier.followup`, issue 43).

- ``defer`` (the default): send it to the teacher with the history (layer 2 is never sure of
  it; its answer scored with the last in-scope turn's snippet serves when there is no teacher);
- ``resolve``: score it together with the last in-scope turn's snippet, and decide it in
  layer 2 when that score is sure (cheaper: fewer LLM calls; BENCHMARKS.md "Follow-ups");
- ``off``: score it on its own words, like every other query (before issue 43).
"""

from __future__ import annotations

from typing import Any

from flywheel.classifier.errors import IntentFileError

FOLLOWUP_MODES = ("resolve", "defer", "off")
DEFAULT_FOLLOWUPS = "defer"


def parse_followups(value: Any, source: str) -> str:
    """``followups`` as one of :data:`FOLLOWUP_MODES` (``None``: the default; YAML's
    ``false``: ``off``). Raises :class:`IntentFileError` for anything else."""
    if value is None:
        return DEFAULT_FOLLOWUPS
    if value is False:
        return "off"
    if value not in FOLLOWUP_MODES:
        raise IntentFileError(source, f"followups must be one of {', '.join(FOLLOWUP_MODES)}, got {value!r}")
    return str(value)
