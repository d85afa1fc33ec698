"""The review queue (issue 25): which logged decisions it shows, why, and in what order;
its filters; and that a label made from it is a human label that leaves the queue."""

from __future__ import annotations

import pytest

from flywheel.classifier.decision import Layer, Tier
from flywheel.logstore import LabelRecord, LogStore, label_records_to_table
from flywheel.training.review.queue import REASONS, ReviewError, ReviewFilters, review_queue
from tests.support.records import NOW, review_record, teacher_call
from tests.support.worlds import write


@pytest.fixture
def store(tmp_path):
    s = LogStore(tmp_path / "log.duckdb")
    write(s, [
        review_record("agree", "find the docs", "RETRIEVAL", teacher=teacher_call("RETRIEVAL")),  # not in the queue
        review_record("unsure", "docs or my plan?", "RETRIEVAL",
             teacher=teacher_call(None, False, candidates=("RETRIEVAL", "PLATFORM"))),
        review_record("disagree", "show my quota", "PLATFORM", teacher=teacher_call("PLATFORM")),
        review_record("old-disagree", "quota left?", "PLATFORM", teacher=teacher_call("PLATFORM"), age_days=30),
        review_record("audit", "write a loop", "CODE_GENERATION", layer=Layer.EMBEDDING, l2="CODE_GENERATION",
             teacher=teacher_call("RETRIEVAL"), audit=True),
        review_record("degraded", "hello <script>alert(1)</script>", "RETRIEVAL", layer=Layer.EMBEDDING,
             l2="RETRIEVAL", tier=Tier.WEAK, confidence=0.4, degraded="teacher_down", pending=True),
        review_record("corrected", "my invoices", "RETRIEVAL", layer=Layer.EMBEDDING, l2="RETRIEVAL"),
        review_record("shadowed", "explain addparam", "RETRIEVAL", layer=Layer.EMBEDDING, l2="RETRIEVAL"),
        review_record("erased", "", "PLATFORM", teacher=teacher_call(None, False, candidates=())),
    ])
    s.add_human_label("corrected", "PLATFORM", author="ana")
    s.insert_objects([("shadow-1", "labels", label_records_to_table(
        [LabelRecord.shadow("shadowed", "v2", "PLATFORM", 0.8, "confident", True)]))])
    return s


def test_the_queue_holds_what_is_worth_a_look_and_says_why(store):
    items = {it.decision_id: it for it in review_queue(store, now=NOW)}
    assert set(items) == {"unsure", "disagree", "old-disagree", "audit", "degraded", "shadowed"}
    assert items["unsure"].reasons == ("unsure",) and items["unsure"].candidates == ("RETRIEVAL", "PLATFORM")
    assert items["disagree"].reasons == ("teacher_vs_l2",) and items["disagree"].teacher_label == "PLATFORM"
    assert items["audit"].reasons == ("audit_vs_l2",)
    assert items["degraded"].reasons == ("degraded", "pending")
    assert items["shadowed"].reasons == ("shadow_vs_l2",) and items["shadowed"].shadow_label == "PLATFORM"
    # the choices a reviewer is offered start with the candidates, then the other answers
    assert items["unsure"].choices[:2] == ("RETRIEVAL", "PLATFORM")
    assert "<script>" in items["degraded"].text      # stored as logged; every front end escapes it


def test_it_is_ranked_by_what_a_label_is_worth(store):
    order = [it.decision_id for it in review_queue(store, now=NOW)]
    assert order[0] == "unsure"                              # the strongest reason
    assert order.index("disagree") < order.index("old-disagree")   # recent first
    worth = {it.decision_id: it.worth for it in review_queue(store, now=NOW)}
    assert worth["old-disagree"] < worth["disagree"] / 10    # 30 days: four half-lives and more


def test_corrected_decisions_come_back_only_when_asked_for(store):
    got = review_queue(store, ReviewFilters(reasons=("corrected",)), now=NOW)
    assert [it.decision_id for it in got] == ["corrected"] and got[0].human_label == "PLATFORM"


