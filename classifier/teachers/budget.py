"""The LLM teacher as a budgeted resource: at most so many calls a minute and a UTC day.

:class:`CallBudget` counts calls against two optional limits; :class:`BudgetedTeacher`
wraps any :class:`~classifier.protocols.Teacher` and refuses a call the budget has no
room for with ``TeacherError("budget", ...)`` *without* calling the inner teacher (the
pipeline then answers with layer 2, tier ``weak``, pending: ``flywheel label`` asks the
teacher later). :func:`apply_budget` wraps a teacher as the intent file's ``teacher``
section says (``max_calls_per_minute``, ``daily_budget``).

The limits are per process, shared by every thread of it. A fleet of replicas is not
coordinated: each replica enforces its own share (see docs/guides/teacher.md, "LLM budget"); a hard
global cap needs a shared limiter in front of the LLM (a gateway), not flywheel.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass
from datetime import date, datetime, timezone
from typing import TYPE_CHECKING, Callable

from flywheel.classifier.errors import NOT_CALLED_KINDS, TeacherError
from flywheel.classifier.protocols import Breaker, ManagedTeacher, Teacher, TeacherAnswer, TeacherRequest

if TYPE_CHECKING:  # pragma: no cover
    from flywheel.classifier.settings.intents import TeacherSettings

__all__ = ["BudgetedTeacher", "CallBudget", "Slot", "apply_budget"]

WINDOW_S = 60.0
MINUTE_KEY = "max_calls_per_minute"   # the intent file's names, used in the refusal message
DAY_KEY = "daily_budget"


@dataclass(frozen=True)
class Slot:
    """One call's place in a :class:`CallBudget`: when (monotonic seconds) and on which
    UTC day it was taken; hand it back with :meth:`CallBudget.refund`."""

    at: float
    day: date


def _utc_day(wall_s: float) -> date:
    return datetime.fromtimestamp(wall_s, tz=timezone.utc).date()


class CallBudget:
    """A thread-safe count of calls against a per-minute and a per-UTC-day limit.

    Parameters
    ----------
    per_minute : int or None
        Calls allowed in any sliding 60-second window; ``None``: no per-minute limit.
    per_day : int or None
        Calls allowed per UTC calendar day (the count starts again at 00:00 UTC);
        ``None``: no daily limit.
    clock : callable
        Monotonic seconds, for the minute window (injectable for tests).
    wall_clock : callable
        Unix seconds, for the UTC day (injectable for tests).

    Notes
    -----
    The minute limit is a **sliding 60 s window** (the times of the calls taken in the
    last 60 s, at most ``per_minute`` of them), not a token bucket: no 60-second span
    ever holds more than ``per_minute`` calls, which is what splitting a provider's hard
    limit across replicas needs (a bucket of the same size lets up to twice that through
    in the minute after an idle spell). A refused call takes nothing. Both limits are
    checked before either is charged, so a call is taken from both or from neither.

    If the wall clock steps back across midnight the day's count is kept (it only ever
    starts again on a later UTC day).
    """

    def __init__(self, per_minute: int | None = None, per_day: int | None = None, *,
                 clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time) -> None:
        for name, value in ((MINUTE_KEY, per_minute), (DAY_KEY, per_day)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be a positive integer or None, got {value!r}")
        self.per_minute = per_minute
        self.per_day = per_day
        self._clock = clock
        self._wall = wall_clock
        self._lock = threading.Lock()
        self._recent: deque[float] = deque()       # monotonic times of the calls in the window
        self._day = _utc_day(wall_clock())
        self._day_count = 0

    def __repr__(self) -> str:
        return f"CallBudget(per_minute={self.per_minute!r}, per_day={self.per_day!r})"

    # caller holds self._lock
    def _roll(self, now: float, today: date) -> None:
        while len(self._recent) > 0 and now - self._recent[0] >= WINDOW_S:
            self._recent.popleft()
        if today > self._day:
            self._day, self._day_count = today, 0

    def take(self) -> Slot:
        """Take a slot for one call.

        Raises
        ------
        TeacherError
            ``budget``, naming the limit that is spent (the daily one when both are),
            e.g. ``llm budget exhausted: max_calls_per_minute (60 calls per minute)``;
            nothing is taken then.
        """
        with self._lock:
            now, today = self._clock(), _utc_day(self._wall())
            self._roll(now, today)
            if self.per_day is not None and self._day_count >= self.per_day:
                raise TeacherError("budget", f"llm budget exhausted: {DAY_KEY} ({self.per_day} calls per day)")
            if self.per_minute is not None and len(self._recent) >= self.per_minute:
                raise TeacherError("budget", f"llm budget exhausted: {MINUTE_KEY} "
                                             f"({self.per_minute} calls per minute)")
            if self.per_minute is not None:
                self._recent.append(now)
            self._day_count += 1
            return Slot(now, self._day)

    def try_acquire(self) -> bool:
        """Take a slot if both limits have room: ``True``, else ``False`` (nothing taken)."""
        try:
            self.take()
        except TeacherError:
            return False
        return True

    def refund(self, slot: Slot) -> None:
        """Give back ``slot``: its call never reached the LLM. A slot already out of the
        minute window, or of an earlier UTC day, gives back nothing there."""
        with self._lock:
            try:
                self._recent.remove(slot.at)
            except ValueError:
                pass
            if slot.day == self._day and self._day_count > 0:
                self._day_count -= 1

    def remaining(self) -> dict[str, int | None]:
        """Calls left now: ``{"minute": n, "day": n}``, ``None`` for a window without a limit."""
        with self._lock:
            self._roll(self._clock(), _utc_day(self._wall()))
            return {"minute": None if self.per_minute is None else self.per_minute - len(self._recent),
                    "day": None if self.per_day is None else max(self.per_day - self._day_count, 0)}


class BudgetedTeacher:
    """A :class:`~classifier.protocols.Teacher` that spends a :class:`CallBudget`.

    Contract:

    - ``label(request)`` takes a slot first; when the budget has none it raises
      ``TeacherError("budget", "llm budget exhausted: <limit> (<n> calls per minute|day)")``
      and the inner teacher is not called.
    - A call that reaches the inner teacher spends its slot whatever the outcome: a
      timeout, an unreachable server or a malformed answer still cost (or may have cost)
      an LLM call. Only an inner refusal that never called the LLM (the breaker's
      ``circuit_open``, :data:`~classifier.errors.NOT_CALLED_KINDS`) gives the slot back,
      so an outage does not drain the day's budget.
    - ``model`` is the inner teacher's. When the inner teacher is a
      :class:`~classifier.protocols.ManagedTeacher`, so is the wrapper: ``check()`` (not
      budgeted: a readiness check is not a labelling call), ``close()`` and ``breaker`` are
      the inner teacher's. Around a plain :class:`~classifier.protocols.Teacher` it has no
      ``check()``, ``close()`` does nothing and ``breaker`` is ``None``.

    Safe to share between threads when the inner teacher is.
    """

    def __init__(self, inner: Teacher, budget: CallBudget) -> None:
        self.inner = inner
        self.budget = budget
        if isinstance(inner, ManagedTeacher):   # then the wrapper is one too
            self.check = inner.check

    @property
    def model(self) -> str:
        return self.inner.model

    @property
    def breaker(self) -> Breaker | None:
        """The inner teacher's circuit breaker (``None`` when it has none)."""
        return self.inner.breaker if isinstance(self.inner, ManagedTeacher) else None

    def __repr__(self) -> str:
        return f"BudgetedTeacher({self.inner!r}, {self.budget!r})"

    def label(self, request: TeacherRequest) -> TeacherAnswer:
        slot = self.budget.take()
        try:
            return self.inner.label(request)
        except TeacherError as exc:
            if exc.kind in NOT_CALLED_KINDS:
                self.budget.refund(slot)
            raise

    def close(self) -> None:
        if isinstance(self.inner, ManagedTeacher):
            self.inner.close()


def apply_budget(teacher: Teacher | None, settings: TeacherSettings, *,
                 clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time) -> Teacher | None:
    """``teacher`` behind a :class:`BudgetedTeacher` with ``settings.max_calls_per_minute``
    and ``settings.daily_budget``; the teacher itself, unchanged, when both are ``None``
    (and ``None`` when there is no teacher). ``clock`` and ``wall_clock`` are for tests."""
    per_minute, per_day = settings.max_calls_per_minute, settings.daily_budget
    if teacher is None or (per_minute is None and per_day is None):
        return teacher
    return BudgetedTeacher(teacher, CallBudget(per_minute, per_day, clock=clock, wall_clock=wall_clock))
