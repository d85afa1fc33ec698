"""Layer 2's own answer reaches the traffic log on every decision layer 2 ran for,
with decisions the real pipeline made (not hand-built records)."""

from __future__ import annotations

import threading

import pytest

from flywheel.classifier.decision import Layer, Tier
from flywheel.classifier.errors import TeacherError
from flywheel.logstore import LogStore
from flywheel.training.stats.traffic import convergence
from tests.support.docs import ALWAYS_SURE, ALWAYS_UNSURE
from tests.support.fakes import ListSink, ScriptedTeacher, make_classifier

QUERIES = ["what is addvar", "write a function that sums", "hello there", "how do loops work"]


def logged(store: LogStore) -> dict[str, tuple]:
    rows = store.query("SELECT decision_id, layer, label, tier, l2_label, l2_confidence, l2_tier "
                       "FROM decisions")
    return {r[0]: r[1:] for r in rows}


def run(clf, store, texts=QUERIES, **kw):
    decisions = [clf.classify(t, **kw) for t in texts]
    clf.close()
    return decisions, logged(store)


@pytest.fixture
def store(tmp_path):
    return LogStore(tmp_path / "log.duckdb")


def layer2_of(clf, text):
    """What layer 2 alone answers for ``text`` (same model, no teacher)."""
    from flywheel.classifier import Classifier

    d = Classifier(clf.model, embedder=clf.embedder, teacher=None).classify(text)
    return d.label, d.confidence, d.tier.value


def test_llm_decisions_log_layer2_answer(store):
    # the teacher always picks the LAST offered option, so it disagrees with layer 2
    teacher = ScriptedTeacher(answer=lambda req: req.options[-1].name)
    clf = make_classifier(ALWAYS_UNSURE, teacher=teacher, log_sink=store.open_sink(fsync=False))
    expected = {t: layer2_of(clf, t) for t in QUERIES}
    decisions, rows = run(clf, store)
    assert all(d.layer is Layer.LLM for d in decisions)
    for text, d in zip(QUERIES, decisions):
        layer, label, tier, l2_label, l2_conf, l2_tier = rows[d.id]
        assert (layer, label) == ("llm", d.label)
        exp_label, exp_conf, exp_tier = expected[text]
        assert (l2_label, l2_tier) == (exp_label, exp_tier)
        assert l2_conf == pytest.approx(exp_conf, rel=1e-6)
        assert l2_tier != "confident"  # it went to the LLM because layer 2 was not sure
    # stats' layer-2-vs-teacher confusions now see the LLM decisions
    stats = convergence(store, window=100)
    disagreeing = sum(1 for t in QUERIES if expected[t][0] != rows[decisions[QUERIES.index(t)].id][1])
    assert disagreeing > 0
    assert sum(p["n"] for p in stats["confused_l2_teacher"]) == disagreeing


def test_degraded_and_layer2_decisions_log_layer2_answer(store):
    down = ScriptedTeacher(error=TeacherError("unavailable", "connection refused"))
    clf = make_classifier(ALWAYS_UNSURE, teacher=down, log_sink=store.open_sink(fsync=False))
    expected = {t: layer2_of(clf, t) for t in QUERIES}
    decisions, rows = run(clf, store)
    for text, d in zip(QUERIES, decisions):
        assert d.layer is Layer.EMBEDDING and d.tier is Tier.WEAK   # degraded to a best guess
        _, _, _, l2_label, l2_conf, l2_tier = rows[d.id]
        assert (l2_label, l2_tier) == (expected[text][0], expected[text][2])  # not the degraded tier
        assert l2_conf == pytest.approx(expected[text][1], rel=1e-6)


def test_rules_and_declared_log_no_layer2(store):
    clf = make_classifier(ALWAYS_SURE, log_sink=store.open_sink(fsync=False))
    a = clf.classify("how much quota do I have")
    b = clf.classify("anything", declared_type="PLATFORM")
    c = clf.classify("what is addvar")
    clf.close()
    rows = logged(store)
    assert rows[a.id][0] == "rules" and rows[a.id][3:] == (None, None, None)
    assert rows[b.id][0] == "declared" and rows[b.id][3:] == (None, None, None)
    assert rows[c.id][0] == "embedding" and rows[c.id][3] == c.label and rows[c.id][5] == "confident"


def test_audit_backlog_is_bounded_and_drops_are_counted():
    gate = threading.Event()

    def slow(req):
        gate.wait(10)
        return req.options[0].name

    got = []
    sink = ListSink()
    clf = make_classifier(ALWAYS_SURE, teacher=ScriptedTeacher(answer=slow), audit_rate=1.0, max_pending_audits=2,
                          audit_callback=lambda rec, call: got.append(rec.decision.id), log_sink=sink)
    decisions = clf.classify_many(["what is addvar"] * 6)
    assert clf.audits_dropped == 4                       # 2 admitted, the rest dropped at once
    audited = [r.decision.id for r in sink.records if r.audit]
    assert len(audited) == 2                             # dropped ones are logged as not audited
    gate.set()
    clf.close()                                          # finishes the admitted audits
    assert sorted(got) == sorted(audited)
    assert len(decisions) == 6
