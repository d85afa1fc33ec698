"""The log's named reads (logstore.reads): each answers its question with typed rows on a
hand-built log, binds the values it is given, and :class:`LogStore` is the
:class:`LogReader` the offline side types against. (What the callers make of the rows,
``flywheel stats``, the review queue and dashboard, the teacher-noise estimate, is tested
with them.)

=====  =====================  =========  ===============  ==============  ========  =====
id     served (layer)         layer 2    teacher          human           language  age d
=====  =====================  =========  ===============  ==============  ========  =====
a      PLATFORM (llm)         RETRIEVAL  PLATFORM         RETRIEVAL       en        0.1
b      RETRIEVAL (embedding)  RETRIEVAL  -                PLATFORM        es        0.2
c      None (llm), weak       RETRIEVAL  unsure R/P       -               es        2
d      RETRIEVAL (embedding)  RETRIEVAL  -, degraded,     -               -         10
       weak                              pending
e, f   PLATFORM (llm)         PLATFORM   PLATFORM         -               en        0.3, 0.4
=====  =====================  =========  ===============  ==============  ========  =====

Shadow v2: b sure PLATFORM (a flip; the human says PLATFORM), a unsure (both unsure:
agree), and an answer for a decision not in the log.
"""

from __future__ import annotations

import inspect
from datetime import datetime

import pytest

from flywheel.classifier.decision import Layer, Tier
from flywheel.logstore import LabelRecord, LogReader, LogStore, label_records_to_table
from flywheel.logstore.reads import (
    TRAFFIC_COUNTS,
    AnchoringCount,
    ErrorDirections,
    HumanCorrection,
    LabelCoverage,
    LabelPair,
    LanguageCounts,
    NamedReads,
    ShadowAgreement,
    TrafficCount,
)
from flywheel.training.protocols import TrafficLog
from tests.support.records import NOW, review_record, teacher_call
from tests.support.worlds import write

P, R = "PLATFORM", "RETRIEVAL"


@pytest.fixture
def store(tmp_path):
    s = LogStore(tmp_path / "log.duckdb")
    write(s, [
        review_record("a", "text a", P, teacher=teacher_call(P), language="en", age_days=0.1),
        review_record("b", "text b", R, layer=Layer.EMBEDDING, language="es", age_days=0.2),
        review_record("c", "text c", None, teacher=teacher_call(None, False, candidates=(R, P)), tier=Tier.WEAK,
                      language="es", age_days=2),
        review_record("d", "text d", R, layer=Layer.EMBEDDING, tier=Tier.WEAK, degraded="teacher_down",
                      pending=True, age_days=10),
        review_record("e", "text e", P, l2=P, teacher=teacher_call(P), language="en", age_days=0.3),
        review_record("f", "text f", P, l2=P, teacher=teacher_call(P), language="en", age_days=0.4),
    ])
    s.add_human_label("a", R, author="ana")
    s.add_human_label("b", P, author="ana")
    s.insert_objects([("shadow-1", "labels", label_records_to_table([
        LabelRecord.shadow("b", "v2", P, 0.8, "confident", True),
        LabelRecord.shadow("a", "v2", None, 0.3, "weak", False),
        LabelRecord.shadow("not-logged", "v2", P, 0.9, "confident", True)]))])
    return s


def test_a_log_store_is_the_reader_the_offline_side_types_against(store):
    assert isinstance(store, LogReader) and isinstance(store, TrafficLog)
    # the protocol states exactly the reads NamedReads implements, with the same signatures
    reads = {n for n in vars(NamedReads) if not n.startswith("_")}
    assert reads == {n for n in vars(LogReader) if not n.startswith("_")} and len(reads) == 11
    for name in reads:
        assert inspect.signature(getattr(LogReader, name)) == inspect.signature(getattr(NamedReads, name)), name

    class RowsOnly:      # a store without the named reads is no LogReader
        def labelled_rows(self):
            return []
    assert not isinstance(RowsOnly(), LogReader)


def test_languages(store):
    assert store.logged_languages() == ["en", "es"]
    assert store.language_breakdown() == [
        LanguageCounts("en", n=3, llm=3, confident=3, degraded=0, judged=3, agree=2, out_of_scope=0),
        LanguageCounts("es", n=2, llm=1, confident=1, degraded=0, judged=0, agree=0, out_of_scope=1),
        LanguageCounts("none", n=1, llm=0, confident=0, degraded=1, judged=0, agree=0, out_of_scope=0)]


def test_anchoring_observations_are_grouped(store):
    got = sorted(store.anchoring_observations(), key=repr)
    assert got == sorted([AnchoringCount(P, R, (), 1), AnchoringCount(None, R, (), 1),
                          AnchoringCount(P, P, (), 2)], key=repr)


def test_teacher_and_human_labels(store):
    assert store.teacher_human_pairs() == [LabelPair(teacher=P, human=R, n=1)]
    assert sorted(store.human_corrections(), key=repr) == [HumanCorrection(P, R, 1), HumanCorrection(R, P, 1)]
    assert sorted(store.label_coverage(), key=repr) == sorted(
        [LabelCoverage(P, n=3, n_labelled=3), LabelCoverage(R, n=2, n_labelled=1), LabelCoverage(None, 1, 0)],
        key=repr)
    assert store.error_directions() == ErrorDirections(teacher_calls=3, teacher_calls_layer2_had=2,
                                                       confident_layer2=1, confident_layer2_corrected=1)


