import threading

import pytest

from flywheel.classifier import Layer, Tier
from flywheel.classifier.errors import InvalidInputError, ModelError, TeacherError, UnknownLabelError
from flywheel.classifier.layer2.fitter import fit_model
from flywheel.classifier.settings.intents import parse_intents
from tests.support.docs import ALWAYS_SURE, ALWAYS_UNSURE, DOC
from tests.support.fakes import HashEmbedder, ListSink, ScriptedTeacher, make_classifier


def test_declared_type_bypasses_everything():
    t = ScriptedTeacher()
    clf = make_classifier(teacher=t)
    d = clf.classify("what is addvar", declared_type="PLATFORM")
    assert (d.label, d.layer, d.tier, d.confidence) == ("PLATFORM", Layer.DECLARED, Tier.CONFIDENT, 1.0)
    assert "declared" in d.latency_ms and "embedding" not in d.latency_ms
    assert clf.classify("x", declared_type="out_of_scope").label is None
    with pytest.raises(UnknownLabelError, match="unknown declared type 'BILLING'"):
        clf.classify("x", declared_type="BILLING")
    assert t.requests == []


def test_rules_decide_with_rule_id():
    clf = make_classifier(teacher=ScriptedTeacher())
    d = clf.classify("how much quota do I have")
    assert (d.label, d.layer, d.confidence, d.reason) == ("PLATFORM", Layer.RULES, 1.0, "rule quota-rule")


def test_confident_layer2_does_not_call_teacher():
    t = ScriptedTeacher()
    clf = make_classifier(ALWAYS_SURE, teacher=t)
    d = clf.classify("show my invoices")
    assert (d.label, d.layer, d.tier, d.alternatives) == ("PLATFORM", Layer.EMBEDDING, Tier.CONFIDENT, [])
    assert 0.0 <= d.confidence <= 1.0 and d.model_version == clf.model_version
    assert t.requests == []


def test_unsure_goes_to_teacher_with_history():
    t = ScriptedTeacher(answer=lambda req: "RETRIEVAL")
    clf = make_classifier(ALWAYS_UNSURE, teacher=t)
    d = clf.classify("and that function?", history=[("CODE_GENERATION", "write a loop " * 10)])
    assert (d.label, d.layer, d.tier) == ("RETRIEVAL", Layer.LLM, Tier.CONFIDENT)
    assert d.teacher.valid and d.teacher.label == "RETRIEVAL"
    req = t.requests[0]
    assert req.history[0].label == "CODE_GENERATION" and len(req.history[0].snippet) <= 60
    assert {o.name for o in req.options} == {"RETRIEVAL", "PLATFORM"}
    t.answer = lambda req: None
    d = clf.classify("something else")
    assert (d.label, d.tier, d.layer) == (None, Tier.NO_MATCH, Layer.LLM)


@pytest.mark.parametrize("kind", ["unavailable", "timeout", "malformed", "unknown_label", "circuit_open", "budget"])
def test_teacher_failure_degrades_to_layer2(kind):
    sink = ListSink()
    clf = make_classifier(ALWAYS_UNSURE, teacher=ScriptedTeacher(error=TeacherError(kind, "boom")), log_sink=sink)
    d = clf.classify("explain addparam")
    assert d.layer is Layer.EMBEDDING and d.tier is Tier.WEAK  # ambiguous is downgraded: the teacher failed
    said = {"unavailable": "llm unavailable: boom",       # never "unavailable: unavailable" (issue 26)
            "timeout": "llm unavailable (timeout): boom", "circuit_open": "llm unavailable (circuit_open): boom",
            "budget": "llm not asked (budget): boom",
            # an answer that is no label is not "unavailable" (issue 44)
            "malformed": "llm answer unusable (malformed): boom",
            "unknown_label": "llm answer unusable (unknown_label): boom"}[kind]
    assert d.reason.endswith(f"; {said}") and "unavailable: unavailable" not in d.reason, d.reason
    rec = sink.records[-1]
    assert rec.pending == (kind in ("unavailable", "timeout", "circuit_open", "budget"))
    assert rec.decision.degraded == kind
    if kind not in ("circuit_open", "budget"):  # refused before calling: no call to record
        assert d.teacher is not None and not d.teacher.valid


