"""The teacher's history anchoring (ADR failure RC-03): the definition
(classifier.anchoring), the live monitor on a real Classifier, the Prometheus metric
and the ``anchoring`` section of ``flywheel stats``.

The hand-computed example used by the unit test and the traffic-log test
(labels A, B; ``None`` = out of scope):

=====================  =======  ======  ========  =========
history (oldest first)  teacher  layer 2  dominant  anchored
=====================  =======  ======  ========  =========
A, B, B                 B        A       B         yes
A, B                    B        B       B (tie)   no (layer 2 agrees)
None, None, A           None     A       None      yes
B, A                    B        A       A (tie)   no
=====================  =======  ======  ========  =========

so ``n_with`` 4, ``anchored_with`` 2, ``rate_with`` 0.5, weights B 2/4, None 1/4, A 1/4.
Without a history (6): teacher/layer 2 = A/B, A/A, None/A, B/B, B/None, B/A, so the
chance counts (teacher == X != layer 2) are A 1, None 1, B 2 of 6 and
``rate_without`` = 0.5 * 2/6 + 0.25 * 1/6 + 0.25 * 1/6 = 0.25; ``lift`` 0.25.
"""

from __future__ import annotations

import json
import math
import threading

import pytest
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from flywheel.classifier.anchoring import AnchoringMonitor, AnchoringReport, anchoring_report, dominant_label
from flywheel.classifier.decision import Decision, Layer, Layer2Answer, TeacherCall, Tier
from flywheel.classifier.errors import TeacherError
from flywheel.classifier.protocols import DecisionRecord, HistoryEntry
from flywheel.logstore import LogStore
from flywheel.service.metrics import ServerMetrics
from flywheel.training.stats.anchoring import anchoring_section, empty_anchoring
from flywheel.training.stats.traffic import convergence, format_table, stats_for_path
from tests.support.docs import ALWAYS_SURE, ALWAYS_UNSURE, DOC
from tests.support.fakes import ScriptedTeacher, make_classifier

WITH = [  # (history, teacher, layer 2): the module docstring's table
    (["A", "B", "B"], "B", "A"),
    (["A", "B"], "B", "B"),
    ([None, None, "A"], None, "A"),
    (["B", "A"], "B", "A"),
]
WITHOUT = [("A", "B"), ("A", "A"), (None, "A"), ("B", "B"), ("B", None), ("B", "A")]
EXPECTED = dict(n_with=4, anchored_with=2, rate_with=0.5, n_without=6, rate_without=0.25, lift=0.25,
                tripped=False)


def _observe_example(m: AnchoringMonitor) -> None:
    for history, teacher, l2 in WITH:
        m.observe(teacher, l2, history)
    for teacher, l2 in WITHOUT:
        m.observe(teacher, l2, [])


# --------------------------------------------------------------------------- the definition

def test_dominant_label_ties_go_to_the_most_recent_and_none_is_a_label():
    assert dominant_label(["A", "B", "B"]) == "B"
    assert dominant_label(["A", "B", "B", "A"]) == "A"      # tie: A is the most recent
    assert dominant_label(["B", "A"]) == "A"
    assert dominant_label(["A", None, None]) is None         # out of scope counts
    assert dominant_label([None, "A"]) == "A"
    with pytest.raises(ValueError, match="no dominant"):
        dominant_label([])


def test_hand_computed_report_with_the_baseline_weighting():
    m = AnchoringMonitor()
    _observe_example(m)
    r = m.report()
    assert isinstance(r, AnchoringReport)
    assert r.to_dict() == pytest.approx(EXPECTED)
    assert r.tripped is False                                # 4 and 6 observations < min_n 20
    small = AnchoringMonitor(min_n=4)
    _observe_example(small)
    assert small.report().tripped is True                    # lift 0.25 >= 0.15
    strict = AnchoringMonitor(min_n=4, max_lift=0.3)
    _observe_example(strict)
    assert strict.report().tripped is False