def test_the_shadow_version_against_the_champion(store):
    assert store.shadow_answered("v2") == 2 and store.shadow_answered("v3") == 0
    got = store.shadow_agreement("v2")
    assert got[:9] == ShadowAgreement(n=2, permissive=0, abstaining=0, flips=1, disagreements_labelled=1,
                                      champion_right=0, shadow_right=1, champion_unsure=1, shadow_unsure=1,
                                      first=None, last=None)[:9]
    assert isinstance(got.first, datetime) and got.first <= got.last
    assert store.shadow_agreement("v3") == ShadowAgreement(0, 0, 0, 0, 0, 0, 0, 0, 0, None, None)


def test_review_candidates_newest_first_within_the_bounds(store):
    def ids(since=0.0, until=NOW + 86_400, language=None, limit=100):
        return [c.decision_id for c in store.review_candidates(since, until, language, limit=limit)]

    assert ids() == ["a", "b", "c", "d"]                   # e and f: the teacher agreed with layer 2
    assert ids(language="es") == ["b", "c"] and ids(language="unknown") == []
    assert ids(since=NOW - 86_400) == ["a", "b"] and ids(until=NOW - 86_400) == ["c", "d"]
    assert ids(limit=1) == ["a"]
    c = {x.decision_id: x for x in store.review_candidates(0.0, NOW + 86_400, limit=100)}
    assert c["c"].candidates == [R, P] and not c["c"].has_teacher and c["c"].label is None and c["c"].l2_answered
    assert c["a"].has_teacher and c["a"].teacher_label == P and c["a"].has_human and c["a"].human_label == R
    assert c["a"].shadow_label is None and c["b"].shadow_label == P and c["b"].language == "es"
    assert c["d"].degraded == "teacher_down" and c["d"].pending and c["d"].alternatives == [P, "CODE_GENERATION"]
    assert abs(c["a"].created_at - (NOW - 0.1 * 86_400 - 60)) < 1e-3


def test_values_are_bound_never_spliced_into_the_sql(store):
    assert store.review_candidates(0.0, NOW + 86_400, "en' OR 'x' = 'x", limit=100) == []
    for bad in ("day'; DROP TABLE decisions; --", "month", 0, -3, True, 2.5):
        with pytest.raises(ValueError, match="window must be"):
            store.traffic_by_window(bad)
    with pytest.raises(ValueError, match="last must be"):
        store.traffic_by_window("day", last=0)
    assert store.count() == 6


def test_traffic_by_window(store):
    rows = store.traffic_by_window(2)
    assert all(isinstance(r, TrafficCount) for r in rows)
    total = next(r for r in rows if (r.scope, r.kind) == ("total", "window"))
    assert total.n == 6 and total.n_windows == 3 and total.w is None
    assert {k: getattr(total, k) for k in TRAFFIC_COUNTS} == {
        "audited": 0, "audit_labelled": 0, "audit_agree": 0, "pending_flagged": 1, "pending": 1,
        "teacher_calls": 4, "teacher_labelled": 3, "human_labelled": 2, "human_corrected": 2, "degraded": 1}
    windows = sorted((r.w, r.n) for r in rows if (r.scope, r.kind) == ("window", "window"))
    assert windows == [(0, 2), (1, 2), (2, 2)]                  # blocks of 2, oldest first: d c | f e | b a
    layers = {r.k1: r.n for r in rows if (r.scope, r.kind) == ("total", "layer")}
    assert layers == {"llm": 4, "embedding": 2}
    assert {(r.k1, r.k2, r.n) for r in rows if (r.scope, r.kind) == ("total", "human_served")} == {(P, R, 1), (R, P, 1)}
    # only the last window keeps its rows; the totals still cover the whole log
    last = store.traffic_by_window(2, last=1)
    assert {r.w for r in last if r.scope == "window"} == {2}
    assert next(r for r in last if (r.scope, r.kind) == ("total", "window")).n == 6
    days = store.traffic_by_window("day")
    assert all(isinstance(r.w, datetime) for r in days if r.scope == "window")
    assert sum(r.n or 0 for r in days if (r.scope, r.kind) == ("window", "window")) == 6


def test_an_empty_log_answers_every_read(tmp_path):
    s = LogStore(tmp_path / "empty.duckdb")
    assert s.logged_languages() == [] and s.language_breakdown() == [] and s.anchoring_observations() == []
    assert s.teacher_human_pairs() == [] and s.human_corrections() == [] and s.label_coverage() == []
    assert s.review_candidates(0.0, NOW, limit=10) == []
    assert s.error_directions() == ErrorDirections(0, 0, 0, 0) and s.shadow_answered("v2") == 0
    assert s.shadow_agreement("v2") == ShadowAgreement(0, 0, 0, 0, 0, 0, 0, 0, 0, None, None)
    rows = s.traffic_by_window("day")
    assert [(r.scope, r.kind, r.n, r.n_windows) for r in rows] == [("total", "window", 0, 0)]
