"""An unsure teacher (issue 24 items 2 and 4): the answer may be a candidate set (2 or 3
intents) or "cannot tell"; both backends send a schema that allows it; the pipeline serves
layer 2's best guess among the candidates; such an answer is logged as a not-valid teacher
call with its set as data (``TeacherCall.candidates``, the log's ``teacher_candidates``; issue
33) and never becomes a training label (the retrain
counts it as ``teacher_unsure``). ``teacher.ask_twice`` (off by default) asks again, the
options in another order, when the teacher and layer 2 disagree; two different answers
make a candidate set."""

from __future__ import annotations

import copy
import json
import time

import pytest

from flywheel.classifier.decision import Layer, Tier
from flywheel.classifier.errors import IntentFileError, TeacherError
from flywheel.classifier.protocols import LabelOption, TeacherRequest
from flywheel.classifier.settings.intents import parse_intents
from flywheel.classifier.settings.label_names import OUT_OF_SCOPE
from flywheel.classifier.teachers import OllamaTeacher, OpenAITeacher, option_order, read_answer, response_schema
from flywheel.logstore import LogStore
from flywheel.training.trainset import build_training_set
from tests.support.docs import ALWAYS_UNSURE, DOC
from tests.support.fakes import HashEmbedder, ListSink, ScriptedTeacher, make_classifier
from tests.support.simulated_ollama import SimulatedOllama
from tests.support.worlds import World, record, write

NAMES = ["A", "B", "C", "D"]
TEXT = "explain addparam"
OPTIONS = (LabelOption("RETRIEVAL", "docs"), LabelOption("PLATFORM", "account"))


# ------------------------------------------------------------------ the parser and the schema
def test_a_confident_answer_is_as_before():
    assert read_answer('{"label": "A"}', NAMES, True) == ("A", (), False)
    assert read_answer('{"label": "A", "candidates": [], "cannot_tell": false}', NAMES, True) == ("A", (), False)
    assert read_answer(json.dumps({"label": OUT_OF_SCOPE}), NAMES, True).label is None


def test_a_candidate_set_of_two_or_three_known_labels():
    p = read_answer('{"label": "B", "candidates": ["A", "B"]}', NAMES, True)
    assert p.candidates == ("A", "B") and p.label == "B" and not p.cannot_tell
    p = read_answer(json.dumps({"label": "C", "candidates": ["C", "D", OUT_OF_SCOPE]}), NAMES, True)
    assert p.candidates == ("C", "D", None)


def test_cannot_tell():
    p = read_answer('{"label": "A", "cannot_tell": true}', NAMES, True)
    assert p.cannot_tell and p.candidates == ()


@pytest.mark.parametrize("content, why", [
    ('{"label": "A", "candidates": ["A", "NOPE"]}', "'NOPE', which is not offered"),
    ('{"label": "A", "candidates": ["A"]}', "must hold 2 to 3 labels, got 1"),
    ('{"label": "A", "candidates": ["A", "B", "C", "D"]}', "must hold 2 to 3 labels, got 4"),
    ('{"label": "A", "candidates": ["A", "A"]}', "repeats a label"),
    ('{"label": "A", "candidates": "A, B"}', "not a list of labels"),
    ('{"label": "A", "cannot_tell": "yes"}', '"cannot_tell" is not a boolean'),
])
def test_bad_candidate_sets_are_malformed(content, why):
    with pytest.raises(TeacherError) as ei:
        read_answer(content, NAMES, True)
    assert ei.value.kind == "malformed" and why in str(ei.value)


def test_out_of_scope_in_a_set_needs_it_allowed():
    with pytest.raises(TeacherError, match="not offered"):
        read_answer(json.dumps({"label": "A", "candidates": ["A", OUT_OF_SCOPE]}), NAMES, False)


def test_the_schema_allows_a_candidate_set_and_cannot_tell():
    s = response_schema(["A", "B"], True)
    assert s["properties"]["candidates"] == {"type": "array",
                                             "items": {"type": "string", "enum": ["A", "B", OUT_OF_SCOPE]}}
    assert s["properties"]["cannot_tell"] == {"type": "boolean"}
    assert s["required"] == ["label"]


def test_another_order_seed_gives_another_order():
    for text in ("a", "b", "explain this", "what is addvar"):
        req = TeacherRequest(text, OPTIONS)
        assert option_order(req) != option_order(TeacherRequest(text, OPTIONS, order_seed=1))


