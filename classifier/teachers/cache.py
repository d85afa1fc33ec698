"""An exact-match cache of the teacher's answers: a question the teacher answered a
while ago is answered again without an LLM call.

The key (:meth:`TeacherCache.key`) is everything the answer depends on:

- the query's normalised text (:func:`classifier.text.normalise_key`: case and runs of
  white space do not count, the same key the retrain merges duplicates by);
- the intent set's revision (:func:`intent_set_revision`, a content hash of the intent
  set: names, descriptions, examples, rules and settings), so a changed intent set is
  never served an answer given for another one;
- the teacher's model, so a changed model is never served another model's answer;
- the history digest (:func:`history_digest`, the compact intent history layer 3 sends);
- the intents offered (layer 2's top candidates, :func:`~classifier.teachers.base.offered_options`)
  and whether out of scope was allowed: the same question, not only the same text.

Bounds: at most ``max_entries`` answers (the least recently used is evicted first) and
each for at most ``ttl_s`` seconds after it was given (a hit does not renew it). The
clock is injectable (tests). Only valid answers are stored; a failure is never cached.

Concurrent callers with the same key ask once (:meth:`TeacherCache.answer`): the first
asks the teacher, the others wait for its answer; when the first fails, each of the
others asks for itself (a failure is not shared, so every failed call is a real one).

One cache per process: the replicas of a fleet each have their own. Imports nothing but
the standard library and :mod:`classifier`.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Sequence

from flywheel.classifier.protocols import HistoryEntry, TeacherAnswer, TeacherRequest
from flywheel.classifier.text import normalise_key

if TYPE_CHECKING:  # pragma: no cover
    from flywheel.classifier.settings.intents import IntentSet

__all__ = ["CACHE_OUTCOMES", "DEFAULT_MAX_ENTRIES", "DEFAULT_TTL_S", "TeacherCache", "history_digest",
           "intent_set_revision"]

#: ``teacher.cache_size``'s default: answers kept at most (0 turns the cache off).
DEFAULT_MAX_ENTRIES = 10_000
#: ``teacher.cache_ttl_s``'s default: one day.
DEFAULT_TTL_S = 86_400.0
#: What a lookup found (``flywheel_teacher_cache_total{outcome}``).
CACHE_OUTCOMES = ("hit", "miss")


def _digest(value: object) -> str:
    raw = json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=True)
    return hashlib.blake2b(raw.encode("utf-8", "surrogatepass"), digest_size=16,
                           person=b"flywheel-tcache").hexdigest()


def intent_set_revision(intents: "IntentSet") -> str:
    """A content hash of ``intents`` (its saved form, :func:`classifier.versions.model.intents_to_doc`):
    equal for equal intent sets, whichever file or version they came from."""
    from flywheel.classifier.versions.model import intents_to_doc  # the one owner of the saved form

    return _digest(intents_to_doc(intents))


def history_digest(history: Sequence[HistoryEntry]) -> str:
    """A digest of the compact history a request carries (labels and normalised snippets,
    oldest first)."""
    return _digest([[h.label, normalise_key(h.snippet)] for h in history])


@dataclass(frozen=True)
class _Entry:
    answer: TeacherAnswer
    expires_at: float


class _Flight:
    """One question being asked; the others with its key wait on ``done``."""

    def __init__(self) -> None:
        self.done = threading.Event()


class TeacherCache:
    """A thread-safe LRU of teacher answers with a TTL.

    Parameters
    ----------
    max_entries : int
        Answers kept at most (>= 1); the least recently used goes first.
    ttl_s : float
        Seconds an answer is served after it was given (> 0).
    clock : callable
        Monotonic seconds (injectable for tests).

    Attributes
    ----------
    hits, misses : int
        Lookups that found an answer (also after waiting for a caller asking the same
        question) and those that asked the teacher.
    evicted, expired : int
        Answers dropped for the size bound and for the TTL.
    """

    def __init__(self, max_entries: int = DEFAULT_MAX_ENTRIES, ttl_s: float = DEFAULT_TTL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 1:
            raise ValueError(f"max_entries must be an integer >= 1, got {max_entries!r}")
        if not ttl_s > 0:
            raise ValueError(f"ttl_s must be > 0, got {ttl_s!r}")
        self.max_entries = max_entries
        self.ttl_s = float(ttl_s)
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._flights: dict[str, _Flight] = {}
        self.hits = 0
        self.misses = 0
        self.evicted = 0
        self.expired = 0

    def __repr__(self) -> str:
        return (f"TeacherCache(max_entries={self.max_entries}, ttl_s={self.ttl_s:g}, entries={len(self)}, "
                f"hits={self.hits}, misses={self.misses})")

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    @property
    def counts(self) -> dict[str, int]:
        """``{"hit": hits, "miss": misses}`` (:data:`CACHE_OUTCOMES`), one consistent read."""
        with self._lock:
            return {"hit": self.hits, "miss": self.misses}

    @staticmethod
    def key(request: TeacherRequest, *, revision: str, model: str) -> str:
        """The cache key of ``request`` asked of ``model`` with the intent set ``revision``
        (see the module docs for what it covers)."""
        return _digest({"text": normalise_key(request.text), "revision": revision, "model": model,
                        "history": history_digest(request.history),
                        "options": sorted(o.name for o in request.options),
                        "oos": bool(request.allow_out_of_scope)})

    def get(self, key: str) -> TeacherAnswer | None:
        """The answer stored under ``key`` and not expired, else ``None``; counted."""
        with self._lock:
            answer = self._get_locked(key)
            if answer is None:
                self.misses += 1
            else:
                self.hits += 1
            return answer

    def put(self, key: str, answer: TeacherAnswer) -> None:
        """Store ``answer`` under ``key`` for ``ttl_s`` seconds from now."""
        with self._lock:
            self._put_locked(key, answer)

    def answer(self, key: str, ask: Callable[[], TeacherAnswer]) -> tuple[TeacherAnswer, bool]:
        """``(answer, True)`` from the cache, else ``(ask(), False)``, stored under ``key``.

        Callers with the same key at the same time ask once: the first calls ``ask``, the
        others wait for it and are served its answer (a hit). When ``ask`` raises, nothing
        is stored, the exception goes to its caller and each waiting caller asks for itself.
        """
        with self._lock:
            found = self._get_locked(key)
            if found is not None:
                self.hits += 1
                return found, True
            waiting = self._flights.get(key)
            if waiting is None:
                flight = self._flights[key] = _Flight()
        if waiting is not None:
            waiting.done.wait()
            with self._lock:
                found = self._get_locked(key)
                if found is not None:
                    self.hits += 1
                    return found, True
            # the first caller failed: ask for ourselves (not shared, not single-flight)
            with self._lock:
                self.misses += 1
            got = ask()
            self.put(key, got)
            return got, False
        try:
            with self._lock:
                self.misses += 1
            got = ask()
            with self._lock:
                self._put_locked(key, got)
            return got, False
        finally:
            with self._lock:
                self._flights.pop(key, None)
            flight.done.set()

    def clear(self) -> None:
        """Drop every answer (the counts stay)."""
        with self._lock:
            self._entries.clear()

    # ------------------------------------------------------------------ internals
    def _get_locked(self, key: str) -> TeacherAnswer | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        if self._clock() >= entry.expires_at:
            del self._entries[key]
            self.expired += 1
            return None
        self._entries.move_to_end(key)
        return entry.answer

    def _put_locked(self, key: str, answer: TeacherAnswer) -> None:
        self._entries[key] = _Entry(answer, self._clock() + self.ttl_s)
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)
            self.evicted += 1
