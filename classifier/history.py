"""The compact intent history: label + short snippet of the last turns, per session."""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from typing import Any, Iterable, Mapping

from classifier.errors import InvalidInputError
from classifier.protocols import HistoryEntry

SNIPPET_CHARS = 60


def coerce_history(items: Iterable[Any] | None, size: int) -> tuple[HistoryEntry, ...]:
    """Accept ``HistoryEntry``, ``(label, text)`` pairs or ``{"label", "text"}`` dicts;
    keep the last ``size`` entries, snippets cut to 60 characters."""
    if items is None:
        return ()
    if isinstance(items, (str, bytes)):
        raise InvalidInputError("history must be a list of (label, text) entries, not a string")
    out: list[HistoryEntry] = []
    for n, it in enumerate(items):
        if isinstance(it, HistoryEntry):
            out.append(HistoryEntry.of(it.label, it.snippet, SNIPPET_CHARS))
        elif isinstance(it, Mapping) and "text" in it or isinstance(it, Mapping) and "snippet" in it:
            text = it.get("text", it.get("snippet"))
            out.append(HistoryEntry.of(it.get("label"), str(text), SNIPPET_CHARS))
        elif isinstance(it, (tuple, list)) and len(it) == 2:
            out.append(HistoryEntry.of(None if it[0] is None else str(it[0]), str(it[1]), SNIPPET_CHARS))
        else:
            raise InvalidInputError(f"history entry #{n + 1} must be (label, text) or {{'label', 'text'}}, got {it!r}")
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