# ------------------------------------------------------------------ both backends
def test_ollama_sends_the_schema_and_reads_a_candidate_set(httpserver):
    httpserver.expect_request("/api/chat", method="POST").respond_with_json(
        {"model": "m", "created_at": "2025-01-01T00:00:00Z", "done": True,
         "message": {"role": "assistant", "content": '{"label": "CODE", "candidates": ["CODE", "RETRIEVAL"]}'}})
    opts = (LabelOption("RETRIEVAL", "look up"), LabelOption("CODE", "write code"))
    ans = OllamaTeacher("m", host=httpserver.url_for("/").rstrip("/")).label(TeacherRequest("x", opts))
    assert ans.unsure and ans.candidates == ("CODE", "RETRIEVAL")
    body = json.loads(httpserver.log[0][0].get_data())
    assert set(body["format"]["properties"]) == {"label", "candidates", "cannot_tell"}
    assert "candidates" in body["messages"][0]["content"] and "cannot_tell" in body["messages"][0]["content"]


def test_the_simulated_ollama_answers_unsure_through_the_real_teacher():
    truth = {"show my invoices": "PLATFORM", "weather tomorrow": None}
    with SimulatedOllama(truth, accuracy=0.0, unsure_rate=1.0, latency_scale=0.0) as sim:
        teacher = OllamaTeacher("sim:1b", host=sim.url, timeout_s=5.0)
        a = teacher.label(TeacherRequest("show my invoices", OPTIONS))
        b = teacher.label(TeacherRequest("weather tomorrow", OPTIONS, allow_out_of_scope=False))
        teacher.close()
    assert a.unsure and "PLATFORM" in a.candidates and len(a.candidates) == 2
    assert b.cannot_tell                       # the right answer (out of scope) was not offered
    assert sim.counts["unsure"] == 2


def test_openai_sends_a_strict_schema_and_reads_cannot_tell(httpserver):
    httpserver.expect_request("/v1/chat/completions", method="POST").respond_with_json(
        {"id": "c", "object": "chat.completion", "created": 0, "model": "m",
         "choices": [{"index": 0, "finish_reason": "stop", "message": {
             "role": "assistant", "content": '{"label": "CODE", "candidates": [], "cannot_tell": true}'}}]})
    opts = (LabelOption("RETRIEVAL", "look up"), LabelOption("CODE", "write code"))
    ans = OpenAITeacher("m", host=httpserver.url_for("/v1"), timeout_s=2.0).label(TeacherRequest("x", opts))
    assert ans.cannot_tell and ans.unsure and ans.unsure_reason() == "teacher cannot tell"
    schema = json.loads(httpserver.log[0][0].get_data())["response_format"]["json_schema"]["schema"]
    assert schema["required"] == ["label", "candidates", "cannot_tell"]   # strict: every property
    assert schema["properties"]["candidates"]["items"]["enum"][-1] == OUT_OF_SCOPE


# ------------------------------------------------------------------ the pipeline
def _layer2_label(text: str = TEXT) -> str | None:
    sink = ListSink()
    make_classifier(ALWAYS_UNSURE, teacher=ScriptedTeacher(), log_sink=sink, teacher_cache=None).classify(text)
    return sink.records[0].layer2.label


def test_a_candidate_set_serves_layer_2s_best_guess_among_them():
    l2 = _layer2_label()
    other = next(n for n in ("RETRIEVAL", "PLATFORM") if n != l2)
    sink = ListSink()
    teacher = ScriptedTeacher(lambda req: [other, OUT_OF_SCOPE])
    d = make_classifier(ALWAYS_UNSURE, teacher=teacher, log_sink=sink, teacher_cache=None).classify(TEXT)
    assert d.layer is Layer.LLM and d.degraded is None
    assert d.label == (None if l2 is None else other)      # layer 2's ranking, restricted to the set
    assert d.tier is Tier.AMBIGUOUS
    assert f"unsure between {other}, {OUT_OF_SCOPE}" in d.reason and "best guess among them" in d.reason
    # the alternatives hold the served label first, as layer 2's own unsure answers do (issue 32)
    assert d.alternatives[0].label == d.label and {a.label for a in d.alternatives} <= {other, None}
    call = sink.records[0].decision.teacher
    assert call is not None and not call.valid and call.label is None
    assert call.error is None and call.unsure and call.candidates == (other, None)


def test_cannot_tell_serves_layer_2s_best_guess_as_weak():
    l2 = _layer2_label()
    d = make_classifier(ALWAYS_UNSURE, teacher=ScriptedTeacher(lambda req: ScriptedTeacher.CANNOT_TELL),
                        teacher_cache=None).classify(TEXT)
    assert d.label == l2 and d.tier is Tier.WEAK and d.degraded is None and d.layer is Layer.LLM
    assert d.alternatives and d.alternatives[0].label == d.label
    assert "teacher cannot tell" in d.reason
    assert d.teacher is not None and d.teacher.error is None and d.teacher.candidates == ()


