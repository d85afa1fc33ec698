"""Multi-turn test files for ``flywheel eval`` (issue 43): each turn with its session's history.

A CSV or JSON Lines test file (:func:`training.eval.loaders.load_labelled` reads its texts,
labels and languages) is *multi-turn* when it has either

- a ``session`` (or ``session_id``) column and a ``turn`` column (an integer: the turn's
  order in its session; rows of a session may come in any order): each turn is classified
  with the compact history of its session's earlier turns, the last ``history_size`` of
  them, as the pipeline keeps it (:class:`~classifier.protocols.HistoryEntry`, 60-character
  snippets). The history's labels are the earlier turns' **gold** labels, not the ones the
  model served: every turn is measured on a correct history, so one mistake is counted
  once (it does not cascade into the follow-ups after it) and a file's figures do not
  depend on the model's earlier answers (``benchmarks/bench_followups.py`` measures the
  served history, the cascade included);
- or a ``history`` column in the compact form: a list of ``[label, snippet]`` pairs or
  ``{"label", "snippet"}`` objects, oldest first (``null`` label: out of scope; in a CSV
  cell, that list as JSON; empty: no history), used as it is.

A ``kind`` column, when present, says which turns are follow-ups (``referential``: the
follow-up benchmark's name; any other value: not one); without it a follow-up is a turn the
pipeline's :class:`~classifier.followup.FollowupDetector` fires on, given its history.

A malformed file raises :class:`~training.eval.loaders.DatasetError` naming the line and the
column. A file with none of those columns is single-turn: :func:`read_turns` is ``None``.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from flywheel.classifier.errors import InvalidInputError
from flywheel.classifier.history import SNIPPET_CHARS, history_entries
from flywheel.classifier.protocols import HistoryEntry
from flywheel.training.eval.loaders import DatasetError, LabelledData, csv_delimiter, infer_format

__all__ = ["FOLLOWUP_KIND", "Turns", "followup_figures", "followup_mask", "read_turns"]

SESSION_COLUMNS = ("session", "session_id")
TURN_COLUMN = "turn"
HISTORY_COLUMN = "history"
KIND_COLUMN = "kind"
FOLLOWUP_KIND = "referential"


@dataclass(frozen=True)
class Turns:
    """The history of each test row (aligned with the file's rows), how it was made
    (``"session"``: from the session's earlier turns; ``"history"``: the file's column), the
    number of sessions (``None`` with a ``history`` column) and, from a ``kind`` column,
    which rows are follow-ups (``None``: no such column; the detector decides)."""

    histories: list[tuple[HistoryEntry, ...]]
    source: str
    sessions: int | None
    followup: list[bool] | None

    def select(self, idx: list[int]) -> "Turns":
        """These turns of the rows ``idx`` only (the test rows a model can score)."""
        return Turns([self.histories[i] for i in idx], self.source, self.sessions,
                     None if self.followup is None else [self.followup[i] for i in idx])

    def figures_args(self, texts: list[str]) -> dict[str, Any]:
        """What :func:`~training.eval.measure.evaluate` takes as ``followups`` for these turns."""
        return {"mask": followup_mask(self, texts), "source": "kind" if self.followup is not None else "detector",
                "history": "gold" if self.source == "session" else "file", "sessions": self.sessions}


def read_turns(path: str | Path, data: LabelledData, *, fmt: str | None = None,
               history_size: int = 6) -> Turns | None:
    """The turns of the multi-turn file ``path`` whose labelled rows are ``data`` (read by
    :func:`~training.eval.loaders.load_labelled` from the same file), or ``None`` for a
    single-turn file (see the module docs). Raises :class:`DatasetError` naming the line
    and the column of a malformed row."""
    p = Path(path)
    kind = (fmt or infer_format(p)).strip().lower()
    if kind not in ("csv", "jsonl"):
        return None
    rows = list(_rows(p, kind))
    names = set().union(*(r.keys() for _, r in rows)) if rows else set()
    session_col = next((c for c in SESSION_COLUMNS if c in names), None)
    if HISTORY_COLUMN not in names and session_col is None and TURN_COLUMN not in names:
        return None
    if len(rows) != len(data):
        raise DatasetError(p, f"{len(rows)} rows with columns but {len(data)} labelled rows")
    followup = _kinds(rows) if KIND_COLUMN in names else None
    if HISTORY_COLUMN in names:
        hist = [_history(p, where, r.get(HISTORY_COLUMN), history_size) for where, r in rows]
        return Turns(hist, "history", None, followup)
    if session_col is None or TURN_COLUMN not in names:
        missing = "session" if session_col is None else TURN_COLUMN
        raise DatasetError(p, f"a multi-turn file needs a {missing!r} column beside "
                              f"{TURN_COLUMN if session_col is None else session_col!r} (or a 'history' column)")
    return Turns(*_session_histories(p, rows, session_col, data, history_size), followup)


def _session_histories(p: Path, rows: list[tuple[str, dict[str, Any]]], session_col: str, data: LabelledData,
                       size: int) -> tuple[list[tuple[HistoryEntry, ...]], str, int]:
    """Each row's history: its session's earlier turns (gold labels), the last ``size``."""
    by_session: dict[str, list[tuple[int, int]]] = {}
    for i, (where, r) in enumerate(rows):
        sid = _cell(p, where, session_col, r.get(session_col))
        turn = _turn(p, where, r.get(TURN_COLUMN))
        turns = by_session.setdefault(sid, [])
        if any(t == turn for t, _ in turns):
            raise DatasetError(p, f"turn {turn} of session {sid!r} appears twice", f"{where}, column {TURN_COLUMN!r}")
        turns.append((turn, i))
    out: list[tuple[HistoryEntry, ...]] = [()] * len(rows)
    for turns in by_session.values():
        earlier: list[HistoryEntry] = []
        for _, i in sorted(turns):
            out[i] = tuple(earlier[-size:]) if size > 0 else ()
            earlier.append(HistoryEntry.of(data.labels[i], data.texts[i], SNIPPET_CHARS))
    return out, "session", len(by_session)


def _kinds(rows: list[tuple[str, dict[str, Any]]]) -> list[bool]:
    return [str(r.get(KIND_COLUMN) or "").strip().lower() == FOLLOWUP_KIND for _, r in rows]


def _cell(p: Path, where: str, column: str, value: Any) -> str:
    if value is None or isinstance(value, (bool, list, dict)) or not str(value).strip():
        raise DatasetError(p, f"column {column!r} must be a non-empty string or number, got {value!r}", where)
    return str(value).strip()


def _turn(p: Path, where: str, value: Any) -> int:
    try:
        if isinstance(value, bool) or isinstance(value, float) and not value.is_integer():
            raise ValueError
        return int(str(value).strip()) if not isinstance(value, (int, float)) else int(value)
    except (TypeError, ValueError):
        raise DatasetError(p, f"column {TURN_COLUMN!r} must be an integer (the turn's order), got {value!r}",
                           where) from None


def _history(p: Path, where: str, value: Any, size: int) -> tuple[HistoryEntry, ...]:
    """A ``history`` cell in the compact form (a JSON list in a CSV cell)."""
    at = f"{where}, column {HISTORY_COLUMN!r}"
    if value is None or (isinstance(value, str) and not value.strip()):
        return ()
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise DatasetError(p, f"not valid JSON ({exc.msg}): expected a list of [label, snippet] pairs",
                               at) from None
    if not isinstance(value, list):
        raise DatasetError(p, f"expected a list of [label, snippet] pairs, got {type(value).__name__}", at)
    try:
        entries = history_entries(value)
    except InvalidInputError as exc:
        raise DatasetError(p, str(exc), at) from None
    return tuple(entries[-size:]) if size > 0 else ()


def _rows(p: Path, fmt: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(where, row)`` of every labelled row, skipping what the loaders skip (blank lines);
    the file was read and checked by :func:`~training.eval.loaders.load_labelled` already."""
    raw = p.read_text(encoding="utf-8-sig")
    if fmt == "jsonl":
        for n, line in enumerate(raw.split("\n"), start=1):
            if line.strip():
                yield f"line {n}", json.loads(line)
        return
    reader = csv.reader(io.StringIO(raw, newline=""), delimiter=csv_delimiter(raw))   # as the loader read it
    names = [h.strip() for h in next(reader)]
    while True:
        start = reader.line_num + 1
        row = next(reader, None)
        if row is None:
            return
        if row and any(c.strip() for c in row):
            yield f"line {start}", dict(zip(names, row))


def followup_mask(turns: Turns, texts: list[str]) -> list[bool]:
    """Which test rows are follow-ups: the file's ``kind`` column, else the rows the
    pipeline's detector fires on given their history."""
    if turns.followup is not None:
        return list(turns.followup)
    from flywheel.classifier.followup import FollowupDetector

    det = FollowupDetector()
    return [det.detect(t, h) is not None for t, h in zip(texts, turns.histories)]


def followup_figures(truth: list[str | None], preds: list[str | None], mask: list[bool],
                     langs: list[str | None] | None, *, source: str, history: str,
                     sessions: int | None) -> dict[str, Any]:
    """The report's ``followups``: ``n`` follow-ups, their ``accuracy`` (served label ==
    gold), ``served_out_of_scope`` (the share served as out of scope, whatever their gold),
    and both ``by_language`` (rows without a language under ``unknown``); ``None`` figures
    when there is no follow-up. ``source``: ``kind`` or ``detector``; ``history``: ``gold``
    (from the sessions' earlier turns) or ``file`` (the ``history`` column)."""
    idx = [i for i, m in enumerate(mask) if m]
    out: dict[str, Any] = {"source": source, "history": history, "sessions": sessions, "turns": len(truth),
                           **_figures(truth, preds, idx)}
    by: dict[str, list[int]] = {}
    for i in idx:
        by.setdefault((langs[i] if langs is not None else None) or "unknown", []).append(i)
    out["by_language"] = {lang: _figures(truth, preds, ix) for lang, ix in sorted(by.items())}
    return out


def _figures(truth: list[str | None], preds: list[str | None], idx: list[int]) -> dict[str, Any]:
    n = len(idx)
    if not n:
        return {"n": 0, "accuracy": None, "served_out_of_scope": None}
    return {"n": n, "accuracy": round(sum(preds[i] == truth[i] for i in idx) / n, 4),
            "served_out_of_scope": round(sum(preds[i] is None for i in idx) / n, 4)}