def test_rows_give_the_same_report_and_weights_count():
    rows = [(h, t, l2) for h, t, l2 in WITH]
    flat = [(t, l2, h) for h, t, l2 in rows] + [(t, l2, None) for t, l2 in WITHOUT]
    assert anchoring_report(flat).to_dict() == pytest.approx(EXPECTED)
    doubled = [(t, l2, h, 2) for t, l2, h in flat]            # every observation twice: same rates
    r = anchoring_report(doubled, min_n=8)
    assert (r.n_with, r.anchored_with, r.n_without) == (8, 4, 12)
    assert (r.rate_with, r.rate_without, r.tripped) == (pytest.approx(0.5), pytest.approx(0.25), True)


def test_empty_sides_and_the_unweighted_baseline():
    r = AnchoringMonitor().report()
    assert r.to_dict() == dict(n_with=0, anchored_with=0, rate_with=None, n_without=0, rate_without=None,
                               lift=None, tripped=False)
    m = AnchoringMonitor()
    for teacher, l2 in WITHOUT:
        m.observe(teacher, l2, ())
    r = m.report()
    # no history at all: the mean of r_A 1/6, r_None 1/6, r_B 2/6 over the 3 labels seen
    assert (r.rate_with, r.lift, r.tripped) == (None, None, False)
    assert r.rate_without == pytest.approx(4 / 18)
    m = AnchoringMonitor()
    for history, teacher, l2 in WITH:
        m.observe(teacher, l2, history)
    assert (m.report().rate_with, m.report().rate_without, m.report().lift) == (0.5, None, None)


def test_a_lift_equal_to_the_limit_trips_despite_float_rounding():
    m = AnchoringMonitor(min_n=20, max_lift=0.15)
    for i in range(20):                                      # rate_with 7/20 = 0.35
        m.observe("A" if i < 7 else "B", "B", ["A"])
    for i in range(20):                                      # r_A 4/20 = 0.2, weight of A 1
        m.observe("A", "B" if i < 4 else "A", [])
    r = m.report()
    assert r.rate_with - r.rate_without < 0.15 and r.lift == pytest.approx(0.15)
    assert r.tripped is True


def test_bad_limits_and_thread_safety():
    with pytest.raises(ValueError, match="min_n"):
        AnchoringMonitor(min_n=0)
    with pytest.raises(ValueError, match="max_lift"):
        AnchoringMonitor(max_lift=0.0)
    m = AnchoringMonitor()

    def work():
        for _ in range(500):
            m.observe("A", "B", ["A", "B", "A"])
            m.observe("A", "B", ())

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    r = m.report()
    assert (r.n_with, r.anchored_with, r.n_without) == (2000, 2000, 2000)
    assert (r.rate_with, r.rate_without, r.lift) == (1.0, 1.0, 0.0)


# --------------------------------------------------------------------------- the live monitor

TRUTH = {e: i["name"] for i in DOC["intents"] for e in i["examples"]}
OTHER = {"RETRIEVAL": "PLATFORM", "PLATFORM": "RETRIEVAL"}
QUERIES = list(TRUTH)                                        # 12; layer 2's top label is the true one


def last_history_teacher() -> ScriptedTeacher:
    """Answers the last history label; without a history, from the query."""
    return ScriptedTeacher(lambda req: req.history[-1].label if req.history else TRUTH[req.text])


def query_teacher() -> ScriptedTeacher:
    """Answers from the query alone, whatever the history says."""
    return ScriptedTeacher(lambda req: TRUTH[req.text])


def _history(i: int, true: str) -> list[tuple[str, str]]:
    other = OTHER[true]
    if i % 3 == 2:  # a tie, the query's own label the most recent: dominant = last = the true label
        return [(other, "an earlier turn"), (true, "the turn before")]
    return [(other, "an earlier turn"), (true, "another turn"), (other, "the turn before")]  # dominant: other


def _run_explicit(teacher: ScriptedTeacher):
    clf = make_classifier(ALWAYS_UNSURE, teacher=teacher)
    for i in range(60):
        q = QUERIES[i % len(QUERIES)]
        d = clf.classify(q, history=_history(i, TRUTH[q]))
        assert d.layer is Layer.LLM
    for i in range(60):
        clf.classify(QUERIES[i % len(QUERIES)])
    return clf.anchoring.report()