def test_an_unsure_audit_is_counted_and_not_a_label():
    from tests.support.docs import ALWAYS_SURE

    got = []
    clf = make_classifier(ALWAYS_SURE, teacher=ScriptedTeacher(lambda req: ["RETRIEVAL", "PLATFORM"]),
                          audit_rate=1.0, audit_callback=lambda rec, call: got.append(call))
    clf.classify(TEXT)
    clf.close()
    assert clf.audit_outcomes["unsure"] == 1
    assert not got[0].valid and got[0].error is None and got[0].candidates == ("RETRIEVAL", "PLATFORM")


# ------------------------------------------------------------------ never a training label
def test_unsure_answers_never_become_training_labels(tmp_path):
    world = World(tmp_path)
    sink = ListSink()
    clf = make_classifier(ALWAYS_UNSURE, teacher=ScriptedTeacher(lambda req: ["RETRIEVAL", "PLATFORM"]),
                          log_sink=sink, teacher_cache=None)
    clf.classify_many(["hi what is the answer here", "hey show me that thing"])
    ok = record("hey what does addvar do", teacher="RETRIEVAL")
    write(world.store, [*sink.records, ok])
    rows = {r.decision_id: r for r in world.store.labelled_rows()}
    assert set(rows) == {ok.decision.id}
    assert world.store.unsure_teacher_answers() == 2
    assert world.store.invalid_teacher_answers() == 2
    ts = build_training_set(world.store, world.intents, embedder=world.embedder)
    assert ts.report["teacher_unsure"] == 2 and ts.report["invalid_teacher_answers_ignored"] == 2
    assert not any("what is the answer here" in t or "show me that thing" in t for t in ts.texts)


def test_the_retrain_reports_teacher_unsure(tmp_path):
    world = World(tmp_path)
    world.seed_traffic(n_teacher=120, n_human=20)
    clf = make_classifier(ALWAYS_UNSURE, teacher=ScriptedTeacher(lambda req: ScriptedTeacher.CANNOT_TELL),
                          log_sink=(sink := ListSink()), teacher_cache=None)
    clf.classify_many(["hi what is the answer here", "hey show me that thing", "and this one"])
    write(world.store, sink.records)
    res = world.run()
    assert res.to_dict()["teacher_unsure"] == 3
    assert "3 unsure" in res.markdown


def test_the_log_store_counts_unsure_after_the_text_is_forgotten(tmp_path):
    store = LogStore(tmp_path / "t.duckdb")
    sink = ListSink()
    make_classifier(ALWAYS_UNSURE, teacher=ScriptedTeacher(lambda req: ["RETRIEVAL", "PLATFORM"]),
                    log_sink=sink, teacher_cache=None).classify(TEXT)
    write(store, sink.records)
    assert store.unsure_teacher_answers() == 1
    assert store.forget_text(time.time() + 60) == 1
    assert store.query("SELECT teacher_error, teacher_candidates FROM decisions") == [
        (None, ["RETRIEVAL", "PLATFORM"])]
    assert store.unsure_teacher_answers() == 1          # retention keeps the set: data, no text
    assert store.unsure_candidate_sets() == [("RETRIEVAL", "PLATFORM")]


# ------------------------------------------------------------------ ask twice
def test_ask_twice_is_off_by_default():
    assert parse_intents(copy.deepcopy(DOC)).teacher.ask_twice is False
    l2 = _layer2_label()
    other = next(n for n in ("RETRIEVAL", "PLATFORM") if n != l2)
    teacher = ScriptedTeacher(lambda req: other)
    clf = make_classifier(ALWAYS_UNSURE, teacher=teacher, teacher_cache=None)
    d = clf.classify(TEXT)
    assert len(teacher.requests) == 1 and d.label == other and clf.second_asks == 0


def test_ask_twice_is_read_from_the_intent_file():
    doc = copy.deepcopy(DOC)
    doc["teacher"] = {"ask_twice": True}
    assert parse_intents(doc).teacher.ask_twice is True
    doc["teacher"] = {"ask_twice": "yes"}
    with pytest.raises(IntentFileError, match="teacher.ask_twice must be true or false"):
        parse_intents(doc)


def _twice(answer, **kw):
    teacher = ScriptedTeacher(answer)
    doc = copy.deepcopy(DOC)
    doc["teacher"] = {"ask_twice": True}
    clf = make_classifier(ALWAYS_UNSURE, teacher=teacher, log_sink=(sink := ListSink()), teacher_cache=None,
                          doc=doc, embedder=HashEmbedder(), **kw)
    return clf, teacher, clf.classify(TEXT), sink