def test_teacher_raising_anything_never_breaks_serving():
    class Broken(ScriptedTeacher):
        def label(self, request):
            raise RuntimeError("bug in a plugin")

    d = make_classifier(ALWAYS_UNSURE, teacher=Broken()).classify("explain addparam")
    assert d.layer is Layer.EMBEDDING and "llm failed: RuntimeError" in d.reason


def test_no_teacher_keeps_layer2_tier_with_alternatives():
    d = make_classifier(ALWAYS_UNSURE).classify("explain addparam")
    assert d.tier is Tier.AMBIGUOUS and "no LLM teacher configured" in d.reason  # ratio 0.0: all close
    assert len(d.alternatives) >= 2 and d.alternatives[0].label == d.label


def test_session_history_is_bounded_and_used():
    t = ScriptedTeacher(answer=lambda req: "PLATFORM")
    clf = make_classifier(ALWAYS_UNSURE, teacher=t)
    for i in range(9):
        clf.classify(f"turn {i} about my invoices", session_id="s1")
    hist = clf.sessions.get("s1")
    assert len(hist) == 6 and hist[-1].snippet == "turn 8 about my invoices"
    assert t.requests[-1].history[-1].snippet == "turn 7 about my invoices"
    assert clf.sessions.get("other") == ()


def test_large_label_set_offers_only_top_candidates():
    doc = {"intents": [{"name": f"I{i}", "examples": [f"topic{i} alpha", f"topic{i} beta"]} for i in range(20)],
           "teacher": {"max_candidates": 4}}
    t = ScriptedTeacher(answer=lambda req: req.options[-1].name)
    clf = make_classifier(ALWAYS_UNSURE, teacher=t, doc=doc)
    d = clf.classify("topic7 alpha")
    assert len(t.requests[0].options) == 4 and t.requests[0].options[0].name == "I7"
    assert d.label == t.requests[0].options[-1].name


@pytest.mark.parametrize("bad", ["", "   \n\t ", None, 42])
def test_bad_input_is_a_clear_error(bad):
    with pytest.raises(InvalidInputError):
        make_classifier().classify(bad)


def test_odd_but_valid_input():
    clf = make_classifier(ALWAYS_SURE)
    assert clf.classify("show\x00 my\x07 invoices").label == "PLATFORM"
    assert clf.classify("bad surrogate \ud800 here").tier is not None
    assert clf.classify("¿Cuál es mi plan de facturación? 請問").tier is not None
    long = clf.classify("invoices " * 1000)
    assert "truncated from 8999 to 4000" in long.reason
    with pytest.raises(InvalidInputError, match="over the limit of 4000"):
        make_classifier(on_long="reject").classify("x" * 4001)


def test_classify_many_encodes_in_one_batch_and_names_bad_items():
    emb = HashEmbedder()
    clf = make_classifier(ALWAYS_SURE, embedder=emb)
    calls = emb.calls
    ds = clf.classify_many(["show my invoices", "what is addvar", "how much quota"])
    assert [d.label for d in ds] == ["PLATFORM", "RETRIEVAL", "PLATFORM"]
    assert ds[2].layer is Layer.RULES
    assert emb.calls == calls + 1
    assert len({d.id for d in ds}) == 3
    with pytest.raises(InvalidInputError, match="text #2"):
        clf.classify_many(["ok", " "])


def test_too_few_examples_is_a_training_error():
    from flywheel.classifier.errors import TrainingError

    doc = {"intents": [{"name": "A", "examples": ["only one"]}, {"name": "B", "examples": ["b one", "b two"]}]}
    with pytest.raises(TrainingError, match="'A' has fewer than 2 examples"):
        fit_model(parse_intents(doc), embedder=HashEmbedder())


