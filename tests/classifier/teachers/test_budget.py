"""The LLM teacher as a budgeted resource (classifier.teachers.budget): the per-minute window, the
UTC day, thread safety, the wrapper, the pipeline's degraded answer, the metrics and the
intent-file settings."""

from __future__ import annotations

import copy
import logging
import threading
from datetime import datetime, timezone

import pytest
from prometheus_client import generate_latest

from flywheel.classifier.decision import DEGRADED_REASONS, Layer, Tier
from flywheel.classifier.errors import IntentFileError, TeacherError
from flywheel.classifier.layer2.fitter import fit_model
from flywheel.classifier.pipeline import RETRYABLE_TEACHER_ERRORS, Classifier
from flywheel.classifier.protocols import LabelOption, ManagedTeacher, Teacher, TeacherRequest
from flywheel.classifier.settings.config import load_config
from flywheel.classifier.settings.intents import TeacherSettings, parse_intents
from flywheel.classifier.teachers import BudgetedTeacher, CallBudget, CircuitBreaker, apply_budget
from flywheel.classifier.versions.model import intents_to_doc
from flywheel.logstore import LogStore
from flywheel.service.client import FlywheelClient
from flywheel.service.metrics import ServerMetrics
from flywheel.service.server import ServerOptions, create_server
from flywheel.training.labeling import backfill_pending
from tests.support.docs import ALWAYS_SURE, ALWAYS_UNSURE, DOC
from tests.support.fakes import HashEmbedder, ListSink, ScriptedTeacher

REQ = TeacherRequest("what is addvar", (LabelOption("RETRIEVAL", "docs"), LabelOption("PLATFORM", "account")))


class Clock:
    """A settable clock: ``clock()`` is ``clock.t``."""

    def __init__(self, t: float = 0.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def utc(*args: int) -> float:
    return datetime(*args, tzinfo=timezone.utc).timestamp()


def budget(per_minute=None, per_day=None, t=1000.0, wall=None):
    mono, wall_clock = Clock(t), Clock(utc(2024, 3, 9, 12) if wall is None else wall)
    return CallBudget(per_minute, per_day, clock=mono, wall_clock=wall_clock), mono, wall_clock


def model(thresholds, teacher_section=None):
    d = copy.deepcopy(DOC)
    d["thresholds"] = thresholds
    if teacher_section is not None:
        d["teacher"] = teacher_section
    return fit_model(parse_intents(d), embedder=HashEmbedder())


def clf(thresholds, teacher_section=None, **kw):
    return Classifier(model(thresholds, teacher_section), embedder=HashEmbedder(), **kw)


def budgeted(thresholds, teacher_section, inner, mono=None, wall=None, **kw) -> tuple[Classifier, BudgetedTeacher]:
    """A classifier whose teacher is ``inner`` wired as ``build_teacher`` + ``apply_budget`` would,
    from the served intent set (``kw`` go to Classifier); and that teacher."""
    m = model(thresholds, teacher_section)
    t = apply_budget(inner, m.intents.teacher, clock=mono or Clock(), wall_clock=wall or Clock(0.0))
    assert isinstance(t, BudgetedTeacher)
    return Classifier(m, embedder=HashEmbedder(), teacher=t, **kw), t


# ------------------------------------------------------------------ CallBudget
def test_minute_limit_is_a_sliding_window():
    b, mono, _ = budget(per_minute=3)
    assert [b.try_acquire() for _ in range(4)] == [True, True, True, False]
    assert b.remaining() == {"minute": 0, "day": None}
    mono.t += 59.9
    assert not b.try_acquire()                       # still inside the 60 s of all three
    mono.t += 0.1
    assert b.remaining()["minute"] == 3              # all three left the window
    assert b.try_acquire()
    mono.t += 20
    assert b.try_acquire() and b.try_acquire() and not b.try_acquire()
    mono.t += 40                                     # only the first of the three has left
    assert b.remaining()["minute"] == 1
    assert b.try_acquire() and not b.try_acquire()


def test_the_daily_count_starts_again_at_utc_midnight():
    b, mono, wall = budget(per_day=2, wall=utc(2024, 3, 9, 23, 59, 58))
    assert b.try_acquire() and b.try_acquire() and not b.try_acquire()
    mono.t += 3600                                   # the minute window has nothing to do with it
    wall.t = utc(2024, 3, 9, 23, 59, 59, 999999)
    assert not b.try_acquire() and b.remaining() == {"minute": None, "day": 0}
    wall.t = utc(2024, 3, 10, 0, 0, 0)
    assert b.remaining()["day"] == 2
    assert b.try_acquire()
    wall.t = utc(2024, 3, 9, 23, 59, 59)             # the wall clock steps back: no second reset
    assert b.try_acquire() and not b.try_acquire()


def test_a_refusal_names_the_limit_and_takes_nothing():
    b, mono, _ = budget(per_minute=1, per_day=5)
    b.take()
    with pytest.raises(TeacherError) as ei:
        b.take()
    assert ei.value.kind == "budget"
    assert str(ei.value) == "budget: llm budget exhausted: max_calls_per_minute (1 calls per minute)"
    assert b.remaining() == {"minute": 0, "day": 4}  # the refusal did not count against the day
    for _ in range(4):
        mono.t += 60
        b.take()
    mono.t += 60
    with pytest.raises(TeacherError, match=r"llm budget exhausted: daily_budget \(5 calls per day\)"):
        b.take()


def test_a_refunded_slot_is_free_again():
    b, _, _ = budget(per_minute=2, per_day=2)
    slot = b.take()
    b.refund(slot)
    assert b.remaining() == {"minute": 2, "day": 2}


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "10"])
def test_limits_must_be_positive_integers(bad):
    with pytest.raises(ValueError, match="positive integer"):
        CallBudget(per_minute=bad)
    with pytest.raises(ValueError, match="daily_budget"):
        CallBudget(per_day=bad)


