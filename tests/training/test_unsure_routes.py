"""A teacher's unsure answer reaches the review queue and the tuner's hard pairs on all three
routes (issue 33): inline (layer 3), in a background audit (``service.runtime``'s audit
recorder writes it as a teacher label of the decision) and in ``flywheel label``'s back-fill.
Before, only the inline set did: the other two were logged as a bare invalid label."""

from __future__ import annotations

import copy

from flywheel.classifier.decision import Layer, Tier
from flywheel.classifier.layer2.fitter import fit_model
from flywheel.classifier.settings.config import load_config
from flywheel.classifier.settings.intents import parse_intents
from flywheel.logstore import LogStore
from flywheel.training.labeling import backfill_pending
from flywheel.training.review.queue import review_queue
from flywheel.training.tuner.step import candidate_pairs
from tests.support.docs import ALWAYS_SURE, ALWAYS_UNSURE, DOC
from tests.support.fakes import HashEmbedder, ScriptedTeacher, make_classifier
from tests.support.records import review_record
from tests.support.worlds import write

PAIR = ("RETRIEVAL", "PLATFORM")


def _reaches_the_queue_and_the_hard_pairs(store: LogStore, did: str, cands: tuple) -> None:
    assert store.unsure_candidate_sets() == [cands]
    assert candidate_pairs(store.unsure_candidate_sets()) == [{"pair": sorted(PAIR), "sets": 1}]
    item = next(it for it in review_queue(store) if it.decision_id == did)
    assert "unsure" in item.reasons and item.candidates == cands and item.choices[:2] == cands


def test_an_audits_unsure_answer_reaches_the_queue_and_the_hard_pairs(tmp_path):
    from flywheel.service.runtime import open_runtime

    cfg = load_config(home=tmp_path, audit_rate=1.0)
    emb = HashEmbedder()
    doc = copy.deepcopy(DOC)
    doc["thresholds"] = ALWAYS_SURE
    fit_model(parse_intents(doc), embedder=emb).save(tmp_path / "m")
    cfg.model = str(tmp_path / "m")
    served = open_runtime(cfg, progress=False, embedder=emb, teacher=ScriptedTeacher(lambda req: list(PAIR)))
    d = served.classifier.classify("explain addparam")
    served.close()
    assert d.layer is Layer.EMBEDDING and served.classifier.audit_outcomes["unsure"] == 1
    store = served.store
    assert store.query("SELECT valid, teacher_candidates FROM labels") == [(False, list(PAIR))]
    assert store.unsure_teacher_answers() == 1
    _reaches_the_queue_and_the_hard_pairs(store, d.id, PAIR)


def test_a_back_filled_unsure_answer_reaches_the_queue_and_the_hard_pairs(tmp_path):
    store = LogStore(tmp_path / "log.duckdb")
    write(store, [review_record("p1", "explain addparam", "RETRIEVAL", layer=Layer.EMBEDDING, tier=Tier.WEAK,
                                confidence=0.4, degraded="teacher_down", pending=True)])
    clf = make_classifier(ALWAYS_UNSURE, teacher=ScriptedTeacher(lambda req: list(PAIR)))
    counts = backfill_pending(store, clf, progress=False)
    assert counts["unsure"] == 1 and store.pending() == []
    assert store.query("SELECT valid, teacher_candidates FROM labels") == [(False, list(PAIR))]
    _reaches_the_queue_and_the_hard_pairs(store, "p1", PAIR)


def test_cannot_tell_from_a_back_fill_is_unsure_with_no_candidates(tmp_path):
    store = LogStore(tmp_path / "log.duckdb")
    write(store, [review_record("p1", "explain addparam", "RETRIEVAL", layer=Layer.EMBEDDING, tier=Tier.WEAK,
                                confidence=0.4, degraded="teacher_down", pending=True)])
    backfill_pending(store, make_classifier(ALWAYS_UNSURE, teacher=ScriptedTeacher(
        lambda req: ScriptedTeacher.CANNOT_TELL)), progress=False)
    assert store.unsure_teacher_answers() == 1 and store.unsure_candidate_sets() == []
    (item,) = review_queue(store)
    assert "unsure" in item.reasons and item.candidates == ()


def test_a_valid_teacher_answer_after_an_unsure_one_takes_it_out_of_unsure(tmp_path):
    store = LogStore(tmp_path / "log.duckdb")
    write(store, [review_record("p1", "explain addparam", "RETRIEVAL", layer=Layer.EMBEDDING, tier=Tier.WEAK,
                                confidence=0.4, l2="RETRIEVAL")])
    store.add_teacher_label("p1", None, "llm", False, 1.0, candidates=PAIR)
    assert [it.reasons for it in review_queue(store)] == [("unsure",)]
    store.add_teacher_label("p1", "RETRIEVAL", "llm", True, 1.0)     # asked again later: sure, as layer 2
    assert review_queue(store) == []