def test_a_teacher_that_echoes_the_last_history_label_trips_the_monitor():
    r = _run_explicit(last_history_teacher())
    # 40 of 60 histories are dominated by the other label, and the teacher echoes it while
    # layer 2 reads the query; without a history it answers the query, as layer 2 does
    assert (r.n_with, r.anchored_with, r.n_without) == (60, 40, 60)
    assert r.rate_with == pytest.approx(40 / 60) and r.rate_without == 0.0
    assert r.lift == pytest.approx(40 / 60) and r.tripped is True


def test_a_teacher_that_reads_the_query_does_not_trip_it():
    r = _run_explicit(query_teacher())
    assert (r.n_with, r.anchored_with, r.n_without) == (60, 0, 60)
    assert (r.rate_with, r.rate_without, r.lift, r.tripped) == (0.0, 0.0, 0.0, False)


SESSION = ["show my invoices", "what plan am i on", "upgrade my plan",              # PLATFORM
           "what is addvar", "explain addparam", "how do loops work"]             # then RETRIEVAL


@pytest.mark.parametrize("teacher, anchored", [(last_history_teacher, 60), (query_teacher, 0)])
def test_session_histories_feed_the_monitor(teacher, anchored):
    """20 sessions of 3 PLATFORM then 3 RETRIEVAL turns: the echoing teacher keeps
    answering PLATFORM (its own answers fill the history), so turns 4-6 are anchored."""
    clf = make_classifier(ALWAYS_UNSURE, teacher=teacher())
    for s in range(20):
        for q in SESSION:
            clf.classify(q, session_id=f"s{s}")
    r = clf.anchoring.report()
    assert (r.n_with, r.anchored_with, r.n_without) == (100, anchored, 20)
    assert r.rate_without == 0.0 and r.tripped is (anchored > 0)


def test_only_teacher_answers_are_observed():
    clf = make_classifier(ALWAYS_SURE, teacher=query_teacher())         # layer 2 decides
    clf.classify("show my invoices", history=[("RETRIEVAL", "x")])
    clf.classify("how much quota do I have")                 # a rule decides
    assert clf.anchoring.report().n_with + clf.anchoring.report().n_without == 0
    failing = make_classifier(ALWAYS_UNSURE, teacher=ScriptedTeacher(error=TeacherError("unavailable", "down")))
    d = failing.classify("show my invoices", history=[("RETRIEVAL", "x")])
    assert d.layer is Layer.EMBEDDING
    assert failing.anchoring.report().n_with == 0
    off = make_classifier(ALWAYS_UNSURE, teacher=query_teacher())
    off.anchoring = None                                     # not measured: nothing breaks
    assert off.classify("show my invoices").layer is Layer.LLM


# --------------------------------------------------------------------------- the metric

def _samples(metrics: ServerMetrics) -> dict[tuple[str, str], float]:
    text = generate_latest(metrics.registry).decode()
    return {(s.name, s.labels.get("history", "")): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples
            if s.name.startswith("flywheel_anchoring")}


def test_metric_exposition():
    metrics = ServerMetrics()
    m = AnchoringMonitor()
    metrics.bind_anchoring(m)
    metrics.bind_anchoring(None)                              # no monitor: binds nothing
    s = _samples(metrics)
    assert math.isnan(s[("flywheel_anchoring_rate", "with")]) and math.isnan(s[("flywheel_anchoring_rate", "without")])
    assert s[("flywheel_anchoring_observed_total", "with")] == 0.0
    _observe_example(m)
    s = _samples(metrics)
    assert s[("flywheel_anchoring_rate", "with")] == 0.5
    assert s[("flywheel_anchoring_rate", "without")] == pytest.approx(0.25)
    assert s[("flywheel_anchoring_observed_total", "with")] == 4.0
    assert s[("flywheel_anchoring_observed_total", "without")] == 6.0
    text = generate_latest(metrics.registry).decode()
    assert "# TYPE flywheel_anchoring_rate gauge" in text
    assert "# TYPE flywheel_anchoring_observed_total counter" in text


def test_metric_follows_the_classifier():
    clf = make_classifier(ALWAYS_UNSURE, teacher=last_history_teacher())
    metrics = ServerMetrics()
    metrics.bind_anchoring(clf.anchoring)
    clf.classify("what is addvar", history=[("PLATFORM", "my invoices")])
    clf.classify("what is addvar")
    s = _samples(metrics)
    assert s[("flywheel_anchoring_rate", "with")] == 1.0 and s[("flywheel_anchoring_rate", "without")] == 0.0
    assert s[("flywheel_anchoring_observed_total", "with")] == 1.0