def test_filters(store):
    def ids(**kw):
        return {it.decision_id for it in review_queue(store, ReviewFilters(**kw), now=NOW)}

    assert ids(intent="CODE_GENERATION") == {"audit"}
    assert ids(layer="embedding") == {"audit", "degraded", "shadowed"}
    assert ids(tier="weak") == {"degraded"}
    assert ids(reasons=("pending",)) == {"degraded"}
    assert ids(max_confidence=0.5) == {"degraded"}
    assert ids(min_confidence=0.5) == {"unsure", "disagree", "old-disagree", "audit", "shadowed"}
    assert ids(since=NOW - 86_400) == {"unsure", "disagree", "audit", "degraded", "shadowed"}
    assert ids(until=NOW - 86_400) == {"old-disagree"}
    assert len(review_queue(store, limit=2, now=NOW)) == 2


def test_a_human_label_takes_an_item_out_of_the_queue(store):
    store.add_human_label("unsure", "PLATFORM", author="ana")
    assert "unsure" not in {it.decision_id for it in review_queue(store, now=NOW)}


@pytest.mark.parametrize("kw, match", [
    ({"reasons": ("nope",)}, "unknown review reason"),
    ({"min_confidence": 1.5}, "between 0 and 1"),
    ({"min_confidence": 0.8, "max_confidence": 0.2}, "above max_confidence"),
])
def test_bad_filters_are_named(store, kw, match):
    with pytest.raises(ReviewError, match=match):
        review_queue(store, ReviewFilters(**kw))
    assert set(REASONS) >= {"unsure", "corrected"}


def test_an_item_serialises_with_label_names(store):
    d = next(it for it in review_queue(store, now=NOW) if it.decision_id == "unsure").to_dict()
    assert d["candidates"] == ["RETRIEVAL", "PLATFORM"] and d["reasons"] == ["unsure"]
    assert d["created_at"].endswith("Z") and isinstance(d["worth"], float)


def test_choices_keep_only_the_intents_a_label_may_be(store):
    got = {it.decision_id: it for it in review_queue(store, now=NOW, labels=("RETRIEVAL", "PLATFORM"))}
    assert "CODE_GENERATION" not in got["unsure"].choices and got["unsure"].choices == ("RETRIEVAL", "PLATFORM")


def test_identical_texts_are_one_item_that_answers_them_all(tmp_path):
    s = LogStore(tmp_path / "log.duckdb")
    write(s, [
        review_record("new", "what are your hours", "CANCEL", teacher=teacher_call("BOOK")),
        review_record("old", "  what are your hours ", "BOOK", teacher=teacher_call("CANCEL"), age_days=2),
        review_record("other", "what are your hours?", "BOOK", teacher=teacher_call("CANCEL"), age_days=1),
    ])
    items = review_queue(s, now=NOW)
    assert [it.decision_id for it in items] == ["new", "other"]          # the best one represents them
    assert items[0].decision_ids == ("new", "old") and items[0].count == 2
    assert items[1].decision_ids == ("other",) and items[1].count == 1
    d = items[0].to_dict()
    assert d["decision_ids"] == ["new", "old"] and d["count"] == 2
    assert len(review_queue(s, limit=1, now=NOW)) == 1                    # the limit counts items


def test_the_teachers_out_of_scope_answer_is_not_no_answer(tmp_path):
    s = LogStore(tmp_path / "log.duckdb")
    write(s, [review_record("oos", "tell me a joke", "PLATFORM", teacher=teacher_call(None)),
              review_record("none", "hello there", "PLATFORM", layer=Layer.EMBEDDING, l2="PLATFORM",
                            degraded="teacher_down")])
    items = {it.decision_id: it for it in review_queue(s, now=NOW)}
    assert items["oos"].teacher_answered and items["oos"].teacher_label is None
    assert items["oos"].to_dict()["teacher_label"] == "OUT_OF_SCOPE" and items["oos"].to_dict()["teacher_answered"]
    assert not items["none"].teacher_answered and items["none"].to_dict()["teacher_label"] is None
    assert {it.decision_id for it in review_queue(s, ReviewFilters(intent="OUT_OF_SCOPE"), now=NOW)} == {"oos"}


def test_every_served_intent_is_a_choice_the_likely_ones_first(store):
    from flywheel.training.review.queue import all_choices

    served = ("BOOK", "PLATFORM", "HOURS", "RETRIEVAL")
    item = next(it for it in review_queue(store, now=NOW, labels=served) if it.decision_id == "unsure")
    assert item.choices == ("RETRIEVAL", "PLATFORM")
    assert all_choices(item, served) == ("RETRIEVAL", "PLATFORM", "BOOK", "HOURS")
    assert all_choices(item, None) == item.choices