@pytest.mark.parametrize("limits", [(37, None), (None, 37), (37, 1000), (1000, 37)])
def test_many_threads_get_exactly_the_budget(limits):
    b, _, _ = budget(*limits)
    n_threads, tries = 16, 25
    start = threading.Barrier(n_threads)
    wins = [0] * n_threads

    def worker(i):
        start.wait()
        for _ in range(tries):
            wins[i] += b.try_acquire()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert sum(wins) == 37


# ------------------------------------------------------------------ BudgetedTeacher
def test_a_refused_call_never_reaches_the_inner_teacher():
    inner = ScriptedTeacher(answer=lambda req: "PLATFORM")
    t = BudgetedTeacher(inner, budget(per_minute=2)[0])
    assert isinstance(t, Teacher) and t.model == "fake-llm"
    assert t.label(REQ).label == "PLATFORM"
    inner.error = TeacherError("timeout", "no answer within 5 s")
    with pytest.raises(TeacherError, match="timeout"):
        t.label(REQ)                                  # a failed call still spent its slot
    with pytest.raises(TeacherError) as ei:
        t.label(REQ)
    assert ei.value.kind == "budget" and "llm budget exhausted: max_calls_per_minute" in str(ei.value)
    assert len(inner.requests) == 2


def test_an_open_breaker_spends_nothing():
    inner = ScriptedTeacher(error=TeacherError("circuit_open", "retry in 30 s"))
    t = BudgetedTeacher(inner, budget(per_minute=1, per_day=1)[0])
    for _ in range(3):
        with pytest.raises(TeacherError, match="circuit_open"):
            t.label(REQ)
    assert t.budget.remaining() == {"minute": 1, "day": 1}


def test_the_wrapper_passes_close_check_and_breaker_through():
    class Inner(ScriptedTeacher):
        def __init__(self):
            super().__init__()
            self.breaker, self.closed, self.checked = CircuitBreaker(), False, 0

        def check(self):
            self.checked += 1

        def close(self):
            self.closed = True

    inner = Inner()
    t = BudgetedTeacher(inner, budget(per_minute=1)[0])
    t.check()
    t.check()                                         # not budgeted: no labelling call
    t.close()
    assert (inner.checked, inner.closed, t.breaker) == (2, True, inner.breaker)
    assert t.budget.remaining()["minute"] == 1
    assert isinstance(t, ManagedTeacher)              # the wrapper of a ManagedTeacher is one

    class Bare:                                       # a Teacher and nothing more
        model = "bare"

        def label(self, request):
            raise AssertionError("not called")

    plain = BudgetedTeacher(Bare(), budget(per_minute=1)[0])
    assert isinstance(plain, Teacher) and not isinstance(plain, ManagedTeacher)
    assert getattr(plain, "check", None) is None and plain.breaker is None
    plain.close()                                     # an inner teacher without close()


def test_apply_budget_wraps_only_when_a_limit_is_set():
    inner = ScriptedTeacher()
    assert apply_budget(inner, TeacherSettings()) is inner
    assert apply_budget(None, TeacherSettings(max_calls_per_minute=5)) is None
    t = apply_budget(inner, TeacherSettings(daily_budget=100))
    assert isinstance(t, BudgetedTeacher) and t.inner is inner
    assert (t.budget.per_minute, t.budget.per_day) == (None, 100)


