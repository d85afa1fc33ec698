"""The compact intent history: label + short snippet of the last turns, per session."""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from typing import Any, Iterable, Mapping

from flywheel.classifier.errors import InvalidInputError
from flywheel.classifier.protocols import HistoryEntry

SNIPPET_CHARS = 60


def history_entries(items: Iterable[Any] | None, max_chars: int | None = SNIPPET_CHARS) -> list[HistoryEntry]:
    """Accept ``HistoryEntry``, ``(label, text)`` pairs or ``{"label", "text"|"snippet"}``
    dicts (label ``None``: out of scope) as ``HistoryEntry`` objects, snippets cut to
    ``max_chars`` characters (``None``: kept whole).

    Raises
    ------
    InvalidInputError
        ``items`` is a string, or an entry has none of those shapes.
    """
    if items is None:
        return []
    if isinstance(items, (str, bytes)):
        raise InvalidInputError("history must be a list of (label, text) entries, not a string")

    def entry(label: Any, text: Any) -> HistoryEntry:
        label = None if label is None else str(label)
        return HistoryEntry(label, str(text)) if max_chars is None else HistoryEntry.of(label, str(text), max_chars)

    out: list[HistoryEntry] = []
    for n, it in enumerate(items):
        if isinstance(it, HistoryEntry):
            out.append(entry(it.label, it.snippet))
        elif isinstance(it, Mapping) and ("text" in it or "snippet" in it):
            out.append(entry(it.get("label"), it.get("text", it.get("snippet"))))
        elif isinstance(it, (tuple, list)) and len(it) == 2:
            out.append(entry(it[0], it[1]))
        else:
            raise InvalidInputError(f"history entry #{n + 1} must be (label, text) or {{'label', 'text'}}, got {it!r}")
    return out


def coerce_history(items: Iterable[Any] | None, size: int) -> tuple[HistoryEntry, ...]:
    """:func:`history_entries`, keeping the last ``size`` entries."""
    out = history_entries(items)
    return tuple(out[-size:]) if size > 0 else ()


class SessionHistory:
    """Bounded per-session histories: ``size`` entries each, ``max_sessions`` sessions
    (least recently used evicted). Thread-safe."""

    def __init__(self, size: int = 6, max_sessions: int = 10_000) -> None:
        self.size = size
        self.max_sessions = max_sessions
        self._sessions: OrderedDict[str, deque[HistoryEntry]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, session_id: str) -> tuple[HistoryEntry, ...]:
        with self._lock:
            d = self._sessions.get(session_id)
            if d is None:
                return ()
            self._sessions.move_to_end(session_id)
            return tuple(d)

    def add(self, session_id: str, label: str | None, text: str) -> None:
        if self.size <= 0:
            return
        with self._lock:
            d = self._sessions.get(session_id)
            if d is None:
                d = self._sessions[session_id] = deque(maxlen=self.size)
                while len(self._sessions) > self.max_sessions:
                    self._sessions.popitem(last=False)
            else:
                self._sessions.move_to_end(session_id)
            d.append(HistoryEntry.of(label, text, SNIPPET_CHARS))

    def __len__(self) -> int:
        return len(self._sessions)