def test_swap_model_refuses_other_encoder_and_serves_new_version():
    clf = make_classifier(ALWAYS_SURE)
    old = clf.model_version
    other = fit_model(parse_intents(DOC), embedder=HashEmbedder(dim=128, id="fake:hash-128"))
    with pytest.raises(ModelError, match="trained with encoder"):
        clf.swap_model(other)
    assert clf.model_version == old
    new = fit_model(parse_intents(DOC), embedder=HashEmbedder(), version="v-new")
    clf.swap_model(new)
    assert clf.classify("show my invoices").model_version == "v-new"


def test_concurrent_classify_during_swaps_never_fails():
    sink = ListSink()
    clf = make_classifier(ALWAYS_SURE, log_sink=sink)
    models = [fit_model(parse_intents(DOC), embedder=HashEmbedder(), version=f"v{i}") for i in range(3)]
    errors = []

    def worker(n):
        try:
            for i in range(50):
                clf.classify(f"show my invoices {n} {i}")
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(6)]
    for th in threads:
        th.start()
    for m in models * 5:
        clf.swap_model(m)
    for th in threads:
        th.join()
    assert errors == []
    assert len(sink.records) == 300 and len({r.decision.id for r in sink.records}) == 300
    assert all(r.embedding is not None and r.encoder_id == "fake:hash-256" for r in sink.records)


def test_audit_sample_sends_confident_decisions_to_teacher():
    got = []
    t = ScriptedTeacher(answer=lambda req: "PLATFORM")
    clf = make_classifier(ALWAYS_SURE, teacher=t, audit_rate=1.0,
                          audit_callback=lambda rec, call: got.append((rec, call)))
    d = clf.classify("show my invoices")
    clf.close()
    assert d.layer is Layer.EMBEDDING
    assert len(got) == 1 and got[0][0].decision.id == d.id and got[0][1].label == "PLATFORM"
    assert got[0][0].audit


def _one_intent(**over):
    """DOC cut to its first intent (RETRIEVAL) and its out-of-scope examples: a yes/no file."""
    return {**DOC, "rules": [], "intents": DOC["intents"][:1], **over}


def test_one_intent_trains_classifies_and_evaluates(tmp_path):
    """A file with a single intent is that intent against out of scope (issue 32: it crashed
    in train, classify and eval), with real out-of-scope examples or synthetic ones only."""
    from flywheel.classifier.pipeline import Classifier
    from flywheel.classifier.versions.model import IntentModel
    from flywheel.training.eval.measure import evaluate

    emb = HashEmbedder()
    model = fit_model(parse_intents(_one_intent()), embedder=emb)
    assert model.manifest.labels == ["RETRIEVAL"]
    served = Classifier(IntentModel.load(model.save(tmp_path / "one")), embedder=emb)
    seen = served.classify("what does addresult return")
    assert (seen.label, seen.layer) == ("RETRIEVAL", Layer.EMBEDDING)
    assert served.classify("weather tomorrow").label is None
    teacher = ScriptedTeacher(answer=lambda req: "RETRIEVAL")
    unsure = make_classifier(ALWAYS_UNSURE, teacher=teacher, doc=_one_intent()).classify("explain addvar")
    assert unsure.label == "RETRIEVAL" and [o.name for o in teacher.requests[0].options] == ["RETRIEVAL"]
    report = evaluate(served, ["what is addvar", "how do loops work", "cook pasta", "football score"],
                      ["RETRIEVAL", "RETRIEVAL", None, None], progress=False, latency_sample=0)
    assert report["n"] == 4 and 0.0 <= report["accuracy"] <= 1.0
    synthetic_only = _one_intent(out_of_scope={"synthetic": 30})
    assert make_classifier(doc=synthetic_only).classify("what is addvar").label in ("RETRIEVAL", None)


def test_a_swapped_in_version_has_both_language_passes_built_before_it_serves():
    """Issue 44: the detector answers cheaply when sure and loads its high-accuracy models
    on the first unsure query; a promoted version builds both before the swap, so no served
    query pays for that load."""
    clf = make_classifier(ALWAYS_SURE)
    new = fit_model(parse_intents({**DOC, "languages": ["en", "es"]}), embedder=HashEmbedder(), version="v-es")
    clf.swap_model(new)
    assert clf._rt.language.high_accuracy_loaded