# ------------------------------------------------------------------ the pipeline
def test_an_exhausted_budget_degrades_to_a_pending_weak_answer():
    assert "budget" in RETRYABLE_TEACHER_ERRORS and "budget" in DEGRADED_REASONS
    sink = ListSink()
    inner = ScriptedTeacher(answer=lambda req: "RETRIEVAL")
    c, _ = budgeted(ALWAYS_UNSURE, {"max_calls_per_minute": 1}, inner, log_sink=sink)
    first = c.classify("explain addparam")
    assert first.layer is Layer.LLM and first.degraded is None
    d = c.classify("what is addvar")                  # another question: a repeat is answered from the cache
    assert (d.layer, d.tier, d.degraded, d.pending) == (Layer.EMBEDDING, Tier.WEAK, "budget", True)
    assert "llm budget exhausted: max_calls_per_minute (1 calls per minute)" in d.reason
    assert d.teacher is None                          # no call was made: none is recorded
    assert len(inner.requests) == 1
    assert sink.records[-1].pending and sink.records[-1].decision.degraded == "budget"


def test_a_budget_refusal_is_a_failed_audit_not_an_error(caplog):
    calls = []
    inner = ScriptedTeacher(answer=lambda req: "PLATFORM")
    c, t = budgeted(ALWAYS_SURE, {"daily_budget": 1}, inner, audit_rate=1.0,
                    audit_callback=lambda rec, call: calls.append(call))
    t.budget.take()                                   # the day's one call is spent
    with caplog.at_level(logging.ERROR):
        d = c.classify("show my invoices")
        c.close()
    assert d.layer is Layer.EMBEDDING and d.tier is Tier.CONFIDENT and d.degraded is None
    assert c.audit_outcomes == {"agree": 0, "disagree": 0, "failed": 1, "unsure": 0}
    assert inner.requests == []
    assert len(calls) == 1 and not calls[0].valid and calls[0].error.startswith("budget: llm budget exhausted")
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_pending_budget_decisions_are_back_filled_by_label(tmp_path):
    store = LogStore(tmp_path / "log.duckdb")
    c, t = budgeted(ALWAYS_UNSURE, {"daily_budget": 1}, ScriptedTeacher(answer=lambda req: "RETRIEVAL"),
                    log_sink=store.open_sink())
    t.budget.take()
    for text in ("explain addparam", "what is addvar", "how do loops work"):
        assert c.classify(text).degraded == "budget"
    c.log_sink.flush()
    assert len(store.pending()) == 3
    # `flywheel label` in a process with a budget of its own: it stops when that is spent
    later, _ = budgeted(ALWAYS_UNSURE, {"daily_budget": 2}, ScriptedTeacher(answer=lambda req: "RETRIEVAL"))
    counts = backfill_pending(store, later, progress=False)
    assert (counts["labelled"], counts["remaining"]) == (2, 1)
    assert counts["stopped_because"].startswith("budget: llm budget exhausted: daily_budget")
    assert len(store.pending()) == 1
    c.close()


# ------------------------------------------------------------------ metrics
def test_the_remaining_budget_and_budget_degradations_are_exposed():
    no_teacher = ServerMetrics()
    no_teacher.bind_serving(classifier=clf(ALWAYS_UNSURE, {"max_calls_per_minute": 2}))
    assert no_teacher.registry.get_sample_value("flywheel_teacher_budget_remaining", {"window": "minute"}) is None
    m = ServerMetrics()
    get = m.registry.get_sample_value
    assert get("flywheel_degraded_decisions_total", {"reason": "budget"}) == 0      # pre-created
    assert get("flywheel_teacher_calls_total", {"outcome": "budget"}) == 0
    mono = Clock()
    c, _ = budgeted(ALWAYS_UNSURE, {"max_calls_per_minute": 2}, ScriptedTeacher(), mono=mono)
    m.bind_serving(classifier=c)
    assert get("flywheel_teacher_budget_remaining", {"window": "minute"}) == 2
    assert get("flywheel_teacher_budget_remaining", {"window": "day"}) is None      # no daily limit
    for text in ("explain addparam", "what is addvar", "how do loops work"):   # no repeat: the cache would answer it
        m.observe_decision(c.classify(text))
    assert get("flywheel_teacher_budget_remaining", {"window": "minute"}) == 0
    assert get("flywheel_degraded_decisions_total", {"reason": "budget"}) == 1
    mono.t += 60
    assert get("flywheel_teacher_budget_remaining", {"window": "minute"}) == 2      # read at scrape time