def test_the_sidecar_exposes_its_classifier_monitor(tmp_path):
    """Through a real sidecar: the server binds its classifier's monitor at start."""
    import copy

    from flywheel.classifier.layer2.fitter import fit_model
    from flywheel.classifier.settings.intents import parse_intents
    from tests.support.fakes import HashEmbedder
    from tests.support.sidecar import client, serving

    doc = copy.deepcopy(DOC) | {"thresholds": ALWAYS_UNSURE}
    model_dir = fit_model(parse_intents(doc), embedder=HashEmbedder(), version="v1").save(tmp_path / "v1")
    with serving(model_dir, teacher=last_history_teacher(), log_decisions=False) as server, \
            client(server) as fw:
        assert fw.classify("what is addvar", history=[("PLATFORM", "my invoices")]).label == "PLATFORM"
        assert fw.classify("what is addvar").label == "RETRIEVAL"
        s = _samples(server.metrics)
    assert s[("flywheel_anchoring_rate", "with")] == 1.0 and s[("flywheel_anchoring_rate", "without")] == 0.0
    assert s[("flywheel_anchoring_observed_total", "with")] == 1.0
    assert s[("flywheel_anchoring_observed_total", "without")] == 1.0


# --------------------------------------------------------------------------- flywheel stats

def _rec(n: int, layer: Layer, label: str | None, l2: str | None, history=(), *, l2_ran: bool = True):
    d = Decision(label=label, confidence=0.9, tier=Tier.CONFIDENT if label else Tier.NO_MATCH, layer=layer,
                 reason="test", model_version="v1",
                 teacher=TeacherCall("m", label, True, 100.0) if layer is Layer.LLM else None, id=f"{n:032x}")
    return DecisionRecord(decision=d, text=f"text {n}", created_at=1_714_521_600.0 + 60 * n,
                          history=tuple(HistoryEntry(h, "snippet") for h in history),
                          layer2=Layer2Answer(l2, 0.4, Tier.AMBIGUOUS) if l2_ran else None)


@pytest.fixture(scope="module")
def anchoring_log(tmp_path_factory):
    path = tmp_path_factory.mktemp("anchoring") / "flywheel.duckdb"
    records = [_rec(i, Layer.LLM, t, l2, h) for i, (h, t, l2) in enumerate(WITH)]
    records += [_rec(10 + i, Layer.LLM, t, l2) for i, (t, l2) in enumerate(WITHOUT)]
    records += [  # not observations: layer 2 decided; and a teacher decision without layer 2's answer
        _rec(20, Layer.EMBEDDING, "A", "A", ["B", "B"]),
        _rec(21, Layer.LLM, "B", None, ["B", "B"], l2_ran=False),
    ]
    sink = LogStore(path).open_sink(ingest_interval_s=None, fsync=False)
    for r in records:
        sink.write(r)
    sink.flush()
    sink.close()
    return path


def test_stats_section_from_the_log(anchoring_log):
    s = convergence(LogStore(anchoring_log), window=5, last=1)
    assert s["total"] == 12
    assert s["anchoring"] == pytest.approx(EXPECTED)
    assert list(s["anchoring"]) == list(EXPECTED)
    assert anchoring_section(LogStore(anchoring_log), min_n=4)["tripped"] is True
    assert ("anchoring (RC-03): with history 2/4 50.0%, without (chance) 25.0% of 6, lift +25.0 pts: "
            "not tripped") in format_table(s)


def test_stats_json_and_missing_log(anchoring_log, tmp_path):
    from flywheel.cli import build_app

    r = CliRunner().invoke(build_app(), ["stats", "--json", "--log-db", str(anchoring_log)])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["anchoring"] == pytest.approx(EXPECTED)
    missing = stats_for_path(tmp_path / "none.duckdb")
    assert missing["missing"] is True and missing["anchoring"] == empty_anchoring()
    assert empty_anchoring() == dict(n_with=0, anchored_with=0, rate_with=None, n_without=0, rate_without=None,
                                     lift=None, tripped=False)