def test_layer_2s_out_of_scope_answer_is_not_no_answer(tmp_path):
    from dataclasses import replace

    s = LogStore(tmp_path / "log.duckdb")
    rules = replace(review_record("rules", "book me a room", "PLATFORM", layer=Layer.RULES,
                                  teacher=teacher_call("RETRIEVAL")), layer2=None)   # layer 2 did not run
    write(s, [review_record("l2-oos", "tell me a joke", "PLATFORM", l2=None, teacher=teacher_call("PLATFORM")),
              review_record("l2-said", "my quota", "PLATFORM", l2="RETRIEVAL", teacher=teacher_call("PLATFORM")),
              rules])
    items = {it.decision_id: it for it in review_queue(s, now=NOW)}
    assert set(items) == {"l2-oos", "l2-said", "rules"}
    d = {k: it.to_dict() for k, it in items.items()}
    assert d["l2-oos"]["l2_label"] == "OUT_OF_SCOPE" and d["l2-oos"]["l2_answered"]
    assert d["l2-said"]["l2_label"] == "RETRIEVAL" and d["l2-said"]["l2_answered"]
    assert d["rules"]["l2_label"] is None and not d["rules"]["l2_answered"]
    assert d["rules"]["reasons"] == ["teacher_vs_l2"]              # still the served label against the teacher's
    assert {it.decision_id for it in review_queue(s, ReviewFilters(intent="OUT_OF_SCOPE"), now=NOW)} == {"l2-oos"}


def test_a_background_audit_written_as_a_label_reaches_the_queue(tmp_path):
    """A real audit's answer is a teacher label written after the decision (not inline):
    its disagreement with layer 2 is in the queue as ``audit_vs_l2`` with the teacher's answer."""
    s = LogStore(tmp_path / "log.duckdb")
    write(s, [review_record("audited", "write a loop", "CODE_GENERATION", layer=Layer.EMBEDDING,
                            l2="CODE_GENERATION", audit=True),
              review_record("agreed", "write a class", "CODE_GENERATION", layer=Layer.EMBEDDING,
                            l2="CODE_GENERATION", audit=True)])
    s.add_teacher_label("audited", "RETRIEVAL", "llm", True)
    s.add_teacher_label("agreed", "CODE_GENERATION", "llm", True)
    items = {it.decision_id: it for it in review_queue(s, now=NOW)}
    assert set(items) == {"audited"}
    assert items["audited"].reasons == ("audit_vs_l2",) and items["audited"].teacher_label == "RETRIEVAL"


def test_a_text_a_person_labelled_is_not_asked_about_again(tmp_path):
    s = LogStore(tmp_path / "log.duckdb")
    write(s, [review_record("old", "what are your hours", "RETRIEVAL", teacher=teacher_call("PLATFORM"), age_days=2),
              review_record("new", " what are your hours\n", "RETRIEVAL", teacher=teacher_call("PLATFORM")),
              review_record("other", "what are your hours?", "RETRIEVAL", teacher=teacher_call("PLATFORM"))])
    assert {it.decision_id for it in review_queue(s, now=NOW)} == {"new", "other"}   # merged: new answers old
    s.add_human_label("old", "PLATFORM", author="ana")
    assert [it.decision_id for it in review_queue(s, now=NOW)] == ["other"]         # "new" repeats a labelled text
    got = review_queue(s, ReviewFilters(reasons=("corrected",)), now=NOW)
    assert [it.decision_id for it in got] == ["old"]                               # the labelled one, when asked


def test_a_degraded_decision_everyone_agrees_on_since_leaves_the_queue(tmp_path):
    s = LogStore(tmp_path / "log.duckdb")
    write(s, [review_record(did, f"query {did}", "RETRIEVAL", layer=Layer.EMBEDDING, l2="RETRIEVAL",
                            tier=Tier.WEAK, confidence=0.4, degraded="teacher_down", pending=True)
              for did in ("agreed", "disagreed", "waiting")])
    assert {it.decision_id for it in review_queue(s, now=NOW)} == {"agreed", "disagreed", "waiting"}
    s.add_teacher_label("agreed", "RETRIEVAL", "llm", True)        # the back-fill: the same as layer 2 and served
    s.add_teacher_label("disagreed", "PLATFORM", "llm", True)
    items = {it.decision_id: it for it in review_queue(s, now=NOW)}
    assert set(items) == {"disagreed", "waiting"}
    assert items["disagreed"].reasons == ("teacher_vs_l2", "degraded")     # answered: no longer pending
    assert items["waiting"].reasons == ("degraded", "pending")