def test_both_windows_are_exposed_and_none_without_a_budget():
    m = ServerMetrics()
    get = m.registry.get_sample_value
    c, t = budgeted(ALWAYS_UNSURE, {"max_calls_per_minute": 5, "daily_budget": 100}, ScriptedTeacher())
    m.bind_serving(classifier=c)
    c.classify("explain addparam")
    assert get("flywheel_teacher_budget_remaining", {"window": "minute"}) == 4
    assert get("flywheel_teacher_budget_remaining", {"window": "day"}) == 99
    unbudgeted = ServerMetrics()                      # the same teacher without its budget: no series at all
    unbudgeted.bind_serving(classifier=clf(ALWAYS_UNSURE, {"max_calls_per_minute": 5, "daily_budget": 100},
                                           teacher=t.inner))
    assert unbudgeted.registry.get_sample_value("flywheel_teacher_budget_remaining", {"window": "minute"}) is None
    assert b"flywheel_teacher_budget_remaining" not in generate_latest(unbudgeted.registry)


def test_the_sidecar_counts_budget_refusals_and_serves_the_gauges(tmp_path):
    d = copy.deepcopy(DOC)
    d["thresholds"] = ALWAYS_UNSURE
    model_dir = fit_model(parse_intents(d), embedder=HashEmbedder(), version="unsure-v1").save(tmp_path / "v1")
    inner = ScriptedTeacher(answer=lambda req: "RETRIEVAL")
    inner.breaker = CircuitBreaker()
    teacher = BudgetedTeacher(inner, CallBudget(per_minute=1, per_day=10))
    server = create_server(load_config(teacher="off", model=str(model_dir)), ServerOptions(address="127.0.0.1:0"),
                           log_decisions=False, embedder=HashEmbedder(), teacher=teacher)
    try:
        server.start()
        fw = FlywheelClient(server.target, timeout_s=5.0)
        first, second = fw.classify("explain addparam"), fw.classify("what is addvar")   # a repeat: the cache
        fw.close()
        get = server.metrics.registry.get_sample_value
        assert first.layer is Layer.LLM
        assert (second.layer, second.tier) == (Layer.EMBEDDING, Tier.WEAK)
        assert "llm budget exhausted" in second.reason
        assert get("flywheel_teacher_calls_total", {"outcome": "ok"}) == 1
        assert get("flywheel_teacher_calls_total", {"outcome": "budget"}) == 1
        assert get("flywheel_teacher_calls_total", {"outcome": "circuit_open"}) == 0
        assert get("flywheel_degraded_decisions_total", {"reason": "budget"}) == 1
        assert get("flywheel_teacher_budget_remaining", {"window": "minute"}) == 0
        assert get("flywheel_teacher_budget_remaining", {"window": "day"}) == 9
        assert get("flywheel_teacher_breaker_open") == 0      # the inner teacher's breaker, through the wrapper
        assert len(inner.requests) == 1
    finally:
        server.stop(grace_s=1.0)


# ------------------------------------------------------------------ the intent file
def test_the_intent_file_sets_the_budget():
    s = parse_intents({**DOC, "teacher": {"max_calls_per_minute": 60, "daily_budget": 5000}}).teacher
    assert (s.max_calls_per_minute, s.daily_budget) == (60, 5000)
    s = parse_intents(DOC).teacher
    assert (s.max_calls_per_minute, s.daily_budget) == (None, None)
    s = parse_intents({**DOC, "teacher": {"max_calls_per_minute": None, "daily_budget": 1}}).teacher
    assert (s.max_calls_per_minute, s.daily_budget) == (None, 1)
    saved = parse_intents({**DOC, "teacher": {"daily_budget": 7}})
    assert parse_intents(intents_to_doc(saved)).teacher == saved.teacher         # a saved version keeps it


@pytest.mark.parametrize("key", ["max_calls_per_minute", "daily_budget"])
@pytest.mark.parametrize("bad", [0, -5, 1.5, "60", True, [60]])
def test_a_bad_budget_names_the_key(key, bad):
    with pytest.raises(IntentFileError, match=rf"teacher\.{key} must be an integer >= 1, got"):
        parse_intents({**DOC, "teacher": {key: bad}}, source="intents.yaml")


def test_build_teacher_puts_the_intent_files_budget_in_front_of_the_teacher():
    from flywheel.classifier.teachers import OllamaTeacher, build_teacher

    limited = parse_intents({**DOC, "teacher": {"max_calls_per_minute": 30, "daily_budget": 1000}})
    t = build_teacher(load_config(ollama_host="http://127.0.0.1:9"), limited)
    assert isinstance(t, BudgetedTeacher)
    assert t.budget.remaining() == {"minute": 30, "day": 1000}
    plain = build_teacher(load_config(ollama_host="http://127.0.0.1:9"), parse_intents(DOC))
    assert isinstance(plain, OllamaTeacher)