def test_ask_twice_disagreement_becomes_a_candidate_set():
    l2 = _layer2_label()
    other = next(n for n in ("RETRIEVAL", "PLATFORM") if n != l2)
    # the first ask disagrees with layer 2; the second (options in another order) says something else
    clf, teacher, d, sink = _twice(lambda req: other if req.order_seed == 0 else OUT_OF_SCOPE)
    assert len(teacher.requests) == 2 and clf.second_asks == 1
    first, second = teacher.requests
    assert (first.order_seed, second.order_seed) == (0, 1)
    assert first.options == second.options and option_order(first) != option_order(second)
    assert "asked twice" in d.reason and f"unsure between {other}, {OUT_OF_SCOPE}" in d.reason
    assert d.tier in (Tier.AMBIGUOUS, Tier.WEAK) and d.degraded is None
    call = sink.records[0].decision.teacher
    assert not call.valid and call.error is None and call.candidates == (other, None)


def test_ask_twice_agreement_is_a_normal_label():
    l2 = _layer2_label()
    other = next(n for n in ("RETRIEVAL", "PLATFORM") if n != l2)
    clf, teacher, d, sink = _twice(lambda req: other)
    assert len(teacher.requests) == 2 and clf.second_asks == 1
    assert d.label == other and d.tier is Tier.CONFIDENT and "asked twice" in d.reason
    call = sink.records[0].decision.teacher
    assert call.valid and call.label == other


def test_ask_twice_does_not_ask_again_when_the_teacher_agrees_with_layer_2():
    l2 = _layer2_label()
    clf, teacher, d, _ = _twice(lambda req: l2 if l2 is not None else OUT_OF_SCOPE)
    assert len(teacher.requests) == 1 and clf.second_asks == 0 and "asked twice" not in d.reason


def test_the_classifier_setting_overrides_the_intent_file():
    l2 = _layer2_label()
    other = next(n for n in ("RETRIEVAL", "PLATFORM") if n != l2)
    clf, teacher, d, _ = _twice(lambda req: other, ask_twice=False)
    assert len(teacher.requests) == 1


def test_a_first_option_answer_is_caught_by_asking_twice_through_the_simulated_teacher():
    """The simulator's position bias (the only order-dependent error it makes) is what asking
    twice catches: the second ask, options reordered, names another first option."""
    text = "show my invoices"      # its first option is not layer 2's label, so the teacher disagrees
    doc = copy.deepcopy(DOC)
    doc["teacher"] = {"ask_twice": True}
    with SimulatedOllama({text: "PLATFORM"}, accuracy=0.0, position_bias=1.0, latency_scale=0.0) as sim:
        teacher = OllamaTeacher("sim:1b", host=sim.url, timeout_s=5.0)
        clf = make_classifier(ALWAYS_UNSURE, teacher=teacher, log_sink=(sink := ListSink()), teacher_cache=None,
                              doc=doc, embedder=HashEmbedder())
        d = clf.classify(text)
        teacher.close()
    offered = [a[3] for a in sim.answers]
    assert len(offered) == 2 and offered[0][0] != offered[1][0]           # another first option the second time
    assert [a[2] for a in sim.answers] == [order[0] for order in offered] and sim.counts["first_option"] == 2
    # two answers: a candidate set, never a training label
    call = sink.records[0].decision.teacher
    assert not call.valid and call.unsure and "asked twice" in d.reason
    assert set(offered[0][:1] + offered[1][:1]) <= set(call.candidates)


def test_the_position_bias_is_checked():
    with pytest.raises(ValueError, match="position_bias"):
        SimulatedOllama({}, position_bias=1.5)


def test_an_unsure_answer_is_data_and_its_reason_is_prose():
    from flywheel.classifier import protocols
    from flywheel.classifier.protocols import TeacherAnswer

    ans = TeacherAnswer("RETRIEVAL", "m", 1.0, candidates=("RETRIEVAL", None, "PLATFORM"))
    assert ans.candidate_set == ("RETRIEVAL", None, "PLATFORM")
    assert ans.unsure_reason() == f"teacher unsure between RETRIEVAL, {OUT_OF_SCOPE}, PLATFORM"
    assert TeacherAnswer(None, "m", 1.0, cannot_tell=True).candidate_set == ()
    assert TeacherAnswer("A", "m", 1.0).candidate_set is None
    # nothing reads a set back out of the prose any more (issue 33)
    assert not hasattr(TeacherAnswer, "candidates_in") and not hasattr(protocols, "UNSURE_BETWEEN")
