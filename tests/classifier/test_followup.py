"""Follow-ups (issue 43, ADR RC-03): the detector fires on queries that lean on an in-scope
previous turn and on nothing else; through ``Classifier.classify`` a referential follow-up is
never a sure out-of-scope answer, and misleading history never moves a self-contained query."""

from __future__ import annotations

import pytest

from flywheel.classifier.decision import Layer, Tier
from flywheel.classifier.errors import IntentFileError
from flywheel.classifier.followup import FollowupDetector
from flywheel.classifier.layer2.fitter import fit_model
from flywheel.classifier.pipeline import Classifier
from flywheel.classifier.protocols import HistoryEntry, TeacherAnswer, TeacherRequest
from flywheel.classifier.settings.intents import load_intents, parse_intents
from flywheel.classifier.versions.model import intents_to_doc
from tests.support.paths import ROOT

SUPPORT = ROOT / "benchmarks/data/followups/support_intents.yaml"

# (anchor turn, its label, the follow-up, the label it means)
FOLLOWUPS = [
    ("Wo ist meine Bestellung 12345?", "ORDER_STATUS", "und wann kommt sie an?", "ORDER_STATUS"),
    ("Die Jacke ist mir zu klein", "RETURNS", "kann ich sie umtauschen?", "RETURNS"),
    ("My new helmet arrived but it is too small", "RETURNS", "and the other one?", "RETURNS"),
    ("I was billed 40 euros extra on my last purchase", "BILLING", "why is that?", "BILLING"),
    ("La mochila que me llegó está rota", "RETURNS", "¿y cómo lo arreglo?", "RETURNS"),
    ("¿Dónde está mi pedido 55120?", "ORDER_STATUS", "¿y lo anterior?", "ORDER_STATUS"),
]
SELF_CONTAINED = [
    ("I forgot my password", "ACCOUNT"),
    ("Which payment methods do you accept?", "BILLING"),
    ("¿Dónde está mi pedido 7781?", "ORDER_STATUS"),
    ("Ich möchte die Schuhe zurückschicken", "RETURNS"),
    ("What is the weather tomorrow in Paris?", None),
]
MISLEADING = [("ACCOUNT", "I forgot my password and my account is locked"), ("BILLING", "it was charged twice")]


@pytest.mark.parametrize("anchor, label, text, _", FOLLOWUPS)
def test_the_detector_fires_on_referential_followups_in_every_language(anchor, label, text, _):
    f = FollowupDetector().detect(text, [HistoryEntry.of(label, anchor)])
    assert f is not None and f.anchor.label == label


@pytest.mark.parametrize("text", [t for t, _ in SELF_CONTAINED] + [
    "and I was also charged twice for the helmet", "Write an AVAP function that sorts a list of prices",
    # a bare "what"/"how" opens any question; "it" in "what time is it" points at nothing
    "What is the capital of Mongolia?", "How do I cook pasta?", "What time is it in Tokyo?"])
def test_the_detector_never_fires_on_self_contained_queries(text):
    assert FollowupDetector().detect(text, [HistoryEntry.of("RETURNS", "The boots are too small")]) is None


def test_the_detector_needs_a_recent_in_scope_turn():
    det = FollowupDetector()
    assert det.detect("und wann kommt sie an?", []) is None
    assert det.detect("und wann kommt sie an?", [HistoryEntry.of(None, "Tell me a joke")]) is None
    old = [HistoryEntry.of("ORDER_STATUS", "Wo ist meine Bestellung?"), HistoryEntry.of(None, "a"),
           HistoryEntry.of(None, "b")]
    assert det.detect("und wann kommt sie an?", old) is None


def test_a_chain_of_followups_leans_on_the_turn_with_content():
    h = [HistoryEntry.of("ACCOUNT", "Ich komme nicht mehr in mein Konto"), HistoryEntry.of("ACCOUNT", "und jetzt?")]
    f = FollowupDetector().detect("geht immer noch nicht", h)
    assert f is not None and f.anchor == h[0]


def test_the_followups_setting_is_read_checked_and_saved():
    doc = {"version": 1, "intents": [{"name": "A", "examples": ["x"]}]}
    assert parse_intents(doc).followups == "defer"
    assert parse_intents({**doc, "followups": False}).followups == "off"
    assert intents_to_doc(parse_intents({**doc, "followups": "resolve"}))["followups"] == "resolve"
    assert "followups" not in intents_to_doc(parse_intents(doc))
    with pytest.raises(IntentFileError, match="followups must be one of"):
        parse_intents({**doc, "followups": "maybe"})
    with pytest.raises(ValueError, match="followups must be one of"):
        Classifier(None, followups="maybe")  # type: ignore[arg-type]


class Oracle:
    """A teacher that reads the history: it answers what the test says each text means."""

    model = "oracle"

    def __init__(self, answers: dict[str, str | None]) -> None:
        self.answers, self.requests = answers, []

    def label(self, request: TeacherRequest) -> TeacherAnswer:
        self.requests.append(request)
        return TeacherAnswer(self.answers.get(request.text), self.model, 1.0)


@pytest.fixture(scope="module")
def support_model():
    return fit_model(load_intents(SUPPORT))


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["resolve", "defer"])
def test_referential_followups_are_never_a_sure_out_of_scope_answer(support_model, mode):
    clf = Classifier(support_model, followups=mode)
    for n, (anchor, label, text, meant) in enumerate(FOLLOWUPS):
        d = clf.classify(text, history=[(label, anchor)], session_id=f"s{n}")
        assert d.label is not None, (text, d.reason)
        assert "follow-up" in d.reason and f"of {label}" in d.reason
        assert d.label == meant, (text, d.label, d.reason)


@pytest.mark.slow
def test_off_serves_followups_on_their_own_words(support_model):
    clf = Classifier(support_model, followups="off")
    d = clf.classify("und wann kommt sie an?", history=[("ORDER_STATUS", "Wo ist meine Bestellung 12345?")])
    assert "follow-up" not in d.reason


@pytest.mark.slow
def test_defer_asks_the_teacher_with_the_history(support_model):
    teacher = Oracle({"und wann kommt sie an?": "ORDER_STATUS"})
    clf = Classifier(support_model, teacher=teacher, followups="defer", teacher_cache=None)
    clf.classify("Wo ist meine Bestellung 12345?", session_id="s")
    d = clf.classify("und wann kommt sie an?", session_id="s")
    assert d.layer is Layer.LLM and d.label == "ORDER_STATUS" and d.tier is Tier.CONFIDENT
    assert teacher.requests[-1].history[-1].snippet == "Wo ist meine Bestellung 12345?"


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["resolve", "defer"])
def test_misleading_history_never_moves_a_self_contained_query(support_model, mode):
    """RC-03: a self-contained query is scored on its content alone."""
    clf = Classifier(support_model, followups=mode)
    for text, _ in SELF_CONTAINED:
        alone = clf.classify(text)
        for hist in ([MISLEADING[0]], MISLEADING, [MISLEADING[1], ("RETURNS", "and the other one?")]):
            d = clf.classify(text, history=hist)
            assert (d.label, d.tier, d.confidence) == (alone.label, alone.tier, alone.confidence), (text, hist)
            assert "follow-up" not in d.reason
